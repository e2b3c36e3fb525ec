"""`kvops calibrate`: vLLM startup logs in every wording (a real CPU capture and public GPU excerpts, see
tests/fixtures/logs/SOURCES.md), a live /metrics, TGI's log; predicted against actual; profiles that plans use."""

from __future__ import annotations

import json

import yaml

from kvops.engines.device_total import engine_total
from kvops.engines.tgi.logs import parse_tgi_log
from kvops.engines.vllm.logs import parse_vllm_log
from kvops.units import GiB
from tests.support.corpus import CORPUS
from tests.support.extras import needs
from tests.support.paths import LOGS
from tests.support.tiny_model import TINY_LLAMA, build_model


def gib(value: float) -> int:
    return round(value * GiB)


def read(name: str) -> str:
    return (LOGS / name).read_text()


def test_vllm_0_32_cpu_one_line_capacity_and_args():
    log = parse_vllm_log(read("vllm-0.32.0-cpu-fp8-sliding.log"))
    assert log.device == "cpu" and log.get("version") == "0.32.0"
    assert (log.kv_cache_size_tokens, log.max_model_len, log.max_concurrency) == (7372, 2048, 3.6)
    assert log.args["kv_cache_memory_bytes"] == 7352377 and log.args["kv_cache_dtype"] == "fp8"
    assert log.get("kv_cache_bytes") == gib(0.01) and log.get("total_memory_bytes") == gib(
        11.84
    )  # "Explicitly set (0.01/11.84) GiB"


def test_a_run_of_0_32_on_states_its_lora_slots_and_decode_context_parallelism():
    """From vLLM 0.32, whose LoRA layers and DCP rule kvops reads, a run's args state them to the plan it is
    compared with; an older run's LoRA is left out (its layers kvops has not read), as the corpus's are."""
    from kvops.engines.vllm.run import stated_options

    def run(version: str):
        return stated_options(
            parse_vllm_log(
                f"INFO 12-07 10:00:00 [api_server.py:1896] vLLM API server version {version}\n"
                "INFO 12-07 10:00:00 [utils.py:233] non-default args: {'model': 'meta-llama/Llama-3.1-8B', "
                "'enable_lora': True, 'max_loras': 4, 'max_lora_rank': 64, 'lora_dtype': 'bfloat16', "
                "'decode_context_parallel_size': 2, 'tensor_parallel_size': 2}\n"
            ),
            None,
        )

    new, old = run("0.34.0"), run("0.31.0")
    assert (new.enable_lora, new.max_loras, new.max_lora_rank, new.lora_dtype, new.dcp) == (True, 4, 64, "bfloat16", 2)
    assert (old.enable_lora, old.dcp) == (False, 1) and new.lora_slots() is not None


def test_2026_gpu_lines_with_the_cuda_graph_utilization_hint():
    log = parse_vllm_log(read("vllm-v1-2026-tp2-cudagraph.log"))
    assert log.device == "gpu" and log.get("kv_cache_bytes") == gib(9.84)
    assert (log.kv_cache_size_tokens, log.max_model_len, log.max_concurrency) == (619202, 262144, 2.36)
    assert log.cudagraph_bytes(24 * GiB) == round((0.88 - 0.8592) * 24 * GiB)


def test_2026_estimated_cuda_graph_memory_and_model_loading_lines():
    log = parse_vllm_log(read("vllm-v1-2026-tp4-estimated-graphs.log"))
    assert (log.cudagraph_bytes(None), log.get("kv_cache_bytes")) == (gib(0.17), gib(15.72))
    assert parse_vllm_log(read("vllm-v1-2026-model-loading.log")).get("weights_bytes") == gib(12.66)


def test_2025_two_line_and_early_v1_block_count():
    two = parse_vllm_log(read("vllm-v1-2025-two-line.log"))
    assert (two.get("kv_cache_bytes"), two.kv_cache_size_tokens, two.max_model_len, two.max_concurrency) == (
        gib(2.30),
        75840,
        120000,
        2.48,
    )
    early = parse_vllm_log(read("vllm-v1-2025-gpu-blocks.log"))
    assert (early.get("weights_bytes"), early.get("num_gpu_blocks"), early.max_model_len, early.max_concurrency) == (
        gib(67.7229),
        1381,
        2048,
        10.79,
    )


def test_v0_memory_profile_in_both_wordings():
    multi = parse_vllm_log(read("vllm-v0-memory-profiling.log"))
    assert multi.get("total_memory_bytes") == gib(23.58) and multi.get("gpu_memory_utilization") == 0.99
    assert (
        multi.get("weights_bytes"),
        multi.get("non_torch_bytes"),
        multi.activation_bytes,
        multi.get("kv_cache_bytes"),
    ) == (gib(21.21), gib(0.20), gib(0.37), gib(1.57))
    one = parse_vllm_log(read("vllm-v0-profiling-results.log"))
    assert (
        one.get("weights_bytes"),
        one.get("total_memory_bytes"),
        one.get("non_torch_bytes"),
        one.get("kv_cache_bytes"),
    ) == (gib(14.9888), gib(23.58), gib(0.35), gib(2.89))
    assert one.activation_bytes == gib(17.98) - gib(14.9888)  # peak torch memory less the weights
    assert (one.get("num_gpu_blocks"), one.max_model_len, one.max_concurrency, one.get("gpu_memory_utilization")) == (
        1478,
        29000,
        0.82,
        0.90,
    )


def test_pinned_kv_line():
    assert parse_vllm_log(read("vllm-v1-pinned-kv.log")).get("kv_cache_bytes") == gib(49.0)


def test_tgi_plain_and_json_output_lines():
    log = parse_tgi_log(read("tgi-3.3-llama-3-8b.log"))
    assert log.get("max_batch_total_tokens") == 20152 and log.get("kv_blocks") == (20152, 1)
    assert log.get("attention") == ("flashinfer", "true") and log.get("max_batch_prefill_tokens") == 8049
    assert log.args == {"model_id": "meta-llama/Meta-Llama-3-8B", "num_shard": 1, "cuda_memory_fraction": 1.0}
    assert parse_tgi_log(read("tgi-json-output.log")).get("max_batch_total_tokens") == 133696


@needs("tokenizers")
def test_calibrating_the_cpu_capture_predicts_it_exactly(run_kvops, tmp_path):
    """The captured run's own shape, rebuilt here: the log states every flag, the planner predicts every figure."""
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
    report = json.loads(
        run_kvops(
            "calibrate", "--vllm-log", str(LOGS / "vllm-0.32.0-cpu-fp8-sliding.log"), "--model", str(model), "--json"
        ).stdout
    )
    rows = {row["term"]: row for row in report["comparisons"]}
    for name in ("kv_cache", "kv_cache_size_tokens", "max_concurrency"):
        assert rows[name]["difference"] == 0, rows[name]
    assert rows["kv_cache_size_tokens"]["actual"] == 7372
    text = run_kvops(
        "calibrate", "--vllm-log", str(LOGS / "vllm-0.32.0-cpu-fp8-sliding.log"), "--model", str(model)
    ).stdout
    assert "kv_cache_size_tokens" in text and "exact" in text and "CPU KV cache size: 7,372 tokens" in text


def test_gpu_log_prediction_against_actual_and_profile_round_trip(run_kvops, tmp_path):
    """V0 logs itemise every term: the saved profile makes the plan reproduce the run's KV budget."""
    saved = tmp_path / "profile.yaml"
    out = run_kvops(
        "calibrate",
        "--vllm-log",
        str(LOGS / "vllm-v0-memory-profiling.log"),
        "--model",
        "qwen3-8b",
        "--gpu",
        "rtx-4090",
        "--max-model-len",
        "4096",
        "--save",
        str(saved),
    ).stdout
    assert "weights" in out and "non_torch" in out and "activation" in out and f"saved profile {saved}" in out
    profile = yaml.safe_load(saved.read_text())
    assert profile["kvops_profile"] == 1 and profile["engine"] == "vllm"
    assert (
        profile["total_memory_bytes"],
        profile["weights_bytes"],
        profile["activation_bytes"],
        profile["non_torch_bytes"],
    ) == (gib(23.58), gib(21.21), gib(0.37), gib(0.20))
    doc = json.loads(
        run_kvops(
            "plan",
            "-m",
            "qwen3-8b",
            "--gpu",
            "rtx-4090",
            "--max-model-len",
            "4096",
            "--gpu-memory-utilization",
            "0.99",
            "--enforce-eager",
            "--profile",
            str(saved),
            "--engine-version",  # the run's own release (the newest, 0.34, sizes KV after warmup instead)
            str(profile["engine_version"]),
            "--format",
            "json",
            expect=None,
        ).stdout
    )
    assert abs(doc["memory"]["kv_cache_bytes"] - gib(1.57)) <= 10 * (
        1 << 20
    )  # the log's figures are rounded to 0.01 GiB


def test_v1_log_profile_holds_the_measured_overhead(run_kvops, tmp_path):
    saved = tmp_path / "profile.json"
    report = json.loads(
        run_kvops(
            "calibrate",
            "--vllm-log",
            str(LOGS / "vllm-v1-2026-tp2-cudagraph.log"),
            "--model",
            "qwen3-8b",
            "--gpu",
            "rtx-3090",
            "--tp",
            "2",
            "--gpu-memory-utilization",
            "0.88",
            "--max-model-len",
            "32768",
            "--save",
            str(saved),
            "--json",
        ).stdout
    )
    rows = {row["term"]: row for row in report["comparisons"]}
    assert rows["kv_cache"]["actual"] == gib(9.84) and rows["kv_cache"]["predicted"] > 0
    # vLLM converts its estimate to a utilization with the total torch reports (an RTX 3090's 23.58 GiB)
    assert rows["cuda_graphs"]["actual"] == round((0.88 - 0.8592) * engine_total("RTX-3090").bytes)
    assert json.loads(saved.read_text())["cudagraph_bytes"] == rows["cuda_graphs"]["actual"]


def test_tgi_calibration_round_trips_the_kv_pool(run_kvops, tmp_path):
    saved = tmp_path / "tgi.yaml"
    report = json.loads(
        run_kvops(
            "calibrate",
            "--tgi-log",
            str(LOGS / "tgi-3.3-llama-3-8b.log"),
            "--gpu",
            "l4",
            "--save",
            str(saved),
            "--json",
        ).stdout
    )
    rows = {row["term"]: row for row in report["comparisons"]}
    assert rows["max_batch_total_tokens"]["actual"] == 20152 and rows["max_batch_total_tokens"]["predicted"] > 0
    doc = json.loads(
        run_kvops(
            "plan",
            "--engine",
            "tgi",
            "-m",
            "llama-3-8b",
            "--gpu",
            "l4",
            "--max-model-len",
            "8192",
            "--profile",
            str(saved),
            "--format",
            "json",
        ).stdout
    )
    assert doc["capacity"]["max_batch_total_tokens"] == 20152
    assert any(term["name"] == "overhead" and term["basis"] == "measured" for term in doc["memory"]["terms"])


def test_calibrate_needs_a_source_and_says_what_it_looked_for(run_kvops, tmp_path):
    assert "give --vllm-log FILE" in run_kvops("calibrate", expect=2).stderr
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    assert "no vLLM startup lines found" in run_kvops("calibrate", "--vllm-log", str(empty), expect=1).stderr
    assert (
        "no 'Setting max batch total tokens to N' line"
        in run_kvops("calibrate", "--tgi-log", str(empty), expect=1).stderr
    )


# --- the calibrate fixes of issue 13, on public logs of the corpus -------------------------------------------

CORPUS_VLLM = CORPUS / "vllm"


def test_gpu_blocks_are_never_the_cpu_blocks(run_kvops, tmp_path):
    # "GPU blocks: 1952, # CPU blocks: 2048" as the poster printed it (vllm-project/vllm#10517)
    saved = tmp_path / "p.yaml"
    log = CORPUS_VLLM / "vllm-0.6-rtx3090-llama-3.1-8b-20k-tp1.log"
    run_kvops("calibrate", "--vllm-log", str(log), "--model", "llama-3.1-8b-instruct", "--save", str(saved))
    assert yaml.safe_load(saved.read_text())["num_gpu_blocks"] == 1952
    assert (
        parse_vllm_log("INFO gpu_executor.py:76] # GPU blocks: 5691, # CPU blocks: 2048").get("num_gpu_blocks") == 5691
    )


def test_utilization_from_the_runs_non_default_args(run_kvops, tmp_path):
    # the log prints no utilization line: its non-default args say 0.65, the release's default is 0.9
    saved = tmp_path / "p.yaml"
    log = CORPUS_VLLM / "vllm-0.19.0-a100-gpt-oss-20b-tp1.log"
    run_kvops("calibrate", "--vllm-log", str(log), "--gpu", "A100-80GB", "--save", str(saved))
    profile = yaml.safe_load(saved.read_text())
    assert profile["gpu_memory_utilization"] == 0.65
    assert (profile["model"], profile["gpu"], profile["engine_version"]) == (
        "openai/gpt-oss-20b",
        "A100-80GB",
        "0.19.0",
    )


def test_a_log_from_another_gpu_is_warned_recorded_and_not_planned_with_its_total(run_kvops, tmp_path):
    saved = tmp_path / "p.yaml"
    log = CORPUS_VLLM / "vllm-0.6-rtx3090-llama-3.1-8b-20k-tp1.log"  # total_gpu_memory=23.58GiB: an RTX 3090
    ran = run_kvops(
        "calibrate",
        "--vllm-log",
        str(log),
        "--model",
        "llama-3.1-8b-instruct",
        "--gpu",
        "H100-80GB",
        "--save",
        str(saved),
    )
    assert (
        "the log's device total is ~23.58 GiB, not a H100-80GB's (~79.19 GiB): it ran on another GPU (RTX-3090)"
        in ran.stderr
    )
    profile = yaml.safe_load(saved.read_text())
    # the profile records the GPU, model and release it came from
    assert (profile["gpu"], profile["model"], profile["engine_version"]) == (
        "RTX-3090",
        "meta-llama/Llama-3.1-8B-Instruct",
        "0.7.3",
    )
    plan = run_kvops(
        "plan",
        "-m",
        "llama-3.1-8b-instruct",
        "--gpu",
        "H100-80GB",
        "--max-model-len",
        "8192",
        "--profile",
        str(saved),
        "--json",
    )
    doc = json.loads(plan.stdout)
    assert "--profile was measured on RTX-3090, the plan is for H100-80GB" in " ".join(doc["warnings"])
    total = next(term for term in doc["memory"]["terms"] if term["name"] == "total")
    assert total["bytes"] == engine_total("H100-80GB").bytes and total["basis"] != "measured"  # the plan's own GPU


def test_a_pipeline_parallel_log_says_whose_stage_its_memory_lines_are(run_kvops):
    """Each stage's worker prints its own memory lines and the log kept Worker_PP0's; the plan's terms are the
    binding stage's, so the comparison says so and points at the pool's own lines (tokens, concurrency)."""
    log = CORPUS_VLLM / "vllm-0.19.0-h100-llama-3.1-8b-instruct-tp1pp2-8192-llmd.log"
    ran = run_kvops("calibrate", "--vllm-log", str(log), "--gpu", "H100-80GB", "--pp", "2", "--json")
    assert "pipeline parallel 2: the log's memory lines are one stage's (Worker_PP0)" in ran.stderr
    rows = {row["term"]: row for row in json.loads(ran.stdout)["comparisons"]}
    tokens = rows["kv_cache_size_tokens"]
    assert tokens["actual"] == 1_075_312 and abs(tokens["predicted"] - tokens["actual"]) / tokens["actual"] < 0.01


def test_an_enum_in_the_non_default_args_is_read_by_its_members_name(run_kvops, tmp_path):
    """vLLM prints `--compilation-config {"cudagraph_mode": "NONE"}` back as `<CUDAGraphMode.NONE: 0>`: read as
    'NONE', the run is planned without CUDA graphs, as it ran (it was read as None: the default graphs)."""
    log = parse_vllm_log((CORPUS / "vllm" / "vllm-0.31.0-h200-llama-3.2-1b-instruct-fp16-nograph-tp1.log").read_text())
    config = log.args["compilation_config"]
    assert config["cudagraph_mode"] == "NONE" and config["dynamic_shapes_config"]["type"] == "BACKED"
    assert config["mode"] is None  # a plain None stays None
    report = json.loads(
        run_kvops(
            "calibrate",
            "--vllm-log",
            str(CORPUS / "vllm" / "vllm-0.31.0-h200-llama-3.2-1b-instruct-fp16-nograph-tp1.log"),
            "-m",
            "llama-3.2-1b-instruct",
            "--gpu",
            "H200",
            "--json",
        ).stdout
    )
    predicted = {row["term"]: row["predicted"] for row in report["comparisons"]}
    assert predicted["overhead"] == predicted["activation"] + predicted["non_torch"]  # no CUDA graphs planned
