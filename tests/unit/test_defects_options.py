"""Options of older vLLM releases pasted into `kvops plan --from-command`: each test replays a line that named no
release. The releases are read in the PyPI wheels' vllm/engine/arg_utils.py: --num-scheduler-steps is in 0.10.0's
(l.803) and not in 0.10.1's; --rope-scaling and --rope-theta are in 0.11.0's (l.541, l.543) and not in 0.11.1's."""

from __future__ import annotations

import pytest

from tests.unit.cli.test_plan import plan_doc

PASTED = (
    "vllm serve Qwen/Qwen3-8B --num-scheduler-steps 8 "
    """--rope-scaling '{"rope_type": "yarn", "factor": 4.0}' --rope-theta 1000000"""
)
OPTIONS = {"--num-scheduler-steps": "0.10.1", "--rope-scaling": "0.11.1", "--rope-theta": "0.11.1"}


def planned(run_kvops, version: str) -> tuple[list[str], dict[str, str]]:
    """The plan's argv and its line for each pasted option."""
    doc = plan_doc(run_kvops, "--gpu", "h100", "--engine-version", version, "--from-command", PASTED)
    lines = {option: next(text for text in doc["from_command"] if text.startswith(option)) for option in OPTIONS}
    return doc["command"]["argv"], lines


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0", "0.34.0"])
def test_a_removed_option_names_the_first_release_without_it(run_kvops, version):
    """The lines said "(removed before 0.32.0)" for all three."""
    argv, lines = planned(run_kvops, version)
    for option, since in OPTIONS.items():
        assert option not in argv
        assert f"vLLM {version}'s vllm serve refuses it (removed in vLLM {since})" in lines[option]
    assert lines["--num-scheduler-steps"].endswith("multi-step scheduling, removed with the V0 engine")
    assert """give it as --hf-overrides '{"rope_scaling": ...}'""" in lines["--rope-scaling"]


def test_a_release_between_the_removals_keeps_what_it_takes_and_drops_what_it_refuses(run_kvops):
    """vLLM 0.10.1 refuses --num-scheduler-steps but takes the rope options: kvops had kept all three in the command
    as 'unknown', so the plan's command failed at startup ("unrecognized arguments")."""
    argv, lines = planned(run_kvops, "0.10.1")
    assert "--num-scheduler-steps" not in argv and "--rope-scaling" in argv and "--rope-theta" in argv
    assert "vLLM 0.10.1's vllm serve refuses it (removed in vLLM 0.10.1)" in lines["--num-scheduler-steps"]
    assert lines["--rope-theta"] == (
        "--rope-theta 1000000: kept: vLLM 0.10.1 takes it (vllm serve refuses it from vLLM 0.11.1); not modelled"
    )


@pytest.mark.parametrize("version", ["0.8.5-v0", "0.10.0"])
def test_an_older_release_that_takes_them_is_not_told_they_are_removed(run_kvops, version):
    argv, lines = planned(run_kvops, version)
    for option, since in OPTIONS.items():
        assert option in argv
        assert "removed" not in lines[option] and f"vllm serve refuses it from vLLM {since}" in lines[option]
