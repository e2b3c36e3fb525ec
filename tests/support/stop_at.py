"""A model that stops where the request says: `--logits-processors tests.support.stop_at:StopAt`.

A request with `vllm_xargs: {"stop_at": N}` and a stop token samples that token as its N-th output token, and
never before, so it ends there with finish_reason "stop", as a real model ending its answer would. The scheduler
cannot see N (it reads max_tokens, stop tokens and min_tokens, not extra args): to it the length is unknown, and
every engine given the same requests generates the same tokens. Dummy weights cannot give that: their stops are
drawn by the engine's own sampler, so two engines would serve different lengths.

Written against vLLM 0.32.0's logits-processor interface (vllm/v1/sample/logits_processor/interface.py): a
request's output token list is shared by reference and grows as it decodes, as the built-in min_tokens processor
relies on (vllm/v1/sample/logits_processor/builtin.py).
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates


class StopAt(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[int, list[int], int]] = {}  # batch row -> (stop_at, output tokens, stop token)

    def is_argmax_invariant(self) -> bool:
        return False

    @staticmethod
    def _track(params, _prompt, output: list[int]) -> tuple[int, list[int], int] | None:
        stop_at = (params.extra_args or {}).get("stop_at")
        if stop_at is None or not params.stop_token_ids:
            return None
        return int(stop_at), output, params.stop_token_ids[0]

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, self._track)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (stop_at, output, token) in self.rows.items():
            if len(output) + 1 >= stop_at:  # this step samples the stop_at-th token: the stop token, only
                logits[row] = -float("inf")
                logits[row, token] = 0.0
            else:  # never earlier
                logits[row, token] = -float("inf")
        return logits
