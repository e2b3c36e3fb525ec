"""Fuzzing the watcher's and the proxy's inputs (hypothesis, derandomized and bounded: seconds in CI).

Paths, bodies and header values go over real sockets to a proxy served as `kvops watch` serves it, in front of a
recording stand-in upstream; expositions go to the metrics parser. Whatever comes in: no traceback, no 500, no
secret in any output, and at critical no generation request reaches the upstream.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import math
import string

import pytest

from kvops import engines
from kvops.engines.metrics import MetricsError, Samples
from kvops.policy import Level
from kvops.watch.guard import canonical_path, quoted
from kvops.watch.watcher import EventLog
from tests.support.aio import ServerThread
from tests.support.raw_http import exchange, request_bytes, status_of
from tests.support.upstream import RecordingUpstream
from tests.unit.watch.test_proxy import LevelHolder, make_proxy_app

pytest.importorskip("hypothesis", reason="hypothesis is not installed (pip install -e '.[test]'; .ci/run does)")
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
ROUTES = {engine: [r.path.replace("*", "m") for r in engines.get(engine).api.ROUTES] for engine in engines.NAMES}
SECRET = "fuzz-secret-5b0d"


# --- paths -----------------------------------------------------------------------------------------------------------


def _encoded(character: str, upper: bool) -> str:
    return "".join(f"%{byte:02X}" if upper else f"%{byte:02x}" for byte in character.encode())


@st.composite
def disguised(draw, path: str) -> str:
    """`path` spelled as a client might to slip past a guard that matches the raw path: dot segments, detours,
    doubled or trailing slashes, matrix parameters, percent-encoded letters and slashes."""
    parts = []
    for segment in [s for s in path.split("/") if s]:
        for _ in range(draw(st.integers(0, 2))):
            parts.append(draw(st.sampled_from([".", "%2e", "x/..", "%2E/", "", "a;b=c/.."])))
        spelled = "".join(_encoded(c, draw(st.booleans())) if draw(st.integers(0, 4)) == 0 else c for c in segment)
        if draw(st.booleans()):
            spelled += draw(st.sampled_from([";v=1", ";", ";jsessionid=x"]))
        parts.append(spelled)
    separator = draw(st.sampled_from(["/", "//", "/", "%2F", "/./"]))
    joined = "/" + separator.join(parts)
    return joined + draw(st.sampled_from(["", "/", "//", "/.", "?stream=true"]))


@FUZZ
@given(st.data())
def test_every_disguise_of_a_route_canonicalises_to_it(data):
    engine = data.draw(st.sampled_from(engines.NAMES))
    route = data.draw(st.sampled_from([p for p in ROUTES[engine] if p != "/"]))
    target = data.draw(disguised(route))
    assert canonical_path(target.split("?", 1)[0]) == route, target


@FUZZ
@given(st.text(alphabet=string.printable + "é%;./", max_size=80))
@example("/../../..")
@example("%")
@example("/%ff%fe/%C0%AF")
def test_canonical_paths_are_canonical(raw):
    path = canonical_path("/" + raw)
    assert path.startswith("/") and "//" not in path and ";" not in path
    assert not any(segment in (".", "..") for segment in path.split("/"))
    assert canonical_path(quoted(path)) == path  # what is forwarded decodes to what was guarded


@pytest.fixture(scope="module")
def upstream():
    recorder = RecordingUpstream(chunks=1)
    with ServerThread(recorder.app) as server:
        server.recorder = recorder
        yield server


@pytest.fixture(scope="module")
def proxies(upstream):
    """A guarded proxy per engine at critical, and a vLLM one at warn; their event logs."""
    logs = {}
    servers = {}
    for name, engine, level in (
        ("vllm", "vllm", Level.CRITICAL),
        ("tgi", "tgi", Level.CRITICAL),
        ("warn", "vllm", Level.WARN),
    ):
        logs[name] = io.StringIO()
        holder = LevelHolder(level)
        servers[name] = ServerThread(
            make_proxy_app(upstream.url, holder, engine=engine, max_body_bytes=1 << 20),
            guarded=True,
            log=EventLog(logs[name]),
        ).start()
    yield servers, logs
    for server in servers.values():
        server.stop()


def _guarded_paths_received(upstream) -> list[str]:
    every = {p for paths in ROUTES.values() for p in paths}
    return [r.raw_path for r in upstream.recorder.received if canonical_path(r.raw_path.split("?")[0]) in every]


@FUZZ
@given(st.data())
def test_no_disguised_generation_request_reaches_the_upstream_at_critical(proxies, upstream, data):
    servers, _ = proxies
    engine = data.draw(st.sampled_from(engines.NAMES))
    target = data.draw(disguised(data.draw(st.sampled_from(ROUTES[engine]))))
    answer = exchange(servers[engine].port, request_bytes("POST", target, b'{"prompt": "x", "max_tokens": 4000}'))
    status = status_of(answer)
    assert status in (503, 400), (target, answer[:200])
    assert _guarded_paths_received(upstream) == []


# --- bodies ----------------------------------------------------------------------------------------------------------

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.integers(min_value=1, max_value=5000)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
)
TOKEN_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "max_tokens": JSON_SCALARS,
        "max_completion_tokens": JSON_SCALARS,
        "n": JSON_SCALARS,
        "best_of": JSON_SCALARS,
        "use_beam_search": JSON_SCALARS,
        "min_tokens": JSON_SCALARS,
    },
)
DOCUMENTS = st.recursive(
    JSON_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
)


@st.composite
def bodies(draw) -> bytes:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return draw(st.binary(max_size=200))
    if kind == 1:  # deep, or with a very long number
        depth = draw(st.integers(100, 3000))
        return b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"
    if kind == 2:
        return b'{"prompt": "x", "max_tokens": ' + b"9" * draw(st.integers(20, 6000)) + b"}"
    document = {**draw(st.dictionaries(st.text(max_size=8), DOCUMENTS, max_size=3)), **draw(TOKEN_FIELDS)}
    return json.dumps(document, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")


@FUZZ
@given(bodies(), st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1/responses", "/invocations"]))
def test_any_body_is_answered_without_a_500_and_never_beyond_the_cap(proxies, upstream, body, path):
    servers, _ = proxies
    before = len(upstream.recorder.received)
    answer = exchange(servers["warn"].port, request_bytes("POST", path, body, {"Content-Type": "application/json"}))
    status = status_of(answer)
    assert status in (200, 400), answer[:300]
    if status == 400:
        assert len(upstream.recorder.received) == before
        return
    forwarded = upstream.recorder.received[-1].json()
    route = engines.get("vllm").api.ROUTES.match("POST", path)
    fields = next(v.fields for v in route.variants if v.when is None or v.when in forwarded)
    for name in fields.tokens:  # every token limit this route's engine reads is capped
        value = forwarded.get(name)
        assert value is None or value <= 512, (name, value)


# --- header values ---------------------------------------------------------------------------------------------------


@pytest.fixture
def library_logs():
    """aiohttp's and asyncio's records routed to an event log, as `kvops watch` routes them; restored after."""
    from kvops.watch.connection import capture_library_logs

    saved = {
        name: (logging.getLogger(name).handlers[:], logging.getLogger(name).propagate)
        for name in ("aiohttp", "asyncio")
    }
    stream = io.StringIO()
    capture_library_logs(EventLog(stream))
    yield stream
    for name, (handlers, propagate) in saved.items():
        logging.getLogger(name).handlers[:] = handlers
        logging.getLogger(name).propagate = propagate


@FUZZ
@given(
    st.binary(max_size=64),
    st.integers(0, 20_000),
    st.sampled_from(["Authorization", "Cookie", "X-Api-Key", "Proxy-Authorization"]),
    st.sampled_from([b"GET /v1/models", b"POST /v1/completions", b"POST /v1/./completions"]),
)
def test_no_header_value_reaches_any_output(proxies, upstream, library_logs, capfd, tail, padding, name, line):
    servers, logs = proxies
    value = b"Bearer " + SECRET.encode() + b"x" * padding + tail
    head = line + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + name.encode() + b": " + value
    raw = head + b"\r\nContent-Length: 2\r\n\r\n{}"
    answer = exchange(servers["vllm"].port, raw, timeout=10)
    status = status_of(answer)
    assert status is None or status < 500 or status == 503, answer[:200]
    output = library_logs.getvalue() + "".join(log.getvalue() for log in logs.values())
    captured = capfd.readouterr()
    assert SECRET not in output + captured.out + captured.err
    assert captured.err == ""  # nothing on stderr: no traceback


# --- expositions -----------------------------------------------------------------------------------------------------

LINES = st.one_of(
    st.text(max_size=60),
    st.builds(
        lambda name, labels, value: f"{name}{labels} {value}",
        st.sampled_from(
            [
                "vllm:kv_cache_usage_perc",
                "vllm:gpu_cache_usage_perc",
                "vllm:num_requests_running",
                "vllm:num_preemptions_total",
                "vllm:cache_config_info",
                "tgi_batch_current_max_tokens",
                "tgi_queue_size",
                "other",
            ]
        ),
        st.sampled_from(["", '{engine="0"}', '{engine="1",model_name="m"}', "{", '{a="\\"}', '{num_gpu_blocks="x"}']),
        st.one_of(st.floats(allow_nan=True), st.sampled_from(["NaN", "+Inf", "-Inf", "1e999", "x", "", "0x1"])),
    ),
    st.sampled_from(["# TYPE vllm:kv_cache_usage_perc gauge", "# HELP x y", "# TYPE x counter", "# EOF", "#"]),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(LINES, max_size=30), st.sampled_from(engines.NAMES))
def test_any_exposition_gives_a_reading_or_a_metrics_error(lines, engine):
    module = engines.get(engine).metrics
    text = "\n".join(lines) + "\n"
    try:
        reading = module.reading(Samples.from_exposition(text, only=module.SERIES), 16000)
    except MetricsError as error:
        assert str(error) and "\n" not in str(error)
        return
    assert math.isfinite(reading.kv_usage) and 0.0 <= reading.kv_usage <= 1.0


# --- readings through the watcher: whatever an engine or Prometheus answers, a level or missing data ----------------


class ExpositionSource:
    """Each poll parses one exposition as ScrapeSource does after its fetch, without HTTP."""

    url = "http://engine/metrics"
    replica_label = "instance"

    def __init__(self, engine: str, text: str):
        self.module, self.text = engines.get(engine).metrics, text

    async def poll(self):
        from kvops.watch.sources import Poll

        try:
            samples = Samples.from_exposition(self.text, only=self.module.SERIES)
            return Poll(readings={"engine:8000": self.module.reading(samples, 16000)})
        except MetricsError as exc:
            return Poll(failures={"engine:8000": str(exc)})

    async def close(self) -> None:
        return None


@functools.cache
def _policy():
    from kvops.policy import load_policy

    return load_policy()


def _through_the_watcher(source, polls: int = 2) -> None:
    import asyncio

    from kvops.cli.watch import once_text
    from kvops.watch.watcher import Watcher

    async def run():
        watcher = Watcher(_policy(), "vllm", source, log=EventLog(io.StringIO()), request_tokens=32768)
        for _ in range(polls):
            snapshot = await watcher.poll()
            json.dumps(snapshot.to_dict(), allow_nan=False)  # /kvops/status: valid JSON, no NaN
            once_text(snapshot)
        await watcher.close()

    asyncio.run(run())


HUGE = st.sampled_from(["1e306", "-1e306", "1.7976931348623157e308", "9" * 30, "1e18", "4e18"])


@FUZZ
@given(st.lists(st.one_of(LINES, st.builds(lambda v: f"vllm:num_requests_running {v}", HUGE)), max_size=30))
def test_any_exposition_through_the_watcher_is_a_level_or_missing_data(lines):
    text = "vllm:kv_cache_usage_perc 0.5\n" + "\n".join(lines) + "\n"
    _through_the_watcher(ExpositionSource("vllm", text))


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12), HUGE),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)
ROWS = st.lists(
    st.one_of(
        JSON_VALUES,
        st.fixed_dictionaries(
            {
                "metric": st.one_of(
                    st.fixed_dictionaries(
                        {
                            "__name__": st.sampled_from(
                                [
                                    "vllm:kv_cache_usage_perc",
                                    "vllm:num_requests_running",
                                    "vllm:cache_config_info",
                                    "up",
                                ]
                            ),
                            "pod": st.one_of(st.sampled_from(["a", "b"]), st.integers(0, 3)),
                        }
                    ),
                    JSON_VALUES,
                ),
                "value": st.one_of(
                    st.tuples(st.floats(), st.one_of(st.sampled_from(["0.5", "NaN", "+Inf", "x"]), HUGE)), JSON_VALUES
                ),
            }
        ),
    ),
    max_size=6,
)


@FUZZ
@given(st.lists(st.one_of(ROWS, JSON_VALUES), min_size=1, max_size=3))
def test_any_prometheus_answer_is_a_level_or_missing_data(answers):
    from tests.unit.watch.test_hostile_watch import ScriptedPrometheus

    _through_the_watcher(
        ScriptedPrometheus([list(map(_listed, a)) if isinstance(a, list) else a for a in answers]), len(answers)
    )


def _listed(row):
    """Rows as Prometheus' JSON gives them: a [time, value] pair is a list."""
    if isinstance(row, dict) and isinstance(row.get("value"), tuple):
        return {**row, "value": list(row["value"])}
    return row
