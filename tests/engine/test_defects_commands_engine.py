"""What `kvops plan` emits for pasted launch lines, through the installed vLLM's own parser (run on 0.33 and 0.34 by
.ci/newer_vllm's pattern: VLLM_TARGET_DEVICE=cpu PYTHONPATH=<unpacked wheel>)."""

from __future__ import annotations

import pytest

from tests.engine.test_plan_flags import parse_serve
from tests.unit.cli.test_plan import plan_doc


@pytest.mark.vllm
def test_dotted_config_fields_and_the_short_level_parse_as_pasted(run_kvops):
    pasted = (
        "vllm serve Qwen/Qwen3-8B -O3 -cc.cudagraph_mode=PIECEWISE --compilation-config.cudagraph_capture_sizes+ 1,2,4 "
        "--speculative-config.method ngram --speculative-config.num_speculative_tokens 4"
    )
    doc = plan_doc(run_kvops, "--gpu", "h100", "--from-command", pasted)
    parsed, messages = parse_serve(doc["command"]["argv"][2:])
    assert messages == [] and str(parsed.optimization_level) == "3"
    assert parsed.speculative_config == {"method": "ngram", "num_speculative_tokens": 4}
    assert parsed.compilation_config.cudagraph_capture_sizes == [1, 2, 4]
    assert parsed.compilation_config.cudagraph_mode.name == "PIECEWISE"
