"""The `vllm serve` options of the installed vLLM, as kvops/engines/vllm/serve_flags.json records them.

Regenerate after a vLLM upgrade: python -m tests.support.vllm_flags > kvops/engines/vllm/serve_flags.json
"""

from __future__ import annotations

import json
import warnings

_KINDS = {0: "switch", None: "value", "?": "optional_value", "+": "list", "*": "list"}


def serve_flag_table() -> dict:
    """Every option of `vllm serve` by its first long spelling: how many words follow it, and every spelling
    (short forms, aliases, the --no- form of a switch)."""
    warnings.simplefilter("ignore")
    import vllm
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    options: dict[str, dict] = {}
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        long = [name for name in action.option_strings if name.startswith("--") and not name.startswith("--no-")]
        canonical = (long or action.option_strings)[0]
        options[canonical] = {"kind": _KINDS[action.nargs], "spellings": sorted(action.option_strings)}
    return {"vllm": vllm.__version__, "options": dict(sorted(options.items()))}


if __name__ == "__main__":
    print(json.dumps(serve_flag_table(), indent=1))
