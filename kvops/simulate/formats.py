"""Trace files as users have them, read into a Trace; each reader cites where its wire format is defined.

- `kvops`: kvops' own JSONL (kvops/simulate/trace.py).
- `mooncake`: Mooncake's FAST'25 traces, JSONL {"timestamp", "input_length", "output_length", "hash_ids"}:
  timestamp in milliseconds, each hash id one block of 512 tokens (kvcache-ai/Mooncake FAST25-release/README.md,
  "Trace Format"; traces/conversation_trace.jsonl holds ceil(input_length / 512) ids a line).
- `timed_trace`: the same keys as vLLM's `--dataset-name timed_trace` reads them with its defaults (vLLM 0.32,
  vllm/benchmarks/datasets/datasets.py, `TimedTrace` and its `--timed-trace-*` options): timestamp in seconds
  (`--timed-trace-sec-multiplier` 1), 16 tokens a hash id (`--timed-trace-chunk-hash-size` 16), the layout of the
  Qwen-Bailian traces (alibaba-edu/qwen-bailian-usagetraces-anon README: seconds, 16-token blocks, and chat_id,
  parent_chat_id, type, turn, which are ignored here).
- `burstgpt`: BurstGPT CSV (HPMLL/BurstGPT README, "Schema"): Timestamp (seconds), Model, Request tokens, Response
  tokens, Total tokens, Log Type, and in the newer files Session ID and Elapsed time; columns found by name.
- `azure`: the Azure LLM inference traces, CSV TIMESTAMP, ContextTokens, GeneratedTokens (Azure/AzurePublicDataset
  AzureLLMInferenceDataset2023.md and 2024.md); TIMESTAMP a datetime, "2023-11-16 18:17:03.9799600" in 2023
  (data/AzureLLMInferenceTrace_code.csv), "2024-05-12 00:00:00.001163+00:00" or without a fraction in 2024
  (analysis/AzureLLMInferenceDataset2024.ipynb), parsed to every digit.
- `sharegpt`: a JSON array of {"conversations": [{"from", "value"}, ...]} sampled as vLLM's benchmark samples it
  (vllm/benchmarks/datasets/datasets.py, `ShareGPTDataset` and `is_valid_sequence`); untimed.
- `vllm_bench`: the JSON object `vllm bench serve --save-result --save-detailed` writes, its requests at the times
  they were sent (kvops/simulate/measured.py).

Public traces hold rows no engine serves: a row with no prompt or no output tokens (BurstGPT's failures have 0
Response tokens; vLLM refuses max_tokens 0) is skipped and counted in `Trace.skipped`. Timed CSV traces start at 0:
their arrivals are counted from the earliest row. A file is read bounded: a regular file only (opened non-blocking, so
a FIFO cannot hang the read), at most 4 GiB on disk and after gunzip, lines of at most 16 MiB, gzip read by its magic
bytes as kvops/files.py does, streamed line by line (ShareGPT's one array entry by entry).
"""

from __future__ import annotations

import calendar
import codecs
import csv
import gzip
import json
import math
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from functools import partial
from typing import IO, Any, cast

from kvops.frozen import frozen
from kvops.simulate.measured import Measured, parse_result
from kvops.simulate.trace import (
    MISSING,
    Segment,
    Trace,
    TraceError,
    TraceRequest,
    bad_field,
    first_arrivals,
    is_integer,
    json_object,
    parse_jsonl,
    seconds,
    shown,
)

FORMATS = ("kvops", "timed_trace", "mooncake", "burstgpt", "azure", "sharegpt", "vllm_bench")
MAX_FILE_BYTES = 4 << 30
MAX_LINE_BYTES = 16 << 20
CHUNK_BYTES = 1 << 20
CHARS_PER_TOKEN = 4

Tokenizer = Callable[[str], int]
"""Counts a text's tokens as the engine would: vLLM's benchmark counts len(tokenizer(text).input_ids)."""


@frozen
class Options:
    tokenizer: Tokenizer | None = None
    model_filter: str | None = None
    limit: int | None = None


@frozen
class HashedLayout:
    """How a hash-id trace counts time and blocks."""

    name: str
    per_second: int  # timestamp units a second
    block_tokens: int


MOONCAKE = HashedLayout("Mooncake JSONL: ms, 512-token blocks", 1000, 512)
TIMED_TRACE = HashedLayout("vLLM timed_trace JSONL: s, 16-token blocks", 1, 16)
HASHED_EXAMPLE = '{"timestamp": 0, "input_length": 655, "output_length": 52, "hash_ids": [46, 47]}'
BURSTGPT_COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
FORMAT_NAMES = {"burstgpt": "BurstGPT", "azure": "Azure LLM inference trace"}
AZURE_TIME = re.compile(r"(\d{4}-\d\d-\d\d)[ T](\d\d:\d\d:\d\d)(?:\.(\d+))?\s*(Z|[+-]\d\d:?\d\d)?")
NON_SPACE = re.compile(r"\S")
EMPTY = "rows without prompt or output tokens"


def read_trace(
    path: str | os.PathLike[str],
    fmt: str | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    model_filter: str | None = None,
    limit: int | None = None,
) -> Trace:
    """The trace in `path`, in format `fmt` (one of FORMATS) or the one its content shows. `tokenizer` counts
    ShareGPT's texts (else 4 characters a token, which the source says); `model_filter` keeps one BurstGPT model;
    `limit` keeps the first that many to arrive (an untimed file's first that many lines; a timed one is read whole,
    its lines need not be in arrival order)."""
    where = os.fspath(path)
    if fmt is not None and fmt not in FORMATS:
        raise TraceError(f'trace format "{fmt}": expected one of {", ".join(FORMATS)}')
    fmt = fmt or detect_format(where)
    if model_filter is not None and fmt != "burstgpt":
        raise TraceError(f"{where}: a model filter applies to BurstGPT traces only, and this is read as {fmt}")
    with opened(where) as stream, _read_errors(where):
        return READERS[fmt](stream, where, Options(tokenizer, model_filter, limit))


@contextmanager
def opened(where: str) -> Iterator[IO[bytes]]:
    """The file's bytes, gunzipped when it is gzip. Opened non-blocking and then checked to be a regular file, so a
    FIFO (or a device) is refused instead of waited on."""
    try:
        fd = os.open(where, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise TraceError(f"{where}: cannot read ({exc.strerror or exc})") from None
    try:
        _check_regular(os.fstat(fd), where)
    except TraceError:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as raw:
        gzipped = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        if not gzipped:
            yield _past_bom(raw, where)
            return
        with gzip.GzipFile(fileobj=raw, mode="rb") as unzipped:
            yield _past_bom(cast(IO[bytes], unzipped), where)


def _past_bom(stream: IO[bytes], where: str) -> IO[bytes]:
    """The stream past a UTF-8 byte order mark, which Windows editors write first (every format reads the same)."""
    with _read_errors(where):
        if stream.read(len(codecs.BOM_UTF8)) != codecs.BOM_UTF8:
            stream.seek(0)
    return stream


def _check_regular(info: os.stat_result, where: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise TraceError(f"{where}: not a regular file (a trace is read from a file, not a FIFO, device or folder)")
    if info.st_size > MAX_FILE_BYTES:
        raise TraceError(f"{where}: {info.st_size:,} bytes, over the 4 GiB a trace file may hold")


@contextmanager
def _read_errors(where: str) -> Iterator[None]:
    try:
        yield
    except (OSError, EOFError, zlib.error, csv.Error) as exc:
        raise TraceError(f"{where}: cannot read ({exc})") from None


def lines_of(stream: IO[bytes], where: str) -> Iterator[str]:
    """The text's lines, each at most 16 MiB and all together at most 4 GiB (so after gunzip too)."""
    total = 0
    for number, line in enumerate(iter(partial(stream.readline, MAX_LINE_BYTES + 1), b""), 1):
        if len(line) > MAX_LINE_BYTES:
            raise TraceError(f"{where} line {number}: over 16 MiB (a trace line is one request)")
        total += len(line)
        if total > MAX_FILE_BYTES:
            raise TraceError(f"{where}: over 4 GiB once decompressed, more than a trace file may hold")
        yield line.decode("utf-8", errors="replace").removeprefix("\ufeff")


def detect_format(where: str) -> str:
    """The format the file's first bytes show: a JSON array is ShareGPT; a JSON object with input_lens a vLLM bench
    serve result; a JSON line is kvops' or, with input_length, a hash-id trace; a CSV header names BurstGPT's or
    Azure's columns."""
    with opened(where) as stream, _read_errors(where):
        head = stream.read(64 << 10)
        if b"\x00" in head:
            raise TraceError(f"{where}: not a text file (a trace is JSONL, CSV or JSON, gzipped or not)")
        if head.lstrip().startswith(b"["):
            return "sharegpt"
        if head.lstrip().startswith(b"{") and b'"input_lens"' in head:
            return "vllm_bench"  # one JSON object, on one line or indented; its lists come after a few fields
        if b"\n" not in head.lstrip():
            head += stream.readline(MAX_LINE_BYTES)
    lines = head.decode("utf-8", errors="replace").removeprefix("\ufeff").strip().split("\n")
    return _format_of([line.strip() for line in lines], where)


def _format_of(lines: list[str], where: str) -> str:
    """The format the head's lines show (the last may be cut off)."""
    first = lines[0]
    if first == "{":
        return "vllm_bench"  # an indented JSON object: no JSONL line is a lone brace
    if first.startswith("{"):
        try:
            record = json.loads(first)
        except json.JSONDecodeError:
            return "kvops"  # its reader says what is wrong with the line
        return _hashed_format(lines) if isinstance(record, dict) and "input_length" in record else "kvops"
    columns = {name.strip() for name in next(csv.reader([first]), [])}
    for name, required in (("burstgpt", BURSTGPT_COLUMNS), ("azure", AZURE_COLUMNS)):
        missing = [column for column in required if column not in columns]
        if not missing:
            return name
        if len(missing) < len(required) / 2:  # most of the format's columns: that format, short of these
            raise TraceError(
                f"{where}: a {FORMAT_NAMES[name]} CSV, without the column(s) {', '.join(missing)}; line 1: {shown(first)}"
            )
    raise TraceError(
        f"{where}: not a trace format kvops knows (line 1: {shown(first)}); formats: kvops JSONL, Mooncake or vLLM"
        f" timed_trace JSONL, BurstGPT or Azure CSV, ShareGPT JSON, a vLLM bench serve result ({', '.join(FORMATS)})"
    )


def _hashed_format(lines: list[str]) -> str:
    """Mooncake's traces hash 512-token blocks and count milliseconds; the Qwen-Bailian ones, which vLLM's
    timed_trace defaults fit, hash 16-token blocks, count seconds and carry chat_id. The first line whose hash ids
    tell the block size (a prompt longer than 16 tokens) tells them apart; Mooncake where none does."""
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # the head's last line, cut off
        if not isinstance(record, dict):
            continue
        ids, tokens = record.get("hash_ids"), record.get("input_length")
        if "chat_id" in record:
            return "timed_trace"
        if isinstance(ids, list) and is_integer(tokens) and math.ceil(tokens / 16) != math.ceil(tokens / 512):
            if len(ids) == math.ceil(tokens / 16):
                return "timed_trace"
            if len(ids) == math.ceil(tokens / 512):
                return "mooncake"
    return "mooncake"


def _read_hashed(stream: IO[bytes], where: str, options: Options, layout: HashedLayout) -> Trace:
    requests: list[TraceRequest] = []
    skipped = 0
    blocks: dict[Any, Segment] = {}  # one tuple per full block, shared by every request that starts with it
    for number, line in enumerate(lines_of(stream, where), 1):
        if not line.strip():
            continue
        at = f"{where} line {number}"
        record = json_object(line, at, HASHED_EXAMPLE)
        arrival = seconds(record, "timestamp", at, layout.per_second)
        prompt = _count(record.get("input_length", MISSING), "input_length", at)
        output = _count(record.get("output_length", MISSING), "output_length", at)
        if not prompt or not output:
            skipped += 1
            continue
        prefix = _hashed_prefix(record.get("hash_ids", []), prompt, layout.block_tokens, blocks, at)
        requests.append(TraceRequest(arrival, prompt, output, prefix=prefix, line=number))
    return _trace(first_arrivals(requests, options.limit), where, layout.name, skipped, EMPTY)


def _hashed_prefix(
    ids: Any, prompt: int, block_tokens: int, blocks: dict[Any, Segment], at: str
) -> tuple[Segment, ...]:
    """hash_ids as prefix segments "h<id>", a block each, the last clipped to the prompt and ids past it dropped, as
    vLLM's TimedTrace._expand_prompt does; a clipped block is another segment than the whole one, as vLLM's cache key
    "{id}:{size}" makes it. Unlike vLLM, which sends only the hashed blocks, tokens past the last id are still the
    prompt's: its own, unshared."""
    if not isinstance(ids, list):
        raise bad_field(at, "hash_ids", "a list of block hashes", ids)
    full, rest = divmod(prompt, block_tokens)
    try:
        segments = [
            blocks.get(block) or blocks.setdefault(block, (_key(block, at), block_tokens)) for block in ids[:full]
        ]
    except TypeError:  # an id that is a list or an object
        raise bad_field(at, "hash_ids", "a list of integer block hashes", ids) from None
    if rest and len(ids) > full:
        segments.append((_key(ids[full], at), rest))
    return tuple(segments)


def _key(block: Any, at: str) -> str:
    if not isinstance(block, (int, str)) or isinstance(block, bool):
        raise bad_field(at, "hash_ids", "a list of integer block hashes", block)
    return f"h{block}"


def _count(value: Any, name: str, at: str) -> int:
    """A token count of at least 0, from JSON or a CSV cell."""
    if isinstance(value, str):
        with suppress(ValueError):
            value = int(value)
    if not is_integer(value) or value < 0:
        raise bad_field(at, name, "an integer of at least 0", value)
    return int(value)


def _read_burstgpt(stream: IO[bytes], where: str, options: Options) -> Trace:
    rows = csv.reader(lines_of(stream, where))
    stamp, model, prompt, output = _columns(rows, BURSTGPT_COLUMNS, where, "BurstGPT")
    kept: list[tuple[float, int, int, int]] = []
    skipped = 0
    models: set[str] = set()
    for row in rows:
        if not row:
            continue
        at = f"{where} line {rows.line_num}"
        if options.model_filter is not None and _cell(row, model, "Model", at) != options.model_filter:
            models.add(row[model])
            continue
        arrival = _number(_cell(row, stamp, "Timestamp", at), "Timestamp", at)
        tokens = _count(_cell(row, prompt, "Request tokens", at), "Request tokens", at)
        generated = _count(_cell(row, output, "Response tokens", at), "Response tokens", at)
        if not tokens or not generated:
            skipped += 1
            continue
        kept.append((arrival, tokens, generated, rows.line_num))
    if options.model_filter is not None and not kept and not skipped:
        raise TraceError(f'{where}: no rows with Model "{options.model_filter}" (models: {", ".join(sorted(models))})')
    start = min((arrival for arrival, _, _, _ in kept), default=0.0)
    requests = [
        TraceRequest(arrival - start, tokens, generated, line=line) for arrival, tokens, generated, line in kept
    ]
    requests = first_arrivals(requests, options.limit)
    name = "BurstGPT CSV" + (f", model {options.model_filter}" if options.model_filter is not None else "")
    return _trace(requests, where, name, skipped, "failures (0 Response tokens) and empty prompts")


def _read_azure(stream: IO[bytes], where: str, options: Options) -> Trace:
    rows = csv.reader(lines_of(stream, where))
    stamp, prompt, output = _columns(rows, AZURE_COLUMNS, where, "Azure LLM inference")
    kept: list[tuple[int, float, int, int, int]] = []
    skipped = 0
    seconds_of: dict[str, int] = {}  # "date time offset" -> seconds since the epoch: rows share their second
    for row in rows:
        if not row:
            continue
        at = f"{where} line {rows.line_num}"
        whole, fraction = _instant(_cell(row, stamp, "TIMESTAMP", at), seconds_of, at)
        tokens = _count(_cell(row, prompt, "ContextTokens", at), "ContextTokens", at)
        generated = _count(_cell(row, output, "GeneratedTokens", at), "GeneratedTokens", at)
        if not tokens or not generated:
            skipped += 1
            continue
        kept.append((whole, fraction, tokens, generated, rows.line_num))
    start = min(((whole, fraction) for whole, fraction, _, _, _ in kept), default=(0, 0.0))
    requests = [
        TraceRequest((whole - start[0]) + (fraction - start[1]), tokens, generated, line=line)
        for whole, fraction, tokens, generated, line in kept
    ]
    return _trace(first_arrivals(requests, options.limit), where, "Azure LLM inference CSV", skipped, EMPTY)


def _instant(text: str, seconds_of: dict[str, int], at: str) -> tuple[int, float]:
    """An Azure TIMESTAMP as whole seconds since the epoch and the fraction, every digit kept (2023 writes 7)."""
    match = AZURE_TIME.fullmatch(text.strip())
    if match is None:
        raise bad_field(at, "TIMESTAMP", 'a datetime like "2023-11-16 18:17:03.9799600"', text)
    day, time, digits, zone = match.groups()
    key = f"{day} {time} {zone}"
    if key not in seconds_of:
        seconds_of[key] = _epoch_seconds(day, time, zone or "", at)
    return seconds_of[key], int(digits) / 10 ** len(digits) if digits else 0.0


def _epoch_seconds(day: str, time: str, zone: str, at: str) -> int:
    try:
        moment = datetime.fromisoformat(f"{day}T{time}")
    except ValueError:
        raise bad_field(at, "TIMESTAMP", "a valid date and time", f"{day} {time}") from None
    offset = 0 if zone in ("", "Z") else int(zone[0] + "1") * (int(zone[1:3]) * 3600 + int(zone[-2:]) * 60)
    return calendar.timegm(moment.timetuple()) - offset


def _columns(rows: Iterator[list[str]], required: tuple[str, ...], where: str, name: str) -> list[int]:
    header = next(rows, None)
    if header is None:
        raise TraceError(f"{where}: empty (a {name} CSV starts with its header: {','.join(required)})")
    index = {column.strip(): position for position, column in enumerate(header)}
    missing = [column for column in required if column not in index]
    if missing:
        raise TraceError(f'{where} line 1: the header lacks "{missing[0]}" ({name} columns: {", ".join(required)})')
    return [index[column] for column in required]


def _cell(row: list[str], index: int, name: str, at: str) -> str:
    if index >= len(row):
        raise TraceError(f'{at}: field "{name}": missing ({len(row)} columns, fewer than the header\'s)')
    return row[index]


def _number(text: str, name: str, at: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise bad_field(at, name, "a number of seconds of at least 0", text)
    return value


def _read_sharegpt(stream: IO[bytes], where: str, options: Options) -> Trace:
    """First turn the prompt, second the output, whatever their "from" (vLLM takes conversations[0] and [1]);
    entries with fewer than two turns dropped (load_data), pairs outside is_valid_sequence skipped (sample). vLLM
    shuffles the entries first; this keeps the file's order."""
    count = options.tokenizer or _estimated_tokens
    requests: list[TraceRequest] = []
    skipped = 0
    for number, entry in JsonArray(stream, where).entries():
        at = f"{where} entry {number}"
        if not isinstance(entry, dict):
            raise TraceError(f'{at}: expected an object with "conversations", got {shown(entry)}')
        turns = entry.get("conversations")
        if turns is not None and not isinstance(turns, list):
            raise bad_field(at, "conversations", 'a list of turns {"from": ..., "value": ...}', turns)
        if turns is None or len(turns) < 2:
            skipped += 1
            continue
        prompt, output = count(_turn(turns, 0, at)), count(_turn(turns, 1, at))
        if not vllm_valid_sequence(prompt, output):
            skipped += 1
            continue
        requests.append(TraceRequest(0.0, prompt, output))
        if options.limit is not None and len(requests) >= options.limit:
            break
    estimate = "" if options.tokenizer else "; token counts estimated at 4 characters a token"
    why = "conversations under two turns or outside vLLM's length filter"
    return _trace(requests, where, "ShareGPT JSON" + estimate, skipped, why, timed=False)


def vllm_valid_sequence(prompt: int, output: int) -> bool:
    """vLLM's benchmark filter with its defaults (is_valid_sequence): both at least 4 tokens, the prompt at most
    1024, the two together at most 2048."""
    return prompt >= 4 and output >= 4 and prompt <= 1024 and prompt + output <= 2048


def _turn(turns: list[Any], index: int, at: str) -> str:
    turn = turns[index]
    value = turn.get("value") if isinstance(turn, dict) else turn
    if not isinstance(value, str):
        raise bad_field(at, f"conversations[{index}].value", "a string", value)
    return value


def _estimated_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


class JsonArray:
    """The entries of one JSON array, decoded one at a time from 1 MiB chunks: a ShareGPT file is hundreds of MiB,
    and an entry may be at most 16 MiB."""

    def __init__(self, stream: IO[bytes], where: str) -> None:
        self.stream, self.where = stream, where
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.decoder = json.JSONDecoder()
        self.text, self.position, self.read_bytes, self.ended = "", 0, 0, False

    def entries(self) -> Iterator[tuple[int, Any]]:
        if self._next_char() != "[":
            raise TraceError(f'{self.where}: not a JSON array (ShareGPT: [{{"conversations": [...]}}, ...])')
        self.position += 1
        number = 0
        while (char := self._next_char()) != "]":
            if number and char == ",":
                self.position += 1
                char = self._next_char()
            elif number and char:
                raise TraceError(f"{self.where} entry {number}: expected , or ] after it, got {shown(char)}")
            if not char:
                raise TraceError(f"{self.where}: the JSON array ends before its ]")
            number += 1
            yield number, self._value(number)

    def _next_char(self) -> str:
        """The next character that is not white space, reading on as needed; "" at the end of the file."""
        while (match := NON_SPACE.search(self.text, self.position)) is None:
            if self.ended:
                return ""
            self._read()
        self.position = match.start()
        return match.group()

    def _value(self, number: int) -> Any:
        while True:
            try:
                value, self.position = self.decoder.raw_decode(self.text, self.position)
                return value
            except RecursionError:
                raise TraceError(f"{self.where} entry {number}: nested too deeply to be a conversation") from None
            except json.JSONDecodeError as exc:
                if self.ended:
                    raise TraceError(f"{self.where} entry {number}: not JSON ({exc.msg})") from None
                if len(self.text) - self.position > MAX_LINE_BYTES:
                    raise TraceError(
                        f"{self.where} entry {number}: over 16 MiB (an entry is one conversation)"
                    ) from None
                self._read()

    def _read(self) -> None:
        chunk = self.stream.read(CHUNK_BYTES)
        self.read_bytes += len(chunk)
        if self.read_bytes > MAX_FILE_BYTES:
            raise TraceError(f"{self.where}: over 4 GiB once decompressed, more than a trace file may hold")
        self.ended = not chunk
        self.text = self.text[self.position :] + self.utf8.decode(chunk, final=self.ended)
        self.position = 0


def _trace(requests: list[TraceRequest], where: str, name: str, skipped: int, why: str, timed: bool = True) -> Trace:
    dropped = f", {skipped:,} {why} skipped" if skipped else ""
    if not requests:
        raise TraceError(f"{where}: no requests ({name}{dropped})")
    return Trace(
        tuple(requests), f"{where} ({name}, {len(requests):,} requests{dropped})", timed=timed, skipped=skipped
    )


READERS: dict[str, Callable[[IO[bytes], str, Options], Trace]] = {
    "kvops": lambda stream, where, options: parse_jsonl(lines_of(stream, where), where, options.limit),
    "mooncake": partial(_read_hashed, layout=MOONCAKE),
    "timed_trace": partial(_read_hashed, layout=TIMED_TRACE),
    "burstgpt": _read_burstgpt,
    "azure": _read_azure,
    "sharegpt": _read_sharegpt,
    "vllm_bench": lambda stream, where, options: _head(_bench_result(stream, where).trace, options.limit),
}


def read_bench_result(path: str | os.PathLike[str]) -> Measured:
    """A `vllm bench serve --save-result --save-detailed` file: its requests as a trace, and what its clients
    measured of each."""
    where = os.fspath(path)
    with opened(where) as stream, _read_errors(where):
        return _bench_result(stream, where)


def _bench_result(stream: IO[bytes], where: str) -> Measured:
    raw = stream.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise TraceError(f"{where}: over 4 GiB once decompressed, more than a trace file may hold")
    try:
        data = json.loads(raw.decode("utf-8", errors="replace").removeprefix("\ufeff"))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise TraceError(f"{where}: not JSON ({getattr(exc, 'msg', exc)})") from None
    return parse_result(data, where)


def _head(trace: Trace, limit: int | None) -> Trace:
    return trace if limit is None else trace.head(limit)
