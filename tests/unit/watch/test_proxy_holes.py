"""The admission proxy's holes found with hostile input (issue 20), each reproduced over real sockets on 127.0.0.1:
a gzip body that smuggles a second request, max_completion_tokens beside max_tokens, a list of prompts at degrade,
a priority header from anyone, and a watcher that starts while /metrics is unusable."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import zlib

import pytest

from kvops.policy import Level, load_policy
from kvops.watch.sources import ScrapeSource
from kvops.watch.watcher import EventLog, Watcher
from tests.support.aio import ServerThread
from tests.support.metrics_server import MetricsServer, vllm_exposition
from tests.support.raw_http import exchange, request_bytes, response_body, status_of
from tests.support.upstream import RecordingUpstream
from tests.support.watch_process import WatchProcess
from tests.unit.watch.test_hostile_proxy import guarded_proxy
from tests.unit.watch.test_proxy import LevelHolder, make_proxy_app

requests = pytest.importorskip("requests", reason="requests is not installed (pip install -e '.[test]'; .ci/run does)")

SMUGGLED_BODY = b'{"prompt": "x", "max_tokens": 100000, "n": 8}'


def completions_request(body: bytes) -> bytes:
    """A whole HTTP/1.1 POST /v1/completions, as a smuggled second request would arrive."""
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
    )


def smuggling_gzip(smuggled: bytes = completions_request(SMUGGLED_BODY)) -> bytes:
    """A gzip body exactly as long as the first part of what it inflates to: an upstream that reads the inflated
    body under the compressed Content-Length takes the rest, `smuggled`, for a second request."""
    for filler in (b" ", b"x", b"{}"):
        for count in range(1, 2000):
            padding = filler * count
            packed = gzip.compress(padding + smuggled, mtime=0)
            if len(packed) == len(padding):
                return packed
    raise AssertionError("no padding makes the compressed length equal the padding's")


def settle(recorder: RecordingUpstream, seconds: float = 1.0) -> list[str]:
    """The paths the upstream received, once a pipelined second request would have been answered too."""
    time.sleep(seconds)
    return [received.path for received in recorder.received]


def send(port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    return exchange(port, request_bytes("POST", path, body, {"Content-Type": "application/json", **headers}))


# --- a. content codings: the body forwarded is the body its Content-Length frames ------------------------------------


def test_a_gzip_body_on_an_unguarded_path_is_forwarded_as_sent_and_smuggles_nothing(upstream):
    packed = smuggling_gzip()
    with guarded_proxy(upstream.url, Level.CRITICAL) as proxy:
        answer = send(proxy.port, "/v1/embeddings", packed, {"Content-Encoding": "gzip"})
        paths = settle(upstream.recorder)
    assert status_of(answer) == 200
    assert paths == ["/v1/embeddings"]  # before the fix: ["/v1/embeddings", "/v1/completions"] (the smuggled one)
    received = upstream.recorder.received[0]
    assert received.body == packed and received.headers["Content-Encoding"] == "gzip"
    assert received.headers["Content-Length"] == str(len(packed))


def test_a_server_that_inflates_bodies_cannot_make_the_proxy_send_more_than_its_content_length(upstream):
    """Behind a server that decodes request bodies itself (aiohttp's default), the inflated body no longer matches
    the client's Content-Length: the proxy refuses it rather than frame it under the wrong length."""
    packed = smuggling_gzip()
    with ServerThread(make_proxy_app(upstream.url, LevelHolder(Level.CRITICAL))) as proxy:
        answer = send(proxy.port, "/v1/embeddings", packed, {"Content-Encoding": "gzip"})
        paths = settle(upstream.recorder)
    assert status_of(answer) == 400 and b"Content-Length" in answer
    assert "/v1/completions" not in paths


def test_a_gzip_body_on_a_guarded_path_is_decoded_clamped_and_framed_by_its_own_length(upstream):
    sent = {"prompt": "x", "max_tokens": 4000, "n": 8}
    with guarded_proxy(upstream.url, Level.DEGRADE) as proxy:
        answer = send(
            proxy.port, "/v1/completions", gzip.compress(json.dumps(sent).encode()), {"Content-Encoding": "gzip"}
        )
    assert status_of(answer) == 200 and b"X-KVops-Clamped: max_tokens 4000->512, n 8->1" in answer
    [received] = upstream.recorder.received
    assert received.json() == {"prompt": "x", "max_tokens": 512, "n": 1}
    assert "Content-Encoding" not in received.headers and received.headers["Content-Length"] == str(len(received.body))


@pytest.mark.parametrize(
    "coding, compress",
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", lambda data: zlib.compress(data)[2:-4]),  # raw deflate, as some clients send it
        ("gzip, identity", gzip.compress),
        ("identity", lambda data: data),
    ],
    ids=["gzip", "x-gzip", "deflate-zlib", "deflate-raw", "gzip-identity", "identity"],
)
def test_each_coding_the_proxy_reads_is_decoded_at_every_level_alike(upstream, coding, compress):
    raw = b'{"prompt": "x", "max_tokens": 4}'
    with guarded_proxy(upstream.url, Level.OK) as proxy:
        answer = send(proxy.port, "/v1/completions", compress(raw), {"Content-Encoding": coding})
    assert status_of(answer) == 200
    [received] = upstream.recorder.received
    assert received.body == raw and "Content-Encoding" not in received.headers


@pytest.mark.parametrize(
    "coding, body, status, fragment",
    [
        ("br", b"\x8b\x02\x80{}\x03", 415, "Content-Encoding br is not supported"),
        ("zstd", b"(\xb5/\xfd\x00", 415, "Content-Encoding zstd is not supported"),
        ("gzip", b"\x1f\x8b not gzip at all", 400, "not valid gzip"),
        ("gzip", gzip.compress(b'{"prompt": "x"}')[:-6], 400, "not valid gzip"),
        ("deflate", b"\x00\x01\x02\x03 not deflate", 400, "not valid deflate"),
        ("gzip", gzip.compress(b" " * (9 << 20)), 413, "exceeds the proxy's limit of 8388608 bytes"),
        ("gzip, gzip, gzip, gzip, gzip", b"x", 415, "more than 4 content codings"),
    ],
    ids=["br", "zstd", "garbage", "truncated", "bad-deflate", "bomb", "too-many"],
)
def test_a_body_the_proxy_cannot_decode_on_a_guarded_path_is_refused_never_passed_through(
    upstream, coding, body, status, fragment
):
    with guarded_proxy(upstream.url, Level.WARN) as proxy:
        answer = send(proxy.port, "/v1/completions", body, {"Content-Encoding": coding})
    assert status_of(answer) == status
    assert fragment in json.loads(response_body(answer))["error"]["message"]
    assert upstream.recorder.received == []


def test_a_gzip_body_on_a_route_the_proxy_does_not_read_passes_as_sent(upstream):
    packed = gzip.compress(b"--form data--")
    with guarded_proxy(upstream.url, Level.WARN) as proxy:
        answer = send(proxy.port, "/v1/audio/transcriptions", packed, {"Content-Encoding": "gzip"})
    assert status_of(answer) == 200
    [received] = upstream.recorder.received
    assert received.body == packed and received.headers["Content-Encoding"] == "gzip"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/embeddings"], ids=["guarded", "unguarded"])
def test_a_transfer_coding_besides_chunked_is_501_not_forwarded_still_coded(upstream, path):
    """aiohttp only de-chunks `Transfer-Encoding: gzip, chunked`: the gzip bytes would go on unlabelled."""
    packed = gzip.compress(b'{"prompt": "x"}')
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
    with guarded_proxy(upstream.url, Level.OK) as proxy:
        answer = exchange(proxy.port, head.encode() + b"%x\r\n%b\r\n0\r\n\r\n" % (len(packed), packed))
    assert status_of(answer) == 501 and upstream.recorder.received == []


# --- b. every field vLLM reads as the output limit is capped --------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/invocations", "/v1/chat/completions/batch"])
def test_max_completion_tokens_above_the_cap_is_capped_when_max_tokens_is_also_set(upstream, path):
    """vLLM's ChatCompletionRequest reads max_completion_tokens when it is set and max_tokens only when it is not
    (vllm/entrypoints/openai/chat_completion/protocol.py, build_tok_params): each is capped on its own."""
    messages: list = [{"role": "user", "content": "x"}]
    sent = {"messages": [messages] if path.endswith("/batch") else messages}
    sent |= {"max_tokens": 10, "max_completion_tokens": 100000}
    with guarded_proxy(upstream.url, Level.WARN) as proxy:
        response = requests.post(proxy.url + path, json=sent, timeout=30)
    assert response.status_code == 200 and response.headers["X-KVops-Clamped"] == "max_tokens 100000->512"
    assert upstream.recorder.received[-1].json() == {**sent, "max_tokens": 10, "max_completion_tokens": 512}


def test_both_limits_above_the_cap_are_both_capped(upstream):
    sent = {"messages": [], "max_tokens": 9000, "max_completion_tokens": 700, "min_tokens": 600}
    with guarded_proxy(upstream.url, Level.WARN) as proxy:
        response = requests.post(proxy.url + "/v1/chat/completions", json=sent, timeout=30)
    assert response.headers["X-KVops-Clamped"] == "max_tokens 9000->512, min_tokens 600->512"
    assert upstream.recorder.received[-1].json() == {
        "messages": [],
        "max_tokens": 512,
        "max_completion_tokens": 512,
        "min_tokens": 512,
    }


# --- c. a list of prompts counts as that many requests ----------------------------------------------------------------

PROMPTS_100 = {"prompt": [f"prompt {i}" for i in range(100)], "max_tokens": 4000}


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", PROMPTS_100),
        ("/v1/completions", {"prompt": [[1, 2], [3, 4]]}),
        ("/v1/completions", {"prompt": "x", "prompt_embeds": "AAAA"}),
        ("/v1/completions", {"prompt_embeds": ["AAAA", "BBBB"]}),
        ("/invocations", {"prompt": ["a", "b"], "n": 2}),
        ("/v1/chat/completions/batch", {"messages": [[{"role": "user", "content": "a"}], [{"role": "user"}]]}),
    ],
    ids=["100-prompts", "token-lists", "prompt-and-embeds", "embeds", "invocations", "chat-batch"],
)
def test_a_batch_of_prompts_at_degrade_is_refused_429_as_its_many_requests(upstream, path, body):
    with guarded_proxy(upstream.url, Level.DEGRADE) as proxy:
        response = requests.post(proxy.url + path, json=body, timeout=30)
    assert (response.status_code, response.headers["Retry-After"], response.headers["X-KVops-Level"]) == (
        429,
        "10",
        "degrade",
    )
    message = response.json()["error"]["message"]
    assert "counts as" in message and "send one prompt per request" in message
    assert upstream.recorder.received == []  # before the fix: 100 prompts x 512 tokens reached the upstream


def test_vertex_instances_at_degrade_count_as_that_many_requests(upstream):
    instances = [{"inputs": "x", "parameters": {"max_new_tokens": 900}}, {"messages": [], "max_tokens": 700}]
    with guarded_proxy(upstream.url, Level.DEGRADE, engine="tgi") as proxy:
        response = requests.post(proxy.url + "/vertex", json={"instances": instances}, timeout=30)
    assert response.status_code == 429 and response.json()["error_type"] == "overloaded"
    assert upstream.recorder.received == []


@pytest.mark.parametrize(
    "body",
    [{"prompt": "one"}, {"prompt": [1, 2, 3]}, {"prompt": ["one"]}, {"prompt": [[1, 2]]}],
    ids=["text", "token-ids", "list-of-one", "token-list-of-one"],
)
def test_one_prompt_at_degrade_is_served(upstream, body):
    with guarded_proxy(upstream.url, Level.DEGRADE) as proxy:
        response = requests.post(proxy.url + "/v1/completions", json={**body, "n": 4}, timeout=30)
    assert response.status_code == 200 and upstream.recorder.received[-1].json()["n"] == 1


def test_a_batch_at_warn_is_capped_per_prompt_and_a_protected_batch_at_degrade_is_clamped(upstream):
    with guarded_proxy(upstream.url, Level.WARN) as proxy:
        warn = requests.post(proxy.url + "/v1/completions", json=PROMPTS_100, timeout=30)
        proxy.holder.level = Level.DEGRADE
        protected = requests.post(
            proxy.url + "/v1/completions", json={**PROMPTS_100, "n": 3}, headers={"X-KVops-Priority": "-1"}, timeout=30
        )
    assert warn.status_code == 200 and upstream.recorder.received[0].json()["max_tokens"] == 512
    assert protected.status_code == 200 and protected.headers["X-KVops-Clamped"] == "max_tokens 4000->512, n 3->1"


# --- d. the priority header only from a trusted gateway -------------------------------------------------------------


def test_a_priority_header_from_a_client_that_is_not_trusted_is_ignored_and_dropped(upstream):
    with guarded_proxy(upstream.url, Level.CRITICAL, trust_priority_from=()) as proxy:
        claimed = requests.post(
            proxy.url + "/v1/completions", json={"prompt": "x"}, headers={"X-KVops-Priority": "-1"}, timeout=30
        )
        proxy.holder.level = Level.OK
        malformed = requests.post(
            proxy.url + "/v1/completions", json={"prompt": "x"}, headers={"X-KVops-Priority": "high"}, timeout=30
        )
    assert claimed.status_code == 503  # before the fix: 200, served as protected at critical
    assert malformed.status_code == 200  # not read, so not refused for its form either
    assert "X-KVops-Priority" not in upstream.recorder.received[-1].headers


@pytest.mark.parametrize(
    "networks, status", [(("127.0.0.0/8",), 200), (("10.0.0.0/8", "::1/128"), 503)], ids=["trusted", "other"]
)
def test_a_priority_header_counts_only_from_the_trusted_networks(upstream, networks, status):
    from ipaddress import ip_network

    trusted = tuple(ip_network(network) for network in networks)
    with guarded_proxy(upstream.url, Level.CRITICAL, trust_priority_from=trusted) as proxy:
        response = requests.post(
            proxy.url + "/v1/completions", json={"prompt": "x"}, headers={"X-KVops-Priority": "-1"}, timeout=30
        )
    assert response.status_code == status


@pytest.mark.parametrize(
    "value, message",
    [
        ("10.0.0.1/8", "'10.0.0.1/8' has host bits set; did you mean 10.0.0.0/8?"),
        ("10.0.0.0/33", "'10.0.0.0/33' is not an IP network (CIDR, e.g. 10.0.0.0/8, or one address)"),
        ("gateway", "'gateway' is not an IP network (CIDR, e.g. 10.0.0.0/8, or one address)"),
    ],
)
def test_trust_priority_from_errors_are_one_line(run_kvops, value, message):
    ran = run_kvops(
        "watch",
        "--engine",
        "vllm",
        "--metrics-url",
        "http://127.0.0.1:9/metrics",
        "--proxy",
        "http://127.0.0.1:9",
        "--listen",
        ":0",
        "--trust-priority-from",
        value,
        expect=2,
    )
    assert message in ran.stderr and "Traceback" not in ran.stderr


def test_trust_priority_from_needs_the_proxy(run_kvops):
    ran = run_kvops(
        "watch",
        "--engine",
        "vllm",
        "--metrics-url",
        "http://127.0.0.1:9/metrics",
        "--trust-priority-from",
        "10.0.0.0/8",
        expect=2,
    )
    assert "--trust-priority-from applies to --proxy" in ran.stderr


@pytest.mark.parametrize("value, exit_code", [("10.0.0.0/8", 4), ("", 3)], ids=["set", "empty"])
def test_trust_priority_from_is_read_from_the_environment_where_manifests_put_it(value, exit_code):
    """What the gateway's ConfigMap gives the sidecar: KVOPS_TRUST_PRIORITY_FROM, empty meaning no one."""
    from click.testing import CliRunner

    from kvops.cli import main

    args = ["watch", "--engine", "vllm", "--metrics-url", "http://127.0.0.1:9/metrics", "--once", "--timeout", "1"]
    result = CliRunner().invoke(main, args, env={"KVOPS_TRUST_PRIORITY_FROM": value})
    assert result.exit_code == exit_code  # set without --proxy: the usage error (--once: 4); empty: the poll runs
    assert ("--trust-priority-from applies to --proxy" in result.output) == bool(value)


def test_manifests_for_a_gateway_wire_the_trusted_networks_and_plain_k8s_trusts_none(run_kvops, tmp_path):
    import yaml

    from tests.unit.deploy.test_deploy import EXAMPLE

    def sidecar(target: str) -> tuple[dict, dict[str, str]]:
        out = tmp_path / target
        run_kvops("manifests", *EXAMPLE, "--target", target, "--out", str(out))
        files = {path.name: path.read_text() for path in out.iterdir()}
        pod = yaml.safe_load(files["deployment.yaml"])["spec"]["template"]["spec"]
        return next(c for c in pod["containers"] if c["name"] == "kvops"), files

    plain, _ = sidecar("k8s")
    assert "env" not in plain and "--trust-priority-from" not in plain["args"]
    gateway, files = sidecar("llm-d")
    [trust] = gateway["env"]
    assert trust["name"] == "KVOPS_TRUST_PRIORITY_FROM"
    reference = trust["valueFrom"]["configMapKeyRef"]
    config = yaml.safe_load(files["gateway-trust.yaml"])
    assert (config["kind"], config["metadata"]["name"]) == ("ConfigMap", reference["name"])
    assert config["data"][reference["key"]] == "" and reference["optional"] is True  # off until the operator sets it


# --- e. a watcher that starts while /metrics is unusable ----------------------------------------------------------


@pytest.mark.parametrize(
    "fault", [{"status": 500}, {"body": "garbage"}, {"body": vllm_exposition("NaN")}], ids=["500", "garbage", "nan"]
)
def test_a_watcher_that_starts_without_a_usable_reading_fails_closed(fault):
    with MetricsServer(vllm_exposition(0.3)) as server:
        server.set(**fault)
        watcher = Watcher(load_policy(), "vllm", ScrapeSource("vllm", server.url, timeout=10), log=EventLog(None))
        before = watcher.current.limits

        async def run():
            polled = [await watcher.poll() for _ in range(4)]
            server.set(vllm_exposition(0.3))
            polled.append(await watcher.poll())
            await watcher.close()
            return polled

        polled = asyncio.run(run())
    assert before.reject and before.level == Level.UNKNOWN  # before the fix: no limits at all
    assert [(s.level, s.limits.reject) for s in polled[:4]] == [(Level.UNKNOWN, True)] * 4
    assert (polled[4].level, polled[4].limits.reject, polled[4].limits.max_tokens_cap) == (Level.OK, False, None)


def test_a_fail_open_policy_starts_without_limits(tmp_path):
    (tmp_path / "policy.yaml").write_text("unknown:\n  mode: fail-open\n")
    with MetricsServer("garbage") as server:
        watcher = Watcher(
            load_policy(tmp_path / "policy.yaml"),
            "vllm",
            ScrapeSource("vllm", server.url, timeout=10),
            log=EventLog(None),
        )

        async def run():
            snapshot = await watcher.poll()
            await watcher.close()
            return snapshot

        snapshot = asyncio.run(run())
    assert snapshot.level == Level.UNKNOWN and snapshot.limits.actions() == []


def test_the_proxy_of_a_watcher_started_on_a_dead_metrics_endpoint_refuses_until_the_first_good_reading(upstream):
    with MetricsServer(vllm_exposition(0.3)) as metrics:
        metrics.set(status=500)
        with WatchProcess(
            "--engine", "vllm", "--metrics-url", metrics.url, "--proxy", upstream.url, "--interval", "0.2"
        ) as watch:
            refused = requests.post(watch.url + "/v1/completions", json={"prompt": "x"}, timeout=30)
            metrics.set(status=200)
            watch.wait_level("ok")
            served = requests.post(watch.url + "/v1/completions", json={"prompt": "x"}, timeout=30)
    assert (refused.status_code, refused.headers["X-KVops-Level"], refused.headers["Retry-After"]) == (
        503,
        "unknown",
        "10",
    )
    assert served.status_code == 200
    assert len(upstream.recorder.received) == 1
