"""Every flag `kvops plan` emits, parsed by the installed vLLM's own argument parsers: `vllm serve` (the model as
its positional argument, no deprecation warning) and the API server module a --launcher names (`--model`)."""

from __future__ import annotations

import logging

import pytest

from tests.unit.cli.test_plan import plan_doc

PLAN = (
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
)
PLAN += ("--kv-cache-memory-bytes", "20GiB", "--enforce-eager")


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def check_flags(parsed) -> None:
    assert parsed.kv_cache_dtype == "int8_per_token_head" and parsed.kv_cache_memory_bytes == 20 * 2**30
    assert parsed.scheduler_cls == "kvops_vllm.scheduler.KVGuardScheduler" and parsed.max_num_queued_reqs == 8
    assert (parsed.tensor_parallel_size, parsed.data_parallel_size, parsed.enforce_eager) == (2, 2, True)


@pytest.mark.vllm
def test_every_emitted_vllm_flag_exists_in_the_installed_engine(run_kvops):
    import warnings

    warnings.simplefilter("ignore")
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    doc = plan_doc(run_kvops, *PLAN)
    argv = doc["command"]["argv"]
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"] and "--model" not in argv
    parser = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    caught = Warnings()
    logging.getLogger("vllm.utils.argparse_utils").addHandler(caught)
    try:
        parsed = parser.parse_args(argv[1:])  # what `vllm serve ...` parses
    finally:
        logging.getLogger("vllm.utils.argparse_utils").removeHandler(caught)
    assert parsed.model_tag == "Qwen/Qwen3-8B" and caught.messages == []
    check_flags(parsed)


@pytest.mark.vllm
def test_the_api_server_launcher_gets_the_model_as_its_option(run_kvops):
    import warnings

    warnings.simplefilter("ignore")
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    doc = plan_doc(run_kvops, *PLAN, "--launcher", "python -m vllm.entrypoints.openai.api_server")
    argv = doc["command"]["argv"]
    assert argv[:5] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "Qwen/Qwen3-8B"]
    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[3:])
    assert parsed.model == "Qwen/Qwen3-8B"
    check_flags(parsed)
