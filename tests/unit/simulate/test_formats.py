"""The public trace formats read into a Trace, each from a sample laid out exactly as its publisher defines it; the
format detected from the content; the bounds (file and line size, FIFOs, gzip)."""

from __future__ import annotations

import gzip
import json
import os
import threading
from pathlib import Path

import pytest

from kvops.simulate import formats
from kvops.simulate.formats import detect_format, read_trace, vllm_valid_sequence
from kvops.simulate.trace import TraceError, TraceRequest

# kvcache-ai/Mooncake FAST25-release/README.md, "Trace Format": its two sample requests, one JSON object a line.
MOONCAKE = (
    '{"timestamp": 27482, "input_length": 6955, "output_length": 52,'
    ' "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]}\n'
    '{"timestamp": 30535, "input_length": 6472, "output_length": 26,'
    ' "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2366]}\n'
)

# alibaba-edu/qwen-bailian-usagetraces-anon README, "Data Specification": the record's keys and values (its hash_ids
# are elided there; 521 tokens in 16-token blocks are 33 ids), the layout vLLM's timed_trace defaults suit.
BAILIAN = json.dumps(
    {
        "chat_id": 159,
        "parent_chat_id": 55,
        "timestamp": 61.114,
        "input_length": 521,
        "output_length": 132,
        "type": "text",
        "turn": 2,
        "hash_ids": [1089, 1090, 1091, *range(6326, 6356)],
    }
)

# HPMLL/BurstGPT README, "Schema": BurstGPT_1.csv and _2.csv have these six columns; BurstGPT_3 adds Session ID and
# Elapsed time after Timestamp. Failures have 0 Response tokens.
BURSTGPT_1 = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
    "45,ChatGPT,1087,230,1317,Conversation log\n"
    "46,GPT-4,300,0,300,API log\n"
    "118,GPT-4,417,276,693,Conversation log\n"
)
BURSTGPT_3 = (
    "Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "19440110.0,1722ac82-0a46-4bf0-aa08-89794e7a2b3f,43,GPT-4,906,446,1352,Conversation log\n"
    "19440161.0,d5983bf9-4b48-497b-892b-a58995247443,2,ChatGPT,36,29,65,Conversation log\n"
)

# Azure/AzurePublicDataset AzureLLMInferenceDataset2023.md (schema) and the first rows of
# data/AzureLLMInferenceTrace_code.csv: 7 fractional digits.
AZURE_2023 = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:17:03.9799600,4808,10\n"
    "2023-11-16 18:17:04.0319600,3180,8\n"
    "2023-11-16 18:17:04.0781490,110,27\n"
)
# AzureLLMInferenceDataset2024.md (same schema) and analysis/AzureLLMInferenceDataset2024.ipynb: microseconds and a
# UTC offset, or no fraction at all.
AZURE_2024 = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2024-05-12 00:00:00.001163+00:00,1452,3\n"
    "2024-05-12 00:00:00.041683+00:00,584,3\n"
    "2024-05-12 00:00:01+00:00,862,0\n"
    "2024-05-12 00:00:02+00:00,862,38\n"
)

# ShareGPT_V3_unfiltered_cleaned_split.json as vLLM's ShareGPTDataset reads it: a list of {"id", "conversations":
# [{"from": "human" | "gpt", "value": ...}, ...]}.
SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "x" * 40}, {"from": "gpt", "value": "y" * 400}]},
    {"id": "b", "conversations": [{"from": "human", "value": "only one turn"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "y" * 400}]},
    {"id": "d", "conversations": [{"from": "human", "value": "z" * 5000}, {"from": "gpt", "value": "y" * 40}]},
    {"id": "e", "conversations": [{"from": "human", "value": "a" * 4000}, {"from": "gpt", "value": "b" * 4400}]},
    {"id": "f", "conversations": [{"from": "human", "value": "q " * 30}, {"from": "gpt", "value": "r " * 90}]},
    {"id": "g"},
]


def write(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def failure(path: str, fmt: str | None = None, **options) -> str:
    with pytest.raises(TraceError) as caught:
        read_trace(path, fmt, **options)
    return str(caught.value)


def test_mooncake_hash_ids_are_512_token_blocks_and_timestamps_milliseconds(tmp_path):
    path = write(tmp_path, "mooncake.jsonl", MOONCAKE)
    assert detect_format(path) == "mooncake"
    trace = read_trace(path)
    first, second = trace.requests
    assert (first.arrival_s, first.prompt_tokens, first.output_tokens) == (27.482, 6955, 52)
    assert first.prefix[:2] == (("h46", 512), ("h47", 512))
    assert first.prefix[-2:] == (("h2353", 512), ("h2354", 6955 - 13 * 512))
    assert second.prefix[-1] == ("h2366", 6472 - 12 * 512)
    shared = [a for a, b in zip(first.prefix, second.prefix) if a == b]
    assert sum(tokens for _, tokens in shared) == 12 * 512  # the README: "the first 12 * 512 = 6144 tokens"
    assert trace.source.endswith("(Mooncake JSONL: ms, 512-token blocks, 2 requests)")


def test_timed_trace_is_vllms_default_layout_seconds_and_16_token_blocks(tmp_path):
    path = write(tmp_path, "qwen.jsonl", BAILIAN + "\n")
    assert detect_format(path) == "timed_trace"
    (request,) = read_trace(path).requests
    assert request.arrival_s == 61.114
    assert len(request.prefix) == 33
    assert request.prefix[-1] == ("h6355", 521 - 32 * 16)
    assert request.prefix_tokens == 521
    as_mooncake = read_trace(path, "mooncake").requests[0]
    assert as_mooncake.arrival_s == pytest.approx(0.061114)
    assert as_mooncake.prefix[0] == ("h1089", 512)


def test_a_hashed_trace_whose_first_prompt_is_one_block_either_way_is_told_by_a_later_line(tmp_path):
    """A first prompt of 10 tokens has one id in 16- and 512-token blocks alike: a timed_trace had been read as
    Mooncake (milliseconds: 1,000 x the rate)."""
    lines = [{"timestamp": 0, "input_length": 10, "output_length": 50, "hash_ids": [0]}]
    lines += [
        {
            "timestamp": 0.5 * index,
            "input_length": 100 * index,
            "output_length": 50,
            "hash_ids": list(range(-(-100 * index // 16))),
        }
        for index in range(1, 5)
    ]
    path = write(tmp_path, "timed.jsonl", "".join(json.dumps(line) + "\n" for line in lines))
    assert detect_format(path) == "timed_trace"
    assert read_trace(path).requests[-1].arrival_s == 2.0
    lone = write(tmp_path, "lone.jsonl", json.dumps(lines[0]) + "\n")
    assert detect_format(lone) == "mooncake"  # nothing tells: Mooncake, as before


def test_hashed_rows_without_tokens_are_skipped_and_bad_ids_named(tmp_path):
    zero = '{"timestamp": 5, "input_length": 10, "output_length": 0, "hash_ids": [1]}\n'
    trace = read_trace(write(tmp_path, "m.jsonl", MOONCAKE + zero), "mooncake")
    assert (len(trace), trace.skipped) == (2, 1)
    assert "1 rows without prompt or output tokens skipped" in trace.source
    short = '{"timestamp": 0, "input_length": 2000, "output_length": 5, "hash_ids": [7]}\n'
    (request,) = read_trace(write(tmp_path, "s.jsonl", short), "mooncake").requests
    assert request.prefix == (("h7", 512),)  # the tokens past the last id are the request's own
    bad = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2.5]}\n'
    assert failure(write(tmp_path, "b.jsonl", bad), "mooncake") == (
        f'{tmp_path}/b.jsonl line 1: field "hash_ids": expected a list of integer block hashes, got 2.5'
    )
    missing = '{"timestamp": 0, "output_length": 5}\n'
    assert failure(write(tmp_path, "n.jsonl", missing), "mooncake") == (
        f'{tmp_path}/n.jsonl line 1: field "input_length": missing (expected an integer of at least 0)'
    )


def test_burstgpt_skips_failures_and_starts_at_zero(tmp_path):
    path = write(tmp_path, "BurstGPT_1.csv", BURSTGPT_1)
    assert detect_format(path) == "burstgpt"
    trace = read_trace(path)
    assert trace.requests == (TraceRequest(0.0, 472, 18), TraceRequest(40.0, 1087, 230), TraceRequest(113.0, 417, 276))
    assert trace.skipped == 1
    assert trace.source == (
        f"{path} (BurstGPT CSV, 3 requests, 1 failures (0 Response tokens) and empty prompts skipped)"
    )
    gpt4 = read_trace(path, model_filter="GPT-4")
    assert gpt4.requests == (TraceRequest(0.0, 417, 276),)
    assert "model GPT-4" in gpt4.source
    assert failure(path, model_filter="GPT4") == f'{path}: no rows with Model "GPT4" (models: ChatGPT, GPT-4)'


def test_burstgpt_3_columns_are_found_by_name(tmp_path):
    trace = read_trace(write(tmp_path, "BurstGPT_3.csv", BURSTGPT_3))
    assert trace.requests == (TraceRequest(0.0, 906, 446), TraceRequest(51.0, 36, 29))


def test_burstgpt_bad_rows(tmp_path):
    header = BURSTGPT_1.splitlines()[0]
    bad = write(tmp_path, "bad.csv", f"{header}\n5,ChatGPT,472,18,490,Conversation log\n6,ChatGPT,abc,1,1,API log\n")
    assert failure(bad) == f'{bad} line 3: field "Request tokens": expected an integer of at least 0, got "abc"'
    short = write(tmp_path, "short.csv", f"{header}\n5,ChatGPT\n")
    assert failure(short) == f'{short} line 2: field "Request tokens": missing (2 columns, fewer than the header\'s)'
    lacking = write(tmp_path, "lacking.csv", "Timestamp,Model,Request tokens,Total tokens\n1,GPT-4,5,5\n")
    assert failure(lacking, "burstgpt") == (
        f'{lacking} line 1: the header lacks "Response tokens" (BurstGPT columns: Timestamp, Model, Request tokens,'
        " Response tokens)"
    )


def test_azure_2023_timestamps_keep_all_seven_digits(tmp_path):
    path = write(tmp_path, "AzureLLMInferenceTrace_code.csv", AZURE_2023)
    assert detect_format(path) == "azure"
    trace = read_trace(path)
    assert [request.arrival_s for request in trace.requests] == pytest.approx([0.0, 0.052, 0.098189], abs=1e-12)
    assert trace.requests[2] == TraceRequest(trace.requests[2].arrival_s, 110, 27)
    ticks = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.0000000,1,1\n2023-11-16 18:17:03.0000001,1,1\n"
    )
    assert read_trace(write(tmp_path, "ticks.csv", ticks)).requests[1].arrival_s == pytest.approx(1e-7, abs=1e-15)


def test_azure_2024_offsets_and_whole_seconds(tmp_path):
    trace = read_trace(write(tmp_path, "AzureLLMInferenceTrace_conv_1week.csv", AZURE_2024))
    assert [request.arrival_s for request in trace.requests] == pytest.approx([0.0, 0.04052, 1.998837], abs=1e-12)
    assert trace.skipped == 1
    zones = "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-12 02:00:00+02:00,1,1\n2024-05-12 00:00:30Z,1,1\n"
    assert read_trace(write(tmp_path, "zones.csv", zones)).requests[1].arrival_s == 30.0
    bad = write(tmp_path, "bad.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-13-12 00:00:00,1,1\n")
    assert failure(bad) == f'{bad} line 2: field "TIMESTAMP": expected a valid date and time, got "2024-13-12 00:00:00"'
    odd = write(tmp_path, "odd.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n")
    assert failure(odd) == (
        f'{odd} line 2: field "TIMESTAMP": expected a datetime like "2023-11-16 18:17:03.9799600", got "yesterday"'
    )


def test_sharegpt_as_vllm_samples_it_estimated_at_4_characters_a_token(tmp_path):
    path = write(tmp_path, "sharegpt.json", json.dumps(SHAREGPT, indent=2))
    assert detect_format(path) == "sharegpt"
    trace = read_trace(path)
    assert trace.requests == (TraceRequest(0.0, 10, 100), TraceRequest(0.0, 15, 45))
    assert not trace.timed
    assert trace.skipped == 5
    assert "token counts estimated at 4 characters a token" in trace.source
    words = read_trace(path, tokenizer=lambda text: len(text.split()))
    assert words.requests == (TraceRequest(0.0, 30, 90),)  # 1 word for "x" * 40: under vLLM's 4-token minimum
    assert "estimated" not in words.source


def test_sharegpt_streams_entry_by_entry(tmp_path, monkeypatch):
    path = write(tmp_path, "compact.json", json.dumps(SHAREGPT))
    whole = read_trace(path, "sharegpt")
    monkeypatch.setattr(formats, "CHUNK_BYTES", 7)
    assert read_trace(path, "sharegpt").requests == whole.requests
    assert len(read_trace(path, "sharegpt", limit=1)) == 1


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '[{"conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": null}]}]',
            'entry 1: field "conversations[1].value": expected a string, got null',
        ),
        ('[{"conversations": "no"}]', 'entry 1: field "conversations": expected a list of turns'),
        ("[1]", 'entry 1: expected an object with "conversations", got 1'),
        ('[{"conversations": []} {"conversations": []}]', 'entry 1: expected , or ] after it, got "{"'),
        ('[{"conversations": []},', "the JSON array ends before its ]"),
        ('[{"conversations": [}]', "entry 1: not JSON (Expecting value)"),
    ],
)
def test_bad_sharegpt_entries(tmp_path, text, message):
    path = write(tmp_path, "s.json", text)
    assert failure(path, "sharegpt").startswith(f"{path}") and message in failure(path, "sharegpt")


def test_vllm_length_filter():
    # vllm/benchmarks/datasets/datasets.py is_valid_sequence with its defaults (4, 1024, 2048)
    assert vllm_valid_sequence(4, 4) and vllm_valid_sequence(1024, 1024)
    assert not vllm_valid_sequence(3, 100) and not vllm_valid_sequence(100, 3)
    assert not vllm_valid_sequence(1025, 4) and not vllm_valid_sequence(1024, 1025)


def test_kvops_jsonl_detected_and_limited(tmp_path):
    lines = "".join(json.dumps({"arrival_s": i, "prompt_tokens": 5, "output_tokens": 2}) + "\n" for i in range(5))
    path = write(tmp_path, "t.jsonl", lines)
    assert detect_format(path) == "kvops"
    assert len(read_trace(path)) == 5
    assert len(read_trace(path, limit=2)) == 2


def test_gzip_is_read_transparently(tmp_path):
    path = write(tmp_path, "mooncake.jsonl.gz", gzip.compress(MOONCAKE.encode()))
    assert detect_format(path) == "mooncake"
    assert len(read_trace(path)) == 2
    damaged = write(tmp_path, "damaged.gz", gzip.compress(MOONCAKE.encode())[:40])
    assert failure(damaged, "mooncake").startswith(f"{damaged}: cannot read (")


def test_a_line_over_16_mib_is_refused(tmp_path):
    big = '{"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [' + "1, " * (6 << 20) + "1]}\n"
    path = write(tmp_path, "big.jsonl", MOONCAKE + big)
    assert failure(path, "mooncake") == f"{path} line 3: over 16 MiB (a trace line is one request)"


def test_a_file_over_4_gib_is_refused_before_reading(tmp_path):
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as sparse:
        sparse.truncate((4 << 30) + 1)
    assert failure(str(path), "kvops") == f"{path}: 4,294,967,297 bytes, over the 4 GiB a trace file may hold"


def test_decompressed_size_is_bounded_too(tmp_path, monkeypatch):
    path = write(tmp_path, "bomb.jsonl.gz", gzip.compress(MOONCAKE.encode() * 50))
    monkeypatch.setattr(formats, "MAX_FILE_BYTES", 2000)
    assert "over 4 GiB once decompressed" in failure(path, "mooncake")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "trace.fifo"
    os.mkfifo(fifo)
    messages: list[str] = []
    for fmt in (None, "kvops"):
        reader = threading.Thread(target=lambda fmt=fmt: messages.append(failure(str(fifo), fmt)), daemon=True)
        reader.start()
        reader.join(timeout=10)
        if reader.is_alive():
            with fifo.open("wb"):  # release the blocked reader before failing
                pass
            pytest.fail("reading a FIFO blocked")
    assert messages == [f"{fifo}: not a regular file (a trace is read from a file, not a FIFO, device or folder)"] * 2


def test_what_is_not_a_trace(tmp_path):
    assert (
        failure(str(tmp_path))
        == f"{tmp_path}: not a regular file (a trace is read from a file, not a FIFO, device or folder)"
    )
    missing = tmp_path / "none.jsonl"
    assert failure(str(missing)) == f"{missing}: cannot read (No such file or directory)"
    binary = write(tmp_path, "model.bin", b"\x00\x01\x02" * 10)
    assert failure(binary) == f"{binary}: not a text file (a trace is JSONL, CSV or JSON, gzipped or not)"
    other = write(tmp_path, "other.csv", "a,b,c\n1,2,3\n")
    assert failure(other).startswith(f'{other}: not a trace format kvops knows (line 1: "a,b,c"); formats: kvops')
    assert failure(other, "parquet") == (
        'trace format "parquet": expected one of kvops, timed_trace, mooncake, burstgpt, azure, sharegpt, vllm_bench'
    )
    mooncake = write(tmp_path, "m.jsonl", MOONCAKE)
    assert failure(mooncake, model_filter="GPT-4") == (
        f"{mooncake}: a model filter applies to BurstGPT traces only, and this is read as mooncake"
    )
    only_failures = write(tmp_path, "f.csv", BURSTGPT_1.splitlines()[0] + "\n1,GPT-4,5,0,5,API log\n")
    assert failure(only_failures) == (
        f"{only_failures}: no requests (BurstGPT CSV, 1 failures (0 Response tokens) and empty prompts skipped)"
    )


@pytest.mark.parametrize("zipped", [False, True])
def test_a_byte_order_mark_is_read_past_in_every_format(tmp_path, zipped):
    """A ShareGPT file or a bench result saved with a BOM had been 'not a trace format kvops knows'."""
    turns = [{"from": "human", "value": "x " * 50}, {"from": "gpt", "value": "y " * 30}]
    text = json.dumps([{"conversations": turns}])
    data = b"\xef\xbb\xbf" + text.encode()
    path = tmp_path / "bom.json"
    path.write_bytes(gzip.compress(data) if zipped else data)
    assert detect_format(str(path)) == "sharegpt"
    assert len(read_trace(str(path))) == 1


def test_a_csv_short_of_one_of_its_formats_columns_names_it(tmp_path):
    path = write(tmp_path, "b.csv", "Timestamp,Model,Request tokens\n1,ChatGPT,10\n")
    with pytest.raises(TraceError, match=r"a BurstGPT CSV, without the column\(s\) Response tokens; line 1"):
        detect_format(path)
