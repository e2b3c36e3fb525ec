"""Logs as hostile input (issue 23): a 1 MB log line made `kvops explain` and `calibrate` take minutes, through
regexes that backtrack (a number searched at every digit of a run, a `.*` scanned to the line's end from every
repeat of its phrase). Held by construction, timing nothing: every pattern that reads a log or nvidia-smi output
is checked by its structure to run in linear time when searched along a line (tests/support/linear_regex.py)."""

from __future__ import annotations

import importlib
import re

import pytest

from kvops.engines.tgi.logs import parse_tgi_log
from kvops.engines.vllm.logs import parse_vllm_log
from kvops.errors import KvopsError
from kvops.nvidia_smi import parse_nvidia_smi
from tests.support.hostile import deadline
from tests.support.linear_regex import problems

# the modules whose regexes read a log, a startup line or nvidia-smi output a user gives
READERS = (
    "kvops.engines.vllm.logs",
    "kvops.engines.tgi.logs",
    "kvops.engines.tgi.metrics",
    "kvops.engines.oom",
    "kvops.nvidia_smi",
)


def patterns() -> dict[str, re.Pattern[str]]:
    """Every compiled regex of the readers: module constants, and those inside their pattern tables."""
    found: dict[str, re.Pattern[str]] = {}
    for module_name in READERS:
        for name, value in vars(importlib.import_module(module_name)).items():
            items = (
                value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
            )
            for index, item in enumerate(items):
                for part in item if isinstance(item, tuple) else (item,):
                    if isinstance(part, re.Pattern):
                        found[f"{module_name}.{name}[{index}]: {part.pattern[:60]}"] = part
    return found


PATTERNS = patterns()


def test_the_readers_have_patterns_to_check():
    assert len(PATTERNS) > 90


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_every_log_pattern_is_linear_by_construction(name):
    assert problems(PATTERNS[name]) == []


@pytest.mark.parametrize(
    "pattern",
    [
        r"(\d+(?:\.\d+)?) GiB for peak activation",  # 0.32's: tried at every digit of a run of digits
        r"memory snapshot: .*total_memory=(\d+)GiB",  # each repeat of the phrase scanned to the end
        r"non-default args: (\{.*\})\s*$",
        r"(?:V[01] )?LLM engine \(v([^)]+)\)",  # [^)] runs over the next "LLM engine (v"
        r"\bvLLM: (\d+\.\d+[\w.+-]*?)\.?(?:\s|$)",  # two repeats over digits side by side
        r"^\|\s+(\d+)\s+(.+?)\s+(?:On|Off)\s+\|",  # anchored, but .+? and \s+ overlap
        r"(a+)+b",
    ],
)
def test_the_check_finds_the_patterns_that_backtracked(pattern):
    assert problems(re.compile(pattern))


@pytest.mark.parametrize(
    "pattern",
    [
        r"(?<![\d.])(\d+(?:\.\d+)?) GiB for peak activation",
        r"memory snapshot: (?:(?!memory snapshot: ).)*total_memory=(\d+)GiB",
        r'File "[^"]*", line \d+, in (\S+)',
        r"Args \{(.*?)(?:\}\s*$|$)",
        r"(GPU|CPU)(?: \+ host)? KV cache size: ([\d,]+) tokens",
    ],
)
def test_the_check_passes_linear_patterns(pattern):
    assert problems(re.compile(pattern)) == []


LINES = {
    "a run of digits": "1" * 1_000_000,
    "a repeated snapshot": "memory snapshot: " * 60_000,
    "a repeated args": "non-default args: {" * 50_000,
    "a repeated banner": "LLM engine (v" * 80_000,
    "a version of digits": "vLLM: 1." + "1" * 1_000_000 + ":",
}


@pytest.mark.parametrize("line", list(LINES.values()), ids=list(LINES))
def test_a_1_mb_line_is_read(line):
    """The lines the issue measured, and those the check found: each read once (the deadline only stops a hang)."""
    with deadline(120):
        assert parse_vllm_log(line).facts == {}
        parse_tgi_log(line)
        with pytest.raises(KvopsError, match=r"^smi\.txt: "):
            parse_nvidia_smi(line, "smi.txt")


def test_numbers_no_engine_prints_are_not_facts():
    """5,000 digits (int() refuses them) and 10**400 GiB (float() gives Inf, which round() refuses) read as nothing."""
    log = parse_vllm_log(
        "GPU KV cache size: " + "9" * 5000 + " tokens\n"
        "Model loading took " + "9" * 400 + " GiB\n"
        "The model's max seq len (" + "9" * 5000 + ") is larger than the maximum number of tokens that can be "
        "stored in KV cache (1)\n"
        "CUDA out of memory. Tried to allocate " + "9" * 400 + ".00 GiB"
    )
    assert log.facts == {} and log.failure is None
    assert parse_tgi_log("Setting max batch total tokens to " + "9" * 5000).facts == {}
