"""The commands `kvops plan --from-command` emits for vLLM 0.32, 0.33 and 0.34, parsed by that release's own `vllm
serve` parser in a fresh interpreter (0.32.0: the installed CPU build; 0.33.0 and 0.34.0: their wheels unpacked by
.ci/newer_vllm into ~/.cache/kvops-ci, ahead on PYTHONPATH, VLLM_TARGET_DEVICE=cpu): every pasted option the release
refuses is left out, so the command starts as written; and each shipped option table is the release's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.support.paths import REPO

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvops-ci"
RELEASES = ("0.32.0", "0.33.0", "0.34.0")
PASTED = (
    'vllm serve Qwen/Qwen3-8B --swap-space 16 --disable-log-requests --rope-scaling \'{"rope_type": "yarn"}\' '
    "--max-num-seqz 8 --num-scheduler-steps 8 --disable-prefix-caching --shuffle-safetensors-files "
    "--max-cudagraph-capture-size 2048 --served-model-name q --port 9000"
)
# `vllm serve ARGS` parsed as the release's CLI parses it; prints the fields asked for, or exits 2 as vLLM does
PARSE = """
import json, sys, warnings
warnings.simplefilter("ignore")
import vllm
from vllm.entrypoints.cli.serve import ServeSubcommand
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
parsed = parser.parse_args(["serve", *json.loads(sys.argv[1])])
compilation = parsed.compilation_config
print(json.dumps({"version": vllm.__version__, "port": parsed.port, "served": parsed.served_model_name,
    "prefix_caching": parsed.enable_prefix_caching,
    "max_capture": getattr(compilation, "max_cudagraph_capture_size", None)}))
"""


def environment(version: str) -> dict[str, str]:
    """The release on PYTHONPATH ahead of the installed one (0.32.0: the installed CPU build), or a skip."""
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    if version == "0.32.0":
        if find_spec("vllm") is None:
            pytest.skip("vLLM's CPU build is not installed (pip install -e '.[vllm]')")
        env["PYTHONPATH"] = str(REPO)
        return env
    tree = CACHE / f"vllm-{version}"
    if not (tree / "vllm").is_dir():
        pytest.skip(f"vLLM {version}'s wheel is not unpacked at {tree} (bash .ci/newer_vllm does it)")
    env["PYTHONPATH"] = os.pathsep.join([str(tree), str(REPO)])
    return env


def parse(version: str, args: list[str]) -> dict:
    ran = subprocess.run(
        [sys.executable, "-c", PARSE, json.dumps(args)],
        env=environment(version),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, f"vLLM {version} refused {args}:\n{ran.stderr[-2000:]}"
    parsed = json.loads(ran.stdout.strip().splitlines()[-1])
    assert parsed["version"] == version
    return parsed


@pytest.mark.parametrize("version", RELEASES)
def test_the_emitted_command_of_a_pasted_line_starts_on_the_release_planned(run_kvops, version):
    ran = run_kvops("plan", "--format", "json", "--gpu", "h100", "--engine-version", version, "--from-command", PASTED)
    doc = json.loads(ran.stdout)
    argv = doc["command"]["argv"]
    parsed = parse(version, argv[2:])
    assert (parsed["port"], parsed["served"]) == (9000, ["q"])
    # --disable-prefix-caching: 0.33 on read it as the switch off; 0.32 refuses it, so it is left out (the default)
    assert parsed["prefix_caching"] == (None if version == "0.32.0" else False)
    assert parsed["max_capture"] == 2048  # the graph option, emitted as the compilation config's field
    assert ("--disable-log-requests" in argv) == (version != "0.32.0")
    assert ("--shuffle-safetensors-files" in argv) == (version == "0.34.0")
    left_out = [line for line in doc["from_command"] if "left out of the plan's command" in line]
    assert len(left_out) == 4 + (version != "0.34.0") + (version == "0.32.0") * 2


@pytest.mark.parametrize("version", RELEASES)
def test_the_docker_command_starts_on_the_release_its_image_runs(run_kvops, version):
    pasted = (
        f"docker run --gpus all vllm/vllm-openai:v{version} --model Qwen/Qwen3-8B --swap-space 4 --disable-log-requests"
    )
    words = run_kvops("plan", "--format", "docker", "--gpu", "h100", "--from-command", pasted).stdout.split()
    image = f"vllm/vllm-openai:v{version}"
    assert image in words
    parse(version, words[words.index(image) + 1 :])


@pytest.mark.parametrize("version", RELEASES)
def test_each_shipped_table_is_the_releases_own(version):
    from tests.support.vllm_flags import table_of

    environment(version)  # skips where the release is absent
    tree = None if version == "0.32.0" else str(CACHE / f"vllm-{version}")
    shipped = json.loads((REPO / "kvops" / "engines" / "vllm" / "serve_flags.json").read_text())
    assert shipped["releases"][version]["options"] == table_of(tree)["options"], (
        "regenerate: python -m tests.support.vllm_flags --write ~/.cache/kvops-ci/vllm-0.33.0 ~/.cache/kvops-ci/vllm-0.34.0"
    )
