"""A launch command as users paste it (`vllm serve MODEL --flag value ...`, `text-generation-launcher ...`, a
`docker run ... IMAGE ...` line, `python -m vllm.entrypoints.openai.api_server ...`), read into the deployment
options it states: engine-neutral words here, each engine's flags in `kvops/engines/<name>/command.py`.

Every option is accounted for: read into the plan, "ignored: does not change memory", "not modelled" (it changes
memory in a way kvops does not compute: measure the run), or "unknown" (not an option of that engine release).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvops.errors import UsageError
from kvops.frozen import frozen

IGNORED = "ignored: does not change memory"

# an option's kind: how many words follow it
SWITCH, VALUE, OPTIONAL_VALUE, LIST = "switch", "value", "optional_value", "list"


@frozen
class Word:
    """One option of the command: as written, its canonical spelling, and its value (None for a switch)."""

    written: str
    canonical: str | None  # None: not an option of the engine
    value: str | None
    negated: bool = False  # written --no-X for the switch --X
    tokens: tuple[str, ...] = ()  # the words of the command it was read from, as given


@dataclass
class StatedCommand:
    """What a launch command states: DeploymentOptions fields, and one line for every option not read."""

    engine: str
    values: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    # the options not read, each (its canonical spelling or as written, then its words as given): the plan's
    # command keeps them
    kept: list[tuple[str, ...]] = field(default_factory=list)
    # config options read field by field (--compilation-config.cudagraph_mode NONE), emitted as one JSON value each
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def ignore(self, word: Word, why: str = IGNORED) -> None:
        self.lines.append(f"{_shown(word)}: {why}")
        self.keep(word)

    def keep(self, word: Word) -> None:
        self.kept.append((word.canonical or word.written, *word.tokens))


def _shown(word: Word) -> str:
    return word.written if word.value is None else f"{word.written} {word.value}"


def command_words(text: str) -> tuple[list[str], list[str]]:
    """The words of a pasted command (shell quoting and line continuations removed), and the environment variables
    it sets: a leading `VAR=value ...`, and a `docker run`'s `-e VAR=value` before its image."""
    try:
        words = shlex.split(text.replace("\\\n", " "))
    except ValueError as exc:
        raise UsageError(f"--from-command {text!r} is not a shell command ({exc})") from None
    environment = []
    while words and "=" in words[0] and not words[0].startswith("-"):
        environment.append(words.pop(0).split("=", 1)[0])
    if not words:
        raise UsageError(
            "--from-command names no command; paste the line that starts the engine, e.g. 'vllm serve MODEL ...'"
        )
    return words, environment + _docker_environment(words)


def _docker_environment(words: list[str]) -> list[str]:
    """The names a `docker run` line sets with -e/--env NAME[=value]."""
    if words[0] not in ("docker", "podman", "sudo"):
        return []
    names = []
    for index, word in enumerate(words[:-1]):
        given = (
            words[index + 1] if word in ("-e", "--env") else word.partition("=")[2] if word.startswith("--env=") else ""
        )
        if given:  # -e NAME=value, or -e NAME: the host's value
            names.append(given.split("=", 1)[0])
    return names


ENVIRONMENT = (
    "the environment: not in the plan's command, and not modelled; set it in the engine's environment as you did "
    "(the docker, k8s and compose outputs do not carry it)"
)


# variables that pick what kvops plans by option instead
ENVIRONMENT_NOTES = {
    "HF_TOKEN": "the Hub token: the docker, k8s and compose outputs pass it (from the host's environment, or the "
    "Secret hf-token)",
    "VLLM_USE_V1": "picks vLLM's engine, which the plan takes from --engine-version instead: 0.8.5-v0 plans the V0 "
    "engine of 0.8-0.10, 0.7.3-v1 the V1 engine of 0.7 (the plan's command does not carry the variable)",
}


def with_environment(stated: StatedCommand, names: list[str]) -> StatedCommand:
    """A line for each environment variable the pasted command sets, named without its value (a token stays out of
    the plan)."""
    stated.lines.extend(f"{name}: {ENVIRONMENT_NOTES.get(name, ENVIRONMENT)}" for name in names)
    return stated


def after_image(words: list[str], images: tuple[str, ...]) -> list[str] | None:
    """The arguments after the engine's image in a `docker run` or `podman run` line (the image's entrypoint is
    the engine), or None when the line names none of these images."""
    if words[0] not in ("docker", "podman", "sudo"):
        return None
    for index, word in enumerate(words):
        if any(word == image or word.startswith((f"{image}:", f"{image}@")) for image in images):
            return words[index + 1 :]
    return None


# v0.8.5, 3.0.1, v0.6.1.post1, v0.10.1.1 (a hotfix), 2.4.1-rocm and 3.3.5-intel-xpu (TGI's builds for other devices)
RELEASE_TAG = re.compile(r"v?(\d+\.\d+(?:\.\d+){0,2})(?:\.post\d+)?(?:-[a-z][a-z0-9.-]*)?")


def image_tag(words: list[str], images: tuple[str, ...]) -> tuple[str, str] | None:
    """The engine image of a `docker run` line whose tag names a release, and that release
    (vllm/vllm-openai:v0.8.5 -> 0.8.5, text-generation-inference:3.0.1 -> 3.0.1); None without one (latest,
    nightly, a digest, no image)."""
    if after_image(words, images) is None:
        return None
    for word in words:
        for image in images:
            if word.startswith(f"{image}:"):
                tag = RELEASE_TAG.fullmatch(word[len(image) + 1 :])
                return (word, tag.group(1)) if tag else None
    return None


def with_image_release(stated: StatedCommand, words: list[str], images: tuple[str, ...]) -> StatedCommand:
    """A docker line's image tag states the release it runs: planned for it (--engine-version typed still wins)."""
    tagged = image_tag(words, images)
    if tagged:
        image, release = tagged
        stated.values["engine_version"] = release
        stated.lines.append(
            f"{image}: planned for the release its tag names, {release} (--engine-version overrides it)"
        )
    return stated


def split_options(
    args: list[str], lookup: Callable[[str], tuple[str, str] | None], dashes: bool = True
) -> tuple[list[str], list[Word]]:
    """(positional words, options): each option's value taken as its kind says (`lookup`: a spelling -> its canonical
    spelling and kind, None when unknown; an unknown option takes the next word when it is not an option).
    `dashes`: underscores in option names read as dashes (vLLM's parser does it; `--max_model_len`)."""
    positional: list[str] = []
    options: list[Word] = []
    index = 0
    while index < len(args):
        start = index
        word = args[index]
        index += 1
        if not word.startswith("-") or word == "-":
            positional.append(word)
            continue
        name, inline = word, None
        if "=" in word:  # --max-model-len=8192, and the short forms argparse splits alike: -dp=8
            name, inline = word.split("=", 1)
        if dashes and name.startswith("--"):
            head, dot, tail = name[2:].partition(".")
            name = "--" + head.replace("_", "-") + dot + tail
        known = lookup(name.split(".", 1)[0])  # a dotted field of a config option: --speculative-config.method
        kind = known[1] if known else (VALUE if index < len(args) and not args[index].startswith("-") else SWITCH)
        if "." in name and known:  # vLLM's dotted form: --speculative-config.method eagle3
            kind = VALUE
        value = inline
        if (value is None and kind == VALUE and index < len(args)) or (
            value is None and kind == OPTIONAL_VALUE and index < len(args) and not args[index].startswith("-")
        ):
            value, index = args[index], index + 1
        elif value is None and kind == LIST:
            taken = []
            while index < len(args) and not args[index].startswith("-"):
                taken.append(args[index])
                index += 1
            value = " ".join(taken) or None
        if known and kind == VALUE and value is None:
            raise UsageError(f"--from-command: {name} needs a value; the engine refuses it without one")
        canonical = known[0] if known else None
        negated = canonical is not None and _negates(name, canonical)
        options.append(Word(name, canonical, value, negated, tuple(args[start:index])))
    return positional, options


def _negates(name: str, canonical: str) -> bool:
    """The spelling turns the switch off: --no-X of --X, and --disable-X of --enable-X (or the reverse), which vLLM
    pairs from 0.33 (vllm/utils/argparse_utils.py EnableDisableAction)."""
    if name.startswith("--no-"):
        return not canonical.startswith("--no-")
    pairs = (("--disable-", "--enable-"), ("--enable-", "--disable-"))
    return any(name.startswith(off) and canonical == on + name.removeprefix(off) for off, on in pairs)


# --- values as the engines read them ---------------------------------------------------------------------------


def integer(word: Word) -> int:
    """A positive integer option value."""
    return _integer_from(word, 1)


def port(word: Word, stated: StatedCommand) -> None:
    """--port: the plan serves on it (its probes and port mappings follow) and keeps the option as given."""
    stated.values["port"] = integer(word)
    stated.keep(word)


def count(word: Word) -> int:
    """An integer option value from 0."""
    return _integer_from(word, 0)


def _integer_from(word: Word, least: int) -> int:
    try:
        value = int(str(word.value))
    except ValueError:
        raise UsageError(f"{word.written} {word.value!r} is not an integer") from None
    if value < least:
        raise UsageError(f"{word.written} {word.value!r} must be {'positive' if least else '0 or more'}")
    return value


def share(*, zero: bool, one: bool) -> Callable[[Word], float]:
    """A share between 0 and 1, each end allowed or not as the engine's own field allows."""

    def convert(word: Word) -> float:
        try:
            value = float(str(word.value))
        except ValueError:
            raise UsageError(f"{word.written} {word.value!r} is not a number between 0 and 1") from None
        if value < 0 or value > 1 or (value == 0 and not zero) or (value == 1 and not one):
            ends = f"{'[' if zero else '('}0, 1{']' if one else ')'}"
            raise UsageError(f"{word.written} {word.value!r} must be in {ends}")
        return value

    return convert


fraction = share(zero=False, one=True)  # a share of the device, in (0, 1]


def as_text(word: Word) -> str:
    return str(word.value)


Reader = Callable[[Word, StatedCommand], None]


def setter(field: str, convert: Callable[[Word], Any]) -> Reader:
    """A reader that sets one DeploymentOptions field from the option's value."""

    def read(word: Word, stated: StatedCommand) -> None:
        stated.values[field] = convert(word)

    return read
