"""`kvops kv`, `table`, `plot`, `models` as a user runs them: outputs, JSON keys, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.extras import needs

KV_KEYS = {
    "model",
    "kv_dtype",
    "dtype_bytes",
    "tp",
    "batch",
    "beams",
    "effective_batch",
    "tokens",
    "bytes_per_token",
    "token_tax_bytes",
    "total_bytes",
    "total_bytes_all_gpus",
    "layer_groups",
}


def test_kv_json_has_the_documented_keys(run_kvops):
    document = json.loads(run_kvops("kv", "-m", "gemma-2-9b", "-t", "8192", "--beams", "2", "--json").stdout)
    assert set(document) >= KV_KEYS
    assert {group["kind"] for group in document["layer_groups"]} == {"sliding", "full"}
    assert set(document["layer_groups"][0]) >= {"kind", "layers", "kv_heads", "head_dim", "window", "bytes_per_token"}
    assert document["effective_batch"] == 2 and document["beam_search_estimate"]["low_bytes"] > document["total_bytes"]


def test_kv_human_output_shows_the_formula(run_kvops):
    out = run_kvops("kv", "-m", "mistral-7b-v0.1", "--prompt-tokens", "6000", "--gen-tokens", "2192", "-b", "4").stdout
    assert "2 x 8 kv_heads x 128 head_dim x 2 B x 32 layers" in out
    assert "512 KiB" in out and "2 GiB" in out and "8,192 tokens" in out


def test_quantized_cache_says_what_its_scales_cost(run_kvops):
    document = json.loads(run_kvops("kv", "-m", "llama-3-8b", "-t", "10", "--kv-dtype", "int8", "--json").stdout)
    assert document["scale_bytes_per_token"] == 32 * 2 * 8 * 4 and "per token per KV head" in document["scales"]
    assert (
        "held with the weights"
        in json.loads(run_kvops("kv", "-m", "llama-3-8b", "-t", "10", "--kv-dtype", "fp8", "--json").stdout)["scales"]
    )


def test_long_context_is_computed_with_a_warning(run_kvops):
    result = run_kvops("kv", "-m", "opt-125m", "-t", "4096")
    assert "max_position_embeddings 2,048" in result.stderr and "total" in result.stdout


@pytest.mark.parametrize(
    "args, code, fragment",
    [
        (["kv", "-m", "mistrall-7b-v0.2", "-t", "10"], 1, "did you mean"),
        (["kv", "-m", "llama-3-8b", "-t", "0"], 2, "'--tokens'"),
        (["kv", "-m", "llama-3-8b", "-t", "5", "-b", "-1"], 2, "'--batch'"),
        (["kv", "-m", "llama-3-8b"], 2, "missing --tokens"),
        (["kv", "-m", "llama-3-8b", "-t", "5", "--prompt-tokens", "3"], 2, "not both"),
        (["kv", "-m", "llama-3-8b", "-t", "5", "--kv-dtype", "fp7"], 2, "'--kv-dtype'"),
        (["kv", "-m", "llama-3-8b", "-t", "5", "--tp", "3"], 2, "valid: 1, 2, 4, 8"),
        (["kv", "-m", "llama-3-8b", "-t", "5", "--memory", "lots"], 2, "--memory 'lots' is not a size"),
        (["table", "-m", "llama-3-8b", "--batches", "1,x"], 2, "comma-separated"),
        (["plot", "-m", "llama-3-8b", "--out", "x.png", "--gpu-memory", "80 parsecs"], 2, "unknown unit"),
    ],
)
def test_bad_input_is_one_line_and_non_zero(run_kvops, args, code, fragment):
    result = run_kvops(*args, expect=code)
    assert fragment in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_config_missing_a_field_names_field_and_file(run_kvops, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64}))
    result = run_kvops("kv", "-m", str(tmp_path), "-t", "1", expect=1)
    assert "'num_attention_heads'" in result.stderr and str(tmp_path / "config.json") in result.stderr


def test_broken_json_config(run_kvops, tmp_path):
    (tmp_path / "config.json").write_text("{nope")
    assert "not valid JSON" in run_kvops("kv", "-m", str(tmp_path), "-t", "1", expect=1).stderr


@needs("huggingface_hub")
def test_model_from_local_hf_cache_without_network(run_kvops, tmp_path, monkeypatch):
    """A model id found in the HF cache layout (models--org--name/snapshots/<rev>/config.json)."""
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(
        json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256, "torch_dtype": "float16"})
    )
    (tmp_path / "hub" / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    document = json.loads(run_kvops("kv", "-m", "acme/tiny", "-t", "100", "--json").stdout)
    assert document["model_source"] == "hf-cache" and document["bytes_per_token"] == 2 * 2 * 4 * 64 * 2


def test_catalog_lookup_is_case_insensitive_and_takes_aliases(run_kvops):
    ids = {
        json.loads(run_kvops("kv", "-m", name, "-t", "1", "--json").stdout)["model"]
        for name in ("META-LLAMA/LLAMA-2-7B-HF", "llama-2-7b", "Llama-2-7b-hf")
    }
    assert ids == {"meta-llama/Llama-2-7b-hf"}


@needs("pandas")
@pytest.mark.parametrize("table_format", ["text", "csv", "json", "markdown"])
def test_table_formats(run_kvops, table_format):
    out = run_kvops("table", "-m", "mistral-7b-v0.1", "--format", table_format).stdout
    if table_format == "csv":
        lines = out.splitlines()
        assert lines[0] == "batch,tokens,token_tax_bytes,kv_bytes_no_window,kv_bytes"
        assert "1,8192,131072,1073741824,536870912" in lines
        assert len(lines) == 1 + 3 * 4
    elif table_format == "json":
        rows = json.loads(out)["rows"]
        assert {
            "batch": 8,
            "tokens": 1024,
            "token_tax_bytes": 1 << 20,
            "kv_bytes_no_window": 1 << 30,
            "kv_bytes": 1 << 30,
        } in rows
    elif table_format == "markdown":
        assert out.splitlines()[0].startswith("| batch | tokens | token tax")
    else:
        assert "512 MiB" in out and "sliding 4096 on all 32 layers" in out


@needs("matplotlib")
def test_plot_writes_a_png(run_kvops, tmp_path):
    out = tmp_path / "kv.png"
    document = json.loads(
        run_kvops(
            "plot",
            "-m",
            "llama-2-7b",
            "--compare",
            "mistral-7b-v0.1",
            "--gpu-memory",
            "24GiB",
            "--out",
            str(out),
            "--json",
        ).stdout
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert document["gpu_memory_bytes"] == 24 << 30 and document["models"] == [
        "meta-llama/Llama-2-7b-hf",
        "mistralai/Mistral-7B-v0.1",
    ]


def test_models_lists_the_kv_deciding_fields(run_kvops):
    rows = {row["id"]: row for row in json.loads(run_kvops("models", "--json").stdout)}
    assert (
        rows["google/gemma-2-9b"]["sliding_window"] == 4096 and "21 of 42" in rows["google/gemma-2-9b"]["layer_pattern"]
    )
    assert rows["deepseek-ai/DeepSeek-V3"]["mla"] == {"kv_lora_rank": 512, "qk_rope_head_dim": 64}
    assert rows["Qwen/Qwen3-8B"]["head_dim"] == 128 and rows["facebook/opt-125m"]["kv_heads"] == 12
    assert all(row["parameters"] > 0 for row in rows.values())
    assert "Mixtral" in run_kvops("models").stdout


def test_kv_path_imports_neither_pandas_nor_matplotlib():
    code = "import sys; from kvops.cli import main; sys.argv=['kvops','kv','-m','llama-3-8b','-t','5']\ntry: main()\nexcept SystemExit: pass\nprint(sorted(m for m in ('pandas','matplotlib','huggingface_hub') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_tokens_are_read_as_vllm_writes_them(run_kvops):
    """`kvops plan --max-model-len 32k` is accepted: `kvops kv --tokens` reads counts the same way."""
    decimal = json.loads(run_kvops("kv", "-m", "mistral-7b-v0.1", "--tokens", "32k", "--json").stdout)
    binary = json.loads(run_kvops("kv", "-m", "mistral-7b-v0.1", "--tokens", "32K", "--json").stdout)
    assert decimal["tokens"] == 32000 and binary["tokens"] == 32768


def test_what_fits_says_where_windows_apply_and_where_the_model_stops(run_kvops):
    text = run_kvops("kv", "-m", "openai/gpt-oss-20b", "--tokens", "8192", "--memory", "17.8GiB").stdout
    fits = next(line for line in text.splitlines() if line.startswith("tokens that fit"))
    longest = next(line for line in text.splitlines() if line.startswith("longest sequence"))
    assert "every token on every layer, windows not applied" in fits
    assert longest.endswith("windows applied; the model takes at most 131,072 positions")
