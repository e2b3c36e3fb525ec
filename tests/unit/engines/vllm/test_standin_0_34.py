"""vLLM 0.34 GPU startup logs, read by `kvops calibrate` and `kvops explain`.

The logs are STAND-INS, not captures: no public vLLM 0.32-0.34 GPU startup log exists (tests/fixtures/corpus/
checked.txt), so each fixture is built from the exact format strings of the 0.34.0 wheel (its header names every
line's file and line: v1/worker/extensible_kv_cache.py, v1/worker/gpu_worker.py, v1/worker/gpu/model_runner.py,
v1/core/kv_cache_utils.py, v1/engine/core.py, ...) filled with self-consistent numbers."""

from __future__ import annotations

import json

import yaml

from kvops.engines.vllm.logs import parse_vllm_log
from kvops.units import GiB
from tests.support.paths import LOGS

EXTENSIBLE = LOGS / "vllm-0.34.0-standin-extensible.log"
LLAMA_H100 = ("-m", "llama-3.1-8b-instruct", "--gpu", "h100")


def gib(value: float) -> int:
    return round(value * GiB)


def calibration(run_kvops, log, *args: str) -> dict:
    return json.loads(run_kvops("calibrate", "--vllm-log", str(log), *LLAMA_H100, *args, "--json").stdout)


def test_the_extensible_log_reads_every_figure_kvops_uses():
    log = parse_vllm_log(EXTENSIBLE.read_text())
    release = log.release()
    assert release is not None and release.version.text == "0.34.0" and release.extensible
    assert log.device == "gpu" and log.get("gpu_memory_utilization") == 1.0
    assert (log.get("weights_bytes"), log.activation_bytes, log.non_torch_bytes) == (
        gib(14.99),
        gib(1.89),
        gib(15.27) - gib(14.99),
    )
    assert (log.get("kv_cache_bytes"), log.get("num_gpu_blocks"), log.get("reserved_kv_bytes")) == (
        gib(59.56),
        7624,
        gib(62.03),
    )
    assert (log.kv_cache_size_tokens, log.max_model_len, log.max_concurrency) == (487936, 131072, 3.72)
    assert (log.get("total_memory_bytes"), log.get("startup_free_bytes")) == (gib(79.19), gib(78.69))
    assert log.get("cudagraph_captured_bytes") == gib(0.52) and log.cudagraph_estimate_applied is None


def test_the_kv_it_kept_is_quoted_from_the_extension_not_the_reservation(run_kvops):
    """The KV and block count came from 'Extended KV cache to ...', but calibrate and explain quoted the line they
    replaced, 'Available KV cache memory: 62.03 GiB' (the address range reserved before warmup)."""
    rows = {row["term"]: row for row in calibration(run_kvops, EXTENSIBLE)["comparisons"]}
    for term in ("kv_cache", "num_gpu_blocks"):
        assert "Extended KV cache to 7624 blocks (59.56 GiB)" in rows[term]["source"]
    doc = json.loads(run_kvops("explain", "--vllm-log", str(EXTENSIBLE), "--json").stdout)
    assert doc["memory"]["kv_cache"]["source"] == "log: 'Extended KV cache to 7624 blocks (59.56 GiB)'"


def test_calibrate_takes_the_captured_graphs_and_no_overhead_under_the_extensible_cache(run_kvops, tmp_path):
    """Under the extensible KV cache vLLM applies no CUDA-graph estimate: it measures free memory with the captured
    graphs resident (gpu/model_runner.py l.1123, extensible_kv_cache.py measure_kv_cache_bytes). Calibrate had no
    cuda_graphs row and left the plan's estimate (~0.84 GiB) in the profile, and its overhead (budget - weights -
    KV = 4.64 GiB, which also holds vLLM's margin and the memory in use before startup) was compared with the plan's
    activation + non-torch + graphs (2.98 GiB) as +56%. A plan on the saved profile now lands on the run's blocks."""
    saved = tmp_path / "profile.yaml"
    report = calibration(run_kvops, EXTENSIBLE, "--save", str(saved))
    rows = {row["term"]: row for row in report["comparisons"]}
    assert rows["cuda_graphs"]["actual"] == gib(0.52) and "Graph capturing finished" in rows["cuda_graphs"]["source"]
    assert "overhead" not in rows
    profile = yaml.safe_load(saved.read_text())
    assert profile["cudagraph_bytes"] == gib(0.52) and "overhead_bytes" not in profile
    # the plan lists startup_used among the estimates calibrate replaces: the run measured it (79.19 - 78.69 GiB)
    assert rows["startup_used"]["actual"] == profile["startup_used_bytes"] == gib(79.19) - gib(78.69)
    explained = run_kvops("plan", *LLAMA_H100, "--engine-version", "0.34.0", "--profile", str(saved), "--explain")
    assert "startup_used      512 MiB  measured" in explained.stdout and "startup_used" not in explained.stderr
    plan = json.loads(
        run_kvops("plan", *LLAMA_H100, "--engine-version", "0.34.0", "--profile", str(saved), "--json").stdout
    )
    assert plan["capacity"]["num_blocks"] == 7624  # the estimate of the graphs left 7,512


def test_explain_names_the_sizing_path_and_margin_as_the_plan_does(run_kvops):
    """The plan names the path ('KV sizing: extensible') and vllm_margin max(1 GiB, 0.75 x transient); explain said
    neither, so its 'free' 1.45 GiB and the 62.03 GiB 'Available KV cache memory' went unexplained."""
    notes = json.loads(run_kvops("explain", "--vllm-log", str(EXTENSIBLE), "--json").stdout)["notes"]
    sizing = next(note for note in notes if note.startswith("KV sizing: extensible:"))
    assert "'Available KV cache memory: 62.03 GiB' is the address range reserved before warmup" in sizing
    assert "vllm_margin ~1.42 GiB = max(1 GiB, 0.75 x transient ~1.89 GiB)" in sizing
    plan = run_kvops("plan", *LLAMA_H100, "--engine-version", "0.34.0", "--explain").stdout
    assert "KV sizing: extensible:" in plan and "max(1 GiB, 0.75 x transient" in plan


PINNED = LOGS / "vllm-0.34.0-standin-pinned.log"


def test_a_pinned_run_of_0_34_takes_the_older_path_and_its_startup_free_memory(run_kvops):
    """--kv-cache-memory-bytes turns the extensible KV cache off (_resolve_extensible_kv_cache) and skips the
    profile; its one memory line, 'Initial free memory 78.69 GiB, reserved 40.0 GiB ...' (gpu_worker.py), states
    the memory free at startup, which kvops ignored: explain's 'free' counted the 0.5 GiB held before startup."""
    log = parse_vllm_log(PINNED.read_text())
    release = log.release()
    assert release is not None and not release.extensible and log.sizing() is None
    assert (log.get("kv_cache_bytes"), log.get("startup_free_bytes")) == (40 * GiB, gib(78.69))
    assert (log.kv_cache_size_tokens, log.max_concurrency) == (327680, 2.5)
    doc = json.loads(run_kvops("explain", "--vllm-log", str(PINNED), *LLAMA_H100, "--json").stdout)
    assert doc["memory"]["before_engine"]["bytes"] == gib(79.19) - gib(78.69)
    assert doc["memory"]["free"]["source"] == "total - held before startup - the engine's terms"
    rows = {row["term"]: row for row in calibration(run_kvops, PINNED)["comparisons"]}
    assert (rows["kv_cache"]["actual"], rows["kv_cache_size_tokens"]["actual"]) == (40 * GiB, 327680)
    assert rows["kv_cache_size_tokens"]["difference"] == 0


def test_the_banner_without_its_logo_names_the_release():
    """With VLLM_DISABLE_LOG_LOGO, or a formatter that is not vLLM's own, the banner is one plain line, 'vLLM server
    version 0.34.0, serving model M' (entrypoints/common/startup.py l.18, 0.33.0-0.34.0; api_utils.py l.327 in
    0.32.0), which kvops did not read: a log cut before the engine core's line named no release."""
    line = "(APIServer pid=1) INFO 12-07 10:00:01 [startup.py:38] vLLM server version 0.34.0, serving model m\n"
    found = parse_vllm_log(line).release()
    assert found is not None and found.version.text == "0.34.0"


TP2 = LOGS / "vllm-0.34.0-standin-tp2.log"
NO_VMM = LOGS / "vllm-0.34.0-standin-no-vmm.log"


def test_tensor_parallel_ranks_keep_the_smallest_measurement():
    """Each rank measures its own memory after warmup and all commit the minimum (gpu_worker.py _min_across_ranks):
    rank 1's 17,136 blocks come first in the log, the KV is the 17,120 every rank extended to."""
    text = TP2.read_text()
    assert text.index("17136 KV cache blocks") < text.index("17120 KV cache blocks")
    log = parse_vllm_log(text)
    assert (log.get("num_gpu_blocks"), log.get("kv_cache_bytes")) == (17120, gib(66.88))
    assert (log.kv_cache_size_tokens, log.max_concurrency, log.args["tensor_parallel_size"]) == (1095680, 8.36, 2)


def test_explain_names_the_profiler_path_vllm_fell_back_to(run_kvops):
    """Where the driver cannot map memory, vLLM 0.34 turns the extensible KV cache off and says so ('Disabling the
    extensible KV cache: ...', v1/executor/abstract.py); explain read the run right (its KV is 'Available KV cache
    memory', its budget 0.92) but did not say which path sized it, as `kvops plan --no-vmm --explain` does."""
    log = parse_vllm_log(NO_VMM.read_text())
    release = log.release()
    assert release is not None and not release.extensible and release.default_gpu_memory_utilization == 0.92
    assert (log.get("kv_cache_bytes"), log.get("gpu_memory_utilization")) == (gib(54.85), 0.92)
    notes = json.loads(run_kvops("explain", "--vllm-log", str(NO_VMM), "--json").stdout)["notes"]
    assert any(
        note.startswith("KV sizing: profiler: vLLM turned the extensible KV cache off")
        and "GPU driver error 801: operation not supported" in note
        for note in notes
    )
    rows = {row["term"]: row for row in calibration(run_kvops, NO_VMM)["comparisons"]}
    assert rows["cuda_graphs"]["actual"] == gib(0.84)  # the estimate vLLM took: "CUDA graph pool memory" (estimated)


AFTER_WARMUP = LOGS / "vllm-0.34.0-standin-kv-after-warmup.log"


def test_a_kv_cache_too_small_after_warmup_is_explained_and_replanned_as_measured(run_kvops):
    """The extensible KV cache can refuse after warmup (finalize_extensible_kv_cache -> shrink_kv_cache_configs):
    here another process held 9.39 GiB of an A100-40GB. Explain gave the profiler's reason ('the budget left after
    weights, activation peak and non-torch'), and re-planned the run on budget - weights - KV as one overhead (13.5
    GiB), which the planner's extensible sizing took for the transient: ~296 MiB of KV where the run had 10.89 GiB.
    The re-plan now takes the run's terms one by one and lands on vLLM's own figures."""
    doc = json.loads(
        run_kvops(
            "explain", "--vllm-log", str(AFTER_WARMUP), "-m", "llama-3.1-8b-instruct", "--gpu", "a100-40gb", "--json"
        ).stdout
    )
    assert doc["diagnosis"]["basis"].startswith("why: the memory free after CUDA-graph capture and warmup")
    assert doc["memory"]["kv_cache"]["bytes"] == gib(10.9) and doc["memory"]["before_engine"]["bytes"] == gib(9.39)
    problem = doc["action"]["problem"]
    assert "more than the ~10.9 GiB vLLM has" in problem and "the estimated maximum model length is 89216" in problem


GPU_0_33 = LOGS / "vllm-0.33.0-standin-gpu.log"


def test_a_0_33_run_reads_as_the_profiler_with_its_estimate(run_kvops):
    """0.33 has no extensible KV cache: its log reads as 0.20-0.33's profile (the estimate taken before sizing KV, the
    default utilization 0.92, 16-token blocks), and none of 0.34's meanings apply to it."""
    log = parse_vllm_log(GPU_0_33.read_text())
    release = log.release()
    assert release is not None and release.version.text == "0.33.0" and not release.extensible
    assert not log.extensible and log.sizing() is None and "reserved_kv_bytes" not in log.facts
    assert (log.get("kv_cache_bytes"), log.get("cudagraph_bytes"), log.activation_bytes) == (
        gib(54.85),
        gib(0.84),
        gib(2.73) - gib(0.84),
    )
    rows = {row["term"]: row for row in calibration(run_kvops, GPU_0_33)["comparisons"]}
    assert "startup_used" not in rows and rows["kv_cache_size_tokens"]["actual"] == 449328
    assert rows["kv_cache_size_tokens"]["predicted"] % 16 == 0  # the plan's 16-token blocks, as 0.33's


def test_without_the_extension_the_least_rank_measurement_is_the_kv():
    """A run that stops after warmup (the check in shrink_kv_cache_configs) prints no 'Extended KV cache' line; each
    rank printed its own 'Memory after warmup' and vLLM sized on the least (_min_across_ranks). kvops kept the first
    printed: rank 1's 17,136 blocks, where the ranks had 17,120. Lines from vllm-0.34.0-standin-tp2.log."""
    text = "".join(line for line in TP2.read_text().splitlines(keepends=True) if "Extended KV cache" not in line)
    log = parse_vllm_log(text)
    assert (log.get("num_gpu_blocks"), log.get("kv_cache_bytes")) == (17120, gib(66.88))
    assert log.lines["kv_cache_bytes"].startswith("(Worker_TP0 pid=301)")


def test_the_config_turning_the_extensible_cache_off_names_the_profiler_path():
    """NIXL on a host without an IMEX channel: the config leaves the extensible KV cache off and says so at info
    (config/vllm.py _resolve_extensible_kv_cache, 0.34.0 l.3256); a stand-in line in that format string."""
    line = (
        "(APIServer pid=1) INFO 12-07 10:00:08 [vllm.py:3256] Extensible KV cache off: without an IMEX channel, KV "
        "transfers within a host (e.g. NIXL) would lose NVLink and fall back to RDMA or TCP. If transfers only cross "
        "hosts, pass --enable-extensible-kv-cache.\n"
    )
    sizing = parse_vllm_log(line).sizing()
    assert sizing is not None and sizing.startswith("KV sizing: profiler: vLLM turned the extensible KV cache off")
    assert "without an IMEX channel" in sizing
