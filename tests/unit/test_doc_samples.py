"""The manual's sample outputs are what the commands print now (issue 23): every `$ kvops plan`, `kv`, `lint`,
`simulate` and `explain` in a console block of DOCS is run, and the lines under it must be its output, stdout and
stderr as a terminal shows them (stderr alone for a command whose stdout goes to a file). A `...` line stands for
lines a sample leaves out; a sample without one is the whole output. A command with a `# comment` shows how to call
it, not what it prints (its files come from the steps before it), and is not run; nor is one that reads a running
server's address (`--metrics http://...`), which changes per run (tests/unit/test_defects_docs.py runs the
`kvops watch --once` sample against a Prometheus of its own).

`python -m tests.unit.test_doc_samples` rewrites the whole samples from the real commands; excerpts are edited by
hand.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.extras import needs
from tests.support.paths import REPO

DOCS = ("README.md", "docs/planning.md", "docs/formula.md", "docs/deploying.md", "docs/simulate.md", "docs/explain.md")
COMMANDS = (("kvops", "plan"), ("kvops", "kv"), ("kvops", "lint"), ("kvops", "simulate"), ("kvops", "explain"))
# models served by tests/support/hub_server.py, the stand-in for the Hub, whose address changes per run: their
# samples are not run here (tests/unit/model/test_hub.py runs the same plans against the stand-in); nor are those
# of a live engine (tests/engine/test_explain_live.py)
HUB_STAND_IN = re.compile(r"(?:^|[\s/])acme/")
LIVE_SERVER = re.compile(r"--metrics https?://")
LEFT_OUT = "..."


@dataclass(frozen=True)
class Sample:
    doc: str
    line: int  # of the `$ ` line, from 1
    command: str
    shown: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def words(self) -> list[str]:
        words = shlex.split(self.command)
        return words[: words.index(">")] if ">" in words else words

    @property
    def is_excerpt(self) -> bool:
        return LEFT_OUT in self.shown


def samples(doc: str) -> list[Sample]:
    """The COMMANDS of a document's console blocks, each with the lines under it."""
    lines = (REPO / doc).read_text().splitlines()
    found: list[Sample] = []
    block = False
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            block = line == "```console"
        elif block and line.startswith("$ "):
            command, shown = line[2:], _shown(lines[number:])
            words, commented = shlex.split(command), shlex.split(command, comments=True) != shlex.split(command)
            unreachable = HUB_STAND_IN.search(command) or LIVE_SERVER.search(command)
            if tuple(words[:2]) in COMMANDS and not commented and not unreachable:
                found.append(Sample(doc, number, command, shown))
    return found


def _shown(after: list[str]) -> tuple[str, ...]:
    """The lines under a command, up to the next command or the end of its block."""
    shown = []
    for line in after:
        if line.startswith(("$ ", "```")):
            break
        shown.append(line)
    return tuple(shown)


def printed(sample: Sample) -> tuple[str, ...]:
    """What the command prints now, run from the checkout with the Hub offline."""
    from kvops.cli import main

    here = Path.cwd()
    os.chdir(REPO)
    try:
        result = CliRunner(env={"HF_HUB_OFFLINE": "1"}).invoke(main, sample.words[1:], catch_exceptions=False)
    finally:
        os.chdir(here)
    text = result.stderr if ">" in shlex.split(sample.command) else result.output
    return tuple(text.rstrip("\n").splitlines())


def shows(shown: tuple[str, ...], output: tuple[str, ...]) -> bool:
    """The shown lines are the output, or with `...` for left-out lines, runs of it in order."""
    pattern = "\n".join(".*?" if line == LEFT_OUT else re.escape(line) for line in shown)
    return re.fullmatch(pattern.replace("\n.*?\n", "(?:\n.*?)?\n"), "\n".join(output), re.DOTALL) is not None


ALL = [sample for doc in DOCS for sample in samples(doc)]


def test_the_manual_has_samples_to_check():
    assert {sample.doc for sample in ALL} == set(DOCS)
    assert sum(not sample.is_excerpt for sample in ALL) >= 2


# `kvops simulate` drives the installed vLLM's scheduler
RUNS = [
    pytest.param(sample, id=sample.id, marks=needs("vllm") if sample.words[1] == "simulate" else ()) for sample in ALL
]


@pytest.mark.parametrize("sample", RUNS)
def test_the_sample_is_what_the_command_prints_now(sample):
    output = printed(sample)
    how = "edit the excerpt" if sample.is_excerpt else "run python -m tests.unit.test_doc_samples"
    assert shows(sample.shown, output), f"{sample.id} is stale ({how}); `{sample.command}` prints:\n" + "\n".join(
        output
    )


def test_a_left_out_run_matches_any_lines_and_the_rest_must_be_exact():
    output = ("head", "a", "b", "tail")
    assert shows(("head", "...", "tail"), output) and shows(("head", "a", "b", "tail"), output)
    assert shows(("...", "b", "..."), output) and shows(("head", "...", "a", "b", "tail"), output)
    assert not shows(("head", "tail"), output) and not shows(("head", "...", "b"), output)


def rewrite() -> None:
    """Every whole sample replaced by what its command prints now."""
    for doc in DOCS:
        path = REPO / doc
        lines = path.read_text().splitlines()
        for sample in reversed(samples(doc)):
            if not sample.is_excerpt:
                lines[sample.line : sample.line + len(sample.shown)] = printed(sample)
        path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    rewrite()
