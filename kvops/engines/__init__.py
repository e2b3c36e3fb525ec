"""The serving engines kvops plans, watches and guards: the registry, the only list of them.

Everything that differs between engines lives in that engine's package (`kvops/engines/<name>/`), behind the
`Engine` interface of `base.py`; the rest of kvops asks `engines.get(name)`. Adding an engine is one package and one
line here. Adapters are imported when first asked for, so commands that name no engine do not load them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from kvops.errors import UsageError

if TYPE_CHECKING:
    from kvops.engines.base import Engine
    from kvops.engines.command import StatedCommand

# engine name -> the module whose ENGINE is its adapter
REGISTRY = {
    "vllm": "kvops.engines.vllm.engine",
    "tgi": "kvops.engines.tgi.engine",
}
NAMES = tuple(REGISTRY)


def get(name: str) -> Engine:
    """The adapter of the engine called `name` (any case)."""
    module = REGISTRY.get(name.strip().lower())
    if module is None:
        raise UsageError(f"--engine {name!r}; valid: {', '.join(NAMES)}")
    engine: Engine = importlib.import_module(module).ENGINE
    return engine


def read_command(text: str, version: str | None = None, fallback: str | None = None) -> StatedCommand:
    """The deployment a pasted launch command states, read by the engine whose program or image it names, as the
    release planned reads it (`version` typed, else the line's image tag, else `fallback`, a file's)."""
    from kvops.engines.command import command_words, with_environment

    words, environment = command_words(text)
    for name in NAMES:
        stated = get(name).read_command(words, version, fallback)
        if stated is not None:
            return with_environment(stated, environment)
    programs = "; ".join(" ".join(get(name).program) for name in NAMES)
    raise UsageError(
        f"--from-command: {words[0]!r} starts no engine kvops plans; paste a line that runs {programs}, python -m vllm.entrypoints.openai.api_server, or docker run with their images"
    )
