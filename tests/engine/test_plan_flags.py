"""Every flag `kvops plan` emits, parsed by the installed vLLM's own argument parsers: `vllm serve` (the model as
its positional argument, no deprecation warning) and the API server module a --launcher names (`--model`)."""

from __future__ import annotations

import logging
import shlex

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


def parse_serve(args: list[str]):
    """`vllm serve ARGS` as the installed vLLM parses them, and the warnings its parser logged."""
    import warnings

    warnings.simplefilter("ignore")
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    caught = Warnings()
    logging.getLogger("vllm.utils.argparse_utils").addHandler(caught)
    try:
        return parser.parse_args(["serve", *args]), caught.messages
    finally:
        logging.getLogger("vllm.utils.argparse_utils").removeHandler(caught)


@pytest.mark.vllm
def test_every_emitted_vllm_flag_exists_in_the_installed_engine(run_kvops):
    doc = plan_doc(run_kvops, *PLAN)
    argv = doc["command"]["argv"]
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"] and "--model" not in argv
    parsed, messages = parse_serve(argv[2:])  # what `vllm serve ...` parses
    assert parsed.model_tag == "Qwen/Qwen3-8B" and messages == []
    check_flags(parsed)


@pytest.mark.vllm
@pytest.mark.parametrize("guard", ["--guard", "--no-guard"])
def test_the_docker_command_does_not_name_a_plugin_its_image_lacks(run_kvops, guard):
    """The official image has vLLM and no kvops_vllm: the docker command leaves the KV guard's scheduler out (and
    says how to add it) and passes the image's `vllm serve` entrypoint only flags the installed vLLM parses."""
    plan = [arg for arg in PLAN if arg not in ("--guard", "--kv-cache-memory-bytes", "20GiB", "--enforce-eager")]
    ran = run_kvops("plan", *plan, guard, "--format", "docker")
    words = shlex.split(ran.stdout)
    assert "kvops_vllm" not in ran.stdout and words[:3] == ["docker", "run", "--rm"]
    [image] = [word for word in words if word.startswith("vllm/vllm-openai:v")]  # the planned release's image
    parsed, messages = parse_serve(words[words.index(image) + 1 :])
    assert parsed.model_tag == "Qwen/Qwen3-8B" and messages == []
    stock = parse_serve(["Qwen/Qwen3-8B"])[0].scheduler_cls  # what vLLM schedules with when no flag names a class
    assert parsed.scheduler_cls == stock and "kvops" not in str(stock) and parsed.max_num_queued_reqs == 8
    # two replicas (--gpus 4, tp 2): data parallel, several API servers, so no --middleware to leave out
    told = f"leaves out --scheduler-cls kvops_vllm.scheduler.KVGuardScheduler: the image {image} has no kvops_vllm"
    assert (told in ran.stderr) == (guard == "--guard")


@pytest.mark.vllm
def test_decode_context_parallel_and_lora_flags_parse_as_vllm_reads_them(run_kvops):
    mla = plan_doc(run_kvops, "-m", "deepseek-v3", "--gpu", "h200", "--gpus", "8", "-dcp", "8")
    parsed, messages = parse_serve(mla["command"]["argv"][2:])
    assert parsed.decode_context_parallel_size == 8 and parsed.tensor_parallel_size == 8 and messages == []
    lora = ("--enable-lora", "--max-loras", "4", "--max-lora-rank", "64", "--fully-sharded-loras")
    served = plan_doc(run_kvops, "-m", "llama-3.1-8b", "--gpu", "h100", "--tp", "2", *lora, "--lora-dtype", "bfloat16")
    parsed, messages = parse_serve(served["command"]["argv"][2:])
    assert (parsed.enable_lora, parsed.max_loras, parsed.max_lora_rank) == (True, 4, 64) and messages == []
    assert parsed.fully_sharded_loras and parsed.lora_dtype == "bfloat16"


@pytest.mark.vllm
def test_a_pasted_commands_kept_options_parse_as_it_gave_them(run_kvops):
    pasted = (
        "vllm serve Qwen/Qwen3-8B --port 9000 --served-model-name q --scheduling-policy priority --quantization fp8 "
        """--hf-overrides '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}' --max-model-len 65536"""
    )
    doc = plan_doc(run_kvops, "--gpu", "h100", "--from-command", pasted)
    parsed, messages = parse_serve(doc["command"]["argv"][2:])
    assert (parsed.port, parsed.served_model_name, parsed.scheduling_policy) == (9000, ["q"], "priority")
    assert parsed.quantization == "fp8" and parsed.max_model_len == 65536 and messages == []
    assert parsed.hf_overrides == {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}


@pytest.mark.vllm
def test_the_api_server_launcher_gets_the_model_as_its_option(run_kvops):
    import warnings

    warnings.simplefilter("ignore")
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.common.cli_args import make_arg_parser  # vLLM 0.33 on
    except ImportError:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser

    doc = plan_doc(run_kvops, *PLAN, "--launcher", "python -m vllm.entrypoints.openai.api_server")
    argv = doc["command"]["argv"]
    assert argv[:5] == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "Qwen/Qwen3-8B"]
    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[3:])
    assert parsed.model == "Qwen/Qwen3-8B"
    check_flags(parsed)
