"""Where readings come from, behind one interface: `await source.poll()` -> a `Poll` of readings per replica.

- `ScrapeSource`: an engine's own /metrics, fetched with aiohttp and parsed with prometheus_client's parser.
- `PrometheusSource`: a Prometheus server queried with prometheus-api-client, one replica per value of a label
  (`instance`, `pod`, ...), for a fleet.

A source never raises for bad input: an engine that is down, answers 500, hangs past the timeout, or serves
garbage, NaN or a renamed metric becomes a failure with a one-line reason for that replica (or for the whole
source, when Prometheus itself cannot be asked).
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from kvops.engines.metrics import MetricsError, Reading, Sample, Samples, selector_matchers

if TYPE_CHECKING:
    import aiohttp

MAX_BODY_BYTES = 32 * 1024 * 1024  # a vLLM /metrics is ~50 KiB (MiBs with many LoRA adapters); this is not one
PARSE_INLINE_CHARS = 1 << 20  # larger expositions are parsed in a thread: milliseconds per MiB of event-loop time


@dataclass
class Poll:
    readings: dict[str, Reading] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # replica -> why its metrics are unusable
    error: str | None = None  # the source as a whole failed: no replica could be read


class MetricsSource(Protocol):
    url: str  # what /kvops/policy names as its source
    replica_label: str  # the label that names a replica in alerts (`instance` for a direct scrape)

    async def poll(self) -> Poll: ...

    async def close(self) -> None: ...


def engine_module(engine: str) -> ModuleType:
    """The engine's metrics module (its SERIES, reading and promql)."""
    from kvops import engines

    return engines.get(engine).metrics


class ScrapeSource:
    """GET an engine's /metrics each poll; the replica is named like Prometheus' `instance` label (host:port)."""

    replica_label = "instance"

    def __init__(self, engine: str, url: str, *, timeout: float, capacity_tokens: int | None = None):
        self.engine = engine_module(engine)
        self.url = url
        self.timeout = timeout
        self.capacity_tokens = capacity_tokens
        self.replica = urlsplit(url).netloc or url
        self._session: aiohttp.ClientSession | None = None

    async def poll(self) -> Poll:
        try:
            text = await asyncio.wait_for(self._fetch(), self.timeout)
            reading = await self._read(text)
        except MetricsError as exc:
            return Poll(failures={self.replica: str(exc)})
        except asyncio.TimeoutError:
            return Poll(failures={self.replica: f"no answer from {self.url} within {self.timeout:g} s"})
        except Exception as exc:  # aiohttp's connection errors, a reset mid-body, bad encodings: the engine's fault
            return Poll(failures={self.replica: f"cannot read {self.url}: {describe(exc)}"})
        return Poll(readings={self.replica: reading})

    async def _read(self, text: str) -> Reading:
        """The reading of an exposition; a large one is parsed off the event loop (that loop also runs the proxy)."""

        def read() -> Reading:
            return self.engine.reading(Samples.from_exposition(text, only=self.engine.SERIES), self.capacity_tokens)

        return await asyncio.to_thread(read) if len(text) > PARSE_INLINE_CHARS else read()

    async def _fetch(self) -> str:
        """The whole exposition, read to its end; MetricsError past MAX_BODY_BYTES (a level is never decided from
        part of a body: what aiohttp has buffered at one moment may be the first 64 KiB of many MiB)."""
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession()
        async with self._session.get(self.url, headers={"Accept": "text/plain"}) as response:
            if response.status != 200:
                raise MetricsError(f"{self.url} answered HTTP {response.status} {response.reason or ''}".rstrip())
            too_large = f"{self.url} sent more than {MAX_BODY_BYTES // (1024 * 1024)} MiB: not an engine's /metrics"
            if response.content_length is not None and response.content_length > MAX_BODY_BYTES:
                raise MetricsError(too_large)
            body = bytearray()
            async for chunk in response.content.iter_any():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise MetricsError(too_large)
            return body.decode(response.charset or "utf-8", errors="replace")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class PrometheusSource:
    """One instant query per poll for every series the engine's readings need, grouped into replicas by a label.

    With a selector the query also fetches `up`, so a replica whose target is down is reported as such; without
    one, `up` would pull in every other job's targets, and a replica that vanishes is reported as absent.
    """

    def __init__(
        self,
        engine: str,
        url: str,
        *,
        selector: str | None,
        replica_label: str,
        timeout: float,
        capacity_tokens: int | None = None,
    ):
        self.engine = engine_module(engine)
        self.url = url.rstrip("/")
        self.matchers = selector_matchers(selector)
        self.replica_label = replica_label
        self.timeout = timeout
        self.capacity_tokens = capacity_tokens
        names = list(self.engine.SERIES) + (["up"] if self.matchers else [])
        self.query = "{" + ",".join([f'__name__=~"{"|".join(names)}"'] + self.matchers) + "}"
        self._client: Any = None  # a prometheus_api_client.PrometheusConnect, made on the first query
        self.answered = False  # some query has had a Prometheus answer
        self.not_prometheus: str | None = None  # the last answer's proof that the URL is not the API's base

    async def poll(self) -> Poll:
        try:
            rows = await asyncio.wait_for(asyncio.to_thread(self._query), self.timeout + 1)
        except asyncio.TimeoutError:
            return Poll(error=f"no answer from Prometheus {self.url} within {self.timeout:g} s")
        except Exception as exc:  # requests' connection errors, HTTP errors, a body that is not Prometheus JSON
            self.not_prometheus = self._not_prometheus(exc)
            return Poll(error=self.not_prometheus or f"cannot query Prometheus {self.url}: {describe(exc)}")
        self.answered, self.not_prometheus = True, None
        try:
            return self.group(rows)
        except MalformedAnswer as exc:
            return Poll(error=f"Prometheus {self.url} answered {exc}")

    def _query(self) -> list[dict]:
        if self._client is None:
            from prometheus_api_client import PrometheusConnect
            from urllib3.util.retry import Retry

            self._client = PrometheusConnect(self.url, disable_ssl=True, retry=Retry(total=0), timeout=self.timeout)
        return self._client.custom_query(self.query)

    def _not_prometheus(self, exc: Exception) -> str | None:
        """One line saying the URL is not Prometheus' base URL, when the query's answer shows it: HTTP 404 at
        `URL/api/v1/query`, or a body that is not the API's JSON (an engine's /metrics under it); else None."""
        from requests.exceptions import JSONDecodeError

        status = re.match(r"HTTP Status Code (\d+)", str(exc))  # custom_query's PrometheusApiClientException
        if status and status.group(1) == "404":
            why = "answered 404"
        elif isinstance(exc, (JSONDecodeError, KeyError, TypeError)):  # not JSON; JSON without data.result
            why = "answered a body that is not a Prometheus query result"
        else:
            return None
        asked = f"{self.url}/api/v1/query {why}"
        return (
            f"--prometheus {self.url} is not Prometheus' base URL ({asked}): give the server's base URL, {self._hint()}"
        )

    def _hint(self) -> str:
        """The base URL when the one given is an API path (cut before its /api/v1), else an example."""
        parts = urlsplit(self.url)
        if "/api/v1/" in parts.path + "/":
            return parts._replace(path=parts.path[: (parts.path + "/").index("/api/v1/")], query="").geturl()
        engine = "; an engine's /metrics is --metrics-url" if parts.path.endswith("/metrics") else ""
        return f"e.g. http://prometheus:9090{engine}"

    def group(self, rows: Any) -> Poll:
        """Query results -> one reading (or failure) per replica. A row whose labels cannot be read makes the whole
        answer unusable (MalformedAnswer: the poll fails, as missing data); a row whose value cannot be read fails
        its replica."""
        by_replica: dict[str, list[Sample]] = defaultdict(list)
        broken: dict[str, str] = {}
        if not isinstance(rows, list):
            raise MalformedAnswer(f"a result of {type(rows).__name__}, not a list of series")
        for row in rows:
            labels = _labels(row)
            name = labels.pop("__name__", "")
            replica = labels.get(self.replica_label, self._unlabelled)
            value = _value(row)
            if value is None:
                broken[replica] = f"Prometheus answered a {name or 'series'} row without a [time, value] pair"
                continue
            by_replica[replica].append(Sample(name, labels, value))
        poll = Poll(failures=broken)
        for replica, samples in sorted(by_replica.items()):
            why = self._unusable(replica, samples)
            if replica in broken or why:
                poll.failures.setdefault(replica, why or "")
                continue
            up = [s.value for s in samples if s.name == "up"]
            if up and not any(v == 1 for v in up):
                poll.failures[replica] = "target down in Prometheus (up == 0)"
                continue
            try:
                poll.readings[replica] = self.engine.reading(
                    Samples(s for s in samples if s.name != "up"), self.capacity_tokens
                )
            except MetricsError as exc:
                poll.failures[replica] = str(exc)
            except Exception as exc:  # what the engine's reader did not foresee is that replica's bad data
                poll.failures[replica] = f"unusable metrics: {describe(exc)}"
        return poll

    def _unusable(self, replica: str, samples: list[Sample]) -> str | None:
        """Why one replica's series cannot be read as one engine's: they lack the replica label (every replica would
        read as one), or several scrape jobs carry them (each count would be summed once per job)."""
        if replica == self._unlabelled:
            names = sorted(set.intersection(*(set(s.labels) for s in samples)))  # the target's, not each family's
            return (
                f"series without a {self.replica_label} label (they have {', '.join(names) or 'none'}): "
                "--replica-label names the label that tells replicas apart"
            )
        jobs = sorted({s.labels["job"] for s in samples if "job" in s.labels})
        if len(jobs) > 1:
            return (
                f"scraped by {len(jobs)} jobs ({', '.join(jobs)}), each count would be summed once per job: "
                f"give --selector '{{job=\"{jobs[0]}\"}}'"
            )
        return None

    @property
    def _unlabelled(self) -> str:
        return f"(no {self.replica_label} label)"

    async def close(self) -> None:
        if self._client is not None:
            self._client.close()


class MalformedAnswer(Exception):
    """A Prometheus answer whose series cannot be told apart (a row without labels): the message says what came."""


def _labels(row: Any) -> dict[str, str]:
    """A result row's labels, as strings; MalformedAnswer when the row has none to read."""
    metric = row.get("metric") if isinstance(row, dict) else None
    if not isinstance(metric, dict):
        raise MalformedAnswer(f'a result row without its "metric" labels ({str(row)[:80]})')
    return {str(key): str(value) for key, value in metric.items()}


def _value(row: dict) -> float | None:
    """The sample of an instant-vector row (`"value": [time, "number"]`); NaN when the number is not one (the
    engine's reader then names it), None when there is no such pair."""
    pair = row.get("value")
    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        return None
    return _number(pair[1])


def _number(text: Any) -> float:
    try:
        return float(text)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def describe(exc: BaseException) -> str:
    """An exception as one short line: its message, or its type when it has none."""
    text = " ".join(str(exc).split())
    name = type(exc).__name__
    if not text:
        return name
    text = text if len(text) <= 160 else text[:157] + "..."
    return f"{name}: {text}"
