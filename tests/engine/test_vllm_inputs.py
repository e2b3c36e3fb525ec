"""Inputs as users type them, read as the installed vLLM reads them: its own parsers, not a copy."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from kvops.units import parse_count

COUNTS = ["32K", "32k", "1M", "1m", "25.6k", "4.02k", "2.01k", "131072", "8G", "1.5m", "0.5k"]


@pytest.mark.vllm
@pytest.mark.parametrize("text", COUNTS)
def test_counts_equal_vllms_human_readable_int(text):
    import warnings

    warnings.simplefilter("ignore")
    from vllm.utils.argparse_utils import human_readable_int

    assert parse_count(text, "--max-model-len") == human_readable_int(text)


@pytest.mark.vllm
def test_serve_flag_table_is_the_installed_vllms():
    from tests.support.vllm_flags import serve_flag_table

    shipped = json.loads(resources.files("kvops.engines.vllm").joinpath("serve_flags.json").read_text())
    installed = serve_flag_table()
    assert shipped["releases"][installed["vllm"]]["options"] == installed["options"], (
        "regenerate: python -m tests.support.vllm_flags --write ~/.cache/kvops-ci/vllm-0.33.0 ~/.cache/kvops-ci/vllm-0.34.0"
    )
