"""`kvops simulate`: its outputs on the installed vLLM's scheduler, and every user mistake as one line."""

from __future__ import annotations

import csv
import json

import pytest

pytestmark = pytest.mark.vllm

SMALL = ("-m", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "4096", "--requests", "40", "--rate", "8")


def test_json_traces_every_figure_to_the_step_time_and_its_coefficients(run_kvops):
    doc = json.loads(run_kvops("simulate", *SMALL, "--json").stdout)
    assert {"pool", "traffic", "slo", "step_time", "arms", "command"} <= set(doc)
    assert doc["pool"]["num_blocks"] > 1000 and doc["pool"]["kv_cache_group_specs"][0]["kind"] == "full"
    coefficients = doc["step_time"]["coefficients"]
    assert coefficients["fitted_on"]
    assert all(term["source"] for term in coefficients["terms"].values())
    assert doc["step_time"]["hardware"]["memory_bandwidth"] == 3.35e12  # the H100 SXM datasheet
    (arm,) = doc["arms"]
    assert arm["arm"] == "stock" and arm["completed"] == 40 and arm["requests"] == 40
    assert 0 < arm["ttft_ms"]["mean"] <= arm["ttft_ms"]["p99"]
    assert arm["engine_settings"]["async_scheduling"] is True
    assert arm["scheduler"].startswith("vLLM ")


def test_each_arm_pads_its_steps_to_the_cuda_graphs_its_launch_captures(run_kvops):
    """vLLM replays the graph of the next captured size (1, 2, 4, then multiples of 8 up to min(2 x max-num-seqs,
    512)); --enforce-eager, cudagraph_mode NONE and the CPU build capture none, and the step time pads nothing."""

    def sizes(*extra: str) -> list[int]:
        doc = json.loads(run_kvops("simulate", *SMALL, "--requests", "4", *extra, "--json").stdout)
        return doc["arms"][0]["engine_settings"].get("cuda_graph_sizes", [])

    assert sizes("--max-num-seqs", "64")[:5] == [1, 2, 4, 8, 16] and sizes("--max-num-seqs", "64")[-1] == 128
    assert sizes() == [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
    assert sizes("--enforce-eager") == []
    assert sizes("--compilation-config", '{"cudagraph_mode": "NONE"}') == []
    assert sizes("--compilation-config", '{"cudagraph_capture_sizes": [4, 1, 32]}') == [1, 4, 32]
    listed = '{"cudagraph_capture_sizes": [4, 1, 32, 4096]}'  # above --max-num-batched-tokens: not captured
    assert sizes("--max-num-batched-tokens", "2048", "--compilation-config", listed) == [1, 4, 32]
    assert sizes("--performance-mode", "interactivity")[:33] == [*range(1, 33), 40]  # every size up to 32


def test_a_sparsely_routed_mixture_of_experts_is_said_to_be_predicted_fast_where_few_requests_run(run_kvops):
    moe = ("-m", "llama-4-scout", "--gpu", "H100", "--tp", "4", "--max-model-len", "4096", "--requests", "10")
    warned = run_kvops("simulate", *moe, "--rate", "2").stderr
    assert "routes each token to 1 of 16 experts" in warned and "1.05 x the simulated" in warned
    assert "read TPOT at a few requests running as a lower bound" in warned and "routed experts or more" not in warned
    assert "experts" not in run_kvops("simulate", *SMALL).stderr


def test_a_mixture_of_more_experts_than_the_fit_saw_is_read_as_a_lower_bound_from_public_runs(run_kvops):
    """GPUStack's public vllm bench serve runs of 32-256-expert models (bench/simulate_public_bench.py) ran at 1.09
    x the simulated TPOT and above: their figures replace the caveat drawn from Llama 4 Scout's 16, and the max
    rate is read as an upper bound."""
    moe = ("-m", "Qwen/Qwen3-30B-A3B", "--gpu", "H100", "--max-model-len", "4096", "--requests", "40")
    warned = run_kvops("simulate", *moe, "--rate", "2").stderr
    assert "the step time for models of 32 routed experts or more: 17 public vllm bench serve runs it was not" in warned
    assert (
        "ran at 1.09-3.66 x its TPOT (GPUStack's performance lab" in warned
        and "read its latencies as a lower bound" in warned
    )
    assert "routes each token" not in warned
    searched = run_kvops(
        "simulate", *moe, "--rate", "8", "--max-rate", "--slo-ttft", "500ms", "--slo-tpot", "8ms"
    ).stderr
    assert "with latencies read as a lower bound, read the max rate" in searched


def on_gpu(gpu: str) -> tuple[str, ...]:
    return ("-m", "llama-3.1-8b", "--gpu", gpu, "--max-model-len", "4096", "--requests", "10", "--rate", "2")


def pool_blocks(output: str) -> int:
    line = next(line for line in output.splitlines() if line.startswith("pool "))
    return int(line.split()[1].replace(",", ""))


def test_lora_slots_shrink_the_simulated_pool_and_their_kernels_are_said_unpriced(run_kvops):
    plain = run_kvops("simulate", *SMALL).stdout
    served = run_kvops("simulate", *SMALL, "--enable-lora", "--max-loras", "4", "--max-lora-rank", "64").stdout
    assert pool_blocks(served) < pool_blocks(plain)
    assert "LoRA adapters' kernels not priced" in served and "LoRA" not in plain


def test_a_gpu_with_a_fitted_scale_says_so_and_how_its_runs_scored_without_it(run_kvops):
    ran = run_kvops("simulate", *on_gpu("a100-80gb"))
    assert "A100-80GB: 2.04 TB/s, 312 TFLOP/s dense; its steps x 1.23, fitted on its public runs" in ran.stdout
    warned = ran.stderr
    assert (
        "the step time on A100-80GB: 4 public vLLM runs, each simulated at the GPU's scale fitted on the others"
        in warned
    )
    assert "read its latencies within that range, or --calibrate" in warned
    assert "no public vLLM run" not in warned
    assert "the step time on" not in run_kvops("simulate", *SMALL).stderr


def test_a_gpu_no_public_run_scores_says_its_latencies_are_a_lower_bound(run_kvops):
    warned = run_kvops("simulate", *on_gpu("a100-40gb")).stderr
    assert "no public vLLM run on A100-40GB scores the step time: it is the profile fitted on H100-80GB" in warned
    assert "priced the public runs on A100-80GB, L40S too fast" in warned and "as a lower bound" in warned
    assert "no public vLLM run" not in run_kvops("simulate", *on_gpu("h100")).stderr


def test_the_cpu_step_time_says_other_machines_ran_the_engine_at_other_speeds(run_kvops):
    cpu = ("-m", "llama-3.1-8b", "--device", "cpu", "--max-model-len", "4096", "--kv-cache-memory-bytes", "1GiB")
    ran = run_kvops("simulate", *cpu, "--requests", "5", "--rate", "2")
    assert "device           cpu: 0.02 TB/s, 0.2 TFLOP/s dense" in ran.stdout
    assert "the step time on cpu: 2 vLLM CPU engine runs it was not fitted on ran at 0.53-1.22 x its TPOT" in ran.stderr
    assert "read its latencies within that range, or --calibrate" in ran.stderr


def test_compare_runs_the_arms_on_the_same_trace_and_says_the_ratio(run_kvops):
    out = run_kvops("simulate", *SMALL, "--compare", "stock,guard,watermark:0.02").stdout
    assert "goodput against stock: guard " in out and "watermark:0.02 " in out
    assert "guard: --scheduler-cls kvops_vllm.scheduler.KVGuardScheduler" in out
    assert "watermark:0.02: --watermark 0.02" in out


@pytest.mark.parametrize("caching", ["--enable-prefix-caching", "--no-enable-prefix-caching"])
def test_a_hybrid_models_state_groups_run_in_the_mode_vllm_runs_them(run_kvops, tmp_path, caching):
    """Nemotron Nano 9B v2 (Mamba-2 and attention): with prefix caching its state groups are in align mode with
    the Mamba-2 mixer's prefill checkpoint page, as vLLM runs them (vLLM 0.34 refuses a state group that caches
    prefixes in any other mode), and a shared 3,000-token prefix is found in whole blocks of 1,344 tokens (the
    hybrid block aligned from 0.34's 64-token default: 1,312 from 0.33's 16); without it, none mode and no hits."""
    trace = tmp_path / "shared.jsonl"
    rows = [
        {
            "arrival_s": n * 0.2,
            "prompt_tokens": 3500,
            "output_tokens": 30,
            "prefix_id": f"system-{n % 2}",
            "prefix_tokens": 3000,
        }
        for n in range(40)
    ]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    hybrid = ("-m", "nvidia/NVIDIA-Nemotron-Nano-9B-v2", "--gpu", "H100", "--max-model-len", "16384")
    doc = json.loads(run_kvops("simulate", *hybrid, "--trace", str(trace), caching, "--json").stdout)
    states = [group for group in doc["pool"]["kv_cache_group_specs"] if group["kind"] == "mamba"]
    (arm,) = doc["arms"]
    assert doc["pool"]["block_size"] == 1344 and states and arm["completed"] == 40
    if caching == "--enable-prefix-caching":
        assert {(group["mamba_cache_mode"], group["prefill_checkpoint_blocks"]) for group in states} == {("align", 1)}
        assert arm["prefix_cached_tokens"] == 38 * 2 * 1344  # all but each prefix's first: its 2 whole blocks
    else:
        assert {(group["mamba_cache_mode"], group["prefill_checkpoint_blocks"]) for group in states} == {("none", 0)}
        assert arm["prefix_cached_tokens"] == 0


def test_a_pasted_commands_scheduler_flags_are_simulated_and_typed_ones_win(run_kvops):
    """--from-command's --watermark, --scheduling-policy and --no-enable-chunked-prefill run in the scheduler (they were
    dropped before 2026-12-07); a flag typed beside the command wins; without chunked prefill vLLM takes a whole
    prompt in one step, so its token budget rises to the context (EngineArgs)."""
    command = (
        "vllm serve meta-llama/Llama-3.1-8B --max-model-len 4096 --watermark 0.05 --scheduling-policy priority"
        " --no-enable-chunked-prefill"
    )
    for typed, watermark in (((), 0.05), (("--watermark", "0.1"), 0.1)):
        ran = run_kvops(
            "simulate", "--from-command", command, "--gpu", "H100", "--requests", "20", "--rate", "4", *typed, "--json"
        )
        settings = json.loads(ran.stdout)["arms"][0]["engine_settings"]
        assert (settings["policy"], settings["watermark"], settings["enable_chunked_prefill"]) == (
            "priority",
            watermark,
            False,
        )
        assert settings["max_num_batched_tokens"] >= 4096


def test_the_schedulers_token_budget_per_step_is_simulated(run_kvops):
    """--max-num-scheduled-tokens bounds the tokens vLLM's scheduler issues a step (below max_num_batched_tokens,
    which sizes the profile): prompts take more steps to prefill, so the first token comes later."""

    def arm(*extra: str) -> dict:
        return json.loads(run_kvops("simulate", *SMALL, *extra, "--json").stdout)["arms"][0]

    stock, bounded = arm(), arm("--max-num-scheduled-tokens", "64")
    assert bounded["engine_settings"]["max_num_scheduled_tokens"] == 64
    assert stock["engine_settings"]["max_num_batched_tokens"] == bounded["engine_settings"]["max_num_batched_tokens"]
    assert bounded["ttft_ms"]["mean"] > 1.5 * stock["ttft_ms"]["mean"]
    assert stock["engine_settings"]["async_scheduling"] is True  # vLLM's default on a GPU
    assert arm("--no-async-scheduling")["engine_settings"]["async_scheduling"] is False


def test_a_setting_the_installed_vllm_refuses_or_lacks_is_one_line(run_kvops):
    from vllm.config import SchedulerConfig

    ran = run_kvops("simulate", *SMALL, "--max-num-batched-tokens", "16", "--max-num-seqs", "64", expect=None)
    assert ran.exit_code != 0 and len(ran.stderr.strip().splitlines()) == 1 and "Traceback" not in ran.stderr
    assert "--max-num-seqs 64 is above --max-num-batched-tokens 16: vLLM refuses to start" in ran.stderr  # the plan's
    window = run_kvops("simulate", *SMALL, "--cache-aware-admission-window", "8", "--json", expect=None)
    arm = run_kvops("simulate", *SMALL, "--compare", "stock,cache-aware:8", "--json", expect=None)
    if "cache_aware_admission_window" in SchedulerConfig.__dataclass_fields__:  # vLLM 0.34 on (.ci/newer_vllm)
        assert json.loads(window.stdout)["arms"][0]["engine_settings"]["cache_aware_admission_window"] == 8
        stock, aware = json.loads(arm.stdout)["arms"]
        assert (stock["engine_settings"]["cache_aware_admission_window"], aware["change"]) == (
            0,
            "--cache-aware-admission-window 8",
        )
    else:
        for ran in (window, arm):
            assert ran.exit_code != 0 and "has no --cache-aware-admission-window setting" in ran.stderr


def test_a_degrade_arm_runs_the_policy_at_the_api_server(run_kvops, tmp_path):
    policy = tmp_path / "policy.yaml"  # critical from the first request running on: every later one is refused
    policy.write_text("levels: {warn: 0.001, degrade: 0.002, critical: 0.003}\n")
    ran = run_kvops("simulate", *SMALL, "--compare", "stock,stock+degrade", "--policy", str(policy), "--json")
    stock, degraded = json.loads(ran.stdout)["arms"]
    engine = {key: value for key, value in degraded["engine_settings"].items() if key != "degrade_policy"}
    assert engine == {**stock["engine_settings"], "middleware": "kvops_vllm.middleware.KVOpsMiddleware"}
    assert degraded["engine_settings"]["degrade_policy"]["levels"]["critical"] == 0.003
    assert (stock["refusals"], stock["refused"]) == (0, 0)
    assert degraded["refusals"] > 0 and degraded["completed"] + degraded["refused"] == 40
    assert json.loads(ran.stdout)["clients"]["retries_after_refusal"] == 2
    table = tmp_path / "requests.csv"
    run_kvops("simulate", *SMALL, "--compare", "stock+degrade", "--policy", str(policy), "--csv", str(table))
    rows = list(csv.DictReader(table.open()))
    assert sum(int(row["refusals"]) for row in rows) == degraded["refusals"]
    assert {row["outcome"] for row in rows if row["outcome"].startswith("refused")} == {
        "refused: 3 times, with Retry-After"
    }
    text = run_kvops("simulate", *SMALL, "--compare", "stock+degrade", "--policy", str(policy)).stdout
    assert "stock+degrade: --middleware kvops_vllm.middleware.KVOpsMiddleware" in text
    assert "refusals with Retry-After" in text


def test_the_plans_arm_runs_stocks_max_num_seqs_and_pool(run_kvops):
    """The plan emits vLLM's default --max-num-seqs (256 on an L4), so its arm runs the pool stock vLLM sizes, the
    pool `kvops plan --max-num-seqs 256` plans."""
    deployment = ("-m", "llama-3.1-8b-instruct", "--gpu", "L4", "--max-model-len", "8192")
    doc = json.loads(run_kvops("simulate", *deployment, "--requests", "20", "--rate", "2", "--compare", "stock,plan",
                               "--json").stdout)  # fmt: skip
    stock, planned = (arm["engine_settings"] for arm in doc["arms"])
    at_default = json.loads(run_kvops("plan", *deployment, "--max-num-seqs", "256", "--json").stdout)
    assert stock["max_num_seqs"] == planned["max_num_seqs"] == 256
    assert stock["num_blocks"] == planned["num_blocks"] == at_default["capacity"]["num_blocks"]


def test_csv_has_a_row_per_request_of_every_arm(run_kvops, tmp_path):
    path = tmp_path / "requests.csv"
    run_kvops("simulate", *SMALL, "--compare", "stock,guard", "--csv", str(path))
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 80 and {row["arm"] for row in rows} == {"stock", "guard"}
    assert {"ttft_ms", "tpot_ms", "e2e_ms", "preemptions", "slo_met", "outcome"} <= set(rows[0])


def test_plot_writes_a_png(run_kvops, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "kv.png"
    run_kvops("simulate", *SMALL, "--plot", str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_trace_file_replays_as_written(run_kvops, tmp_path):
    trace = tmp_path / "trace.jsonl"
    lines = [{"arrival_s": 0.1 * index, "prompt_tokens": 200, "output_tokens": 20} for index in range(10)]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    doc = json.loads(
        run_kvops("simulate", "-m", "llama-3.1-8b", "--gpu", "H100", "--trace", str(trace), "--json").stdout
    )
    assert doc["traffic"]["requests"] == 10 and doc["arms"][0]["completed"] == 10
    text = run_kvops("simulate", "-m", "llama-3.1-8b", "--gpu", "H100", "--trace", str(trace)).stdout
    assert "one draw" not in text  # a trace's own times are no draw


def test_max_rate_finds_a_rate_that_meets_the_attainment_above_the_all_at_once_throughput(run_kvops):
    """The search had stopped at the throughput with every request sent at once (2.16/s here), where the trace's
    longest request sets the pace; sent at a rate, the trace meets the SLO well above it."""
    args = ("-m", "llama-3.1-8b", "--gpu", "L4", "--max-model-len", "4096", "--requests", "80", "--rate", "2")
    doc = json.loads(run_kvops("simulate", *args, "--max-rate", "--json").stdout)
    search = doc["max_rate"]
    assert search["max_rate_rps"] > 1.5 * search["saturation_rps"]
    met = [point for point in search["points"] if point["rate_rps"] == search["max_rate_rps"]]
    assert met and met[0]["slo_attainment"] >= 0.9
    above = [point for point in search["points"] if point["rate_rps"] > search["max_rate_rps"]]
    assert above and all(point["slo_attainment"] < 0.9 for point in above)  # every rate tried above it misses
    assert min(point["rate_rps"] for point in above) <= 1.04 * search["max_rate_rps"]  # within the search's tolerance


def test_max_rate_on_a_trace_that_meets_the_slo_all_at_once_says_it_is_too_short(run_kvops):
    ran = run_kvops("simulate", *SMALL, "--max-rate", "--slo-ttft", "500ms", expect=1)
    assert "--max-rate: all 40 requests sent at once meet 90% of the SLO" in ran.stderr
    assert "the trace is too short to load one replica; give more requests" in ran.stderr


def test_draws_report_each_arms_spread_over_seeds_with_the_first_draw_as_the_table(run_kvops):
    ran = run_kvops("simulate", *SMALL, "--seed", "5", "--draws", "3", "--compare", "stock,guard", "--json")
    doc = json.loads(ran.stdout)
    stock, guard = doc["draws"]
    assert (stock["arm"], guard["arm"]) == ("stock", "guard") and stock["seeds"] == [5, 6, 7]
    ttft = stock["ttft_mean_ms"]
    assert ttft["per_seed"][0] == pytest.approx(doc["arms"][0]["ttft_ms"]["mean"], abs=1e-3)  # the table's run
    assert len(set(ttft["per_seed"])) == 3 and ttft["min"] <= ttft["median"] <= ttft["max"]  # three other draws
    text = run_kvops("simulate", *SMALL, "--draws", "2").stdout
    assert "over 2 draws of the traffic (seeds 0-1): median [lowest-highest]" in text
    assert "one draw of this synthetic traffic" not in text
    one = run_kvops("simulate", *SMALL, "--seed", "3").stdout
    assert "one draw of this synthetic traffic (seed 3): --draws 5 shows how far other seeds move" in one


def test_draws_need_traffic_that_a_seed_draws(run_kvops, tmp_path):
    trace = tmp_path / "trace.jsonl"
    lines = [{"arrival_s": 0.1 * index, "prompt_tokens": 200, "output_tokens": 20} for index in range(10)]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    timed = ("-m", "llama-3.1-8b", "--gpu", "H100", "--trace", str(trace), "--draws", "2")
    for args in (timed, (*timed, "--rate", "4")):
        ran = run_kvops("simulate", *args, expect=2)
        assert "--draws: this traffic is the same at every seed" in ran.stderr
        assert len(ran.stderr.strip().splitlines()) == 1
    ran = run_kvops("simulate", *SMALL, "--draws", "2", "--max-rate", expect=2)
    assert "--draws repeats the runs of --compare over draws of the traffic; leave out --max-rate" in ran.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--compare", "stock,magic"), "--compare 'magic'; valid: stock, plan, guard"),
        (("--compare", "watermark:2"), "--compare 'watermark:2': the watermark is a fraction between 0 and 1"),
        (("--compare", "stock+proxy"), "--compare 'stock+proxy': the one suffix an arm takes is +degrade"),
        (("--compare", "stock,cache-aware"), "--compare 'cache-aware'; valid: stock, plan, guard"),
        (("--slo-ttft", "200"), "--slo-ttft '200' is not a duration; write it with its unit, e.g. 200ms or 2s"),
        (("--engine", "tgi"), "--engine tgi: kvops simulate runs the engine's own scheduler in Python"),
        (("--max-tokens", "cap:0"), "--max-tokens 'cap:0'; valid: trace, exact, none, cap:N (N tokens, 1 or more)"),
        (("--max-tokens", "cap:abc"), "--max-tokens 'cap:abc'; valid"),
        (("--max-tokens", "foo"), "--max-tokens 'foo'; valid"),
        (
            ("--csv", "/dev/null/x.csv"),
            "--csv /dev/null/x.csv: cannot write there (/dev/null is not a writable folder)",
        ),
        (("--plot", "p.txt"), "--plot p.txt: the file is written as PNG: give a name ending .png"),
        (("--csv", "out.png", "--plot", "out.png"), "--csv and --plot both name out.png: give each its own file"),
        (("--csv", ""), "--csv '': give a file name to write"),
        (("--scheduler-cls", "os.path"), "--scheduler-cls os.path: not a vLLM scheduler class"),
        (("--scheduler-cls", "no.such.Class"), "--scheduler-cls no.such.Class: cannot load it"),
    ],
)
def test_user_mistakes_are_one_line(run_kvops, args, message):
    ran = run_kvops("simulate", *SMALL, *args, expect=2)
    assert message in ran.stderr
    assert "Traceback" not in ran.stderr and len(ran.stderr.strip().splitlines()) == 1


def test_synthetic_lengths_beside_a_trace_are_one_line_not_ignored(run_kvops, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n')
    args = ("-m", "llama-3.1-8b", "--gpu", "H100", "--trace", str(trace), "--output-tokens", "fixed:1")
    ran = run_kvops("simulate", *args, expect=2)
    assert f"--output-tokens draws synthetic lengths; --trace {trace} has its own: leave it out" in ran.stderr


def test_a_bad_trace_line_names_the_file_the_line_and_the_field(run_kvops, tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        '{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n{"arrival_s": 1, "prompt_tokens": "x", "output_tokens": 5}\n'
    )
    ran = run_kvops("simulate", "-m", "llama-3.1-8b", "--gpu", "H100", "--trace", str(trace), expect=2)
    assert f'{trace} line 2: field "prompt_tokens"' in ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1


def test_an_untimed_trace_needs_a_rate_or_clients(run_kvops, tmp_path):
    trace = tmp_path / "tokens.jsonl"
    trace.write_text('{"prompt_tokens": 10, "gen_tokens": 5}\n')
    ran = run_kvops("simulate", "-m", "llama-3.1-8b", "--gpu", "H100", "--trace", str(trace), expect=2)
    assert "has no arrival times: give --rate (requests per second) or --concurrency (clients)" in ran.stderr


def bench_result(path) -> str:
    """Eight requests as `vllm bench serve --save-result --save-detailed` records them (the lists kvops reads)."""
    outputs = [100, 120, 80, 100, 150, 90, 110, 100]
    ttfts = [0.041, 0.044, 0.039, 0.043, 0.040, 0.042, 0.045, 0.041]
    result = {
        "input_lens": [300] * 8,
        "output_lens": outputs,
        "ttfts": ttfts,
        "latencies": [ttft + 0.0125 * (tokens - 1) for ttft, tokens in zip(ttfts, outputs)],
        "start_times": [7000 + 0.2 * index for index in range(8)],
        "errors": [""] * 8,
    }
    path.write_text(json.dumps(result))
    return str(path)


def test_calibrate_fits_the_step_time_to_a_benchmark_and_saves_it_for_step_time(run_kvops, tmp_path):
    result, saved = bench_result(tmp_path / "bench.json"), tmp_path / "h100.json"
    deployment = ("-m", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "4096")
    ran = run_kvops("simulate", *deployment, "--calibrate", result, "--save-step-time", str(saved), "--json")
    calibration = json.loads(ran.stdout)["calibration"]
    assert calibration["measured"]["tpot_ms"]["mean"] == pytest.approx(12.5)
    assert calibration["simulated_after"]["tpot_ms"]["mean"] == pytest.approx(12.5, rel=0.005)
    assert calibration["step_time_scale"] > 1  # an 8B model's decode on an H100 takes 12.5 ms only when slowed
    assert json.loads(saved.read_text()) == calibration["profile"]

    again = json.loads(
        run_kvops("simulate", *deployment, "--trace", result, "--step-time", str(saved), "--json").stdout
    )
    (arm,) = again["arms"]
    assert arm["tpot_ms"]["mean"] == pytest.approx(calibration["simulated_after"]["tpot_ms"]["mean"])
    text = run_kvops("simulate", *deployment, "--calibrate", result).stdout
    assert "simulated, calibrated" in text and "on every coefficient of the gpu profile" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--rate", "4"), "--calibrate replays the benchmark's own requests through stock vLLM; leave out --rate"),
        (("--compare", "stock,guard"), "leave out --compare"),
        (("--max-rate",), "leave out --max-rate"),
    ],
)
def test_calibrate_takes_the_benchmarks_requests_alone(run_kvops, tmp_path, args, message):
    result = bench_result(tmp_path / "bench.json")
    ran = run_kvops("simulate", "-m", "llama-3.1-8b", "--gpu", "H100", "--calibrate", result, *args, expect=2)
    assert message in ran.stderr and len(ran.stderr.strip().splitlines()) == 1


def test_save_step_time_needs_calibrate(run_kvops, tmp_path):
    ran = run_kvops("simulate", *SMALL, "--save-step-time", str(tmp_path / "x.json"), expect=2)
    assert "--save-step-time writes what --calibrate fits: give --calibrate RESULT too" in ran.stderr


def test_a_benchmark_of_another_model_is_said_to_be_one(run_kvops, tmp_path):
    result = tmp_path / "bench.json"
    bench_result(result)
    result.write_text(json.dumps({"model_id": "Qwen/Qwen2.5-7B-Instruct", **json.loads(result.read_text())}))
    ran = run_kvops(
        "simulate", "-m", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "4096", "--trace", str(result)
    )
    assert "the benchmark served Qwen/Qwen2.5-7B-Instruct, and this simulation plans meta-llama/" in ran.stderr
    assert "the benchmark" in ran.stdout and "simulated, stock" in ran.stdout  # its figures beside the arm's


def test_an_arm_named_twice_is_one_line(run_kvops):
    # --compare stock,stock simulated stock twice and printed two identical rows without a word
    ran = run_kvops("simulate", "-m", "llama-3.1-8b", "--gpu", "l4", "--compare", "stock,stock", expect=2)
    assert "Invalid value for --compare: 'stock' is named twice; name each once" in ran.stderr


def test_rate_inf_sends_every_request_at_once_as_vllm_bench_serve_does(run_kvops, tmp_path):
    """`vllm bench serve --request-rate inf` (its default) sends every request at once: kvops refused 'inf'."""
    burst = ("-m", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "4096", "--requests", "30")
    at_once = json.loads(run_kvops("simulate", *burst, "--rate", "inf", "--json").stdout)
    clients = json.loads(run_kvops("simulate", *burst, "--concurrency", "30", "--json").stdout)
    assert "all sent at once" in at_once["traffic"]["source"]
    assert at_once["arms"][0]["ttft_ms"] == clients["arms"][0]["ttft_ms"]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"arrival_s": {t}, "prompt_tokens": 100, "output_tokens": 20}}\n' for t in (0, 1, 3)))
    rows = tmp_path / "rows.csv"
    run_kvops("simulate", *burst[:6], "--trace", str(trace), "--rate", "inf", "--csv", str(rows))
    assert [line.split(",")[2] for line in rows.read_text().splitlines()[1:]] == ["0.0"] * 3
    refused = run_kvops("simulate", *burst, "--rate", "nan", expect=2).stderr
    assert "'nan' is not a finite number (requests per second, or inf: all at once" in refused
