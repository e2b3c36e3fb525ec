"""`kvops explain` on real vLLM logs (a CPU-engine failure captured here, public GPU excerpts and tracebacks listed in
tests/fixtures/logs/SOURCES.md), on nvidia-smi output from public threads, and against the live CPU engine: the
split each log's own numbers imply, which term ran out, KV in use and headroom from the engine's gauges, the level
and the planner's next action. Bad input ends in one line."""

from __future__ import annotations

import json
import re
import socket
from math import ceil

import pytest

from kvops.engines.device_total import engine_total
from kvops.engines.oom import size_bytes
from kvops.engines.vllm.logs import parse_vllm_log
from kvops.nvidia_smi import parse_nvidia_smi
from kvops.units import GiB
from tests.support.extras import needs
from tests.support.paths import FIXTURES
from tests.support.tiny_model import TINY_LLAMA, build_model

LOGS = FIXTURES / "logs"
SMI = FIXTURES / "smi"
MiB = 1 << 20


def adds_up(parts: list[int], whole: int) -> bool:
    """Figures logged with two decimals of GiB add up to another to within their rounding (0.005 GiB each)."""
    return abs(sum(parts) - whole) <= (len(parts) + 1) * GiB // 200


def gib(value: float) -> int:
    return round(value * GiB)


def explain_doc(run_kvops, *args: str) -> dict:
    return json.loads(run_kvops("explain", *args, "--json").stdout)


def figure(doc: dict, name: str) -> int | None:
    return doc["memory"][name]["bytes"]


def basis(doc: dict, name: str) -> str:
    return doc["memory"][name]["basis"]


# --- the CPU engine's own logs ------------------------------------------------------------------------------


@needs("tokenizers")
def test_cpu_engine_refusing_a_kv_pool_too_small_for_max_model_len(run_kvops, tmp_path):
    """Captured here: --kv-cache-memory-bytes 64 MiB (512 blocks of 128 KiB) for --max-model-len 131072 (1024 blocks)."""
    model = build_model(tmp_path / "tiny-long", dict(TINY_LLAMA, max_position_embeddings=131072))
    log = str(LOGS / "vllm-0.32.0-cpu-kv-too-small.log")
    doc = explain_doc(run_kvops, "--vllm-log", log, "--model", str(model))
    assert (doc["state"], doc["device"], doc["version"]) == ("failed", "cpu", "0.32.0")
    diagnosis = doc["diagnosis"]
    assert diagnosis["term"] == "kv_cache"
    # the message rounds to 0.12 and 0.06 GiB; the plan of this very run gives the exact need
    assert (
        diagnosis["figures"].items()
        >= {
            "max_model_len": 131072,
            "needed_bytes": 1024 * 128 * 1024,
            "available_bytes": 64 * MiB,
            "estimated_max_model_len": 65408,
            "message_needed_bytes": gib(0.12),
            "message_available_bytes": gib(0.06),
        }.items()
    )
    assert (figure(doc, "kv_cache"), basis(doc, "kv_cache")) == (64 * MiB, "reported")
    assert (figure(doc, "total"), basis(doc, "total")) == (gib(13.34), "reported")  # the NUMA node's host memory
    assert (figure(doc, "cuda_graphs"), basis(doc, "cuda_graphs")) == (0, "exact")
    assert (
        basis(doc, "weights") == "computed" and figure(doc, "weights") == 2 * 1_443_072 + 131072 * 64 * 2
    )  # counted from config.json, bf16, + vLLM's rotary cos/sin cache (max_position_embeddings x head_dim x 2 B)
    assert basis(doc, "activation") == "missing" and basis(doc, "non_torch") == "missing"
    action = doc["action"]
    assert (
        action["source"] == "planner" and action["change"] == f"--kv-cache-memory-bytes {(1024 + 1) * 128 * 1024}"
    )  # + the null block
    text = run_kvops("explain", "--vllm-log", log, "--model", str(model)).stdout
    assert (
        "FAILED: the KV cache ran out" in text
        and "needs 128 MiB of KV cache, the engine had 64 MiB; vLLM estimates 65,408 tokens fit" in text
    )
    assert "--kv-cache-memory-bytes 134348800  (planner)" in text


@needs("tokenizers")
def test_cpu_engine_startup_log_split(run_kvops, tmp_path):
    shape = dict(
        TINY_LLAMA,
        architectures=["MistralForCausalLM"],
        model_type="mistral",
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=128,
        sliding_window=256,
        max_position_embeddings=4096,
    )
    model = build_model(tmp_path / "mistral-sliding", shape)
    doc = explain_doc(run_kvops, "--vllm-log", str(LOGS / "vllm-0.32.0-cpu-fp8-sliding.log"), "--model", str(model))
    assert (doc["state"], doc["device"], doc["diagnosis"]) == ("started", "cpu", None)
    assert (figure(doc, "kv_cache"), basis(doc, "kv_cache")) == (7352377, "reported")
    assert doc["kv"] is None and doc["action"]["source"] == "none"


# --- GPU startup logs from public threads: the split their own numbers imply ---------------------------------


def test_v0_profile_itemises_every_term_and_they_fill_the_budget(run_kvops):
    doc = explain_doc(run_kvops, "--vllm-log", str(LOGS / "vllm-v0-memory-profiling.log"))
    assert (figure(doc, "total"), figure(doc, "requested")) == (gib(23.58), gib(23.35))
    assert (figure(doc, "weights"), figure(doc, "non_torch"), figure(doc, "activation"), figure(doc, "kv_cache")) == (
        gib(21.21),
        gib(0.20),
        gib(0.37),
        gib(1.57),
    )
    assert {basis(doc, name) for name in ("weights", "non_torch", "activation", "kv_cache")} == {"reported"}
    assert adds_up(
        [figure(doc, name) for name in ("weights", "non_torch", "activation", "kv_cache")], figure(doc, "requested")
    )
    assert basis(doc, "cuda_graphs") == "missing"  # V0 captures them after sizing KV and logs no figure


def test_startup_summary_current_wording(run_kvops):
    """0.2x: 'Actual usage is A GiB for consumed memory (weights + non-torch), B GiB for peak activation, and C GiB for
    CUDAGraph memory' where B includes the CUDA-graph estimate ('CUDA graph pool memory: ... (estimated)')."""
    doc = explain_doc(run_kvops, "--vllm-log", str(LOGS / "vllm-v1-2026-startup-summary.log"))
    assert (figure(doc, "total"), figure(doc, "before_engine"), figure(doc, "requested")) == (
        gib(23.56),
        gib(23.56) - gib(22.93),
        gib(22.03),
    )
    assert figure(doc, "weights+non_torch") == gib(19.47)
    assert (figure(doc, "activation"), basis(doc, "activation")) == (gib(0.6) - gib(0.58), "derived")
    assert (figure(doc, "cuda_graphs"), figure(doc, "kv_cache")) == (gib(0.1), gib(1.95))
    # the budget is consumed + peak activation (with the graph estimate) + KV, as vLLM sized it
    assert adds_up([gib(19.47), gib(0.6), figure(doc, "kv_cache")], figure(doc, "requested"))
    assert doc["state"] == "started"


def test_startup_summary_first_wording_implies_the_kv_pool(run_kvops):
    """0.10: '... W GiB for weight, B GiB for peak activation, N GiB for non-torch memory, and C GiB for CUDAGraph memory'
    (no estimate in B, graphs outside the budget): the KV pool is what the budget leaves."""
    doc = explain_doc(run_kvops, "--vllm-log", str(LOGS / "vllm-v1-2025-startup-summary-first-wording.log"))
    assert (
        figure(doc, "weights"),
        figure(doc, "activation"),
        figure(doc, "non_torch"),
        figure(doc, "cuda_graphs"),
    ) == (gib(8.58), gib(9.96), gib(0.07), gib(0.65))
    assert (figure(doc, "kv_cache"), basis(doc, "kv_cache")) == (
        gib(160.53) - gib(8.58) - gib(9.96) - gib(0.07),
        "derived",
    )
    # vLLM's own suggestion in the same line: budget - every other term - its 150 MiB buffer
    assert adds_up([figure(doc, "kv_cache") - gib(0.65) - 150 * MiB], 151519866880)


def test_v1_lines_without_a_summary_take_the_unreported_terms_from_the_plan(run_kvops):
    doc = explain_doc(
        run_kvops,
        "--vllm-log",
        str(LOGS / "vllm-v1-2026-tp4-estimated-graphs.log"),
        "--model",
        "qwen3-8b",
        "--gpu",
        "rtx-3090",
        "--tp",
        "4",
    )
    assert (figure(doc, "kv_cache"), basis(doc, "kv_cache")) == (gib(15.72), "reported")
    assert (figure(doc, "cuda_graphs"), basis(doc, "cuda_graphs")) == (
        gib(0.17),
        "reported",
    )  # vLLM's estimate, reserved
    assert (
        basis(doc, "weights") == "computed"
        and basis(doc, "activation") == "estimate"
        and basis(doc, "non_torch") == "estimate"
    )
    # the run states its utilization (0.92): what its budget left besides KV is weights + overhead, the log's own
    # figure; the total is the one torch reports on an RTX 3090 (kvops/catalog/device_totals.json)
    assert figure(doc, "requested") == ceil(engine_total("RTX-3090").bytes * 0.92)
    assert (figure(doc, "weights+overhead"), basis(doc, "weights+overhead")) == (
        ceil(engine_total("RTX-3090").bytes * 0.92) - gib(15.72),
        "derived",
    )
    assert figure(doc, "engine") == figure(doc, "requested")


# --- failures: which term ran out, in the message's own numbers ---------------------------------------------


def test_v0_kv_cache_too_small_for_max_model_len(run_kvops):
    """v0.6.4: the profile leaves 0.39 GiB of KV = 80 blocks = 1280 tokens for a max_model_len of 8192."""
    log = str(LOGS / "vllm-v0-kv-too-small.log")
    doc = explain_doc(run_kvops, "--vllm-log", log)
    assert (figure(doc, "total"), figure(doc, "requested")) == (gib(47.74), ceil(gib(47.74) * 0.95))
    assert (figure(doc, "weights"), figure(doc, "non_torch"), figure(doc, "kv_cache")) == (
        gib(38.526),
        gib(4.09),
        gib(0.39),
    )
    assert (figure(doc, "activation"), basis(doc, "activation")) == (
        gib(40.87) - gib(38.526),
        "derived",
    )  # peak torch - weights
    assert adds_up(
        [figure(doc, name) for name in ("weights", "non_torch", "activation", "kv_cache")], figure(doc, "requested")
    )
    assert doc["diagnosis"]["term"] == "kv_cache" and doc["diagnosis"]["figures"]["kv_tokens"] == 1280
    assert doc["action"] == doc["action"] | {"change": "--max-model-len 1280", "source": "engine message"}
    # with the model, the planner re-plans this run on its measured terms: two GPUs halve the weights
    planned = explain_doc(run_kvops, "--vllm-log", log, "--model", "qwen2.5-72b-instruct", "--quantization", "gptq")
    assert planned["action"]["source"] == "planner" and planned["action"]["change"] == "--tp 2"
    assert "needs 512 blocks" in planned["action"]["problem"]


def test_v1_kv_cache_error_with_vllms_estimate(run_kvops):
    log = str(LOGS / "vllm-v1-2026-kv-too-small.log")
    doc = explain_doc(run_kvops, "--vllm-log", log)
    assert (
        doc["diagnosis"]["figures"].items()
        >= {
            "max_model_len": 262144,
            "needed_bytes": gib(24.0),
            "available_bytes": gib(3.18),
            "estimated_max_model_len": 34736,
        }.items()
    )
    assert doc["action"] == doc["action"] | {"change": "--max-model-len 34736", "source": "engine message"}
    # no device total: the planner works on the engine's own 3.18 GiB pool; 96 KiB per token is exactly 24 GiB at 262144
    planned = explain_doc(run_kvops, "--vllm-log", log, "--model", "qwen3-30b-a3b", "--quantization", "fp8")
    assert planned["diagnosis"]["figures"]["needed_bytes"] == 262144 * 96 * 1024
    assert planned["action"]["source"] == "planner" and planned["action"]["change"].startswith("--max-model-len ")
    assert (
        "requests longer than" in planned["action"]["warning"]
    )  # no other change fits: a shorter context, with its cost
    assert any("no device total" in note for note in planned["notes"])


def test_no_memory_left_for_the_kv_cache(run_kvops):
    """gpt-oss-120b on one H100: 65.97 GiB of weights, KV -2.14 GiB."""
    doc = explain_doc(
        run_kvops,
        "--vllm-log",
        str(LOGS / "vllm-v1-2025-no-kv-memory.log"),
        "--model",
        "gpt-oss-120b",
        "--gpu",
        "h100",
        "--gpu-memory-utilization",
        "0.9",
    )
    assert doc["diagnosis"]["term"] == "kv_cache" and doc["diagnosis"]["figures"]["available_bytes"] == -gib(2.14)
    requested = figure(doc, "requested")
    assert requested == ceil(engine_total("H100-80GB").bytes * 0.9)  # the total torch reports, not nvidia-smi's
    assert (figure(doc, "weights"), figure(doc, "kv_cache")) == (gib(65.9651), -gib(2.14))
    assert (figure(doc, "overhead"), basis(doc, "overhead")) == (requested - gib(65.9651) + gib(2.14), "derived")
    assert basis(doc, "activation") == "estimate"  # not reported: the plan's, marked as such
    assert doc["action"] == doc["action"] | {"change": "--tp 2", "source": "planner"}


@pytest.mark.parametrize(
    ("fixture", "phase", "term", "tried", "free", "total"),
    [
        ("vllm-v1-weights-oom.log", "weights", "weights", "512.00 MiB", "313.75 MiB", "44.29 GiB"),
        ("vllm-v1-profile-run-oom.log", "activation", "activation", "1.16 GiB", "1.17 GiB", "7.75 GiB"),
        ("vllm-v1-sampler-warmup-oom.log", "activation", "activation", "1.74 GiB", "953.94 MiB", "15.48 GiB"),
        ("vllm-v1-rocm-kv-alloc-oom.log", "kv_cache", "kv_cache", "12.94 GiB", "18.56 GiB", "127.00 GiB"),
        ("vllm-v0-serving-oom.log", "serving", "activation", "1.50 GiB", "263.25 MiB", "44.53 GiB"),
    ],
)
def test_out_of_memory_names_the_phase_and_its_figures(run_kvops, fixture, phase, term, tried, free, total):
    doc = explain_doc(run_kvops, "--vllm-log", str(LOGS / fixture))
    diagnosis = doc["diagnosis"]
    assert (doc["state"], diagnosis["phase"], diagnosis["term"]) == ("failed", phase, term)
    figures = diagnosis["figures"]
    assert (figures["tried_bytes"], figures["free_bytes"], figures["total_bytes"]) == (
        size_bytes(tried),
        size_bytes(free),
        size_bytes(total),
    )
    assert figures["shortfall_bytes"] == size_bytes(tried) - size_bytes(free)
    assert (figure(doc, "total"), figure(doc, "used")) == (size_bytes(total), size_bytes(total) - size_bytes(free))


def test_out_of_memory_figures_of_this_process_and_others(run_kvops):
    weights = explain_doc(run_kvops, "--vllm-log", str(LOGS / "vllm-v1-weights-oom.log"))["diagnosis"]["figures"]
    assert (weights["process_bytes"], weights["allocated_bytes"], weights["unallocated_bytes"]) == (
        size_bytes("43.98 GiB"),
        size_bytes("43.75 GiB"),
        size_bytes("29.69 MiB"),
    )
    profile = explain_doc(run_kvops, "--vllm-log", str(LOGS / "vllm-v1-profile-run-oom.log"))
    # 7.75 GiB total, 1.17 free, 5.02 this process: 1.56 GiB held elsewhere; the 1.16 GiB asked was under the free 1.17
    assert profile["diagnosis"]["figures"]["held_by_others_bytes"] == size_bytes("7.75 GiB") - size_bytes(
        "1.17 GiB"
    ) - size_bytes("5.02 GiB")
    assert (
        "more was free than asked" in profile["diagnosis"]["summary"]
        and "other processes held ~1.56 GiB" in profile["diagnosis"]["summary"]
    )
    sampler = explain_doc(run_kvops, "--vllm-log", str(LOGS / "vllm-v1-sampler-warmup-oom.log"))["diagnosis"]
    assert (
        sampler["figures"]["private_pool_bytes"] == size_bytes("81.88 MiB") and "warming up sampler" in sampler["basis"]
    )
    serving = explain_doc(run_kvops, "--vllm-log", str(LOGS / "vllm-v0-serving-oom.log"))["diagnosis"]
    assert serving["figures"]["other_processes"] == [{"pid": 3438115, "bytes": size_bytes("44.25 GiB")}]
    assert "engine_step()" in serving["basis"]


def test_weights_out_of_memory_with_the_model_gets_the_planners_way_out(run_kvops):
    doc = explain_doc(run_kvops, "--vllm-log", str(LOGS / "vllm-v1-weights-oom.log"), "--model", "qwen3-30b-a3b")
    assert (figure(doc, "weights"), basis(doc, "weights")) == (
        size_bytes("43.75 GiB"),
        "reported",
    )  # at least: loading stopped there
    assert figure(doc, "total") == size_bytes("44.29 GiB")  # the plan runs on the device total the error states
    assert doc["action"] == doc["action"] | {"change": "--tp 2", "source": "planner"}


def test_cuda_graph_capture_out_of_memory_without_figures(run_kvops):
    doc = explain_doc(run_kvops, "--vllm-log", str(LOGS / "vllm-v1-cudagraph-oom.log"))
    diagnosis = doc["diagnosis"]
    assert (diagnosis["phase"], diagnosis["term"], diagnosis["figures"]) == ("cuda_graphs", "cuda_graphs", {})
    assert "capture_end()" in diagnosis["basis"] and diagnosis["line"].endswith(
        "RuntimeError: CUDA error: out of memory"
    )
    assert doc["action"]["change"] == "--enforce-eager"


def test_startup_check_against_memory_other_processes_hold(run_kvops):
    doc = explain_doc(run_kvops, "--vllm-log", str(LOGS / "vllm-v1-startup-free-memory.log"))
    assert doc["diagnosis"]["term"] == "other_processes"
    assert doc["diagnosis"]["figures"]["held_by_others_bytes"] == gib(79.25) - gib(67.24)
    assert (figure(doc, "total"), figure(doc, "requested")) == (gib(79.25), gib(71.33))
    assert doc["action"]["change"] == "--gpu-memory-utilization 0.84"  # floor(67.24 / 79.25, 2)


def test_failure_phases_from_the_parser():
    phases = {
        name: parse_vllm_log((LOGS / name).read_text()).failure
        for name in (
            "vllm-v1-weights-oom.log",
            "vllm-v1-profile-run-oom.log",
            "vllm-v1-sampler-warmup-oom.log",
            "vllm-v1-cudagraph-oom.log",
            "vllm-v1-rocm-kv-alloc-oom.log",
            "vllm-v0-serving-oom.log",
        )
    }
    assert {name: failure.phase for name, failure in phases.items()} == {
        "vllm-v1-weights-oom.log": "weights",
        "vllm-v1-profile-run-oom.log": "activation",
        "vllm-v1-sampler-warmup-oom.log": "activation",
        "vllm-v1-cudagraph-oom.log": "cuda_graphs",
        "vllm-v1-rocm-kv-alloc-oom.log": "kv_cache",
        "vllm-v0-serving-oom.log": "serving",
    }
    assert phases["vllm-v1-rocm-kv-alloc-oom.log"].oom.backend == "HIP"
    assert (
        parse_vllm_log((LOGS / "vllm-v0-profiling-results.log").read_text()).failure is None
    )  # the lines before the error


def test_phase_from_the_last_startup_line_when_there_is_no_traceback():
    text = (LOGS / "vllm-v1-2026-model-loading.log").read_text() + (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.56 GiB of which 1.00 GiB is free.\n"
    )
    failure = parse_vllm_log(text).failure
    assert failure.phase == "activation" and "Model loading took" in failure.phase_basis


# --- nvidia-smi -------------------------------------------------------------------------------------------


def test_nvidia_smi_table_and_csv_forms():
    (one,) = parse_nvidia_smi((SMI / "nvidia-smi-rtx4090-table.txt").read_text())
    assert (one.index, one.name, one.used_bytes, one.total_bytes) == (
        0,
        "NVIDIA GeForce RTX 4090",
        14214 * MiB,
        24564 * MiB,
    )
    two = parse_nvidia_smi((SMI / "nvidia-smi-4090-two-gpus.txt").read_text())
    assert [(device.index, device.used_bytes) for device in two] == [(0, 507 * MiB), (1, 459 * MiB)]
    four = parse_nvidia_smi((SMI / "nvidia-smi-query-csv.txt").read_text())
    assert [(device.index, device.used_bytes, device.total_bytes) for device in four] == [
        (index, 23859 * MiB, 24564 * MiB) for index in range(4)
    ]
    assert parse_nvidia_smi("24564, 23859\n")[0].total_bytes == 24564 * MiB  # noheader,nounits: total, used


def test_nvidia_smi_gives_the_device_total_and_what_the_engine_does_not_account_for(run_kvops):
    """Arithmetic on two public outputs of the same GPU model (RTX 4090: a V0 log, an nvidia-smi reading of another run):
    nvidia-smi's total replaces torch's, and used - the engine's terms is what it cannot account for."""
    doc = explain_doc(
        run_kvops,
        "--vllm-log",
        str(LOGS / "vllm-v0-memory-profiling.log"),
        "--nvidia-smi",
        str(SMI / "nvidia-smi-query-csv.txt"),
        "--gpu-index",
        "2",
    )
    assert (figure(doc, "total"), basis(doc, "total"), figure(doc, "used")) == (24564 * MiB, "nvidia-smi", 23859 * MiB)
    engine = figure(doc, "engine")
    assert engine == sum(figure(doc, name) for name in ("weights", "non_torch", "activation", "kv_cache"))
    assert figure(doc, "outside_engine") == 23859 * MiB - engine and figure(doc, "free") == (24564 - 23859) * MiB


# --- bad input: one line each -----------------------------------------------------------------------------


def one_line_error(ran) -> str:
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in ran.stderr, ran.stderr
    return lines[0]


def test_bad_inputs_end_in_one_line(run_kvops, tmp_path):
    assert "give --metrics URL and/or --vllm-log FILE" in one_line_error(run_kvops("explain", expect=2))
    missing = one_line_error(run_kvops("explain", "--vllm-log", str(tmp_path / "nope.log"), expect=1))
    assert missing == f"kvops: error: --vllm-log {tmp_path / 'nope.log'}: cannot read (No such file or directory)"
    assert "cannot read (Is a directory)" in one_line_error(run_kvops("explain", "--vllm-log", str(tmp_path), expect=1))
    binary = tmp_path / "core.bin"
    binary.write_bytes(b"\x7fELF\x00\x00\x01" * 100)
    assert one_line_error(run_kvops("explain", "--vllm-log", str(binary), expect=1)).endswith(
        "core.bin: not a text file"
    )
    other = tmp_path / "nginx.log"
    other.write_text('127.0.0.1 - - [30/Nov/2026:00:00:00 +0000] "GET / HTTP/1.1" 200 612\n')
    assert "no vLLM lines found" in one_line_error(run_kvops("explain", "--vllm-log", str(other), expect=1))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens there
    refused = one_line_error(run_kvops("explain", "--metrics", f"http://127.0.0.1:{port}", expect=1))
    assert refused.startswith(
        f"kvops: error: --metrics http://127.0.0.1:{port}: cannot read http://127.0.0.1:{port}/metrics"
    )
    smi = tmp_path / "smi.txt"
    smi.write_text("No devices were found\n")
    assert "no GPU memory found" in one_line_error(
        run_kvops(
            "explain", "--vllm-log", str(LOGS / "vllm-v0-memory-profiling.log"), "--nvidia-smi", str(smi), expect=1
        )
    )
    assert "--gpu-index 5: not in" in one_line_error(
        run_kvops(
            "explain",
            "--vllm-log",
            str(LOGS / "vllm-v0-memory-profiling.log"),
            "--nvidia-smi",
            str(SMI / "nvidia-smi-4090-two-gpus.txt"),
            "--gpu-index",
            "5",
            expect=1,
        )
    )


def test_metrics_that_are_not_a_usable_vllm_endpoint_end_in_one_line(run_kvops):
    from tests.support.metrics_server import MetricsServer, vllm_exposition

    with MetricsServer("hello\n") as server:
        assert one_line_error(run_kvops("explain", "--metrics", server.url, expect=1)).startswith(
            f"kvops: error: --metrics {server.url}: "
        )
        server.set(vllm_exposition(0.5).replace("vllm:cache_config_info", "vllm:other_info"))
        assert "no vllm:cache_config_info sample" in one_line_error(
            run_kvops("explain", "--metrics", server.url, expect=1)
        )
        server.set(status=500)
        assert "cannot read" in one_line_error(run_kvops("explain", "--metrics", server.url, expect=1))


def test_a_recorded_vllm_exposition_gives_blocks_tokens_and_requests(run_kvops):
    """The recorded CPU-engine /metrics (32 blocks of 128 tokens, 1024 tokens at 4.0x) at 72%: 22 of 31 blocks."""
    from tests.support.metrics_server import MetricsServer, vllm_exposition

    with MetricsServer(vllm_exposition(0.72, running=4, waiting=2, preemptions=3)) as server:
        doc = explain_doc(run_kvops, "--metrics", server.url, "--device", "cpu")
    kv = doc["kv"]
    assert (kv["used_blocks"], kv["free_blocks"], kv["in_use_tokens"], kv["headroom_tokens"]) == (
        22,
        9,
        22 * 128,
        9 * 128,
    )
    assert (kv["request_tokens"], kv["request_blocks"], kv["headroom_requests"], kv["headroom_requests_to_warn"]) == (
        1024,
        8,
        1,
        0,
    )
    assert (kv["bytes_per_block"], kv["in_use_bytes"]) == (
        4 * MiB // 32,
        22 * 4 * MiB // 32,
    )  # the pinned 4 MiB over 32 blocks
    assert (kv["running"], kv["waiting"], kv["preemptions_total"], doc["level"]) == (4, 2, 3, "warn")
    assert doc["action"]["source"] == "none" and "give --model" in doc["action"]["result"]


def test_gzip_logs_are_read(run_kvops, tmp_path):
    import gzip

    packed = tmp_path / "vllm.log.gz"
    packed.write_bytes(gzip.compress((LOGS / "vllm-v0-kv-too-small.log").read_bytes()))
    assert explain_doc(run_kvops, "--vllm-log", str(packed))["diagnosis"]["figures"]["kv_tokens"] == 1280


# --- the live engine --------------------------------------------------------------------------------------


def gauges(engine) -> dict[str, float]:
    from kvops.engines.metrics import Samples

    samples = Samples.from_exposition(engine.metrics())
    return {
        name: samples.total(name)
        for name in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting")
    }


# --- the planner changes explain relies on ------------------------------------------------------------------


def test_more_replicas_is_a_way_out_the_planner_computes(run_kvops):
    ran = run_kvops(
        "plan",
        "-m",
        "llama-3-8b",
        "--gpu",
        "l4",
        "--max-model-len",
        "8192",
        "--concurrency",
        "4",
        "--format",
        "json",
        expect=None,
    )
    replicas = next(way for way in json.loads(ran.stdout)["ways_out"] if way["change"].startswith("--gpus"))
    assert (
        replicas["change"] == "--gpus 2"
        and replicas["fits"]
        and (replicas["replicas"], replicas["concurrency_per_replica"]) == (2, 2)
    )
    assert replicas["flags"]["data-parallel-size"] == 2 and replicas["result"].startswith(
        "fits: 2 replicas of tp 1, 2 of the 4 requests each"
    )


def test_weights_measured_at_one_tp_scale_to_another(run_kvops, tmp_path):
    profile = tmp_path / "profile.yaml"
    profile.write_text("kvops_profile: 1\nengine: vllm\nsource: test\ntp: 1\nweights_bytes: 16000000000\n")
    doc = json.loads(
        run_kvops(
            "plan",
            "-m",
            "llama-3-8b",
            "--gpu",
            "h100",
            "--tp",
            "2",
            "--max-model-len",
            "8192",
            "--profile",
            str(profile),
            "--format",
            "json",
        ).stdout
    )
    weights = next(term for term in doc["memory"]["terms"] if term["name"] == "weights")
    assert weights["bytes"] == 8000000000 and weights["basis"] == "measured" and "x 1/2 for tp 2" in weights["formula"]


def test_explain_says_paging_does_not_add_memory_with_the_pools_numbers(run_kvops):
    from tests.support.metrics_server import MetricsServer, vllm_exposition

    with MetricsServer(vllm_exposition(0.72, running=4, waiting=2, preemptions=3)) as server:
        text = run_kvops("explain", "--metrics", server.url, "--device", "cpu").stdout
    assert (
        "removes fragmentation, not the limit: the pool still holds 32 blocks x 128 tokens = 4,096 token slots in 4 MiB"
        in text
    )


# V0's profile lines in vllm/worker/worker.py's wording (0.7-0.8: determine_num_available_blocks), with the numbers of
# an RTX 3090 whose weights took the whole budget (the shape of vllm-project/vllm PR #14447's 16 x 3090 logs)
V0_NEGATIVE_KV = """\
INFO 12-02 10:00:00 worker.py:267] Memory profiling takes 2.10 seconds
INFO 12-02 10:00:00 worker.py:267] the current vLLM instance can use total_gpu_memory (23.58GiB) x gpu_memory_utilization (0.90) = 21.22GiB
INFO 12-02 10:00:00 worker.py:267] model weights take 21.21GiB; non_torch_memory takes 0.20GiB; PyTorch activation peak memory takes 0.37GiB; the rest of the memory reserved for KV Cache is -0.56GiB.
"""


def _utilization(change: str | None) -> float | None:
    found = re.search(r"--gpu-memory-utilization ([\d.]+)", change or "")
    return float(found.group(1)) if found else None


def test_a_negative_kv_budget_raises_memory_and_never_lowers_the_utilization(run_kvops, tmp_path):
    log = tmp_path / "v0.log"
    log.write_text(V0_NEGATIVE_KV)
    doc = json.loads(run_kvops("explain", "--vllm-log", str(log), "--json").stdout)
    assert doc["diagnosis"]["term"] == "kv_cache" and doc["diagnosis"]["figures"]["available_bytes"] == -gib(0.56)
    raised = _utilization(doc["action"]["change"])
    assert raised is not None and raised > 0.90  # a higher budget: the weights and overheads took all of it
    # with the model named, the planner's way out: more GPUs or more memory, never a lower utilization
    for args in (
        ("--vllm-log", str(log), "--model", "qwen2.5-32b-instruct", "--gpu", "rtx-3090"),
        ("--vllm-log", str(LOGS / "vllm-v1-2025-no-kv-memory.log"), "--model", "gpt-oss-120b", "--gpu", "h100"),
    ):
        action = json.loads(run_kvops("explain", *args, "--json").stdout)["action"]
        change = action["change"] or ""
        assert re.match(r"--(tp|tensor-parallel-size|gpus|gpu|gpu-memory-utilization|max-model-len) ", change), action
        assert (_utilization(change) or 1.0) > 0.9, action


def test_the_release_comes_from_the_running_engines_version_endpoint(run_kvops):
    """With --metrics, explain plans the unreported terms by the release the engine states at /version (a real
    server on 127.0.0.1 serving vLLM's recorded /metrics and its /version JSON); --engine-version overrides it."""
    from tests.support.metrics_server import MetricsServer, vllm_exposition

    with MetricsServer(vllm_exposition(0.5), routes={"/version": '{"version": "0.19.0"}'}) as server:
        args = ("--metrics", server.url, "--model", "llama-3-8b", "--gpu", "H100-80GB")
        stated = explain_doc(run_kvops, *args)
        named = explain_doc(run_kvops, *args, "--engine-version", "0.32.0")
    assert "vLLM 0.19.0 captures CUDA graphs after sizing the KV cache" in stated["memory"]["cuda_graphs"]["source"]
    assert named["memory"]["cuda_graphs"]["bytes"] > 0  # 0.21+: the estimate comes out of the KV budget
