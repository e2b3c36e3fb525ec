"""`kvops plan -f FILE`: the seed's kv_cache block (tests/fixtures/kvops-yaml/seed.yaml) and plain option keys give
the plan the equivalent flags give; keys no engine implements are named, one line each; flags override the file."""

from __future__ import annotations

import json

import pytest

from tests.support.extras import needs
from tests.support.paths import REPO

SEED = REPO / "tests" / "fixtures" / "kvops-yaml" / "seed.yaml"
TARGET = ["--model", "llama-3-8b", "--gpu", "H100-80GB"]
EQUIVALENT = ["--max-model-len", "8192", "--kv-dtype", "int8", "--kv-offloading-size", "64"]


def test_the_seeds_yaml_plans_as_the_equivalent_flags(run_kvops):
    from_file = run_kvops("plan", "-f", str(SEED), *TARGET, "--json")
    from_flags = run_kvops("plan", *TARGET, *EQUIVALENT, "--json")
    assert json.loads(from_file.stdout) == json.loads(from_flags.stdout)
    flags = json.loads(from_file.stdout)["flags"]
    assert (flags["max-model-len"], flags["kv-cache-dtype"], flags["kv-offloading-size"]) == (
        8192,
        "int8_per_token_head",
        64.0,
    )
    unused = [line for line in from_file.stderr.splitlines() if "is not used" in line]
    assert [line.split(": ")[3].split(" (")[0] for line in unused] == ["kv_cache.chunk_size", "kv_cache.swap.path"]
    assert all(line.startswith("kvops: warning: ") and "\n" not in line for line in unused)
    assert "the seed ranks KV quality bf16 > int8 > fp8" in from_file.stderr


def test_flags_override_the_file_and_plain_keys_are_options(run_kvops, tmp_path):
    config = tmp_path / "kvops.yaml"
    config.write_text("model: llama-3-8b\ngpu: H100-80GB\nmax_model_len: 4096\nkv-dtype: fp8\nenforce-eager: true\n")
    from_file = json.loads(run_kvops("plan", "-f", str(config), "--max-model-len", "2048", "--json").stdout)
    from_flags = json.loads(
        run_kvops("plan", *TARGET, "--max-model-len", "2048", "--kv-dtype", "fp8", "--enforce-eager", "--json").stdout
    )
    assert from_file == from_flags and from_file["flags"]["max-model-len"] == 2048


def test_without_compression_the_precision_is_the_kv_dtype(run_kvops, tmp_path):
    config = tmp_path / "kvops.yaml"
    config.write_text(
        "kv_cache:\n  max_length: 8192\n  precision: fp16\n  compression: {enabled: false, method: int8}\n"
    )
    from_file = json.loads(run_kvops("plan", "-f", str(config), *TARGET, "--json").stdout)
    assert from_file == json.loads(
        run_kvops("plan", *TARGET, "--max-model-len", "8192", "--kv-dtype", "fp16", "--json").stdout
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("max_len: 8192\n", "unknown key 'max_len'; valid: kv_cache (the seed's block) or an option of this command:"),
        ("kv_cache: {max_length: 8192, pooling: mean}\n", "unknown key 'kv_cache.pooling'; valid: chunk_size,"),
        ("kv_cache: {swap: {enabled: true, max_size: lots}}\n", "kv_cache.swap.max_size 'lots' is not a size"),
        ("max-model-len: many\n", "'many'"),
        ("- a\n", "want a mapping of option names to values"),
    ],
)
def test_file_mistakes_are_one_line(run_kvops, tmp_path, text, message):
    config = tmp_path / "kvops.yaml"
    config.write_text(text)
    result = run_kvops("plan", "-f", str(config), *TARGET, expect=2)
    assert message in result.stderr and "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


@needs("jsonschema")
def test_the_files_json_schema_takes_the_seed_and_refuses_a_typo(run_kvops, tmp_path):
    import jsonschema
    import yaml

    schema = json.loads(run_kvops("plan", "--file-schema").stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load(SEED.read_text()), schema)
    jsonschema.validate({"model": "llama-3-8b", "max_model_len": 4096, "enforce-eager": True}, schema)
    with pytest.raises(jsonschema.ValidationError, match="'pooling' was unexpected"):
        jsonschema.validate({"kv_cache": {"pooling": "mean"}}, schema)
    with pytest.raises(jsonschema.ValidationError, match="'int9' is not one of"):
        jsonschema.validate({"quantization": "int9"}, schema)
