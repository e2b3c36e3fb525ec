"""vLLM startup log lines: what the engine measured and sized, in the wordings of old and new releases.

Read (each as it appears in some release; the first occurrence wins, TP workers repeat them):
- weights:    "Model loading took 12.66 GiB memory and 31.6 seconds" (V1), "Model loading took 15.4137 GB and ..."
              and "Loading model weights took 14.9888 GB" (older; vLLM divided by 2**30, so GiB), V0 profile
              "model weights take 21.21GiB";
- KV budget:  "Available KV cache memory: 15.72 GiB" (V1), "... the rest of the memory reserved for KV Cache is
              1.57GiB." and "kv_cache_size=3.81GiB" (V0), "reserved 49.0 GiB memory for KV Cache as specified
              by kv_cache_memory_bytes" (pinned), CPU "Explicitly set (1.0/31.28) GiB for KV cache"; with 0.34's
              extensible KV cache, "Extended KV cache to 7624 blocks (59.56 GiB)" and "Memory after warmup: ..."
              (the KV it kept; "Available KV cache memory" is then the range reserved before warmup);
- totals:     "total_gpu_memory (23.58GiB) x gpu_memory_utilization (0.99)" and "total_gpu_memory=23.58GiB"
              (V0), CPU "(1.0/31.28) GiB"; free at startup: the startup summary's, and a pinned run's
              "Initial free memory 78.69 GiB, reserved ...";
- overheads:  "non_torch_memory takes 0.20GiB", "PyTorch activation peak memory takes 0.37GiB" and
              "peak_torch_memory=17.98GiB" (weights + activation peak, V0), DEBUG
              "torch peak memory increase: X GiB", "Estimated CUDA graph memory: 0.17 GiB total", "The current
              --gpu-memory-utilization=0.9200 is equivalent to --gpu-memory-utilization=0.9129 without CUDA graph
              memory profiling", "Graph capturing finished in 5 secs, took 0.52 GiB";
- capacity:   "# GPU blocks: 1381" (early V1/V0), "GPU KV cache size: 2,042,016 tokens" and
              "Maximum concurrency for 2,048 tokens per request: 997.08x" (two lines, 0.7-0.2x) or one line
              "GPU KV cache size: N tokens, Maximum concurrency for L tokens per request: C x" (newer; "CPU" on the
              CPU build);
- config:     "non-default args: {...}" (the flags given), "Using max model len 1024", "(v0.32.0)", "vLLM server
              version 0.34.0, serving model M" (the banner without its logo);
- summary:    "Free memory on device (F/T GiB) on startup. Desired GPU memory utilization is (u, R GiB). Actual
              usage is A GiB for consumed memory (weights + non-torch), B GiB for peak activation, and C GiB for
              CUDAGraph memory. ... Current kv cache memory in use is K GiB." (0.11+; B includes the CUDA-graph
              estimate when vLLM applied it), and its first wording "Actual usage is W GiB for weight, B GiB for
              peak activation, N GiB for non-torch memory, and C GiB for CUDAGraph memory ... N bytes." (0.10);
              "CUDA graph pool memory: C GiB (actual), E GiB (estimated)".
Memory figures are logged with two decimals of GiB: each is exact to +-5 MiB only.

`find_failure` reads why a run died: torch's CUDA/HIP out-of-memory message (kvops.engines.oom) (which phase of startup or serving it
hit, from the traceback's frames or, failing those, the last startup milestone), vLLM's KV budget errors ("KV cache
is needed, which is larger than the available KV cache memory", V0's "max seq len ... larger than the maximum number
of tokens that can be stored in KV cache", "No available memory for the cache blocks", a negative "Available KV
cache memory") and the startup check "Free memory on device ... is less than desired GPU memory utilization".
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace
from typing import Any

from kvops.engines.logs import LogFacts, LogPattern
from kvops.engines.oom import TORCH_OOM, OutOfMemory, out_of_memory
from kvops.engines.vllm.budget import MARGIN_FLOOR, MARGIN_FRACTION
from kvops.engines.vllm.releases import VllmRelease, from_log
from kvops.frozen import frozen
from kvops.units import GiB, format_bytes

ANSI = re.compile(r"\x1b\[[0-9;]*m|\[[0-9;]*m(?=\()")
_NUMBER = r"(\d+(?:\.\d+)?)"
_INT = r"([\d,]+)"
# Linear by construction (a log line is input: a 1 MB line must not take minutes). A pattern that begins with a
# number starts only where a number starts, so a run of digits is tried once, not at each digit; a `.*` after a
# phrase stops at the phrase's next occurrence, so the phrase repeated along a line is not scanned to the end each time.
_LEAD_NUMBER = r"(?<![\d.])" + _NUMBER


def _until_next(phrase: str) -> str:
    """Any text up to (not into) the next occurrence of `phrase`: `.*` for a pattern that starts with it."""
    return r"(?:(?!" + re.escape(phrase) + r").)*"


def gib(text: str) -> int:
    return round(float(text) * GiB)


def integer(text: str) -> int:
    return int(text.replace(",", ""))


# (fact, pattern, converter of the match) in the order they are tried
_SUMMARY_FREE = re.compile(r"Free memory on device (?:\S+ )?\(([\d.]+)/([\d.]+) GiB\) on startup")
_DESIRED = re.compile(r"[Dd]esired GPU memory utilization(?: is)? \(([\d.]+), ([\d.]+) GiB\)")
_CURRENT_KV = re.compile(r"Current kv cache memory in use is ([\d.]+) (GiB|bytes)")
# lines only the V0 engine prints (its worker's memory profile and block count)
_V0_WORDING = re.compile(
    r"Memory profiling results|the current vLLM instance can use|model weights take|# (?:GPU|cuda|CUDA) blocks|GPU blocks: [\d,]+, # CPU blocks"
)

PATTERNS: list[LogPattern] = [
    (
        "weights_bytes",
        re.compile(r"(?:Model loading|Loading model weights) took " + _NUMBER + r" ?(?:GiB|GB)"),
        lambda m: gib(m.group(1)),
    ),
    ("weights_bytes", re.compile(r"model weights take\s+" + _NUMBER + r" ?GiB"), lambda m: gib(m.group(1))),
    ("weights_bytes", re.compile(r"Actual usage is " + _NUMBER + r" GiB for weight,"), lambda m: gib(m.group(1))),
    ("kv_cache_bytes", re.compile(r"Available KV cache memory: (-?[\d.]+) ?GiB"), lambda m: gib(m.group(1))),
    (
        "kv_cache_bytes",
        re.compile(r"the rest of the memory reserved for KV Cache is (-?[\d.]+) ?GiB"),
        lambda m: gib(m.group(1)),
    ),
    ("kv_cache_bytes", re.compile(r"available_kv_cache_memory\s+(-?[\d.]+) ?GiB"), lambda m: gib(m.group(1))),
    ("kv_cache_bytes", re.compile(r"kv_cache_size=(-?[\d.]+) ?GiB"), lambda m: gib(m.group(1))),
    (
        "kv_cache_bytes",
        re.compile(r"reserved " + _NUMBER + r" GiB memory for KV Cache as specified by kv_cache_memory_bytes"),
        lambda m: gib(m.group(1)),
    ),
    (
        "kv_cache_bytes",
        re.compile(r"(?:Explicitly|Auto) set \(" + _NUMBER + r"/[\d.]+\) GiB for KV cache"),
        lambda m: gib(m.group(1)),
    ),
    ("kv_cache_bytes", _CURRENT_KV, lambda m: gib(m.group(1)) if m.group(2) == "GiB" else int(m.group(1))),
    ("total_memory_bytes", re.compile(r"total_gpu_memory(?:=|\s+\(?)" + _NUMBER + r" ?GiB"), lambda m: gib(m.group(1))),
    (
        "total_memory_bytes",
        re.compile(r"(?:Explicitly|Auto) set \([\d.]+/" + _NUMBER + r"\) GiB for KV cache"),
        lambda m: gib(m.group(1)),
    ),
    ("total_memory_bytes", _SUMMARY_FREE, lambda m: gib(m.group(2))),
    (
        "total_memory_bytes",
        re.compile(r"memory snapshot: " + _until_next("memory snapshot: ") + r"total_memory=" + _NUMBER + r"GiB"),
        lambda m: gib(m.group(1)),
    ),
    ("startup_free_bytes", _SUMMARY_FREE, lambda m: gib(m.group(1))),
    # a pinned KV cache's line (gpu_worker.py determine_available_memory: init_snapshot.free_memory, 0.34.0 l.697)
    (
        "startup_free_bytes",
        re.compile(r"Initial free memory " + _NUMBER + r" GiB, reserved [\d.]+ GiB memory for KV Cache"),
        lambda m: gib(m.group(1)),
    ),
    (
        "gpu_memory_utilization",
        re.compile(r"gpu_memory_utilization(?:=|\s+\(?)" + _NUMBER),
        lambda m: float(m.group(1)),
    ),
    ("gpu_memory_utilization", _DESIRED, lambda m: float(m.group(1))),
    ("requested_bytes", _DESIRED, lambda m: gib(m.group(2))),
    (
        "requested_bytes",
        re.compile(r"gpu_memory_utilization \([\d.]+\) = " + _NUMBER + r" ?GiB"),
        lambda m: gib(m.group(1)),
    ),
    (
        "requested_bytes",
        re.compile(r"the current vLLM instance can use\s+" + _NUMBER + r" ?GiB"),
        lambda m: gib(m.group(1)),
    ),
    (
        "non_torch_bytes",
        re.compile(r"(?<!, )non_torch_memory(?: takes |=|\s+)" + _NUMBER + r" ?GiB"),  # not the init snapshot's
        lambda m: gib(m.group(1)),
    ),
    ("non_torch_bytes", re.compile(_LEAD_NUMBER + r" GiB for non-torch memory"), lambda m: gib(m.group(1))),
    (
        "non_torch_bytes",
        re.compile(r"non-torch forward increase memory: " + _NUMBER + r" ?GiB"),
        lambda m: gib(m.group(1)),
    ),
    (
        "activation_bytes",
        re.compile(r"PyTorch activation peak memory(?: takes)?\s+" + _NUMBER + r" ?GiB"),
        lambda m: gib(m.group(1)),
    ),
    ("activation_bytes", re.compile(r"torch peak memory increase: " + _NUMBER + r" ?GiB"), lambda m: gib(m.group(1))),
    ("peak_torch_bytes", re.compile(r"peak_torch_memory=" + _NUMBER + r" ?GiB"), lambda m: gib(m.group(1))),
    (
        "consumed_bytes",
        re.compile(r"Actual usage is " + _NUMBER + r" GiB for consumed memory"),
        lambda m: gib(m.group(1)),
    ),
    ("peak_activation_bytes", re.compile(_LEAD_NUMBER + r" GiB for peak activation"), lambda m: gib(m.group(1))),
    ("cudagraph_bytes", re.compile(r"Estimated CUDA graph memory: " + _NUMBER + r" ?GiB"), lambda m: gib(m.group(1))),
    # the batch sizes the run captured, from its config line (the list's length)
    (
        "cudagraph_captures",
        re.compile(r"""["']cudagraph_capture_sizes["']: ?\[([\d, ]+)\]"""),
        lambda m: len(m.group(1).split(",")),
    ),
    (
        "cudagraph_bytes",
        re.compile(r"CUDA graph pool memory: [\d.]+ GiB \(actual\), " + _NUMBER + r" GiB \(estimated\)"),
        lambda m: gib(m.group(1)),
    ),
    (
        "cudagraph_utilization",
        re.compile(
            r"current --gpu-memory-utilization=" + _NUMBER + r" is equivalent to --gpu-memory-utilization=" + _NUMBER
        ),
        lambda m: (float(m.group(1)), float(m.group(2))),
    ),
    (
        "cudagraph_estimate_disabled",
        re.compile(r"CUDA graph memory profiling is disabled|CUDA graph memory profiling will be enabled by default"),
        lambda m: True,
    ),
    (
        "cudagraph_captured_bytes",
        re.compile(r"CUDA graph pool memory: " + _NUMBER + r" GiB \(actual\)"),
        lambda m: gib(m.group(1)),
    ),
    (
        "cudagraph_captured_bytes",
        re.compile(r"Graph capturing finished in \d+ secs?, took " + _NUMBER + r" GiB"),
        lambda m: gib(m.group(1)),
    ),
    ("cudagraph_captured_bytes", re.compile(_LEAD_NUMBER + r" GiB for CUDAGraph memory"), lambda m: gib(m.group(1))),
    ("model_runner_v2", re.compile(r"Using V2 Model Runner"), lambda m: True),  # gpu_worker.py, 0.24.0 on
    ("num_gpu_blocks", re.compile(r"(?:GPU|cuda|CUDA) blocks: " + _INT), lambda m: integer(m.group(1))),
    # the CPU executor's own pool; on a GPU log the same line's "# CPU blocks" is the swap space, not the pool
    (
        "num_gpu_blocks",
        re.compile(r"^(?!.*(?:GPU|cuda|CUDA) blocks).*# CPU blocks: " + _INT),
        lambda m: integer(m.group(1)),
    ),
    (
        "kv_cache_size_tokens",
        re.compile(r"(GPU|CPU|XPU|TPU)(?: \+ host)? KV cache size: " + _INT + " tokens"),
        lambda m: (m.group(1), integer(m.group(2))),
    ),
    (
        "max_concurrency",
        re.compile(r"Maximum concurrency for " + _INT + r" tokens per request: " + _NUMBER + "x"),
        lambda m: (integer(m.group(1)), float(m.group(2))),
    ),
    ("max_model_len", re.compile(r"Using max model len (\d+)"), lambda m: int(m.group(1))),
    ("version", re.compile(r"(?:V[01] )?LLM engine \(v([^)\s]+)\)"), lambda m: m.group(1)),
    ("version", re.compile(r"vLLM API server version (\d[\w.+-]*)"), lambda m: m.group(1)),
    # the banner's plain wording, without the logo (VLLM_DISABLE_LOG_LOGO, or a formatter that is not vLLM's):
    # entrypoints/serve/utils/api_utils.py l.327 in 0.32.0, entrypoints/common/startup.py l.18 in 0.33.0-0.34.0
    ("version", re.compile(r"vLLM server version (\d[\w.+-]*), serving model"), lambda m: m.group(1)),
    ("version", re.compile(r"\u2588 +version (\d[\w.+-]*)"), lambda m: m.group(1)),  # the startup banner
    ("version", re.compile(r"\bvLLM: (\d+\.\d[\w.+-]*?)\.?(?:\s|$)"), lambda m: m.group(1)),  # Unsloth's banner
    ("engine_generation", re.compile(r"Initializing an? (V[01]) LLM engine"), lambda m: m.group(1)),
    # vLLM 0.34's extensible KV cache (v1/worker/extensible_kv_cache.py extend_kv_cache, measure_kv_cache_blocks):
    # the KV it committed after warmup, and the measurement it sized from
    (
        "extended_kv",
        re.compile(r"Extended KV cache to " + _INT + r" blocks \(" + _NUMBER + r" GiB\)"),
        lambda m: (integer(m.group(1)), gib(m.group(2))),
    ),
    (
        "after_warmup",
        re.compile(
            r"Memory after warmup: "
            + _NUMBER
            + r" GiB free, "
            + _NUMBER
            + r" GiB committed to the KV cache, "
            + _NUMBER
            + r" GiB kept for transient activations \("
            + _NUMBER
            + r" GiB allocated at peak, "
            + _NUMBER
            + r" GiB of torch reservation growth\); "
            + _INT
            + r" KV cache blocks \("
            + _NUMBER
            + r" GiB\) fit within the requested "
            + _NUMBER
            + r" GiB"
        ),
        lambda m: {
            "free_bytes": gib(m.group(1)),
            "committed_bytes": gib(m.group(2)),
            "transient_bytes": gib(m.group(3)),
            "peak_bytes": gib(m.group(4)),
            "growth_bytes": gib(m.group(5)),
            "blocks": integer(m.group(6)),
            "kv_bytes": gib(m.group(7)),
            "requested_bytes": gib(m.group(8)),
        },
    ),
    # the engine core turning it off where a worker cannot map driver memory (v1/executor/abstract.py, 0.34.0 l.175)
    (
        "extensible_disabled",
        re.compile(
            r"Disabling the extensible KV cache: ("
            + _until_next("Disabling the extensible KV cache: ")
            + r")\. The KV cache will be sized from profiling estimates"
        ),
        lambda m: m.group(1),
    ),
    # ... and the config turning it off for NIXL on a host without an IMEX channel (config/vllm.py, 0.34.0 l.3256)
    (
        "extensible_disabled",
        re.compile(r"Extensible KV cache off: (without an IMEX channel), KV transfers within a host"),
        lambda m: m.group(1),
    ),
    ("v0_wording", _V0_WORDING, lambda m: m.group(0)),
    (
        "args",
        re.compile(r"non-default args: (\{" + _until_next("non-default args: ") + r"\})\s*$"),
        lambda m: _literal(m.group(1)),
    ),
    ("cpu_build", re.compile(r"\[cpu_(?:worker|model_runner)\.py:\d+\]|GiB for KV cache on node"), lambda m: True),
]


# What vLLM's "non-default args" repr holds that is not a Python literal: torch dtypes, enum reprs (their member's
# name: <CUDAGraphMode.NONE: 0> is 'NONE'; other <...> reprs None), and the compilation config printed as JSON
# (true/false/null)
_NOT_LITERAL = (
    (re.compile(r"\btorch\.(\w+)"), r"'\1'"),
    (re.compile(r"<\w+\.(\w+): [^<>]*>"), r"'\1'"),
    (re.compile(r"<[^<>]*>"), "None"),
    (re.compile(r"\btrue\b"), "True"),
    (re.compile(r"\bfalse\b"), "False"),
    (re.compile(r"\bnull\b"), "None"),
)


def _literal(text: str) -> dict[str, Any]:
    for pattern, replacement in _NOT_LITERAL:
        text = pattern.sub(replacement, text)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class VllmLog(LogFacts):
    """What one vLLM startup log says, with the line each fact was read from."""

    failure: Failure | None = None

    @property
    def device(self) -> str | None:
        found = self.facts.get("kv_cache_size_tokens")
        if found:
            return "cpu" if found[0] == "CPU" else "gpu"
        if self.facts.get("cpu_build"):
            return "cpu"
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
    def v0(self) -> bool:
        """The V0 engine ran: its log says so, or it prints what only V0 prints."""
        generation = self.facts.get("engine_generation")
        return generation == "V0" if generation else "v0_wording" in self.facts

    def release(self) -> VllmRelease | None:
        """The release this log names, or None when it names no version; a 0.7 log that says "Initializing a V1 LLM
        engine" ran V1 (VLLM_USE_V1=1), and a 0.34 log that extended its KV cache sized it with the extensible KV
        cache."""
        found = from_log(self.facts.get("version"), self.v0, self.facts.get("engine_generation") == "V1")
        if found is not None and self.extensible:
            return replace(found, extensible=True)
        return found

    @property
    def extensible(self) -> bool:
        """The run sized its KV cache after warmup (vLLM 0.34's extensible KV cache)."""
        return "extended_kv" in self.facts or "after_warmup" in self.facts

    def settle(self) -> None:
        """With the extensible KV cache, 'Available KV cache memory' is only the address range reserved before
        warmup; the KV the run kept is what it extended the cache to (kept as the log's KV, its blocks as its
        block count; the reservation stays as reserved_kv_bytes)."""
        extended = self.facts.get("extended_kv")
        warmup = self.facts.get("after_warmup")
        if extended is None and warmup is None:
            return
        if "kv_cache_bytes" in self.facts:
            self._keep("reserved_kv_bytes", self.facts["kv_cache_bytes"], "kv_cache_bytes")
        if extended is not None:
            (blocks, kv), source = extended, "extended_kv"
        else:
            assert warmup is not None
            blocks, kv, source = warmup["blocks"], warmup["kv_bytes"], "after_warmup"
        self._keep("kv_cache_bytes", kv, source)
        self._keep("num_gpu_blocks", blocks, source)

    def sizing(self) -> str | None:
        """How the run sized its KV cache, in `kvops plan --explain`'s words (its "KV sizing" note and vllm_margin
        term), where the log shows the extensible KV cache or vLLM turning it off; None otherwise."""
        if "extensible_disabled" in self.facts:
            return (
                f"KV sizing: profiler: vLLM turned the extensible KV cache off (log: "
                f"'{self.matches['extensible_disabled']}'): sized from the memory profile before warmup, as 0.20-0.33 "
                "do (v1/executor/abstract.py disable_extensible_kv_cache, config/vllm.py _resolve_extensible_kv_cache)"
            )
        if not self.extensible:
            return None
        kept = "extended_kv" if "extended_kv" in self.facts else "after_warmup"
        text = (
            "KV sizing: extensible: the extensible KV cache, sized after warmup and CUDA-graph capture from the "
            f"memory actually free (log: '{self.matches[kept]}')"
        )
        if "reserved_kv_bytes" in self.facts:
            text += (
                f"; its '{self.matches['reserved_kv_bytes']}' is the address range reserved before warmup, not the "
                "KV it kept"
            )
        warmup = self.facts.get("after_warmup")
        if warmup is None:
            return text
        margin = max(MARGIN_FLOOR["nvidia"], int(warmup["peak_bytes"] * MARGIN_FRACTION))
        return text + (
            f"; vllm_margin {format_bytes(margin)} = max({format_bytes(MARGIN_FLOOR['nvidia'])}, {MARGIN_FRACTION:g} "
            f"x transient {format_bytes(warmup['peak_bytes'])}) kept free beside the "
            f"{format_bytes(warmup['transient_bytes'])} kept for transient activations (KV_CACHE_MARGIN_FLOOR_BYTES, "
            f"{format_bytes(MARGIN_FLOOR['amd'])} on ROCm; KV_CACHE_MARGIN_FRACTION, v1/worker/extensible_kv_cache.py)"
        )

    def _keep(self, fact: str, value: Any, source: str) -> None:
        """Set a fact with the line and words of the fact it was read from (quoted where it is reported)."""
        self.facts[fact] = value
        self.lines[fact], self.matches[fact] = self.lines[source], self.matches[source]

    @property
    def activation_bytes(self) -> int | None:
        """The activation peak: logged directly, V0's peak torch memory less the weights, or the startup summary's
        "peak activation" less the CUDA-graph estimate vLLM folds into it (`gpu_worker.py`: transient peak + the
        applied estimate; 0.10's first wording has no estimate in it)."""
        if "activation_bytes" in self.facts:
            return self.facts["activation_bytes"]
        if "peak_torch_bytes" in self.facts and "weights_bytes" in self.facts:
            return self.facts["peak_torch_bytes"] - self.facts["weights_bytes"]
        if "peak_activation_bytes" in self.facts:
            return self.facts["peak_activation_bytes"] - (self.cudagraph_estimate_applied or 0)
        return None

    @property
    def cudagraph_estimate_applied(self) -> int | None:
        """The CUDA-graph estimate vLLM took from the KV budget (None when it logged none or profiling was off)."""
        if self.facts.get("cudagraph_estimate_disabled") or not {
            "consumed_bytes",
            "cudagraph_bytes",
            "cudagraph_utilization",
        } & set(self.facts):
            return None
        return self.cudagraph_bytes(self.facts.get("total_memory_bytes"))

    @property
    def non_torch_bytes(self) -> int | None:
        """Non-torch memory: logged, or the startup summary's "consumed (weights + non-torch)" less the weights."""
        if "non_torch_bytes" in self.facts:
            return self.facts["non_torch_bytes"]
        if "consumed_bytes" in self.facts and "weights_bytes" in self.facts:
            return self.facts["consumed_bytes"] - self.facts["weights_bytes"]
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
    lines = [ANSI.sub("", raw) for raw in text.splitlines()]
    for line in lines:
        log.read(line, PATTERNS)
    _least_warmup(log, lines)
    log.failure = find_failure(text)
    log.settle()
    return log


def _least_warmup(log: VllmLog, lines: list[str]) -> None:
    """Each rank logs its own measurement after warmup and all commit the least (gpu_worker.py _min_across_ranks,
    0.34.0): keep that rank's line, not the first printed."""
    if "after_warmup" not in log.facts:
        return
    pattern, convert = next((pattern, convert) for name, pattern, convert in PATTERNS if name == "after_warmup")
    for line in lines:
        match = pattern.search(line)
        if match and convert(match)["blocks"] < log.facts["after_warmup"]["blocks"]:
            log.facts["after_warmup"] = convert(match)
            log.lines["after_warmup"], log.matches["after_warmup"] = line.strip(), match.group(0)


# --- why a run died -------------------------------------------------------------------------------------

PHASES = ("weights", "activation", "cuda_graphs", "kv_cache", "serving")

_CUDA_ERROR_OOM = re.compile(r"(?:CUDA|HIP) error: out of memory")
_WRAPPED_OOM = re.compile(r"out of memory occurred when warming up (sampler|pooler)(?: with (\d+) dummy requests)?")
_KV_NEEDED = re.compile(
    r"To serve at least one request with the models?'s max seq len \((\d+)\),\s*\(?([\d.]+) GiB KV cache is needed, which is "
    r"larger than the available KV cache memory \(([\d.]+) GiB\)\.(?:\s*Based on the available memory, the estimated maximum "
    r"model length is (\d+)\.)?"
)
_V0_KV_TOKENS = re.compile(
    r"The model's max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((\d+)\)"
)
_NO_KV = re.compile(r"No available memory for the cache blocks")
_STARTUP_FREE = re.compile(
    r"Free memory on device (?:\S+ )?\(([\d.]+)/([\d.]+) GiB\) on startup is less than desired GPU memory utilization \(([\d.]+), ([\d.]+) GiB\)"
)
_FRAME = re.compile(r'File "[^"]*", line \d+, in (\S+)')

# Functions whose frame in a traceback names the phase; where frames nest (capture inside the profile pass, the
# V0 profile run calling execute_model) the earlier phase in this order wins.
_PHASE_FRAMES: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "cuda_graphs",
        frozenset(
            {
                "capture_model",
                "_capture_cudagraphs",
                "profile_cudagraph_memory",
                "capture_end",
                "capture_begin",
                "_warmup_and_capture",
                "capture",
            }
        ),
    ),
    (
        "kv_cache",
        frozenset(
            {
                "initialize_from_config",
                "initialize_kv_cache",
                "initialize_kv_cache_tensors",
                "_allocate_kv_cache_tensors",
                "_reshape_kv_cache_tensors",
                "_init_cache_engine",
                "_allocate_kv_cache",
                "allocate_kv_cache",
            }
        ),
    ),
    (
        "activation",
        frozenset(
            {
                "determine_available_memory",
                "determine_num_available_blocks",
                "profile_run",
                "_dummy_sampler_run",
                "_dummy_pooler_run",
            }
        ),
    ),
    (
        "weights",
        frozenset(
            {
                "load_model",
                "get_model",
                "initialize_model",
                "_initialize_model",
                "load_weights",
                "create_weights",
                "weight_loader",
                "load_weights_and_postprocess",
            }
        ),
    ),
    (
        "serving",
        frozenset(
            {
                "execute_model",
                "execute_model_async",
                "step",
                "step_async",
                "engine_step",
                "run_engine_loop",
                "run_busy_loop",
                "_process_engine_step",
                "step_with_batch_queue",
                "sample_tokens",
            }
        ),
    ),
)
# Startup milestones, in the order vLLM logs them: the phase a failure after each one falls in.
_MILESTONES: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"Starting to load model|Loading safetensors checkpoint shards|Loading weights took"), "weights"),
    (re.compile(r"Model loading took|Loading model weights took"), "activation"),
    (re.compile(r"Profiling CUDA graph memory"), "cuda_graphs"),
    (
        re.compile(
            r"Available KV cache memory|# (?:GPU|CPU|cuda|CUDA) blocks|KV cache size: [\d,]+ tokens|reserved for KV Cache is|kv_cache_size=|GiB for KV cache|memory for KV Cache as specified"
        ),
        "kv_cache",
    ),
    (re.compile(r"Capturing CUDA graph|Capturing cudagraphs|Capturing the model for CUDA graphs"), "cuda_graphs"),
    (re.compile(r"Graph capturing finished"), "activation"),
    (
        re.compile(
            r"init engine \(profile, create kv cache, warmup model\) took|Starting vLLM (?:API )?server|Application startup complete|Avg prompt throughput"
        ),
        "serving",
    ),
)
_MESSAGE_PHASES: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"Failed to load model - not enough GPU memory|Failed to create \S+ (?:\S+ )?weights"), "weights"),
    (_WRAPPED_OOM, "activation"),
)


# a negative KV budget in each release's wording (V1 "Available KV cache memory", V0's profile lines)
_NEGATIVE_KV = re.compile(
    r"(?:Available KV cache memory:|reserved for KV Cache is|kv_cache_size=|available_kv_cache_memory)\s*(-[\d.]+) ?GiB"
)


@frozen
class KvTooSmall:
    """One request at max_model_len does not fit the KV cache (V1's message, in bytes)."""

    line: str
    max_model_len: int
    needed_bytes: int  # KV for one request at max_model_len
    available_bytes: int  # KV the engine had
    estimated_max_model_len: int | None = None  # vLLM's own estimate of the length that fits


@frozen
class KvTokensTooFew:
    """One request at max_model_len does not fit the KV cache (V0's message, in the pool's tokens)."""

    line: str
    max_model_len: int
    kv_tokens: int


@frozen
class NoKvMemory:
    """Nothing was left for the KV cache after the other terms (a zero or negative budget)."""

    line: str
    available_bytes: int | None = None  # the negative budget, where the message states it


@frozen
class StartupFreeMemory:
    """Less was free at startup than gpu_memory_utilization x total: something else holds the device."""

    line: str
    startup_free_bytes: int
    total_bytes: int
    utilization: float
    requested_bytes: int


@frozen
class EngineOutOfMemory:
    """An allocation failed: the torch or CUDA error, and the phase of startup or serving it hit."""

    line: str
    phase: str | None = None  # one of PHASES
    phase_basis: str = ""  # the frame, message or milestone the phase was read from
    oom: OutOfMemory | None = None


Failure = KvTooSmall | KvTokensTooFew | NoKvMemory | StartupFreeMemory | EngineOutOfMemory
"""Why a vLLM run stopped, with the figures its own message states."""


def find_failure(text: str) -> Failure | None:
    """The first failure the log records, or None for a run that started (or a log that stops before failing)."""
    lines = [ANSI.sub("", raw) for raw in text.splitlines()]
    for index, line in enumerate(lines):
        try:
            failure = _failure_at(line, index, lines)
        except (ValueError, OverflowError):  # figures no engine prints (5,000 digits, 10**400 GiB): not a failure
            continue
        if failure:
            return failure
    return None


def _failure_at(line: str, index: int, lines: list[str]) -> Failure | None:
    if match := _KV_NEEDED.search(line):
        return KvTooSmall(
            line.strip(),
            max_model_len=int(match.group(1)),
            needed_bytes=gib(match.group(2)),
            available_bytes=gib(match.group(3)),
            estimated_max_model_len=int(match.group(4)) if match.group(4) else None,
        )
    if match := _V0_KV_TOKENS.search(line):
        return KvTokensTooFew(line.strip(), max_model_len=int(match.group(1)), kv_tokens=int(match.group(2)))
    if _NO_KV.search(line) or (match := _NEGATIVE_KV.search(line)):
        return NoKvMemory(line.strip(), available_bytes=gib(match.group(1)) if match else None)
    if match := _STARTUP_FREE.search(line):
        return StartupFreeMemory(
            line.strip(),
            startup_free_bytes=gib(match.group(1)),
            total_bytes=gib(match.group(2)),
            utilization=float(match.group(3)),
            requested_bytes=gib(match.group(4)),
        )
    if TORCH_OOM.search(line) or _CUDA_ERROR_OOM.search(line) or _WRAPPED_OOM.search(line):
        oom = next((found for found in map(out_of_memory, lines) if found), None)
        phase, basis = _phase(index, lines)
        return EngineOutOfMemory(line.strip(), phase=phase, phase_basis=basis, oom=oom)
    return None


def _phase(index: int, lines: list[str]) -> tuple[str | None, str]:
    """The phase an out-of-memory error at lines[index] hit: named by the exception's own message, else by the
    frames of the tracebacks around it (ranks interleave theirs), else by the last startup milestone before it."""
    window = lines[max(0, index - 400) : index + 400]
    for line in window:
        for pattern, phase in _MESSAGE_PHASES:
            if match := pattern.search(line):
                return phase, f"the error message: {match.group(0)!r}"
    frames = {match.group(1) for line in window if (match := _FRAME.search(line))}
    for phase, names in _PHASE_FRAMES:
        hit = sorted(frames & names)
        if hit:
            return phase, f"traceback frame {hit[0]}()"
    last: tuple[str | None, str] = (None, "")
    for line in lines[:index]:
        for pattern, milestone_phase in _MILESTONES:
            if match := pattern.search(line):
                last = (milestone_phase, f"the last startup line before it: {match.group(0)!r}")
    return last
