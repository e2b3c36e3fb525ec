"""config.json and safetensors headers as a hostile user writes them (issue 23): every field kvops reads is typed
and bounded, an impossible model is refused, a file that is not a regular file is never read; each refusal is one
ConfigError naming the field and the file. Real catalog configs (83 of them) all still load."""

from __future__ import annotations

import json
import math
import os
import struct

import pytest

from kvops.errors import ConfigError
from kvops.model import catalog
from kvops.model.checkpoint import parse_header, read_local
from kvops.model.config import spec_from_config
from kvops.model.fields import MAX_LAYERS, WHOLE_NUMBERS
from kvops.model.locate import catalog_spec, load_model
from tests.support.hostile import MISTRAL_CONFIG

WHERE = "hostile/config.json"


def spec(config: dict):
    return spec_from_config(config, name="hostile", source="path", where=WHERE)


def refusal(config: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        spec(config)
    message = str(caught.value)
    assert message.startswith(f"{WHERE}: ") and "\n" not in message
    return message


@pytest.mark.parametrize(
    "value, shown",
    [
        ("32", "'32' (a string)"),
        (1e308, "1e+308, out of range"),
        (math.inf, "Infinity"),
        (math.nan, "NaN"),
        (-1, "-1, out of range"),
        (10**9, "1000000000, out of range"),
        (True, "true (a boolean)"),
        ([32], "a list of 1"),
        ({"n": 32}, "an object"),
        (2.5, "2.5"),
    ],
    ids=["string", "1e308", "Infinity", "NaN", "negative", "a billion", "boolean", "list", "object", "fraction"],
)
def test_num_hidden_layers_that_is_no_layer_count_is_one_line_with_what_is_valid(value, shown):
    """`num_hidden_layers: 1e9` used to build a billion layers; now it is refused before anything is built."""
    message = refusal({**MISTRAL_CONFIG, "num_hidden_layers": value})
    assert f"'num_hidden_layers' is {shown}" in message
    assert f"valid: a whole number from 0 to {MAX_LAYERS:,}" in message


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"num_key_value_heads": 7}, "num_key_value_heads 7 does not divide num_attention_heads 32"),
        ({"num_key_value_heads": 64}, "num_key_value_heads 64 does not divide num_attention_heads 32"),
        ({"vocab_size": -5}, "'vocab_size' is -5, out of range; valid: a whole number from 0 to 16,777,216"),
        ({"hidden_size": 4097}, "hidden_size 4097 is not divisible by num_attention_heads 32"),
        ({"num_kv_shared_layers": 32}, "num_kv_shared_layers 32 leaves no layer of 32 with a KV cache"),
        (
            {"num_local_experts": 8, "num_experts_per_tok": 9},
            "num_experts_per_tok 9 is more than the model's 8 experts",
        ),
        ({"layer_types": ["full_attention"]}, "layer_types lists 1 layers but num_hidden_layers is 32"),
        ({"layer_types": [1] * 32}, "'layer_types[0]' is 1; valid: a list of strings"),
        ({"text_config": [1]}, "'text_config' is a list of 1; valid: an object of fields, or null"),
        ({"quantization_config": "fp8"}, "'quantization_config' is 'fp8' (a string); valid: an object"),
        ({"quantization_config": {"quant_method": 5}}, "'quantization_config.quant_method' is 5; valid: a string"),
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [0, 128]}},
            "'quantization_config.weight_block_size[0]' is 0, out of range",
        ),
        ({"quantization_config": {"quant_method": "awq", "bits": 0}}, "'quantization_config.bits' is 0, out of range"),
        ({"architectures": "MistralForCausalLM"}, "'architectures' is 'MistralForCausalLM' (a string); valid: a list"),
        ({"model_type": ["mistral"]}, "'model_type' is a list of 1; valid: a string"),
        (
            {"partial_rotary_factor": "half"},
            "'partial_rotary_factor' is 'half' (a string); valid: a number from 0 to 1",
        ),
        ({"rope_parameters": [1]}, "'rope_parameters' is a list of 1; valid: an object of fields, or null"),
        ({"sliding_window": "4096"}, "'sliding_window' is '4096' (a string)"),
        ({"max_position_embeddings": 1 << 40}, "'max_position_embeddings' is 1099511627776, out of range"),
    ],
)
def test_impossible_or_mistyped_models_are_refused_with_the_field_and_what_is_valid(fields, message):
    assert message in refusal({**MISTRAL_CONFIG, **fields})


def test_every_field_kvops_reads_is_typed_in_text_and_vision_configs_too():
    """The same table holds under text_config and vision_config, named with their section."""
    wrapper = {"model_type": "gemma3", "text_config": {**MISTRAL_CONFIG, "head_dim": "128"}, "vision_config": {}}
    assert "'text_config.head_dim' is '128' (a string)" in refusal(wrapper)
    wrapper = {**MISTRAL_CONFIG, "vision_config": {"model_type": "siglip_vision_model", "patch_size": 0}}
    assert "'vision_config.patch_size' is 0, out of range; valid: a whole number from 1" in refusal(wrapper)


def test_a_missing_field_a_count_needs_is_named():
    vision = {"model_type": "siglip_vision_model", "hidden_size": 8, "intermediate_size": 8, "patch_size": 2}
    assert "missing 'image_size', which the parameter count needs" in refusal(
        {**MISTRAL_CONFIG, "vision_config": vision}
    )


def test_no_num_hidden_layers_takes_the_architecture_default_and_says_so():
    """transformers and vLLM load a config without num_hidden_layers with its class default (a composite config
    leaves out what equals it), so kvops plans the model the engine will run, and warns: every KV figure scales
    with the layer count, and a top-level config.json that transformers wrote always states it."""
    model = spec({key: value for key, value in MISTRAL_CONFIG.items() if key != "num_hidden_layers"})
    assert model.num_layers == 32
    assert model.warnings == (
        f"{WHERE}: no num_hidden_layers; mistral's default of 32 layers is used, as transformers and vLLM load this "
        "config (every KV figure scales with it: add the field if the model differs)",
    )
    assert spec(MISTRAL_CONFIG).warnings == ()
    unknown = {key: value for key, value in MISTRAL_CONFIG.items() if key != "num_hidden_layers"} | {"model_type": "x"}
    assert "missing 'num_hidden_layers'" in refusal(unknown)


def test_every_catalog_model_still_loads():
    """The bounds are far past every real config (the catalog's largest: 126 layers, 512 experts)."""
    for entry in catalog.catalog():
        catalog_spec(entry)


@pytest.mark.parametrize("name", sorted(WHOLE_NUMBERS))
def test_every_whole_number_field_refuses_a_string_and_a_billion_billions(name):
    for value in ("8", 10**18):
        message = refusal({**MISTRAL_CONFIG, name: value})
        assert repr(name) in message and "valid: a whole number" in message


# --- the file itself ---------------------------------------------------------------------------------------------


def test_a_fifo_or_a_device_as_config_json_is_refused_without_reading(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    with pytest.raises(ConfigError, match=r"a FIFO .*; kvops reads regular files only"):
        load_model(str(fifo))
    with pytest.raises(ConfigError, match="/dev/zero: a device, which may never end"):
        load_model("/dev/zero")
    folder = tmp_path / "model"
    folder.mkdir()
    os.mkfifo(folder / "config.json")
    with pytest.raises(ConfigError, match="FIFO"):
        load_model(str(folder))


def test_an_oversized_or_deeply_nested_config_json_is_refused(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(ConfigError, match="nested more than 64 levels deep"):
        load_model(str(deep))
    huge = tmp_path / "huge.json"
    with huge.open("wb") as handle:
        handle.truncate(65 << 20)  # sparse: 65 MiB of nothing on disk
    with pytest.raises(ConfigError, match="more than the 64 MiB kvops reads"):
        load_model(str(huge))
    digits = tmp_path / "digits.json"
    digits.write_text('{"num_hidden_layers": ' + "9" * 5000 + "}")
    with pytest.raises(ConfigError, match="not usable JSON"):
        load_model(str(digits))


# --- safetensors headers -----------------------------------------------------------------------------------------


def header(entry) -> bytes:
    raw = json.dumps({"model.embed_tokens.weight": entry}).encode()
    return struct.pack("<Q", len(raw)) + raw


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x01", "fewer than 8 bytes"),
        (struct.pack("<Q", 2**63) + b"{}", "a header of 9223372036854775808 bytes"),
        (struct.pack("<Q", 500) + b"{}", "it ends inside its 500-byte header"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (struct.pack("<Q", 200_000) + b"[" * 100_000 + b"]" * 100_000, "nested more than 64 levels"),
        (header({"dtype": "BF16", "shape": [1], "data_offsets": ["a", "b"]}), "has no dtype, shape and data_offsets"),
        (header({"dtype": "BF16", "shape": [-1, 4], "data_offsets": [0, 8]}), "has no dtype, shape and data_offsets"),
        (header({"dtype": ["BF16"], "shape": [1], "data_offsets": [0, 2]}), "has no dtype, shape and data_offsets"),
        (header({"dtype": "BF16", "shape": [4], "data_offsets": [100, 0]}), "ends (data_offsets 0) before it begins"),
        (header({"dtype": "BF16", "shape": [10**30], "data_offsets": [0, 2]}), "has no dtype, shape and data_offsets"),
    ],
    ids=["short", "huge length", "truncated", "a list", "deep", "offsets", "negative dim", "dtype", "reversed", "dim"],
)
def test_a_bad_safetensors_header_is_one_line(tmp_path, data, message):
    (tmp_path / "model.safetensors").write_bytes(data)
    with pytest.raises(ConfigError) as caught:
        read_local(tmp_path)
    assert message in str(caught.value) and "model.safetensors" in str(caught.value)


@pytest.mark.parametrize(
    "index, message",
    [
        ({"weight_map": [1], "metadata": 5}, "a safetensors index needs a weight_map object"),
        ({"weight_map": {"w": 5}}, "weight_map names a file outside the model's folder"),
        ({"weight_map": {"w": "../../etc/passwd"}}, "weight_map names a file outside the model's folder"),
    ],
)
def test_a_bad_safetensors_index_is_one_line(tmp_path, index, message):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConfigError, match=message):
        read_local(tmp_path)


def test_a_fifo_named_model_safetensors_is_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "model.safetensors")
    assert read_local(tmp_path) is None  # not a regular file: no checkpoint headers, the count is used


def test_parse_header_types_what_it_keeps():
    tensors = parse_header(
        json.dumps({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}, "__metadata__": {}}).encode(),
        "x.safetensors",
    )
    assert [(t.name, t.dtype, t.shape, t.nbytes) for t in tensors] == [("w", "BF16", (2, 3), 12)]
