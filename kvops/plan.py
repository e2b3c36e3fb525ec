"""A plan as a value: what one deployment needs and gets, frozen.

The planner (`kvops.planner`) finds a plan, each engine's `plan.py` (`kvops/engines/<name>/plan.py`) computes
it, `kvops.render` prints it. Nothing here knows an engine: a plan holds the engine's own capacity record, flags and
argv as that engine's planner made them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any, Protocol

from kvops.errors import KvopsError
from kvops.frozen import frozen
from kvops.gpus import Gpu
from kvops.model.spec import ModelSpec
from kvops.profile import Profile
from kvops.units import format_bytes
from kvops.workload import Workload

if TYPE_CHECKING:
    from kvops.overheads import OverheadFit


class PlanError(KvopsError):
    """The workload does not fit; the message holds need vs have and the ways out."""

    exit_code = 3


@frozen
class Term:
    """One line of a memory budget, in bytes per GPU, and how it was obtained: `computed` (from the parameter count
    and a dtype), `estimate` (a model of what only a run can measure, with the way to measure it), `measured` (from
    a calibration profile), `input` (given by the user) or `exact`."""

    name: str
    bytes: int
    basis: str
    formula: str
    measure: str | None = None  # how to replace an estimate by a measurement
    band: tuple[int, int] | None = None  # where the engine may land instead, bytes (lowest, highest)

    @property
    def is_estimate(self) -> bool:
        return self.basis == "estimate"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": self.name,
            "bytes": self.bytes,
            "basis": self.basis,
            "formula": self.formula,
            "measure": self.measure,
        }
        if self.band is not None:
            data["band"] = {"low": self.band[0], "high": self.band[1]}
        return data


@frozen
class Speculative:
    """Speculative decoding as the engine is asked for it: the method, the tokens proposed per step, and the
    draft's own spec when it has one (an EAGLE head, a draft model); MTP uses the target's own layers."""

    method: str  # vLLM's method: eagle, eagle3, mtp, draft_model, ngram, suffix, medusa, ...; TGI: speculate
    tokens: int  # num_speculative_tokens (TGI --speculate)
    draft: ModelSpec | None = None
    draft_tp: int | None = None  # draft_tensor_parallel_size; None: the target's tp
    config: str = ""  # the flag's value as given, re-emitted

    @property
    def uses_target_hidden_states(self) -> bool:
        """vLLM's `use_eagle()`: EAGLE, EAGLE-3 and MTP drafters, whose layers join the target's KV pool."""
        return self.method in ("eagle", "eagle3", "mtp")


@frozen
class LoraSlots:
    """vLLM's --enable-lora: the adapter slots it allocates at load, for every LoRA-capable layer of the model."""

    max_loras: int = 1  # --max-loras: adapters served at once, each a slot
    max_rank: int = 16  # --max-lora-rank: every slot is allocated at this rank
    fully_sharded: bool = False  # --fully-sharded-loras: the rank (column layers) and output (row layers) split by tp
    dtype: str = "auto"  # --lora-dtype: auto is the serving dtype


@frozen
class PlanInputs:
    engine: str
    spec: ModelSpec
    gpu: Gpu | None
    tp: int = 1
    gpus: int | None = None  # devices in all; replicas = gpus / (tp x pp)
    pp: int = 1  # pipeline-parallel stages: each holds its share of the layers
    dcp: int = 1  # vLLM --decode-context-parallel-size: the latent cache split by tokens over this many tp ranks
    expert_parallel: bool = False  # vLLM --enable-expert-parallel: whole experts per rank
    dtype: str = "auto"  # the serving dtype (vLLM/TGI --dtype); auto: the checkpoint's
    text_only: bool = False  # vLLM --language-model-only: the vision tower is not loaded
    speculative: Speculative | None = None
    device: str = "gpu"  # "cpu" plans vLLM's CPU build (block size 128, no async scheduling)
    cpu_amx: bool = False  # the CPU build's host has AMX tiles: vLLM's AMX MLA kernel (MLA blocks of 128, not 16)
    cpu_avx512_bf16: bool = False  # the CPU build's host has AVX-512 BF16: vLLM keeps SSM states in float32
    cpu_fp8_kv: bool = True  # the CPU build's host has AVX-512 or AMX tiles, which an fp8 KV cache needs there
    max_model_len: int | str | None = None  # tokens, "auto", or None for the model's max_position_embeddings
    workload: Workload = field(default_factory=Workload)
    concurrency: int | str | None = None  # requests, "auto", or None
    kv_dtype: str = "auto"
    quantization: str = "auto"
    quantization_method: str | None = None  # vLLM's --quantization as a pasted command gave it, re-emitted as given
    memory_fraction: float | None = None  # vLLM --gpu-memory-utilization / TGI --cuda-memory-fraction
    kv_cache_memory_bytes: int | None = None  # vLLM --kv-cache-memory-bytes
    num_gpu_blocks_override: int | None = None  # vLLM --num-gpu-blocks-override: the block count, fixed
    extensible_kv_cache: bool | None = None  # vLLM 0.34+ --[no-]enable-extensible-kv-cache (None: vLLM decides)
    vmm: bool = True  # False: the driver has no virtual memory management (WSL2), vLLM 0.34 falls back to profiling
    custom_all_reduce: bool = True  # False: vLLM --disable-custom-all-reduce
    compilation_config: str | None = None  # vLLM --compilation-config JSON, as given (its CUDA-graph settings read)
    # a run that happened (calibration, the accuracy corpus): options it does not state ran at the engine's defaults,
    # not at what a plan would choose (vLLM's profile sized its sampler for its default max_num_seqs)
    as_run: bool = False
    batched_tokens: int | None = None  # vLLM --max-num-batched-tokens / TGI --max-batch-prefill-tokens
    max_num_seqs: int | None = None  # vLLM --max-num-seqs / TGI --max-concurrent-requests
    block_size: int | None = None
    enforce_eager: bool = False
    guard: bool | None = None  # the engine's KV-guard scheduler; None: the engine's default
    # replaces the engine's program, e.g. ("python", "-m", "vllm.entrypoints.openai.api_server")
    launcher: tuple[str, ...] = ()
    max_queued: int | None = None  # vLLM --max-num-queued-reqs
    max_input_tokens: int | None = None  # TGI
    # vLLM KV cache layout settings (None: the engine's default)
    hybrid_manager: bool = True  # False: --disable-hybrid-kv-cache-manager
    prefix_caching: bool | None = None  # --[no-]enable-prefix-caching
    chunked_prefill: bool = True  # vLLM --[no-]enable-chunked-prefill: off, a step takes whole prompts
    performance_mode: str = "balanced"  # vLLM --performance-mode: batching defaults and CUDA-graph sizes
    async_scheduling: bool | None = None  # vLLM --[no-]async-scheduling (None: vLLM's default, on for GPUs)
    disable_sliding_window: bool = False  # vLLM --disable-sliding-window: full attention, the context cut to the window
    kv_skip_layers: tuple[str, ...] = ()  # vLLM --kv-cache-dtype-skip-layers: layer indices or "sliding_window"
    lora: LoraSlots | None = None  # vLLM --enable-lora and its slots
    mamba_cache_mode: str | None = None  # --mamba-cache-mode
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    cpu_offload_bytes: int = 0  # vLLM --cpu-offload-gb: weights kept in host memory
    command_lines: tuple[str, ...] = ()  # what a pasted launch command's other options are (--from-command)
    kept_options: tuple[
        tuple[str, ...], ...
    ] = ()  # the words of those options, as given: appended to the plan's command
    port: int | None = None  # the engine's --port as the pasted command gave it (None: the engine's default)
    # the scheduler's flags a pasted command states: no memory term, but checked against the plan as vLLM checks them
    scheduler_flags: tuple[tuple[str, Any], ...] = ()
    profile: Profile | None = None
    warn_level: float = 0.70
    kv_offloading_size: float | None = None  # vLLM --kv-offloading-size: GiB of host memory, all TP ranks
    kv_offloading_backend: str | None = None  # vLLM --kv-offloading-backend (native when a size is given)
    gpu_memory_target: float | None = None  # the policy's gpu_memory.below: the plan says why it reserves more
    engine_version: str | None = None  # the release whose rules the plan follows (None: the newest)
    overhead_fit: OverheadFit | None = None  # the fitted overheads to plan with (None: the ones kvops ships)

    @property
    def devices(self) -> int:
        """GPUs in all (one replica when --gpus is not given)."""
        return self.gpus or self.tp * self.pp

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def replicas(self) -> int:
        return self.devices // self.gpus_per_replica


class Release(Protocol):
    """The engine release a plan follows; each engine's releases.py defines its own."""

    @property
    def family(self) -> str: ...

    @property
    def label(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


class Capacity(Protocol):
    """What an engine's plan says its KV pool holds; each engine's plan.py defines its own frozen record."""

    # read-only, as the engines' frozen records hold them
    @property
    def num_blocks(self) -> int: ...

    @property
    def usable_blocks(self) -> int: ...

    @property
    def block_size(self) -> int: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def max_concurrency(self) -> float:
        """Requests at max_model_len the pool holds at once (a fraction when fewer than one)."""
        ...

    @property
    def requests_under_warn(self) -> int: ...

    @property
    def requests_at_full(self) -> int: ...

    @property
    def kv_tokens(self) -> int: ...

    @property
    def request_tokens(self) -> int:
        """Tokens one request of the planned workload holds (or reserves) at its peak."""
        ...

    @property
    def holding(self) -> str:
        """What one request of the planned workload holds, as the plan's summary says it ("each holding N KV tokens")."""
        ...

    def lines(self) -> list[str]:
        """The capacity as the plan's text report shows it."""
        ...

    def to_dict(self) -> dict[str, Any]: ...


@frozen
class Verdict:
    """Why a plan does not fit: the problem in words, and the KV memory needed against what there is."""

    problem: str
    need_bytes: int
    have_bytes: int
    states_need: bool = False  # the problem's words already give need against have

    def message(self) -> str:
        if self.states_need:
            return self.problem
        return f"{self.problem} (need {format_bytes(self.need_bytes)}, have {format_bytes(max(self.have_bytes, 0))} per GPU)"


@frozen
class WayOut:
    """One change a user can make to a plan that does not fit, and what the planner found it gives."""

    change: str  # the option as typed, e.g. "--tp 2"
    fits: bool | None  # None: not re-planned (its effect is described, not computed)
    result: str
    warning: str | None = None
    flags: Mapping[str, Any] | None = None  # the re-planned engine flags, when it fits
    replanned: bool = False  # the planner re-planned with the change (its flags are known when it fits)
    replicas: int | None = None
    concurrency_per_replica: int | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "change": self.change,
            "fits": self.fits,
            "result": self.result,
            "warning": self.warning,
        }
        if self.replanned:
            data["flags"] = dict(self.flags) if self.flags is not None else None
        if self.replicas is not None:
            data |= {"replicas": self.replicas, "concurrency_per_replica": self.concurrency_per_replica}
        return data


@frozen
class Plan:
    inputs: PlanInputs
    memory: tuple[Term, ...]
    kv_cache_bytes: int  # the KV memory the capacity is sized on: the engine's predicted figure less kv_margin_bytes
    capacity: Capacity | None  # None when the plan stopped before sizing the pool
    flags: Mapping[str, Any]
    program: tuple[str, ...]  # what starts the engine: its own program or the user's --launcher
    args: tuple[str, ...]  # the engine's arguments, after its program
    image: str
    port: int
    verdict: Verdict | None = None  # None: the workload fits
    ways_out: tuple[WayOut, ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    release: Release | None = None  # the engine release whose rules the plan follows
    kv_margin_bytes: int = 0  # kvops' margin below the engine's predicted KV (0: none planned)

    @property
    def engine_kv_bytes(self) -> int:
        """The KV memory the engine itself is predicted to size (its 'Available KV cache memory')."""
        return self.kv_cache_bytes + self.kv_margin_bytes

    @property
    def engine(self) -> str:
        return self.inputs.engine

    @property
    def fits(self) -> bool:
        return self.verdict is None

    @property
    def problem(self) -> str | None:
        return self.verdict.problem if self.verdict else None

    @property
    def need_bytes(self) -> int | None:
        return self.verdict.need_bytes if self.verdict else None

    @property
    def have_bytes(self) -> int | None:
        return self.verdict.have_bytes if self.verdict else None

    @property
    def argv(self) -> list[str]:
        return [*self.program, *self.args]

    @property
    def estimates(self) -> list[Term]:
        return [term for term in self.memory if term.is_estimate]

    @property
    def estimates_warning(self) -> str | None:
        """The one warning every plan with estimated terms carries: which, and how to measure them instead."""
        if not self.estimates:
            return None
        items = ", ".join(f"{term.name} {format_bytes(term.bytes)}" for term in self.estimates)
        return f"estimates in this plan: {items}; {self.estimates[0].measure}"

    @property
    def all_warnings(self) -> list[str]:
        """The model's warnings (a layer count taken from a default), the plan's, the estimates last."""
        return [*self.inputs.spec.warnings, *self.warnings, *filter(None, [self.estimates_warning])]

    @property
    def local_model(self) -> str | None:
        """The model's folder when the engine loads it from a local path: deployments mount it."""
        return model_argument(self.inputs.spec) if self.inputs.spec.source == "path" else None

    def term(self, name: str) -> Term | None:
        return next((term for term in self.memory if term.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        inputs = self.inputs
        return {
            "engine": self.engine,
            "engine_version": self.release.to_dict() if self.release else None,
            "model": inputs.spec.name,
            "gpu": inputs.gpu.to_dict() if inputs.gpu else None,
            "gpus": inputs.devices,
            "tp": inputs.tp,
            "pp": inputs.pp,
            "device": inputs.device,
            "fits": self.fits,
            "problem": self.problem,
            "need_bytes": self.need_bytes,
            "have_bytes": self.have_bytes,
            "flags": dict(self.flags),
            "command": {"argv": self.argv, "program": list(self.program), "image": self.image, "port": self.port},
            "memory": self._memory_dict(),
            "capacity": self.capacity.to_dict() if self.capacity else {},
            "workload": inputs.workload.to_dict(),
            "estimates": [
                {"term": term.name, "bytes": term.bytes, "basis": term.formula, "measure": term.measure}
                for term in self.estimates
            ],
            "ways_out": [way.to_dict() for way in self.ways_out],
            "warnings": self.all_warnings,
            "notes": list(self.notes),
            "from_command": list(inputs.command_lines),
        }

    def _memory_dict(self) -> dict[str, Any]:
        """The engine's predicted KV and kvops' margin apart, and which of them the capacity is sized on."""
        uses = "kv_cache_bytes" if not self.kv_margin_bytes else "kv_cache_bytes - margin_bytes"
        return {
            "kv_cache_bytes": self.engine_kv_bytes,
            "margin_bytes": self.kv_margin_bytes,
            "capacity_kv_bytes": self.kv_cache_bytes,
            "capacity_uses": f"capacity_kv_bytes = {uses}",
            "terms": [term.to_dict() for term in self.memory],
        }


def model_argument(spec: ModelSpec) -> str:
    """What the engine loads: the HF id, or for a local config.json the folder holding it."""
    if spec.source != "path":
        return spec.name
    if spec.name.endswith("config.json"):
        return spec.name[: -len("config.json")].rstrip("/") or "."
    return spec.name
