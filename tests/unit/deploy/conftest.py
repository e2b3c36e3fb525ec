"""The schema validator the deploy tests check upstream CRDs and Helm schemas with."""

from __future__ import annotations

import pytest


@pytest.fixture
def jsonschema():
    return pytest.importorskip(
        "jsonschema", reason="jsonschema is not installed (pip install -e '.[test]'; .ci/run does)"
    )
