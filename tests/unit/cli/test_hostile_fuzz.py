"""Fuzzing the files a user gives (issue 23; hypothesis, derandomized and bounded: seconds in CI).

Real catalog configs with one field kvops reads set to anything JSON can hold, through `kvops kv` and `kvops plan`;
policies, profiles and `-f` files of any YAML shape, through their loaders. Whatever the file: a result or one error
line naming it, never a traceback."""

from __future__ import annotations

import json
import math
import traceback

import pytest
from click.testing import CliRunner

from kvops.cli import main
from kvops.errors import KvopsError
from kvops.model import catalog
from kvops.model.fields import LISTS, NUMBERS, TEXTS, WHOLE_NUMBERS

pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install -e '.[test]'; .ci/run does)")
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
# dense, MoE with fp8 blocks, MLA, multimodal with a vision tower, hybrid recurrent, MXFP4 with sliding layers, NAS
BASES = ["mistralai/Mistral-7B-Instruct-v0.3", "Qwen/Qwen3-30B-A3B-FP8", "deepseek-ai/DeepSeek-V3"]
BASES += ["google/gemma-3-12b-it", "Qwen/Qwen3-Next-80B-A3B-Instruct", "openai/gpt-oss-20b"]
BASES += ["nvidia/Llama-3_3-Nemotron-Super-49B-v1", "nvidia/Nemotron-H-56B-Base-8K"]
READ = sorted({*WHOLE_NUMBERS, *NUMBERS, *TEXTS, *LISTS, "quantization_config", "text_config", "vision_config"})

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 10**9, 1e308, "32", "", "bf16", "fp8", "full_attention"]),
    st.text(max_size=8),
)
VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.sampled_from(READ), children, max_size=3)
    ),
    max_leaves=8,
)


def config_of(base: str) -> dict:
    return json.loads(json.dumps(catalog.find(base).config))


def no_traceback(args: list[str]) -> None:
    result = CliRunner().invoke(main, args, catch_exceptions=True)
    exception = result.exception
    if exception is not None and not isinstance(exception, SystemExit):
        shown = "".join(traceback.format_exception(type(exception), exception, exception.__traceback__))
        pytest.fail(f"kvops {' '.join(args)} raised:\n{shown}")
    errors = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("kvops: warning:")]
    assert result.exit_code in (0, 3) or len(errors) == 1, result.stderr


@FUZZ
@given(
    st.sampled_from(BASES), st.sampled_from(["", "text_config.", "vision_config.", "quantization_config."]), st.data()
)
def test_any_value_of_a_field_kvops_reads_is_a_plan_or_one_line(tmp_path_factory, base, section, data):
    config = config_of(base)
    target = config.get(section.rstrip(".")) if section else config
    if not isinstance(target, dict):
        target = config
    name = data.draw(st.sampled_from(sorted({*READ, *target})), "field")
    target[name] = data.draw(VALUES, "value")
    path = tmp_path_factory.mktemp("config") / "config.json"
    path.write_text(json.dumps(config))
    command = data.draw(st.sampled_from(["kv", "plan"]), "command")
    args = ["kv", "-m", str(path), "-t", "4096"] if command == "kv" else ["plan", "-m", str(path), "--gpu", "H100"]
    no_traceback(args)


YAML_VALUES = st.recursive(
    st.one_of(SCALARS, st.sampled_from(["warn", "critical", "fail-open", 0.5, 0.9, 60])),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(
            st.one_of(
                st.sampled_from(
                    ["levels", "actions", "signals", "unknown", "headroom", "priorities", "warn", "degrade"]
                    + ["critical", "max_tokens_cap", "reject", "retry_after_seconds", "stall", "raise_to", "seconds"]
                    + ["mode", "grace_polls", "gpu_memory", "below", "kv_cache", "compression", "swap", "max_size"]
                    + ["kvops_profile", "engine", "source", "tp", "kv_cache_bytes", "gpu_memory_utilization"]
                ),
                st.integers(-3, 3),
            ),
            children,
            max_size=4,
        ),
    ),
    max_leaves=10,
)


@FUZZ
@given(YAML_VALUES)
def test_any_policy_is_a_policy_or_one_line(tmp_path_factory, document):
    import yaml

    from kvops.policy import PolicyError, load_policy

    path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(yaml.safe_dump(document))
    try:
        load_policy(path)
    except PolicyError as exc:
        assert str(exc).startswith(("--policy", str(path))) and "\n" not in str(exc)


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(
            ["kvops_profile", "engine", "source", "model", "tp", "kv_cache_bytes"]
            + ["gpu_memory_utilization", "block_size", "engine_version", "num_gpu_blocks"]
        ),
        YAML_VALUES,
        max_size=6,
    )
)
def test_any_profile_is_a_profile_or_one_line(document):
    from kvops.profile import Profile

    document = {"kvops_profile": 1, "engine": "vllm", **document}
    try:
        profile = Profile.from_dict(document, "profile.yaml")
    except KvopsError as exc:
        assert str(exc).startswith("profile.yaml: ") and "\n" not in str(exc)
        return
    numbers = [value for value in vars(profile).values() if isinstance(value, (int, float))]
    assert all(math.isfinite(value) and 0 <= value <= 1 << 50 for value in numbers)


@FUZZ
@given(YAML_VALUES)
def test_any_kvops_yaml_is_options_or_one_line(tmp_path_factory, document):
    import yaml

    path = tmp_path_factory.mktemp("file") / "kvops.yaml"
    path.write_text(yaml.safe_dump(document))
    no_traceback(["plan", "-f", str(path), "-m", "qwen3-8b", "--gpu", "L4"])
