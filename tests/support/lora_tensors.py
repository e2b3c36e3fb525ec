"""The bytes of the LoRA slots the installed vLLM allocates for a `vllm serve` argument list: the engine built
in this process from those arguments (its own parser and EngineArgs, dummy weights), then every tensor the LoRA
layers hold, each storage once (vllm/lora/layers: lora_a_stacked, lora_b_stacked, and views of them).

    python -m tests.support.lora_tensors MODEL --enable-lora ...     # prints {"lora_bytes": N, "layers": [...]}
"""

from __future__ import annotations

import json
import os
import sys
import warnings


def lora_storage(worker) -> tuple[int, list[str]]:
    """Run inside the worker (collective_rpc): the LoRA wrappers' tensors' bytes, and the wrappers' names."""
    import torch
    from vllm.lora.layers import BaseLayerWithLoRA

    seen: set[int] = set()
    total, names = 0, []
    for name, module in worker.model_runner.model.named_modules(remove_duplicate=False):
        if not isinstance(module, BaseLayerWithLoRA):
            continue
        names.append(name)
        for value in vars(module).values():
            for tensor in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in seen:
                    seen.add(tensor.untyped_storage().data_ptr())
                    total += tensor.untyped_storage().nbytes()
    return total, names


def main(args: list[str]) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process, to reach its worker
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.simplefilter("ignore")
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.llm_engine import LLMEngine

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser  # vLLM 0.33 on
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser

    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(["--model", *args, "--load-format", "dummy"])
    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(parsed))
    total, names = engine.collective_rpc(lora_storage)[0]
    print(json.dumps({"lora_bytes": total, "layers": names}))


if __name__ == "__main__":
    main(sys.argv[1:])
