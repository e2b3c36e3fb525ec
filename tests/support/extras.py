"""Tests that need an optional dependency (an extra of kvops or of its tests) skip where it is not installed, with
one line saying what to install: the fast suite (`-m "not engine"`) runs on kvops' own dependencies and pytest."""

from __future__ import annotations

from importlib.util import find_spec

import pytest

INSTALL = "pip install -e '.[test]'; .ci/run does"


def needs(*modules: str) -> pytest.MarkDecorator:
    """Skip the test where any of `modules` is missing."""
    missing = [module for module in modules if find_spec(module) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed ({INSTALL})")
