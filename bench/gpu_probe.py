"""What a GPU really has and does, beside the figures kvops plans and simulates with.

    python bench/gpu_probe.py probe [--model llama-3.1-8b] [--out probe.json]   # on the GPU machine: PyTorch only
    python bench/gpu_probe.py compare probe.json                                 # here: kvops' figures beside it

`probe` reads, on the GPU it runs on:
- the device total as nvidia-smi prints it and as PyTorch sees it (torch.cuda.mem_get_info, the total vLLM logs as
  total_gpu_memory and sizes its KV cache against): kvops/catalog/gpus.json and device_totals.json hold both;
- what a PyTorch process holds outside PyTorch's allocator once CUDA, cuBLAS and attention have run (the CUDA
  context and library workspaces: the floor under the plan's non-torch term);
- the achieved copy bandwidth and dense bf16 matrix throughput, beside the datasheet's (the step-time model's
  coefficients are efficiencies relative to the datasheet, fitted on H100s);
- the model's forward in plain PyTorch (random bf16 weights of the model's shapes, dense KV, one CUDA graph per
  decode batch): decode steps at several batch sizes and prefills of several lengths.

`compare` prints each beside what kvops says for the same GPU and batches: the catalog's totals and the step-time
model's price of the same batch (`kvops simulate`'s "gpu" profile). The forward is plain PyTorch, not vLLM: vLLM's
step adds scheduling, input preparation and sampling around a forward of similar kernels, so kvops' step should
cost at least the measured forward, and close to it where weight reads dominate (decode at small batches).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]

DECODE_BATCHES = (1, 16, 64, 256)
DECODE_CONTEXT = 1024
PREFILL_TOKENS = (512, 2048, 8192)
GIB = 1 << 30
MIB = 1 << 20


# --- on the GPU ----------------------------------------------------------------------------------------------


def nvidia_smi() -> dict[str, Any]:
    fields = "name,memory.total,memory.used,driver_version"
    line = subprocess.run(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()[0]
    name, total, used, driver = (part.strip() for part in line.split(","))
    return {"name": name, "total_mib": int(total), "used_mib": int(used), "driver": driver}


def timed(torch: Any, run: Any, repeats: int) -> float:
    """Mean seconds of `run` on the GPU, by CUDA events, after two warm-ups."""
    run()
    run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000.0 / repeats


class Forward:
    """A decoder's forward in plain PyTorch: RMSNorm, fused QKV, SDPA with grouped KV heads, SwiGLU MLP, LM head
    on the sampled tokens; random bf16 weights, each layer its own (so every step reads all of them)."""

    def __init__(self, torch: Any, config: dict[str, Any]) -> None:
        self.torch = torch
        self.hidden = config["hidden_size"]
        self.heads = config["num_attention_heads"]
        self.kv_heads = config.get("num_key_value_heads", self.heads)
        self.head_dim = config.get("head_dim") or self.hidden // self.heads
        self.layers = config["num_hidden_layers"]
        inner, vocab = config["intermediate_size"], config["vocab_size"]
        qkv = (self.heads + 2 * self.kv_heads) * self.head_dim

        def weight(rows: int, cols: int) -> Any:
            return torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 0.02

        self.weights = [
            (weight(self.hidden, qkv), weight(self.heads * self.head_dim, self.hidden),
             weight(self.hidden, 2 * inner), weight(inner, self.hidden))
            for _ in range(self.layers)
        ]  # fmt: skip
        self.head = weight(self.hidden, vocab)
        self.weight_bytes = sum(w.numel() * 2 for layer in self.weights for w in layer) + self.head.numel() * 2

    def _norm(self, x: Any) -> Any:
        return x * self.torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)

    def layer(self, x: Any, weights: tuple[Any, ...], cache: tuple[Any, Any] | None) -> Any:
        """x: [batch, tokens, hidden]; cache: the layer's keys and values [batch, kv_heads, context, head_dim]."""
        functional = self.torch.nn.functional
        batch, tokens, _ = x.shape
        w_qkv, w_o, w_up, w_down = weights
        qkv = self._norm(x) @ w_qkv
        q, k, v = qkv.split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1
        )
        q = q.view(batch, tokens, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        if cache is not None:  # the new tokens written into the cache's last slots, as a paged cache does
            cache[0][:, :, -tokens:].copy_(k)
            cache[1][:, :, -tokens:].copy_(v)
            k, v = cache
        attended = functional.scaled_dot_product_attention(q, k, v, is_causal=cache is None, enable_gqa=True)
        x = x + attended.transpose(1, 2).reshape(batch, tokens, -1) @ w_o
        gate, up = (self._norm(x) @ w_up).chunk(2, -1)
        return x + (functional.silu(gate) * up) @ w_down

    def step(self, x: Any, caches: list[tuple[Any, Any]] | None) -> Any:
        for index, weights in enumerate(self.weights):
            x = self.layer(x, weights, caches[index] if caches is not None else None)
        return self._norm(x[:, -1]) @ self.head  # logits for the sampled (last) token of each request

    def decode_seconds(self, batch: int, context: int) -> float:
        torch = self.torch
        shape = (batch, self.kv_heads, context + 1, self.head_dim)
        caches = [(torch.zeros(shape, device="cuda", dtype=torch.bfloat16),
                   torch.zeros(shape, device="cuda", dtype=torch.bfloat16)) for _ in range(self.layers)]  # fmt: skip
        x = torch.zeros(batch, 1, self.hidden, device="cuda", dtype=torch.bfloat16)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.step(x, caches)  # warm-up outside the graph, as capture requires
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.step(x, caches)
        seconds = timed(torch, graph.replay, 20)
        del graph, caches
        torch.cuda.empty_cache()
        return seconds

    def prefill_seconds(self, tokens: int) -> float:
        x = self.torch.zeros(1, tokens, self.hidden, device="cuda", dtype=self.torch.bfloat16)
        return timed(self.torch, lambda: self.step(x, None), 5)


def copy_bandwidth(torch: Any) -> float:
    """Bytes read and written per second by a 4 GiB device-to-device copy."""
    source = torch.empty(4 * GIB, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)
    return 2 * source.numel() / timed(torch, lambda: target.copy_(source), 10)


def matmul_flops(torch: Any) -> float:
    """Dense bf16 FLOP/s of an 8192 x 8192 x 8192 matrix product on random data."""
    matrix = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return 2 * 8192**3 / timed(torch, lambda: matrix @ matrix, 10)


def probe(model: str) -> dict[str, Any]:
    import torch

    smi_before = nvidia_smi()
    free, total = torch.cuda.mem_get_info()
    result: dict[str, Any] = {
        "nvidia_smi": smi_before,
        "torch": {
            "version": torch.__version__,
            "device": torch.cuda.get_device_name(),
            "mem_get_info_total_bytes": total,
            "properties_total_bytes": torch.cuda.get_device_properties(0).total_memory,
        },
    }
    result["copy_bytes_per_s"] = copy_bandwidth(torch)
    result["bf16_flops"] = matmul_flops(torch)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    used_by_process = total - free - smi_before["used_mib"] * MIB
    result["process_outside_torch_bytes"] = used_by_process - torch.cuda.memory_reserved()

    config = json.loads((REPO / "kvops" / "catalog" / "models" / f"{model}.json").read_text())["config"]
    forward = Forward(torch, config)
    result["model"] = {"name": model, "weight_bytes": forward.weight_bytes}
    result["decode"] = [
        {"batch": b, "context": DECODE_CONTEXT, "seconds": forward.decode_seconds(b, DECODE_CONTEXT)}
        for b in DECODE_BATCHES
    ]
    result["prefill"] = [{"tokens": t, "seconds": forward.prefill_seconds(t)} for t in PREFILL_TOKENS]
    return result


# --- here, beside kvops' figures ----------------------------------------------------------------------------------


def kvops_step_seconds(model: str, gpu: str) -> Any:
    """The step-time model's price of a batch on this GPU (the "gpu" profile, vLLM's default flags)."""
    from kvops.deployment import DeploymentOptions
    from kvops.planner import plan
    from kvops.simulate.cost import step_time
    from kvops.simulate.steptime import coefficients

    planned = plan(DeploymentOptions(model=model, gpu=gpu, max_model_len=8192).plan_inputs())
    return step_time(planned, coefficients("gpu")).seconds


def compare(path: Path, gpu: str) -> None:
    from kvops.gpus import find_gpu, gpu_performance
    from kvops.packaged import packaged_text

    measured = json.loads(path.read_text())
    smi, torch_view = measured["nvidia_smi"], measured["torch"]
    card = find_gpu(gpu)
    totals = json.loads(packaged_text("kvops.catalog", "device_totals.json"))["devices"]
    print(f"{torch_view['device']} (driver {smi['driver']}, PyTorch {torch_view['version']}) against kvops' {card.id}")
    print(
        f"  nvidia-smi total   {smi['total_mib']} MiB        kvops: {card.memory_mib:.0f} MiB (kvops/catalog/gpus.json)"
    )
    total = torch_view["mem_get_info_total_bytes"]
    logged = totals.get(card.id, {}).get("gib", "none")
    print(f"  PyTorch's total    {total / GIB:.2f} GiB         kvops: {logged} GiB (kvops/catalog/device_totals.json)")
    print(
        f"  outside PyTorch    {measured['process_outside_torch_bytes'] / MIB:.0f} MiB (CUDA context, cuBLAS, once used)"
    )
    performance = gpu_performance(card.id)
    bandwidth, flops = measured["copy_bytes_per_s"], measured["bf16_flops"]
    if performance is not None and performance.memory_bandwidth and performance.peak_flops("bf16"):
        sheet_bandwidth, sheet_flops = performance.memory_bandwidth, performance.peak_flops("bf16") or 1
        print(f"  copy bandwidth     {bandwidth / 1e12:.2f} TB/s = {bandwidth / sheet_bandwidth:.0%} of the datasheet")
        print(f"  bf16 matmul        {flops / 1e12:.0f} TFLOP/s = {flops / sheet_flops:.0%} of the datasheet")
    model = measured["model"]["name"]
    price = kvops_step_seconds(model, card.id)
    print(f"  {model}: plain PyTorch forward (ms) | kvops' vLLM step (ms), the same batch")
    for row in measured["decode"]:
        batch, context = row["batch"], row["context"]
        predicted = price([1] * batch, [context] * batch, batch)
        print(f"    decode {batch:>4} x {context} context  {row['seconds'] * 1e3:8.2f} | {predicted * 1e3:8.2f}")
    for row in measured["prefill"]:
        predicted = price([row["tokens"]], [0], 1)
        print(f"    prefill {row['tokens']:>5} tokens    {row['seconds'] * 1e3:8.2f} | {predicted * 1e3:8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    probing = commands.add_parser("probe", help="measure the GPU this runs on (PyTorch only)")
    probing.add_argument("--model", default="llama-3.1-8b", help="a kvops catalog model file's name")
    probing.add_argument("--out", type=Path, default=Path("probe.json"))
    comparing = commands.add_parser("compare", help="the probe's figures beside kvops'")
    comparing.add_argument("probe", type=Path)
    comparing.add_argument("--gpu", default="H200", help="the kvops catalog GPU the probe ran on")
    options = parser.parse_args()
    if options.command == "probe":
        started = time.monotonic()
        result = probe(options.model)
        result["probe_seconds"] = time.monotonic() - started
        options.out.write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
    else:
        compare(options.probe, options.gpu)


if __name__ == "__main__":
    main()
