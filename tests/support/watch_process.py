"""`kvops watch` in a subprocess, as users run it: its JSON event lines collected, its /kvops/* endpoints at hand."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from tests.support.processes import REPO, checkout_env, stop_group
from tests.support.vllm_server import free_port


class WatchProcess:
    def __init__(self, *args: str):
        self.port = free_port()
        self.args = ["watch", *args, "--listen", f"127.0.0.1:{self.port}"]
        self.lines: list[dict] = []
        self.other_output: list[str] = []
        self.lock = threading.Lock()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> WatchProcess:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kvops", *self.args],
            cwd=REPO,
            env=checkout_env(HF_HUB_OFFLINE="1"),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_event(lambda e: e["event"] == "started", timeout=60)
        return self

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                with self.lock:
                    self.other_output.append(line)
                continue
            with self.lock:
                self.lines.append(event)

    def events(self, name: str | None = None) -> list[dict]:
        with self.lock:
            return [e for e in self.lines if name is None or e["event"] == name]

    def first_rises(self, event: str, levels: list[str]) -> list[dict]:
        """The first change of `event` into each of `levels`, asserted to come in that order. Between two load
        stages the level may dip (the engine's usage really falls while one stage's requests end and the next
        stage's grow, and the dwell has passed): that is the policy working, so only the order of the rises counts."""
        changes = self.events(event)
        firsts = [next((i for i, e in enumerate(changes) if e["to"] == level), None) for level in levels]
        seen = [e["to"] for e in changes]
        assert None not in firsts and firsts == sorted(firsts), (
            f"{event}: {seen} does not rise through {levels} in order"
        )
        return [changes[i] for i in firsts]

    def wait_event(self, predicate, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events():
                if predicate(event):
                    return event
            if self.process.poll() is not None:
                raise AssertionError(
                    f"kvops watch exited with {self.process.returncode}: {self.other_output[-20:]} {self.events()[-5:]}"
                )
            time.sleep(0.05)
        raise AssertionError(
            f"no matching event within {timeout:.0f} s; last events: {json.dumps(self.events()[-8:], indent=1)}"
        )

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=60) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def policy(self) -> dict:
        return json.loads(self.get("/kvops/policy")[1])

    def wait_level(self, level: str, timeout: float = 60, kv_usage: float | None = None) -> dict:
        """The watcher's policy document once its level is `level` (and its KV usage `kv_usage`, where given)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            document = self.policy()
            if document["level"] == level and kv_usage in (None, document["kv_usage"]):
                return document
            if self.process.poll() is not None:
                raise AssertionError(f"kvops watch exited with {self.process.returncode}")
            time.sleep(0.05)
        raise AssertionError(
            f"level not {level} after {timeout:.0f} s: {self.policy()}; events: {json.dumps(self.events()[-6:])[:3000]}"
        )

    def wait_replicas(self, expected: dict[str, str], timeout: float = 60) -> None:
        """Until /kvops/status gives each replica its expected level. A replica whose scrape a busy machine missed
        reads `unknown` for a poll or two (the watcher is right to say so): one reading is not the claim."""
        deadline = time.monotonic() + timeout
        while True:
            replicas = {r["name"]: r["level"] for r in json.loads(self.get("/kvops/status")[1])["replicas"]}
            if replicas == expected:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"replicas {replicas}, not {expected}, after {timeout:.0f} s")
            time.sleep(0.2)

    def metric(self, name: str, **labels: str) -> float | None:
        from prometheus_client.parser import text_string_to_metric_families

        for family in text_string_to_metric_families(self.get("/kvops/metrics")[1]):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return sample.value
        return None

    def stop(self) -> int:
        stop_group(self.process)
        time.sleep(0.1)
        return self.process.returncode

    def __exit__(self, *exc) -> None:
        self.stop()
