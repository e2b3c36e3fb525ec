"""One overload burst, run twice on the real vLLM CPU engine: the stock scheduler, then the KV guard.

    python bench/kv_guard_burst.py [--requests 32] [--seed 0] [--prompt-tokens 32-384] [--new-tokens 64-640] [--json]

Both runs start the same engine (the locally built tiny llama, dummy weights, a 4 MiB KV pool: 31 usable blocks
of 128 tokens) and release the same requests to its scheduler at once, in one order (tests/support/burst.py:
release_together): fixed seed, prompts of random token ids, ignore_eos so each request generates exactly its
max_tokens. Figures: requests completed, vllm:num_preemptions_total, end-to-end
latency p50/p99 as the client sees it, and the queue drain (burst start until vllm:num_requests_waiting was last
seen above 0, sampled every 0.25 s, and until the last answer). 5-10 minutes on 2 cores, mostly engine startup.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "plugins")]

from tests.support.burst import BurstRun, burst, percentile, run_burst  # noqa: E402
from tests.support.tiny_model import build_model  # noqa: E402
from tests.support.vllm_server import DEFAULT_KV_BYTES, VllmServer  # noqa: E402

GUARD = "kvops_vllm.scheduler.KVGuardScheduler"
ENGINE_ARGS = ["--max-model-len", "1024", "--kv-cache-memory-bytes", str(DEFAULT_KV_BYTES)]


def engine(model: Path, logs: Path, scheduler: str | None) -> VllmServer:
    args = ENGINE_ARGS + (["--scheduler-cls", scheduler] if scheduler else [])
    return VllmServer(model, logs / f"vllm-{'guard' if scheduler else 'stock'}.log", args=args)


def figures(name: str, run: BurstRun) -> dict:
    seconds = [answer.seconds for answer in run.complete]
    return {
        "scheduler": name,
        "sent": len(run.requests),
        "completed": len(run.complete),
        "preemptions": run.preemptions,
        "p50_seconds": round(percentile(seconds, 0.50), 2),
        "p99_seconds": round(percentile(seconds, 0.99), 2),
        "queue_drained_seconds": round(run.waiting_drained_seconds, 2),
        "all_done_seconds": round(run.seconds, 2),
        "peak_waiting": int(run.peak("vllm:num_requests_waiting")),
        "peak_running": int(run.peak("vllm:num_requests_running")),
        "peak_kv_usage": round(run.peak("vllm:kv_cache_usage_perc"), 3),
    }


def print_table(rows: list[dict], requests, seed: int, guard_log: list[str]) -> None:
    prompts = [len(r.prompt) for r in requests]
    new = [r.max_tokens for r in requests]
    print(
        f"burst: {len(requests)} requests at once (seed {seed}), prompts {min(prompts)}-{max(prompts)} tokens, "
        f"max_tokens {min(new)}-{max(new)}, ignore_eos; {sum(prompts) + sum(new)} tokens in all"
    )
    print(
        "engine: tiny llama (2 layers, 2 KV heads x 64), bf16, --kv-cache-memory-bytes 4194304 = 32 blocks of 128 tokens (31 usable)\n"
    )
    print(
        f"{'scheduler':<9} {'completed':>9} {'preemptions':>11} {'p50 e2e':>8} {'p99 e2e':>8} {'queue drained':>13} {'all done':>8} "
        f"{'peak waiting':>12} {'peak running':>12} {'peak KV':>7}"
    )
    for r in rows:
        print(
            f"{r['scheduler']:<9} {r['completed']:>6}/{r['sent']:<2} {r['preemptions']:>11} {r['p50_seconds']:>7.1f}s {r['p99_seconds']:>7.1f}s "
            f"{r['queue_drained_seconds']:>12.1f}s {r['all_done_seconds']:>7.1f}s {r['peak_waiting']:>12} {r['peak_running']:>12} {r['peak_kv_usage']:>7.0%}"
        )
    print("\nKV guard log:")
    for line in guard_log:
        print("  " + line.split("] ", 1)[-1])


def token_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        bounds = int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a range of token counts such as 32-384") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: need 1 <= LOW <= HIGH")
    return bounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--prompt-tokens", type=token_range, default=(32, 384), help="prompt lengths, LOW-HIGH (default 32-384)"
    )
    parser.add_argument(
        "--new-tokens", type=token_range, default=(64, 640), help="max_tokens, LOW-HIGH (default 64-640)"
    )
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    if max(options.prompt_tokens) + max(options.new_tokens) > 1024:
        parser.error("--prompt-tokens and --new-tokens must add up to 1024 at most (the engine's --max-model-len)")
    requests = burst(options.requests, options.seed, prompt_tokens=options.prompt_tokens, new_tokens=options.new_tokens)
    rows, guard_log = [], []
    with tempfile.TemporaryDirectory(prefix="kv-guard-burst-") as folder:
        model = build_model(Path(folder) / "tiny-llama")
        for name, scheduler in (("stock", None), ("kv-guard", GUARD)):
            with engine(model, Path(folder), scheduler) as server:
                rows.append(figures(name, run_burst(server, requests)))
                if scheduler:
                    guard_log = [line for line in server.log_text().splitlines() if "kvops guard" in line]
    if options.json:
        print(json.dumps({"seed": options.seed, "runs": rows}, indent=2))
    else:
        print_table(rows, requests, options.seed, guard_log)


if __name__ == "__main__":
    main()
