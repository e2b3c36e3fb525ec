"""kvops' degrade policy at the simulated API server: the shipped policy's levels, on the simulated clock."""

from __future__ import annotations

import pytest

from kvops.errors import UsageError
from kvops.policy import load_policy
from kvops.simulate.degrade import door, split_arm
from kvops.simulate.run import Admission


def test_each_level_answers_as_the_middleware_does():
    answer = door(load_policy())
    assert answer(0.0, 0.50) == Admission()
    assert answer(1.0, 0.75) == Admission(max_tokens=512)  # warn: new tokens capped
    assert answer(2.0, 0.96) == Admission(retry_after_s=1.0)  # critical: 503 with the admission's Retry-After 1


def test_the_shipped_admission_steps_down_as_soon_as_usage_allows():
    answer = door(load_policy())
    answer(0.0, 0.96)
    assert answer(0.1, 0.92) == Admission(retry_after_s=1.0)  # within the hysteresis
    assert answer(0.2, 0.10) == Admission()


def test_an_admission_dwell_holds_the_level_in_simulated_seconds(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("admission: {min_dwell_seconds: 30}\n")
    answer = door(load_policy(path))
    answer(0.0, 0.96)
    assert answer(29.0, 0.10) == Admission(retry_after_s=1.0)
    assert answer(31.0, 0.10) == Admission()


def test_each_arm_has_its_own_level():
    policy = load_policy()
    door(policy)(0.0, 0.99)
    assert door(policy)(1.0, 0.10) == Admission()


@pytest.mark.parametrize(
    ("text", "split"),
    [
        ("guard", ("guard", False)),
        ("guard+degrade", ("guard", True)),
        ("watermark:0.1 + Degrade", ("watermark:0.1", True)),
    ],
)
def test_an_arm_with_the_degrade_suffix(text, split):
    assert split_arm(text) == split


def test_an_unknown_suffix_is_one_line_naming_the_arm():
    with pytest.raises(UsageError, match=r"--compare 'stock\+proxy': the one suffix an arm takes is \+degrade"):
        split_arm("stock+proxy")
