"""Hostile inputs shared by the tests of issue 23: YAML that expands or nests without end, and a guard that turns a
hang (a FIFO read, a runaway regex) into a failure instead of a stuck test run."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


def billion_laughs(levels: int = 9) -> str:
    """The YAML bomb: each level lists the previous one ten times (10**levels strings once expanded)."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


# Mistral-7B's config.json fields kvops reads: the valid base each hostile config changes one field of
MISTRAL_CONFIG = {
    "model_type": "mistral",
    "architectures": ["MistralForCausalLM"],
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "vocab_size": 32768,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
}


# YAML a settings file may not be: each refused in one line (see kvops/files.py)
HOSTILE_YAML = {
    "billion laughs": billion_laughs(),
    "seven laughing levels": billion_laughs(7),  # 60 aliases, ten million values once expanded
    "a self-referencing anchor": "levels: &a [*a]\n",
    "nested 5000 deep": "[" * 5000 + "]" * 5000 + "\n",
    "a python tag": "levels: !!python/object/apply:os.system [true]\n",
}


class Hung(Exception):
    """What `deadline` raises when the code under test did not return in time."""


@contextmanager
def deadline(seconds: int = 30) -> Iterator[None]:
    """Fail, instead of hanging the suite, when the body blocks (SIGALRM: Unix, main thread). It measures nothing:
    the bound is far past what the body needs, so only a hang trips it."""

    def expired(signum, frame):
        raise Hung(f"did not return within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
