"""A vLLM scheduler built in-process on the CPU, driven by a stand-in model runner (vLLM's own scheduler tests
do the same: tests/v1/core/utils.py). The KV specs are real vLLM classes with a tiny pool and no tensors; the
model runner is replaced by `Driver`, which samples one token per request per step the way the engine core's
batch queue does under async scheduling (two steps in flight).
"""

from __future__ import annotations

import warnings
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path


def build_scheduler(
    scheduler_cls,
    model: Path,
    *,
    num_blocks: int,
    block_size: int = 16,
    max_model_len: int = 1024,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 1024,
    sliding_window: int | None = None,
    policy: str = "fcfs",
):
    """`scheduler_cls` over one full-attention group (and one sliding-window group when `sliding_window`);
    `policy` is vLLM's --scheduling-policy (fcfs or priority)."""
    warnings.simplefilter("ignore")
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )
    from vllm.v1.structured_output import StructuredOutputManager

    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        policy=policy,
    )
    model_config = ModelConfig(
        model=str(model), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=max_model_len
    )
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=True)
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),  # a GPU build of vLLM on a machine without one cannot infer it
    )
    spec = dict(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    groups = [KVCacheGroupSpec(["full"], FullAttentionSpec(**spec))]
    if sliding_window:
        groups.append(KVCacheGroupSpec(["sliding"], SlidingWindowSpec(**spec, sliding_window=sliding_window)))
    kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    cache_config.num_gpu_blocks = num_blocks
    return scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        block_size=block_size,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config),
    )


class Requests:
    """Requests as the engine core builds them (block hashes for prefix caching included)."""

    def __init__(self, block_size: int = 16):
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        self.block_hasher = get_request_block_hasher(block_size, hash_fn)

    def make(
        self,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int,
        *,
        first_token: int = 3,
        stream: bool = False,
        min_tokens: int = 0,
        stops: bool = False,
        priority: int = 0,
    ):
        """A request of exactly `max_tokens` new tokens (ignore_eos), or with `stops`, one that stops early on
        STOP_TOKEN (its length unknown to the scheduler; `Driver(lengths=...)` samples it where wanted)."""
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.request import Request

        kind = RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
        params = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            ignore_eos=not stops,
            stop_token_ids=[STOP_TOKEN] if stops else None,
            output_kind=kind,
        )
        prompt = [(first_token + i) % 500 + 3 for i in range(prompt_tokens)]
        return Request(request_id, prompt, params, None, block_hasher=self.block_hasher, priority=priority)


@dataclass
class Finished:
    request_id: str
    finish_reason: str
    stop_reason: object
    tokens: int


@dataclass
class Run:
    steps: int = 0
    preemptions: int = 0
    preempted: list[str] = field(default_factory=list)  # ids, in the order vLLM preempted them
    finished: dict[str, Finished] = field(default_factory=dict)
    peak_running: int = 0
    peak_waiting: int = 0
    peak_usage: float = 0.0


STOP_TOKEN = 2


class Driver:
    """Steps a scheduler like EngineCore.step_with_batch_queue: schedule, keep two steps in flight, then feed the
    oldest step's sampled tokens back through update_from_output. `lengths`: request id -> the output length at
    which its STOP_TOKEN is sampled (requests made with `stops`)."""

    def __init__(self, scheduler, token: int = 7, lengths: dict[str, int] | None = None):
        self.scheduler = scheduler
        self.token = token
        self.lengths = lengths or {}
        self.sampled: dict[str, int] = {}
        self.in_flight: deque = deque()
        self.run = Run()
        self.tokens: dict[str, int] = {}

    def step(self) -> None:
        from kvops.engines.vllm.simulator import model_runner_output

        scheduler = self.scheduler
        output = scheduler.schedule()
        self.run.steps += 1
        self.run.preemptions += len(output.preempted_req_ids or ())
        self.run.preempted += sorted(output.preempted_req_ids or ())
        ids = list(output.num_scheduled_tokens)
        sampled = [[] if scheduler.requests[i].is_prefill_chunk else [self._sample(i)] for i in ids]
        self.in_flight.append((output, model_runner_output(ids, sampled)))
        self.run.peak_running = max(self.run.peak_running, len(scheduler.running))
        self.run.peak_waiting = max(self.run.peak_waiting, len(scheduler.waiting))
        self.run.peak_usage = max(self.run.peak_usage, scheduler.kv_cache_manager.usage)
        if len(self.in_flight) >= 2 or not ids:
            self.settle()

    def _sample(self, request_id: str) -> int:
        self.sampled[request_id] = self.sampled.get(request_id, 0) + 1
        return STOP_TOKEN if self.sampled[request_id] == self.lengths.get(request_id) else self.token

    def settle(self) -> None:
        output, model_output = self.in_flight.popleft()
        for outputs in self.scheduler.update_from_output(output, model_output).values():
            for out in outputs.outputs:
                self.tokens[out.request_id] = self.tokens.get(out.request_id, 0) + len(out.new_token_ids)
                if out.finish_reason is not None:
                    self.run.finished[out.request_id] = Finished(
                        out.request_id, str(out.finish_reason), out.stop_reason, self.tokens[out.request_id]
                    )

    def drain(self, max_steps: int = 5000) -> Run:
        while (self.scheduler.has_requests() or self.in_flight) and self.run.steps < max_steps:
            if self.scheduler.has_requests():
                self.step()
            else:
                self.settle()
        return self.run
