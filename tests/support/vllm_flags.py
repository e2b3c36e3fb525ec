"""The `vllm serve` options of the installed vLLM, as kvops/engines/vllm/serve_flags.json records them.

Regenerate after a vLLM upgrade: python -m tests.support.vllm_flags > kvops/engines/vllm/serve_flags.json
"""

from __future__ import annotations

import json
import warnings


def serve_flag_table() -> dict:
    """Every option string of `vllm serve`, by how many words follow it."""
    warnings.simplefilter("ignore")
    import vllm
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    table: dict[str, list[str]] = {"switches": [], "values": [], "optional_values": [], "lists": []}
    kind = {0: "switches", None: "values", "?": "optional_values", "+": "lists", "*": "lists"}
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            table[kind[action.nargs]].extend(action.option_strings)
    return {"vllm": vllm.__version__, **{key: sorted(set(names)) for key, names in table.items()}}


if __name__ == "__main__":
    print(json.dumps(serve_flag_table(), indent=1))
