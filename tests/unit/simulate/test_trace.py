"""kvops' own trace: the request and trace values, the JSONL format read and written back, and its one-line errors."""

from __future__ import annotations

import json

import pytest

from kvops.errors import UsageError
from kvops.simulate.trace import Trace, TraceError, TraceRequest, parse_jsonl, write_jsonl

LINES = [
    '{"arrival_s": 0.25, "prompt_tokens": 512, "output_tokens": 128}',
    "",
    '{"arrival_s": 1.5, "prompt_tokens": 900, "output_tokens": 64, "max_tokens": 256, "priority": -1,'
    ' "prefix_id": "system-a", "prefix_tokens": 200}',
    '{"arrival_s": 1.0, "prompt_tokens": 3000, "output_tokens": 7, "max_tokens": null,'
    ' "prefix": [["system-a", 200], ["doc-7", 1024]]}',
]


def parse(lines: list[str], where: str = "trace.jsonl") -> Trace:
    return parse_jsonl(lines, where)


def error(lines: list[str]) -> str:
    with pytest.raises(TraceError) as caught:
        parse(lines)
    return str(caught.value)


def test_reads_every_field_and_sorts_by_arrival():
    trace = parse(LINES)
    assert trace.timed
    assert trace.source == "trace.jsonl (kvops JSONL, 3 requests)"
    assert [request.arrival_s for request in trace.requests] == [0.25, 1.0, 1.5]
    assert trace.requests[1] == TraceRequest(1.0, 3000, 7, None, 0, (("system-a", 200), ("doc-7", 1024)))
    assert trace.requests[2] == TraceRequest(1.5, 900, 64, 256, -1, (("system-a", 200),))
    assert trace.requests[1].prefix_tokens == 1224


def test_round_trip_is_exact():
    trace = parse(LINES)
    again = parse(write_jsonl(trace).splitlines())
    assert again.requests == trace.requests
    assert again.timed


def test_untimed_round_trip_and_kvops_tokens_lines():
    # what `kvops tokens --out` writes (kvops/cli/tokens.py): source, prompt_tokens, gen_tokens
    lines = [
        '{"source": "a.txt", "prompt_tokens": 311, "gen_tokens": 200}',
        '{"source": "b.txt", "prompt_tokens": 95, "gen_tokens": 200}',
    ]
    trace = parse(lines)
    assert not trace.timed
    assert trace.requests == (TraceRequest(0.0, 311, 200), TraceRequest(0.0, 95, 200))
    written = write_jsonl(trace)
    assert "arrival_s" not in written
    assert parse(written.splitlines()).requests == trace.requests


def test_limit_stops_early():
    assert len(parse_jsonl(LINES, "t", limit=2)) == 2


@pytest.mark.parametrize(
    "lines, message",
    [
        (
            ['{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}'] * 16
            + ['{"arrival_s": 0, "prompt_tokens": "abc", "output_tokens": 1}'],
            'trace.jsonl line 17: field "prompt_tokens": expected a positive integer, got "abc"',
        ),
        (
            ['{"arrival_s": 0, "promt_tokens": 5, "output_tokens": 1}'],
            'trace.jsonl line 1: unknown field "promt_tokens" (valid: arrival_s, prompt_tokens, output_tokens,'
            " max_tokens, priority, prefix_id, prefix_tokens, prefix)",
        ),
        (
            ['{"arrival_s": 0, "prompt_tokens": 5}'],
            'trace.jsonl line 1: field "output_tokens": missing (expected a positive integer; kvops tokens writes it'
            " as gen_tokens when given --gen-tokens)",
        ),
        (
            ['{"arrival_s": 0, "prompt_tokens": 0, "output_tokens": 1}'],
            'trace.jsonl line 1: field "prompt_tokens": expected a positive integer, got 0',
        ),
        (
            ['{"arrival_s": -1, "prompt_tokens": 5, "output_tokens": 1}'],
            'trace.jsonl line 1: field "arrival_s": expected a number of at least 0, got -1',
        ),
        (
            ['{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 9, "max_tokens": 8}'],
            'trace.jsonl line 1: field "output_tokens": 9 is over max_tokens 8 (a request stops there)',
        ),
        (
            ['{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1, "prefix": [["a", 3], ["b", 3]]}'],
            'trace.jsonl line 1: field "prefix": its segments hold 6 tokens, more than prompt_tokens 5',
        ),
        (
            ['{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1, "prefix": [["a", 0]]}'],
            'trace.jsonl line 1: field "prefix[0]": expected a [key, tokens] pair: a non-empty string and a positive'
            ' integer, got ["a", 0]',
        ),
        (
            ['{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1, "prefix_tokens": 2}'],
            'trace.jsonl line 1: field "prefix_id": missing (expected a non-empty string, with prefix_tokens)',
        ),
        (
            ['{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1}', '{"prompt_tokens": 5, "output_tokens": 1}'],
            'trace.jsonl line 2: field "arrival_s": missing, but line 1 has one (give it on every line or on none)',
        ),
        (
            ['{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1,}'],
            "trace.jsonl line 1: not JSON (Expecting property name enclosed in double quotes at column 57); expected"
            ' an object like {"arrival_s": 0.25, "prompt_tokens": 512, "output_tokens": 128}',
        ),
        (
            ["[1, 2]"],
            'trace.jsonl line 1: expected a JSON object like {"arrival_s": 0.25, "prompt_tokens": 512,'
            ' "output_tokens": 128}, got [1, 2]',
        ),
        (
            ["", "  "],
            'trace.jsonl: no requests (kvops JSONL: one JSON object per line, e.g. {"arrival_s": 0.25,'
            ' "prompt_tokens": 512, "output_tokens": 128})',
        ),
    ],
)
def test_bad_lines_are_one_line_naming_file_line_and_field(lines, message):
    assert error(lines) == message


def test_a_long_bad_value_is_cut_to_fit_the_line():
    message = error([json.dumps({"arrival_s": 0, "prompt_tokens": "x" * 500, "output_tokens": 1})])
    assert message.endswith("...")
    assert len(message) < 160


def test_trace_error_is_a_usage_error_exiting_2():
    assert issubclass(TraceError, UsageError)
    assert TraceError("x").exit_code == 2


@pytest.mark.parametrize(
    "fields",
    [
        {"arrival_s": -0.1},
        {"prompt_tokens": 0},
        {"output_tokens": 0},
        {"max_tokens": 5, "output_tokens": 6},
        {"prefix": (("a", 11),)},
    ],
)
def test_requests_refuse_impossible_values(fields):
    values = {"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 5} | fields
    with pytest.raises(ValueError):
        TraceRequest(**values)


def test_helpers_make_new_traces():
    trace = parse(LINES)
    retimed = trace.with_arrivals([3.0, 2.0, 1.0])
    assert [request.prompt_tokens for request in retimed.requests] == [900, 3000, 512]
    assert retimed.timed
    assert [request.arrival_s for request in trace.scaled(2).requests] == [0.125, 0.5, 0.75]
    assert trace.head(2).requests == trace.requests[:2]
    assert trace.head(-1).requests == ()
    with pytest.raises(ValueError):
        trace.with_arrivals([1.0])
    with pytest.raises(UsageError, match="rate factor 0: expected a positive number"):
        trace.scaled(0)


def test_summary():
    requests = tuple(TraceRequest(float(i), 100 + i, 10 * (i + 1)) for i in range(100))
    summary = Trace(requests, "t").summary()
    assert summary["requests"] == 100
    assert summary["duration_s"] == 99.0
    assert summary["mean_rate_per_s"] == pytest.approx(1.0)  # one a second: one over the mean gap
    later = Trace(tuple(TraceRequest(1000.0 + i, 5, 5) for i in range(100)), "t").summary()
    assert (later["duration_s"], later["mean_rate_per_s"]) == (99.0, pytest.approx(1.0))  # not from time 0
    assert summary["prompt_tokens"] == {"mean": 149.5, "p50": 149, "p90": 189, "p99": 198}
    assert summary["output_tokens"]["p99"] == 990
    untimed = Trace(tuple(TraceRequest(0.0, 5, 5) for _ in range(3)), "u", timed=False).summary()
    assert untimed["duration_s"] is None
    assert untimed["mean_rate_per_s"] is None
    assert Trace((), "empty").summary()["prompt_tokens"]["mean"] is None
