"""A pasted launch command read with the option table of the release planned (serve_flags.json: vLLM 0.32.0, 0.33.0,
0.34.0): an option that release's parser refuses is left out of every emitted command and named in one line; the
CUDA-graph options given on their own are planned as the compilation config's fields; TGI's rope warning follows the
line. The emitted commands are parsed by each release's own parser in tests/engine/test_release_options_engine.py."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from kvops.engines.release import Version
from kvops.engines.vllm import flags

GPU = ("--gpu", "H100-80GB", "--model", "qwen3-8b")
DEFECT = "vllm serve Qwen/Qwen3-8B --swap-space 16 --disable-log-requests"


def plan(run_kvops, *args: str) -> dict:
    return json.loads(run_kvops("plan", "--format", "json", *GPU, *args).stdout)


def line(doc: dict, option: str) -> str:
    [found] = [text for text in doc["from_command"] if text.startswith(option)]
    return found


def test_the_shipped_tables_name_their_releases_and_provenance():
    data = json.loads((Path(flags.__file__).parent / flags.SERVE_FLAGS).read_text())
    assert list(data["releases"]) == ["0.32.0", "0.33.0", "0.34.0"]
    assert "tests/support/vllm_flags.py" in data["about"] and "ServeSubcommand" in data["about"]
    assert flags.serve_table(Version(0, 34, 0)).release == Version(0, 34, 0)
    assert flags.serve_table(Version(0, 33, 1)).release == Version(0, 33, 0)  # the newest table at or before it
    older = flags.serve_table(Version(0, 20, 0))
    assert older.release == Version(0, 32, 0) and not older.full


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0", "0.34.0"])
def test_swap_space_is_left_out_and_named_with_the_release_and_why(run_kvops, version):
    doc = plan(run_kvops, "--engine-version", version, "--from-command", DEFECT)
    assert "--swap-space" not in doc["command"]["argv"]
    said = line(doc, "--swap-space 16")
    assert f"left out of the plan's command: vLLM {version}'s vllm serve refuses it" in said
    assert "removed between vLLM 0.17.0 and 0.18.0" in said


def test_disable_log_requests_is_refused_by_0_32_only(run_kvops):
    """0.33 pairs --enable-log-requests with --disable-log-requests (EnableDisableAction); 0.32 has no such option."""
    old = plan(run_kvops, "--engine-version", "0.32.0", "--from-command", DEFECT)
    assert "--disable-log-requests" not in old["command"]["argv"]
    assert "vLLM 0.32.0's vllm serve refuses it (vLLM 0.33.0 and later take it)" in line(old, "--disable-log-requests")
    for version in ("0.33.0", "0.34.0"):
        new = plan(run_kvops, "--engine-version", version, "--from-command", DEFECT)
        assert new["command"]["argv"][-1] == "--disable-log-requests"
        assert line(new, "--disable-log-requests") == "--disable-log-requests: ignored: does not change memory"


def test_rope_scaling_is_left_out_with_its_successor(run_kvops):
    doc = plan(run_kvops, "--from-command", """vllm serve Qwen/Qwen3-8B --rope-scaling '{"rope_type": "yarn"}'""")
    assert "--rope-scaling" not in doc["command"]["argv"]
    assert "vLLM 0.34.0's vllm serve refuses it" in line(doc, "--rope-scaling") and "--hf-overrides" in line(
        doc, "--rope-scaling"
    )


def test_an_option_newer_than_0_32_is_the_planned_releases_not_unknown(run_kvops):
    pasted = "vllm serve Qwen/Qwen3-8B --shuffle-safetensors-files"
    doc = plan(run_kvops, "--from-command", pasted)
    assert doc["command"]["argv"][-1] == "--shuffle-safetensors-files"
    assert line(doc, "--shuffle-safetensors-files") == "--shuffle-safetensors-files: ignored: does not change memory"
    older = plan(run_kvops, "--engine-version", "0.33.0", "--from-command", pasted)
    assert "--shuffle-safetensors-files" not in older["command"]["argv"]
    assert "(vLLM 0.34.0 and later take it)" in line(older, "--shuffle-safetensors-files")


def test_a_typo_is_left_out_on_a_release_with_a_table_and_kept_before_any(run_kvops):
    pasted = "vllm serve Qwen/Qwen3-8B --max-num-seqz 8 --port 8000"
    doc = plan(run_kvops, "--from-command", pasted)
    assert "--max-num-seqz" not in doc["command"]["argv"] and doc["command"]["argv"][-2:] == ["--port", "8000"]
    assert line(doc, "--max-num-seqz").startswith("--max-num-seqz 8: unknown: not a vllm serve option of vLLM 0.34.0")
    old = plan(run_kvops, "--engine-version", "0.20.0", "--from-command", pasted)
    assert old["command"]["argv"][-4:] == ["--max-num-seqz", "8", "--port", "8000"]  # kvops cannot know: kept
    assert "unknown: not a vllm serve option in vLLM 0.32.0, the oldest release" in line(old, "--max-num-seqz")


def test_a_docker_lines_tag_picks_the_table_and_a_typed_release_wins(run_kvops):
    pasted = "docker run --gpus all vllm/vllm-openai:v0.32.0 --model Qwen/Qwen3-8B --disable-log-requests"
    doc = plan(run_kvops, "--from-command", pasted)
    assert "--disable-log-requests" not in doc["command"]["argv"]
    typed = plan(run_kvops, "--engine-version", "0.34.0", "--from-command", pasted)
    assert typed["command"]["argv"][-1] == "--disable-log-requests"


def test_a_disable_spelling_turns_the_switch_off(run_kvops):
    doc = plan(run_kvops, "--from-command", "vllm serve Qwen/Qwen3-8B --disable-prefix-caching")
    assert "--no-enable-prefix-caching" in doc["command"]["argv"] and "--disable-prefix-caching" not in str(doc)


@pytest.mark.parametrize(
    "output",
    [
        ("plan", "--format", "shell"),
        ("plan", "--format", "docker"),
        ("plan", "--format", "env"),
        ("plan", "--format", "k8s"),
        ("manifests", "-t", "k8s"),
        ("manifests", "-t", "llm-d"),
        ("manifests", "-t", "production-stack"),
    ],
)
def test_no_output_format_carries_a_refused_option(run_kvops, output):
    pasted = "vllm serve Qwen/Qwen3-8B --swap-space 16 --max-num-seqz 8 --served-model-name q"
    ran = run_kvops(*output, *GPU, "--from-command", pasted)
    emitted = "\n".join(text for text in ran.stdout.splitlines() if not text.lstrip().startswith("#"))  # not the
    # header that names the kvops command it was generated by
    assert "swap-space" not in emitted and "max-num-seqz" not in emitted and "served-model-name" in emitted


def test_the_compose_stack_carries_no_refused_option(run_kvops, tmp_path):
    pasted = "vllm serve Qwen/Qwen3-8B --swap-space 16 --max-num-seqz 8 --served-model-name q"
    run_kvops("manifests", "-t", "compose", "--out", str(tmp_path), *GPU, "--from-command", pasted)
    compose = (tmp_path / "compose.yaml").read_text()
    emitted = "\n".join(text for text in compose.splitlines() if not text.lstrip().startswith("#"))
    assert "swap-space" not in emitted and "max-num-seqz" not in emitted and "served-model-name" in emitted


# --- the CUDA-graph options on their own -----------------------------------------------------------------------


def graphs(doc: dict) -> dict:
    return next(term for term in doc["memory"]["terms"] if term["name"] == "cuda_graphs")


@pytest.mark.parametrize(
    "alone, inside",
    [
        ("--max-cudagraph-capture-size 2048", """--compilation-config '{"max_cudagraph_capture_size": 2048}'"""),
        ("--cudagraph-capture-sizes 1 2 4 8", "-cc.cudagraph_capture_sizes+ 1,2,4,8"),
    ],
)
def test_graph_options_alone_are_planned_as_the_compilation_configs_fields(run_kvops, alone, inside):
    one = plan(run_kvops, "--from-command", f"vllm serve Qwen/Qwen3-8B {alone}")
    other = plan(run_kvops, "--from-command", f"vllm serve Qwen/Qwen3-8B {inside}")
    default = plan(run_kvops, "--from-command", "vllm serve Qwen/Qwen3-8B")
    assert graphs(one) == graphs(other) and graphs(one)["bytes"] != graphs(default)["bytes"]
    assert one["command"]["argv"] == other["command"]["argv"]
    assert not any("not modelled" in text for text in one["from_command"])


def test_a_graph_option_beside_the_same_field_in_the_config_is_refused_as_vllm_does(run_kvops):
    pasted = "vllm serve Qwen/Qwen3-8B --max-cudagraph-capture-size 64 -cc.max_cudagraph_capture_size=32"
    ran = run_kvops("plan", *GPU, "--from-command", pasted, expect=2)
    assert "mutually exclusive" in ran.stderr and len(ran.stderr.strip().splitlines()) == 1


def test_capture_sizes_take_integers_space_apart(run_kvops):
    ran = run_kvops("plan", *GPU, "--from-command", "vllm serve M --cudagraph-capture-sizes 1,2,4", expect=2)
    assert "space apart" in ran.stderr


# --- TGI: the rope warning follows the line ---------------------------------------------------------------------


def tgi_warning(run_kvops, rope: str) -> str:
    pasted = f"text-generation-launcher --model-id M {rope} --max-total-tokens 65536"
    doc = json.loads(run_kvops("plan", "--format", "json", "--engine", "tgi", *GPU, "--from-command", pasted).stdout)
    [warning] = [text for text in doc["warnings"] if "max_position_embeddings" in text]
    return warning


@pytest.mark.parametrize(
    "rope, says",
    [
        ("--rope-scaling dynamic --rope-factor 2.0", "--rope-factor 2.0 stretch it to 81,920 positions"),
        ("--rope-scaling dynamic", "TGI takes the factor as 1.0 without --rope-factor): give --rope-factor 1.6"),
        ("--rope-factor=4", "stretches it to 163,840 positions (linear"),
        ("--rope-scaling dynamic --rope-factor 1.2", "49,152 positions only: give --rope-factor 1.6"),
        ("", "(extend it with --rope-scaling and --rope-factor 1.6, or plan a shorter context)"),
    ],
)
def test_tgis_rope_warning_follows_what_the_line_gives(run_kvops, rope, says):
    warning = tgi_warning(run_kvops, rope)
    assert says in warning
    assert ("extend it with" in warning) == (rope == "")


def test_the_emitted_line_is_shell_words(run_kvops):
    ran = run_kvops("plan", *GPU, "--format", "shell", "--from-command", DEFECT)
    assert shlex.split(ran.stdout)[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
