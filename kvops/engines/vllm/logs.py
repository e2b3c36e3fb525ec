"""vLLM startup log lines: what the engine measured and sized, in the wordings of old and new releases.

Read (each as it appears in some release; the first occurrence wins, TP workers repeat them):
- weights:    "Model loading took 12.66 GiB memory and 31.6 seconds" (V1), "Model loading took 15.4137 GB and ..."
              and "Loading model weights took 14.9888 GB" (older; vLLM divided by 2**30, so GiB), V0 profile
              "model weights take 21.21GiB";
- KV budget:  "Available KV cache memory: 15.72 GiB" (V1), "... the rest of the memory reserved for KV Cache is
              1.57GiB." and "kv_cache_size=3.81GiB" (V0), "reserved 49.0 GiB memory for KV Cache as specified
              by kv_cache_memory_bytes" (pinned), CPU "Explicitly set (1.0/31.28) GiB for KV cache";
- totals:     "total_gpu_memory (23.58GiB) x gpu_memory_utilization (0.99)" and "total_gpu_memory=23.58GiB"
              (V0), CPU "(1.0/31.28) GiB";
- overheads:  "non_torch_memory takes 0.20GiB", "PyTorch activation peak memory takes 0.37GiB" and
              "peak_torch_memory=17.98GiB" (weights + activation peak, V0), DEBUG
              "torch peak memory increase: X GiB", "Estimated CUDA graph memory: 0.17 GiB total", "The current
              --gpu-memory-utilization=0.9200 is equivalent to --gpu-memory-utilization=0.9129 without CUDA graph
              memory profiling", "Graph capturing finished in 5 secs, took 0.52 GiB";
- capacity:   "# GPU blocks: 1381" (early V1/V0), "GPU KV cache size: 2,042,016 tokens" and
              "Maximum concurrency for 2,048 tokens per request: 997.08x" (two lines, 0.7-0.2x) or one line
              "GPU KV cache size: N tokens, Maximum concurrency for L tokens per request: C x" (newer; "CPU" on the
              CPU build);
- config:     "non-default args: {...}" (the flags given), "Using max model len 1024", "(v0.32.0)".
Memory figures are logged with two decimals of GiB: each is exact to +-5 MiB only.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

GiB = 1 << 30
ANSI = re.compile(r"\x1b\[[0-9;]*m|\[[0-9;]*m(?=\()")
_NUMBER = r"([\d.]+)"
_INT = r"([\d,]+)"


def gib(text: str) -> int:
    return round(float(text) * GiB)


def integer(text: str) -> int:
    return int(text.replace(",", ""))


# (fact, pattern, converter of the match) in the order they are tried
PATTERNS: list[tuple[str, re.Pattern, Any]] = [
    ("weights_bytes", re.compile(r"(?:Model loading|Loading model weights) took " + _NUMBER + r" ?(?:GiB|GB)"), lambda m: gib(m.group(1))),
    ("weights_bytes", re.compile(r"model weights take " + _NUMBER + r" ?GiB"), lambda m: gib(m.group(1))),
    ("kv_cache_bytes", re.compile(r"Available KV cache memory: " + _NUMBER + r" ?GiB"), lambda m: gib(m.group(1))),
    ("kv_cache_bytes", re.compile(r"the rest of the memory reserved for KV Cache is " + _NUMBER + r" ?GiB"), lambda m: gib(m.group(1))),
    ("kv_cache_bytes", re.compile(r"kv_cache_size=" + _NUMBER + r" ?GiB"), lambda m: gib(m.group(1))),
    ("kv_cache_bytes", re.compile(r"reserved " + _NUMBER + r" GiB memory for KV Cache as specified by kv_cache_memory_bytes"), lambda m: gib(m.group(1))),
    ("kv_cache_bytes", re.compile(r"(?:Explicitly|Auto) set \(" + _NUMBER + r"/[\d.]+\) GiB for KV cache"), lambda m: gib(m.group(1))),
    ("total_memory_bytes", re.compile(r"total_gpu_memory[ =]\(?" + _NUMBER + r" ?GiB"), lambda m: gib(m.group(1))),
    ("total_memory_bytes", re.compile(r"(?:Explicitly|Auto) set \([\d.]+/" + _NUMBER + r"\) GiB for KV cache"), lambda m: gib(m.group(1))),
    ("gpu_memory_utilization", re.compile(r"gpu_memory_utilization[ =]\(?" + _NUMBER), lambda m: float(m.group(1))),
    ("non_torch_bytes", re.compile(r"non_torch_memory(?: takes |=)" + _NUMBER + r" ?GiB"), lambda m: gib(m.group(1))),
    ("activation_bytes", re.compile(r"PyTorch activation peak memory takes " + _NUMBER + r" ?GiB"), lambda m: gib(m.group(1))),
    ("activation_bytes", re.compile(r"torch peak memory increase: " + _NUMBER + r" ?GiB"), lambda m: gib(m.group(1))),
    ("peak_torch_bytes", re.compile(r"peak_torch_memory=" + _NUMBER + r" ?GiB"), lambda m: gib(m.group(1))),
    ("cudagraph_bytes", re.compile(r"Estimated CUDA graph memory: " + _NUMBER + r" ?GiB"), lambda m: gib(m.group(1))),
    ("cudagraph_utilization", re.compile(r"current --gpu-memory-utilization=" + _NUMBER + r" is equivalent to --gpu-memory-utilization=" + _NUMBER), lambda m: (float(m.group(1)), float(m.group(2)))),
    ("cudagraph_captured_bytes", re.compile(r"Graph capturing finished in \d+ secs?, took " + _NUMBER + r" GiB"), lambda m: gib(m.group(1))),
    ("num_gpu_blocks", re.compile(r"# (?:GPU|CPU) blocks: " + _INT), lambda m: integer(m.group(1))),
    ("kv_cache_size_tokens", re.compile(r"(GPU|CPU|XPU|TPU)(?: \+ host)? KV cache size: " + _INT + " tokens"), lambda m: (m.group(1), integer(m.group(2)))),
    ("max_concurrency", re.compile(r"Maximum concurrency for " + _INT + r" tokens per request: " + _NUMBER + "x"), lambda m: (integer(m.group(1)), float(m.group(2)))),
    ("max_model_len", re.compile(r"Using max model len (\d+)"), lambda m: int(m.group(1))),
    ("version", re.compile(r"V1 LLM engine \(v([^)]+)\)"), lambda m: m.group(1)),
    ("args", re.compile(r"non-default args: (\{.*\})\s*$"), lambda m: _literal(m.group(1))),
]


def _literal(text: str) -> dict[str, Any]:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class VllmLog:
    """What one vLLM startup log says, with the line each fact was read from."""

    facts: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, str] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        return self.facts.get(name, default)

    @property
    def device(self) -> str | None:
        found = self.facts.get("kv_cache_size_tokens")
        if found:
            return "cpu" if found[0] == "CPU" else "gpu"
        return None

    @property
    def kv_cache_size_tokens(self) -> int | None:
        found = self.facts.get("kv_cache_size_tokens")
        return found[1] if found else None

    @property
    def max_model_len(self) -> int | None:
        concurrency = self.facts.get("max_concurrency")
        return concurrency[0] if concurrency else self.facts.get("max_model_len") or self.args.get("max_model_len")

    @property
    def max_concurrency(self) -> float | None:
        concurrency = self.facts.get("max_concurrency")
        return concurrency[1] if concurrency else None

    @property
    def args(self) -> dict[str, Any]:
        return self.facts.get("args", {})

    @property
    def activation_bytes(self) -> int | None:
        """The activation peak: logged directly, or V0's peak torch memory less the weights."""
        if "activation_bytes" in self.facts:
            return self.facts["activation_bytes"]
        if "peak_torch_bytes" in self.facts and "weights_bytes" in self.facts:
            return self.facts["peak_torch_bytes"] - self.facts["weights_bytes"]
        return None

    def cudagraph_bytes(self, total: int | None) -> int | None:
        """The CUDA-graph estimate vLLM applied: logged in GiB, or as the utilization it is worth."""
        if "cudagraph_bytes" in self.facts:
            return self.facts["cudagraph_bytes"]
        pair = self.facts.get("cudagraph_utilization")
        if pair and total:
            return round((pair[0] - pair[1]) * total)
        return None


def parse_vllm_log(text: str) -> VllmLog:
    log = VllmLog()
    for raw in text.splitlines():
        line = ANSI.sub("", raw)
        for name, pattern, convert in PATTERNS:
            if name in log.facts:
                continue
            match = pattern.search(line)
            if match:
                log.facts[name] = convert(match)
                log.lines[name] = line.strip()
    return log
