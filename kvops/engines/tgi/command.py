"""A `text-generation-launcher` command line (TGI 3.3.7) read into the deployment options it states.

The options and how many words each takes are launcher_flags.json (TGI's `struct Args`, launcher/src/main.rs);
clap takes `--flag value` and `--flag=value`. The official image's entrypoint is the launcher, so a `docker run
... ghcr.io/huggingface/text-generation-inference:TAG ARGS` line is read from the words after the image.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache

from kvops.engines.command import (
    Reader,
    StatedCommand,
    Word,
    after_image,
    as_text,
    fraction,
    integer,
    port,
    setter,
    split_options,
    with_image_release,
)
from kvops.engines.tgi import flags
from kvops.errors import UsageError
from kvops.packaged import packaged_text

IMAGES = ("ghcr.io/huggingface/text-generation-inference", "huggingface/text-generation-inference")

# options that change memory in ways kvops does not compute (launcher/src/main.rs, TGI 3.3.7)
NOT_MODELLED = {
    "--cuda-graphs": "CUDA graphs are captured after the KV pool is allocated (their memory comes from the slack)",
    "--lora-adapters": "LoRA adapters take GPU memory",
    "--max-batch-size": "a hard batch cap for padded backends",
    "--rope-scaling": "changes the context the model accepts",
    "--rope-factor": "changes the context the model accepts",
    "--enable-prefill-logprobs": "prompt logprobs take VRAM on long prompts",
}
# TGI's --quantize values -> kvops's weight formats
QUANTIZE = {
    "awq": "awq",
    "gptq": "gptq",
    "marlin": "gptq",
    "fp8": "fp8",
    "eetq": "eetq",
    "bitsandbytes": "bitsandbytes",
    "bitsandbytes-nf4": "bitsandbytes-nf4",
    "bitsandbytes-fp4": "bitsandbytes-fp4",
    "compressed-tensors": "auto",
}
_DTYPES = {"float16": "fp16", "bfloat16": "bf16"}


@lru_cache(maxsize=1)
def launcher_options() -> dict[str, tuple[str, str]]:
    data = json.loads(packaged_text("kvops.engines.tgi", "launcher_flags.json"))
    return {
        spelling: (canonical, option["kind"])
        for canonical, option in data["options"].items()
        for spelling in option["spellings"]
    }


def read_command(words: list[str]) -> StatedCommand | None:
    if words[0] == flags.PROGRAM[0]:
        return read_launcher_args(words[1:])
    args = after_image(words, IMAGES)
    return None if args is None else with_image_release(read_launcher_args(args), words, IMAGES)


def read_launcher_args(args: list[str]) -> StatedCommand:
    """The deployment options a launcher argument list states, and a line for each option not read."""
    positional, options = split_options(args, launcher_options().get, dashes=False)
    stated = StatedCommand("tgi")
    for extra in positional:
        stated.lines.append(f"{extra}: unknown: text-generation-launcher takes no positional arguments")
    for word in options:
        if word.canonical is None:
            stated.ignore(word, "unknown: not a text-generation-launcher option in TGI 3.3.7")
        elif word.canonical in READERS:
            READERS[word.canonical](word, stated)
        elif word.canonical == "--max-batch-total-tokens":
            stated.ignore(
                word,
                f"ignored: TGI sizes its pool at warmup from 0.9.4 ({flags.MAX_BATCH_TOTAL_TOKENS_IGNORED}); "
                "0.9.0-0.9.3 allocate this figure as the pool, and a plan for them emits the pool it sizes instead",
            )
        elif word.canonical in NOT_MODELLED:
            stated.ignore(word, f"not modelled: {NOT_MODELLED[word.canonical]}; measure the run (kvops calibrate)")
        else:
            stated.ignore(word)
    revision = stated.values.pop("revision", None)
    if "model" not in stated.values:
        stated.values["model"] = "bigscience/bloom-560m"  # the launcher's default --model-id
        stated.lines.append("--model-id not given: TGI's default, bigscience/bloom-560m")
    if revision:
        stated.values["model"] = f"{stated.values['model']}@{revision}"
    return stated


def _choice(field: str, choices: dict[str, str]) -> Callable[[Word, StatedCommand], None]:
    def read(word: Word, stated: StatedCommand) -> None:
        value = str(word.value)
        if value not in choices:
            raise UsageError(f"{word.written} {value!r}; TGI 3.3.7 takes {', '.join(choices)}")
        stated.values[field] = choices[value]

    return read


def _sharded(word: Word, stated: StatedCommand) -> None:
    if str(word.value).lower() == "false":
        stated.values.setdefault("tp", 1)


def _speculate(word: Word, stated: StatedCommand) -> None:
    stated.values["speculative_config"] = json.dumps({"method": "speculate", "num_speculative_tokens": integer(word)})


READERS: dict[str, Reader] = {
    "--model-id": setter("model", as_text),
    "--revision": setter("revision", as_text),
    "--num-shard": setter("tp", integer),
    "--port": port,
    "--sharded": _sharded,
    "--quantize": _choice("quantization", QUANTIZE),
    "--dtype": _choice("dtype", _DTYPES),
    "--kv-cache-dtype": _choice("kv_dtype", flags.KV_DTYPE_OF_FLAG),
    "--max-input-tokens": setter("max_input_tokens", integer),
    "--max-input-length": setter("max_input_tokens", integer),
    "--max-total-tokens": setter("max_model_len", integer),
    "--max-batch-prefill-tokens": setter("batched_tokens", integer),
    "--max-concurrent-requests": setter("max_num_seqs", integer),
    "--cuda-memory-fraction": setter("memory_fraction", fraction),
    "--speculate": _speculate,
}
