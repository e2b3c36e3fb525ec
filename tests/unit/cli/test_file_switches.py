"""`kvops plan -f FILE` and switches: typed beats the file both ways. A switch the file sets on is turned off by
its typed off form (`--no-enforce-eager`, the spelling vLLM's own option has), one the file sets off (`X: false` or
`no-X: true`) is turned on by typing it, and a switch left untyped is the file's."""

from __future__ import annotations

import json

import pytest

TARGET = ["--model", "llama-3-8b", "--gpu", "H100-80GB", "--tp", "2", "--max-model-len", "8192"]
# (the switch as the file turns it on, its off form, what else the plan needs for the switch to show)
SWITCHES = [
    ("enable-expert-parallel", "no-enable-expert-parallel", []),
    ("enforce-eager", "no-enforce-eager", []),
    ("no-vmm", "vmm", []),
    ("disable-custom-all-reduce", "no-disable-custom-all-reduce", []),
    ("language-model-only", "no-language-model-only", []),
    ("disable-hybrid-kv-cache-manager", "no-disable-hybrid-kv-cache-manager", []),
    ("disable-sliding-window", "no-disable-sliding-window", []),
    ("enable-lora", "no-enable-lora", []),
    ("fully-sharded-loras", "no-fully-sharded-loras", ["--enable-lora"]),
    ("enable-prefix-caching", "no-enable-prefix-caching", []),
    ("no-enable-chunked-prefill", "enable-chunked-prefill", []),
    ("no-async-scheduling", "async-scheduling", []),
    ("enable-extensible-kv-cache", "no-enable-extensible-kv-cache", []),
    ("guard", "no-guard", []),
]
IDS = [switch for switch, _, _ in SWITCHES]


def _plan(run_kvops, *args: str) -> dict:
    return json.loads(run_kvops("plan", *TARGET, *args, "--json").stdout)


def _file(tmp_path, text: str) -> str:
    config = tmp_path / "kvops.yaml"
    config.write_text(text)
    return str(config)


@pytest.mark.parametrize(("switch", "off", "extra"), SWITCHES, ids=IDS)
def test_the_on_and_off_forms_plan_differently(run_kvops, switch, off, extra):
    assert _plan(run_kvops, *extra, f"--{switch}") != _plan(run_kvops, *extra, f"--{off}")


@pytest.mark.parametrize(("switch", "off", "extra"), SWITCHES, ids=IDS)
def test_typed_off_beats_the_files_on(run_kvops, tmp_path, switch, off, extra):
    config = _file(tmp_path, f"{switch}: true\n")
    assert _plan(run_kvops, "-f", config, *extra, f"--{off}") == _plan(run_kvops, *extra, f"--{off}")


@pytest.mark.parametrize(("switch", "off", "extra"), SWITCHES, ids=IDS)
@pytest.mark.parametrize("written", ["{switch}: false", "{off}: true"])
def test_typed_on_beats_the_files_off(run_kvops, tmp_path, switch, off, extra, written):
    config = _file(tmp_path, written.format(switch=switch, off=off) + "\n")
    assert _plan(run_kvops, "-f", config, *extra, f"--{switch}") == _plan(run_kvops, *extra, f"--{switch}")


@pytest.mark.parametrize(("switch", "off", "extra"), SWITCHES, ids=IDS)
@pytest.mark.parametrize("side", ["on", "off"])
def test_an_untyped_switch_is_the_files(run_kvops, tmp_path, switch, off, extra, side):
    typed, other = (switch, off) if side == "on" else (off, switch)
    for text in (f"{typed}: true\n", f"{other}: false\n"):
        config = _file(tmp_path, text)
        assert _plan(run_kvops, "-f", config, *extra) == _plan(run_kvops, *extra, f"--{typed}")


def test_the_off_form_beats_a_pasted_on_and_the_pasted_off_beats_the_files_on(run_kvops, tmp_path):
    pasted = "vllm serve meta-llama/Meta-Llama-3-8B --enforce-eager"
    typed_off = _plan(run_kvops, "--from-command", pasted, "--no-enforce-eager")
    assert "enforce-eager" not in typed_off["flags"]
    assert typed_off == _plan(run_kvops, "--from-command", pasted.replace("--enforce", "--no-enforce"))
    config = _file(tmp_path, "enforce-eager: true\n")
    from_file = _plan(run_kvops, "-f", config, "--from-command", pasted.replace("--enforce", "--no-enforce"))
    assert "enforce-eager" not in from_file["flags"]


@pytest.mark.parametrize("key", ["no-explain", "no_json"])
def test_a_negative_key_of_a_switch_with_no_off_form_is_one_line(run_kvops, tmp_path, key):
    config = _file(tmp_path, f"{key}: true\n")
    result = run_kvops("plan", "-f", config, *TARGET, expect=2)
    switch = key[3:]
    assert f"unknown key '{key}': --{switch} has no off form; write {switch}: false, or leave it out" in result.stderr
    assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("written", ["enforce-eager: 1", "no-enforce-eager: yes please"])
def test_a_switch_key_takes_true_or_false(run_kvops, tmp_path, written):
    result = run_kvops("plan", "-f", _file(tmp_path, written + "\n"), *TARGET, expect=2)
    assert "a switch, true or false" in result.stderr and len(result.stderr.splitlines()) == 1


def test_a_switch_and_its_off_form_both_in_the_file_is_one_line(run_kvops, tmp_path):
    config = _file(tmp_path, "enforce-eager: true\nno-enforce-eager: true\n")
    result = run_kvops("plan", "-f", config, *TARGET, expect=2)
    assert "enforce-eager and no-enforce-eager set one switch; keep one" in result.stderr
    assert len(result.stderr.splitlines()) == 1
