"""What the unit tests share: a recording upstream engine on 127.0.0.1 (the proxy tests, the guard defects)."""

from __future__ import annotations

import pytest

from tests.support.aio import ServerThread
from tests.support.upstream import RecordingUpstream


@pytest.fixture
def upstream():
    """A stand-in engine that records every request it receives (`server.recorder`)."""
    recorder = RecordingUpstream()
    with ServerThread(recorder.app) as server:
        server.recorder = recorder
        yield server
