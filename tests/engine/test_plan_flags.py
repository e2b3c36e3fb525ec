"""Every flag `kvops plan` emits, parsed by the installed vLLM's own argument parser."""

from __future__ import annotations

import pytest

from tests.unit.cli.test_plan import plan_doc


@pytest.mark.vllm
def test_every_emitted_vllm_flag_exists_in_the_installed_engine(run_kvops):
    import warnings

    warnings.simplefilter("ignore")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    doc = plan_doc(
        run_kvops,
        "-m",
        "qwen3-8b",
        "--gpu",
        "h100",
        "--gpus",
        "4",
        "--tp",
        "2",
        "--kv-dtype",
        "int8",
        "--guard",
        "--max-queued",
        "8",
        "--kv-cache-memory-bytes",
        "20GiB",
        "--enforce-eager",
    )
    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(doc["command"]["argv"][2:])
    assert parsed.kv_cache_dtype == "int8_per_token_head" and parsed.kv_cache_memory_bytes == 20 * 2**30
    assert parsed.scheduler_cls == "kvops_vllm.scheduler.KVGuardScheduler" and parsed.max_num_queued_reqs == 8
    assert (parsed.tensor_parallel_size, parsed.data_parallel_size, parsed.enforce_eager) == (2, 2, True)
