"""Real KV pressure on a vLLM engine: closed-loop ignore_eos completions, in stages a test switches between.

Each request sends `prompt_tokens` random token ids (so no two requests share a prefix-cache block) and generates
exactly `max_tokens`; `concurrency` workers keep that many requests in flight. With the tiny model's 32 blocks
of 128 tokens (31 usable: vLLM keeps one null block), a request of P + G tokens holds ceil((P + G) / 128) blocks:

    Stage(4, 650, 100)  4 x 6 blocks = 24/31 = 77%  (warn)
    Stage(4, 780, 100)  4 x 7 blocks = 28/31 = 90%  (degrade)
    Stage(8, 100, 900)  8 sequences growing to 8 blocks each: the pool fills, vLLM preempts  (critical)
    Stage(5, 650, 100)  5 x 6 blocks = 30/31 = 97% from admission to the end, no preemption  (critical, held)
"""

from __future__ import annotations

import json
import random
import threading
import urllib.request
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    concurrency: int
    prompt_tokens: int
    max_tokens: int


# For a watcher driven by these stages: the shipped levels and actions with short signal windows. The dwell (15 s,
# the middleware's too) outlasts the load's dips between requests, so each stage holds its level until the next
# stage raises it.
STAGED_POLICY = """\
min_dwell_seconds: 15
admission: {min_dwell_seconds: 15}
signals:
  queue_growth: {window_seconds: 2, min_growth: 3, raise_to: warn}
  preemptions: {window_seconds: 2, raise_to: degrade}
  stall: {seconds: 30, raise_to: critical}
  prefix_cache_hit_rate: {window_seconds: 5, below: 0.85, raise_to: none}
"""


WARN = Stage(4, 650, 100)
DEGRADE = Stage(4, 780, 100)
CRITICAL = Stage(8, 100, 900)
FULL = Stage(5, 650, 100)


class KvLoad:
    def __init__(self, base_url: str, model: str, *, max_workers: int = 8, seed: int = 7):
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.model = model
        self.stage: Stage | None = None
        self.stopping = threading.Event()
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.completed = 0
        self.errors: list[str] = []
        self.workers = [threading.Thread(target=self._work, args=(index,), daemon=True) for index in range(max_workers)]

    def start(self, stage: Stage) -> KvLoad:
        self.stage = stage
        for worker in self.workers:
            worker.start()
        return self

    def switch(self, stage: Stage) -> None:
        self.stage = stage

    def report(self) -> str:
        """What the load did, for a failure message: a stalled level is the engine or the load."""
        with self.lock:
            last = self.errors[-1] if self.errors else "none"
            return f"{self.completed} requests completed, {len(self.errors)} failed (last: {last})"

    def stop(self, timeout: float = 120) -> None:
        self.stopping.set()
        for worker in self.workers:
            worker.join(timeout)

    def _work(self, index: int) -> None:
        while not self.stopping.is_set():
            stage = self.stage
            if stage is None or index >= stage.concurrency:
                self.stopping.wait(0.05)
                continue
            with self.lock:
                prompt = [self.random.randrange(10, 500) for _ in range(stage.prompt_tokens)]
            body = {
                "model": self.model,
                "prompt": prompt,
                "max_tokens": stage.max_tokens,
                "ignore_eos": True,
                "temperature": 0,
            }
            request = urllib.request.Request(self.url, json.dumps(body).encode(), {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=300) as response:
                    response.read()
                with self.lock:
                    self.completed += 1
            except OSError as exc:
                with self.lock:
                    self.errors.append(str(exc))
                self.stopping.wait(0.2)
