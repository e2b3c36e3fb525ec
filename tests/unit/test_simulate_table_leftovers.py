"""Defects in `kvops simulate` and `kvops table` output, each replayed as the user met it."""

from __future__ import annotations

import csv
import json

import pytest

from kvops.simulate.formats import read_trace

# arrival_s out of file order: the first three lines are not the first three arrivals
SHUFFLED = [(0.9, 101), (0.5, 102), (0.7, 103), (0.1, 104), (0.3, 105), (0.2, 106)]


def _shuffled_trace(tmp_path):
    path = tmp_path / "shuffled.jsonl"
    path.write_text(
        "".join(
            json.dumps({"arrival_s": at, "prompt_tokens": prompt, "output_tokens": 8}) + "\n" for at, prompt in SHUFFLED
        )
    )
    return path


def test_requests_n_on_an_unordered_trace_takes_the_first_n_arrivals(tmp_path):
    """`--trace FILE --requests 3` took the file's first 3 lines (arrivals 0.9, 0.5, 0.7), then sorted them."""
    trace = read_trace(_shuffled_trace(tmp_path), limit=3)
    assert [request.arrival_s for request in trace.requests] == [0.1, 0.2, 0.3]
    assert [request.line for request in trace.requests] == [4, 6, 5]
    assert "3 requests" in trace.source


@pytest.mark.parametrize(
    ("name", "header", "row"),
    [
        ("burstgpt.csv", "Timestamp,Model,Request tokens,Response tokens", "{at},ChatGPT,{prompt},8"),
        ("mooncake.jsonl", None, '{{"timestamp": {ms}, "input_length": {prompt}, "output_length": 8, "hash_ids": []}}'),
    ],
)
def test_every_timed_format_takes_the_first_n_arrivals(tmp_path, name, header, row):
    path = tmp_path / name
    lines = [header] if header else []
    lines += [row.format(at=at, ms=int(at * 1000), prompt=prompt) for at, prompt in SHUFFLED]
    path.write_text("\n".join(lines) + "\n")
    trace = read_trace(path, limit=2)
    assert [request.prompt_tokens for request in trace.requests] == [104, 106]
    assert [request.line for request in trace.requests] == [line + (1 if header else 0) for line in (4, 6)]


def test_an_untimed_trace_keeps_its_first_n_lines(tmp_path):
    path = tmp_path / "untimed.jsonl"
    path.write_text("".join(json.dumps({"prompt_tokens": 10 + n, "output_tokens": 8}) + "\n" for n in range(5)))
    trace = read_trace(path, limit=2)
    assert [(request.prompt_tokens, request.line) for request in trace.requests] == [(10, 1), (11, 2)]


def test_simulate_csv_names_each_requests_line_in_the_trace(run_kvops, tmp_path):
    pytest.importorskip("vllm")
    out = tmp_path / "requests.csv"
    run_kvops(
        "simulate", "-m", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "4096",
        "--trace", str(_shuffled_trace(tmp_path)), "--requests", "3", "--csv", str(out),
    )  # fmt: skip
    rows = list(csv.DictReader(out.open()))
    assert [row["request"] for row in rows] == ["0", "1", "2"]  # its place in arrival order, as before
    assert [row["trace_line"] for row in rows] == ["4", "6", "5"]
    assert [row["prompt_tokens"] for row in rows] == ["104", "106", "105"]
    assert [float(row["sent_ms"]) for row in rows] == [100.0, 200.0, 300.0]  # from the trace's start


def test_the_report_says_preemptions_are_events_and_how_many_requests_they_hit():
    """The column read "preempted" and counted events; the requests preempted were only in --json."""
    from types import SimpleNamespace

    from kvops.render.simulate import _preemptions

    assert _preemptions(SimpleNamespace(preemptions=239, preempted_requests=168)) == "239 (168 req)"
    assert _preemptions(SimpleNamespace(preemptions=8, preempted_requests=8)) == "8"


def test_simulate_text_heads_the_column_preemptions_and_json_keeps_both_keys(run_kvops):
    pytest.importorskip("vllm")
    small = ("-m", "llama-3.1-8b", "--gpu", "H100", "--max-model-len", "4096", "--requests", "8", "--rate", "8")
    assert " preemptions " in run_kvops("simulate", *small).stdout
    (arm,) = json.loads(run_kvops("simulate", *small, "--json").stdout)["arms"]
    assert {"preemptions", "preempted_requests"} <= set(arm)


def test_table_json_carries_the_header_and_text_names_the_block_size_with_separators(run_kvops):
    """--format json was a bare list without model, dtype, tp or block size; the text left out --block-size and
    printed 16384 where `kvops kv` prints 16,384."""
    pytest.importorskip("pandas")
    args = ("table", "-m", "mistral-7b-v0.1", "--batches", "1", "--tokens", "16384", "--block-size", "16")
    doc = json.loads(run_kvops(*args, "--format", "json").stdout)
    assert {key: doc[key] for key in ("model", "kv_dtype", "tp", "block_size", "layer_pattern")} == {
        "model": "mistralai/Mistral-7B-v0.1",
        "kv_dtype": "bf16",
        "tp": 1,
        "block_size": 16,
        "layer_pattern": "sliding 4096 on all 32 layers",
    }
    assert doc["rows"][0]["tokens"] == 16384
    text = run_kvops(*args).stdout
    assert "block size 16" in text.splitlines()[0] and "16,384" in text
    assert "| 16,384 |" in run_kvops(*args, "--format", "markdown").stdout
