"""TGI's rules read in its own source (huggingface/text-generation-inference at the tags named), where kvops
differed from them. TGI cannot run here: each test cites the file and the release it follows."""

from __future__ import annotations

from kvops.engines.tgi.budget import launcher_head_dim, resolve_attention
from kvops.engines.tgi.releases import release
from kvops.model import load_model


def test_attention_reads_the_head_dim_from_config_json_as_the_launcher_does():
    # launcher/src/main.rs v3.3.7 `Config::get_head_dim`: top-level head_dim, hidden_size / num_attention_heads,
    # then text_config.head_dim; a LLaVA-NeXT config has none of them at its top level: fallback flashdecoding
    granite = resolve_attention(load_model("granite-vision-3.3-2b"), "nvidia", release("3.3.7"), "H100-80GB")
    assert (granite.backend, granite.block_size, granite.prefix_caching) == ("flashdecoding", 256, False)
    # text_config.head_dim is read from v3.2.1 only, gemma3's 256 from v3.3.0
    mistral3 = load_model("mistral-small-3.2")
    assert resolve_attention(mistral3, "nvidia", release("3.2.0"), "H100-80GB").block_size == 256
    assert resolve_attention(mistral3, "nvidia", release("3.2.1"), "H100-80GB").block_size == 1
    gemma3 = load_model("gemma-3-12b-it")
    assert launcher_head_dim(gemma3, release("3.2.3")) is None
    assert resolve_attention(gemma3, "nvidia", release("3.3.0"), "H100-80GB").backend == "flashinfer"


def test_fallback_attention_is_paged_below_compute_capability_8():
    # launcher/src/main.rs v2.3.1-v3.3.7 `resolve_attention`: fallback "paged" when major < 8 (a T4 is 7.5)
    phi2 = load_model("phi-2")  # head dim 80
    t4 = resolve_attention(phi2, "nvidia", release("3.3.7"), "T4")
    assert (t4.backend, t4.block_size, t4.supports_chunking) == ("paged", 16, False)
    assert resolve_attention(phi2, "nvidia", release("3.3.7"), "A100-80GB").backend == "flashdecoding"
    assert resolve_attention(phi2, "nvidia", release("2.3.0"), "T4").backend == "flashdecoding"  # no check yet
    # a supported head dim keeps flashinfer whatever the card
    assert resolve_attention(load_model("llama-3-8b"), "nvidia", release("3.3.7"), "T4").backend == "flashinfer"


def test_gemma2_is_sent_to_flash_decoding_in_2_2_and_2_3():
    # launcher/src/main.rs v2.2.0 sets FLASH_DECODING=1 for gemma2 (models/globals.py: BLOCK_SIZE 256);
    # v2.3.0-v2.3.1 force gemma2 to the fallback attention; v2.4.0 dropped it ("Use flashinfer for Gemma 2")
    gemma2 = load_model("gemma-2-9b")
    for version in ("2.2.0", "2.3.0", "2.3.1"):
        assert resolve_attention(gemma2, "nvidia", release(version), "A100-80GB").block_size == 256
    assert resolve_attention(gemma2, "nvidia", release("2.1.1"), "A100-80GB").block_size == 16
    assert resolve_attention(gemma2, "nvidia", release("2.4.0"), "A100-80GB").block_size == 1


def test_bytes_per_token_of_a_sub_byte_kv_is_not_zero():
    """kvops sweep --engines tgi --kv-dtypes int4 printed 0 bytes a token on the refused rows (bits // 8 per value)."""
    from kvops.dtypes import resolve_kv_dtype
    from kvops.engines.tgi.budget import kv_bytes_per_token
    from kvops.model.locate import load_model

    spec = load_model("mistral-7b-v0.1")
    full = kv_bytes_per_token(spec, resolve_kv_dtype("auto", "bfloat16"), 1)
    assert full == 2 * 32 * 8 * 128 * 2
    assert kv_bytes_per_token(spec, resolve_kv_dtype("int4", "bfloat16"), 1) == full // 4
