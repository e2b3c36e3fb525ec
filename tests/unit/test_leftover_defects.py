"""Defects an earlier session found and left (2026-12-07), each replayed as the command that showed it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvops.model import load_model

# RoPE scaling as config.json states it, the config's max_position_embeddings (and longrope's original), and what
# vLLM 0.32.0-0.34.0 derive (vllm/config/model.py `_get_and_verify_max_len`): (default, limit). Checked against
# the 0.32.0 CPU build's own ModelConfig (test_rope_scaling_matches_the_installed_vllm).
ROPE_CASES = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, {}, (16384, 16384)),
    "dynamic": ({"type": "dynamic", "factor": 2.0}, {}, (8192, 8192)),
    "yarn": (
        {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096},
        {"max_position_embeddings": 16384},
        (16384, 16384),
    ),
    "llama3": (
        {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192, "low_freq_factor": 1.0}
        | {"high_freq_factor": 4.0},
        {"max_position_embeddings": 131072},
        (131072, 131072),
    ),
    "longrope": (
        {"type": "longrope", "short_factor": [1.0] * 64, "long_factor": [1.0] * 64},
        {"max_position_embeddings": 131072, "original_max_position_embeddings": 4096},
        (4096, 131072),
    ),
    "null-factor": ({"rope_type": "linear", "factor": None}, {}, (4096, 4096)),
}


def model_dir(tmp_path: Path, name: str, **fields) -> str:
    """Llama-3-8B's config.json with `fields` replaced (None removes one), in its own folder."""
    config = dict(load_model("llama-3-8b").config_json)
    config.update(fields)
    config = {key: value for key, value in config.items() if value is not None}
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def rope_model(tmp_path: Path, case: str) -> str:
    scaling, fields = ROPE_CASES[case][:2]
    return model_dir(tmp_path, case, **{"max_position_embeddings": 4096, "rope_scaling": scaling, **fields})


def plan_doc(run_kvops, *args: str, expect: int = 0) -> dict:
    return json.loads(run_kvops("plan", *args, "--format", "json", expect=expect).stdout)


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_rope_scaling_sets_the_context_as_vllm_derives_it(run_kvops, tmp_path, case):
    """1. A linear or dynamic RoPE factor was ignored (a plan at 4,096 where vLLM runs 16,384, and a warning that
    vLLM refuses what it takes), and longrope planned at 131,072 where vLLM runs original_max_position_embeddings."""
    model = rope_model(tmp_path, case)
    default, limit = ROPE_CASES[case][2]
    doc = plan_doc(run_kvops, "-m", model, "--gpu", "h100")
    assert doc["flags"]["max-model-len"] == default
    at_limit = plan_doc(run_kvops, "-m", model, "--gpu", "h100", "--max-model-len", str(limit))
    assert not [w for w in at_limit["warnings"] if "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in w]
    beyond = plan_doc(run_kvops, "-m", model, "--gpu", "h100", "--max-model-len", str(limit + 1))
    assert [w for w in beyond["warnings"] if "exceeds" in w and str(limit) in w]


def test_rope_scaling_leaves_gemma3_as_configured(run_kvops):
    """vLLM skips the factor for gemma3 (its max_position_embeddings is already scaled): so does kvops."""
    doc = plan_doc(run_kvops, "-m", "gemma-3-27b-it", "--gpu", "h200")
    assert doc["flags"]["max-model-len"] == load_model("gemma-3-27b-it").max_position_embeddings


def test_rope_scaling_matches_the_installed_vllm(tmp_path, monkeypatch):
    """The table above, against the installed vLLM's own ModelConfig (skipped without vLLM)."""
    pytest.importorskip("vllm")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from vllm.config import ModelConfig

    from kvops.engines.vllm import context
    from kvops.model import load_model as load

    for case, (_, _, (default, limit)) in ROPE_CASES.items():
        model = rope_model(tmp_path, case)
        spec = load(model)
        config = ModelConfig(model=model, skip_tokenizer_init=True, dtype="bfloat16")
        assert config.max_model_len == context.default_max_len(spec) == default, case
        assert context.max_len_limit(spec) == limit, case


@pytest.mark.parametrize("layers", ["0,32", "40", "sliding_window,99"])
def test_skip_layers_past_the_model_are_one_line(run_kvops, layers):
    """2. `--kv-cache-dtype-skip-layers 0,40` on a 32-layer model was planned and emitted as given: vLLM matches no
    layer to 40 and quantizes it with the rest. Typed or pasted, it is one line naming the range."""
    ran = run_kvops(
        "plan",
        "-m",
        "llama-3-8b",
        "--gpu",
        "h100",
        "--kv-dtype",
        "fp8",
        "--kv-cache-dtype-skip-layers",
        layers,
        expect=2,
    )
    assert "has 32 layers; valid: 0 to 31, or sliding_window" in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1
    pasted = f"vllm serve meta-llama/Meta-Llama-3-8B --kv-cache-dtype fp8 --kv-cache-dtype-skip-layers {layers}"
    ran = run_kvops("plan", "--gpu", "h100", "--from-command", pasted, expect=2)
    assert "valid: 0 to 31" in ran.stderr


def test_skip_layers_within_the_model_stand(run_kvops):
    doc = plan_doc(
        run_kvops, "-m", "llama-3-8b", "--gpu", "h100", "--kv-dtype", "fp8", "--kv-cache-dtype-skip-layers", "0,31"
    )
    assert doc["flags"]["kv-cache-dtype-skip-layers"] == ["0", "31"]


def timed_trace(tmp_path: Path) -> str:
    path = tmp_path / "timed.jsonl"
    rows = [{"arrival_s": index * 0.25, "prompt_tokens": 200, "output_tokens": 50} for index in range(20)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


SIMULATE = ("simulate", "-m", "llama-3.1-8b-instruct", "--gpu", "l4", "--max-model-len", "8192")


@pytest.mark.parametrize(
    ("traffic", "said"),
    [
        (
            ("--burstiness", "0.2"),
            "--trace {trace} has its own arrival times (--rate scales them, their burstiness kept)",
        ),
        (("--burstiness", "1", "--rate", "8"), "--trace {trace} has its own arrival times"),
        (("--concurrency", "4", "--max-rate"), "--max-rate searches the arrival rate, and --concurrency 4 caps"),
        (("--concurrency", "4", "--replicas", "10"), "--replicas searches the arrival rate, and --concurrency 4 caps"),
    ],
)
def test_simulate_refuses_what_a_timed_trace_would_ignore(run_kvops, tmp_path, traffic, said):
    """3. --burstiness on a trace with its own arrival times was ignored without a word; --max-rate (or --replicas)
    with --concurrency searched a rate the clients hold back, then called the trace too short to load a replica."""
    trace = timed_trace(tmp_path)
    ran = run_kvops(*SIMULATE, "--trace", trace, *traffic, expect=2)
    assert said.format(trace=trace) in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1


def test_simulate_burstiness_needs_drawn_arrivals(run_kvops):
    ran = run_kvops(*SIMULATE, "--requests", "20", "--concurrency", "4", "--burstiness", "0.5", expect=2)
    assert "--burstiness shapes the arrivals drawn at --rate: give --rate too" in ran.stderr


def test_simulate_burstiness_still_shapes_drawn_arrivals():
    from kvops.simulate.traffic import Traffic, build_trace

    poisson = build_trace(Traffic(requests=50, rate=4, seed=3))
    bursty = build_trace(Traffic(requests=50, rate=4, burstiness=0.2, seed=3))
    assert [r.arrival_s for r in poisson.requests] != [r.arrival_s for r in bursty.requests]
    assert poisson == build_trace(Traffic(requests=50, rate=4, burstiness=1.0, seed=3))


CORPUS_LOG = "corpus/vllm/vllm-0.19.0-h100-llama-3.1-8b-instruct-tp1-8192-llmd.log"


@pytest.mark.parametrize(
    "command",
    [
        ("dashboard", "-o", "{out}"),
        ("calibrate", "--vllm-log", "{log}", "--save", "{out}"),
    ],
)
def test_a_missing_output_folder_is_made_by_every_command(run_kvops, tmp_path, command):
    """4. `kvops dashboard -o DIR/d.json` made DIR; `kvops calibrate --save DIR/p.json` failed there after its
    work ('No such file or directory'), and simulate --csv refused it: every command that writes a file now makes
    its missing folder."""
    from tests.support.paths import FIXTURES

    out = tmp_path / "new" / "sub" / "file.json"
    args = [part.format(out=out, log=FIXTURES / CORPUS_LOG) for part in command]
    run_kvops(*args)
    assert out.is_file() and out.read_text().strip()


@pytest.mark.parametrize("command", [("dashboard", "-o"), ("calibrate", "--vllm-log", CORPUS_LOG, "--save")])
def test_an_output_under_a_file_is_one_line_before_the_work(run_kvops, tmp_path, command):
    from tests.support.paths import FIXTURES

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    args = [str(FIXTURES / part) if part == CORPUS_LOG else part for part in command]
    ran = run_kvops(*args, str(blocker / "d.json"), expect=2)
    assert f"{blocker / 'd.json'}: cannot write there ({blocker} is not a writable folder)" in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1


def test_check_output_path_takes_a_folder_to_make(tmp_path):
    from kvops.files import check_output_path

    check_output_path(str(tmp_path / "a" / "b" / "c.csv"), "--csv")
    assert not (tmp_path / "a").exists()  # checked, not made: the writer makes it


@pytest.mark.parametrize(
    ("block", "said"),
    [
        ("  precision: fp99\n", "kv_cache.precision 'fp99' is not a KV dtype; valid: auto,"),
        ("  compression: {enabled: true, method: int3}\n", "kv_cache.compression.method 'int3' is not a KV dtype"),
    ],
)
def test_a_bad_seed_kv_dtype_is_named_as_the_file_wrote_it(run_kvops, tmp_path, block, said):
    """6. `kv_cache: {precision: fp99}` in a -f file was refused as "--kv-dtype 'fp99'", an option the user never
    typed; it now names the file and the key."""
    path = tmp_path / "kvops.yaml"
    path.write_text("model: llama-3-8b\ngpu: h100\nkv_cache:\n" + block)
    ran = run_kvops("plan", "-f", str(path), expect=2)
    assert f"{path}: {said}" in ran.stderr
    assert "--kv-dtype" not in ran.stderr and len(ran.stderr.strip().splitlines()) == 1


def test_simulate_ranks_scheduler_flags_typed_then_pasted_then_file(run_kvops, tmp_path):
    """7. `kvops simulate -f FILE --from-command '...'`: the file's --scheduling-policy (and the other scheduler
    flags) beat the pasted command's, where --max-num-seqs followed it; each now ranks as the docs say."""
    pytest.importorskip("vllm")
    path = tmp_path / "kvops.yaml"
    path.write_text(
        "model: llama-3.1-8b-instruct\ngpu: l4\nmax-model-len: 4096\nmax-num-seqs: 64\n"
        "scheduling-policy: fcfs\nlong-prefill-token-threshold: 100\n"
    )
    pasted = "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 32 --scheduling-policy priority"
    base = ("simulate", "-f", str(path), "--from-command", pasted, "--requests", "5", "--rate", "2", "--json")

    def settings(*typed: str) -> dict:
        return json.loads(run_kvops(*base, *typed).stdout)["arms"][0]["engine_settings"]

    ran = settings()
    assert (ran["max_num_seqs"], ran["policy"], ran["long_prefill_token_threshold"]) == (32, "priority", 100)
    ran = settings("--scheduling-policy", "fcfs", "--max-num-seqs", "16")
    assert (ran["max_num_seqs"], ran["policy"], ran["long_prefill_token_threshold"]) == (16, "fcfs", 100)
