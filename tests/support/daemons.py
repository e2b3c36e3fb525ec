"""Real Prometheus and Alertmanager (Debian's packages) on free 127.0.0.1 ports with temporary data dirs."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from tests.support.processes import stop_group
from tests.support.vllm_server import free_port

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


class Daemon:
    """A subprocess in its own process group, ready when `ready_path` answers 200, stopped with SIGTERM."""

    ready_path = "/-/ready"

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.log_path = workdir / "daemon.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def __enter__(self):
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            self.command(), stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, cwd=self.workdir
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.command()[0]} exited with {self.process.returncode}:\n{self.log_path.read_text()[-2000:]}"
                )
            try:
                with urllib.request.urlopen(self.url + self.ready_path, timeout=1) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        self.__exit__()
        raise RuntimeError(f"{self.command()[0]} not ready after 60 s:\n{self.log_path.read_text()[-2000:]}")

    def __exit__(self, *exc) -> None:
        if self.process:
            stop_group(self.process, grace=20)
        self.log.close()

    def get_json(self, path: str, **params) -> dict | list:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(self.url + path + query, timeout=60) as response:
            return json.loads(response.read())


class PrometheusServer(Daemon):
    """Scrapes `targets` ({job: ["host:port", ...]}) every `scrape_interval`, evaluates `rule_files`; or runs `config`
    (a whole prometheus.yml, relative rule files resolved against `workdir`)."""

    def __init__(
        self,
        workdir: Path,
        targets: dict[str, list[str]] | None = None,
        *,
        scrape_interval: str = "1s",
        rule_files: list[Path] = (),
        config: dict | None = None,
    ):
        super().__init__(workdir)
        if config is None:
            config = {
                "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
                "scrape_configs": [
                    {"job_name": job, "static_configs": [{"targets": hosts}]} for job, hosts in targets.items()
                ],
            }
            if rule_files:
                config["rule_files"] = [str(path) for path in rule_files]
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))

    def command(self) -> list[str]:
        return [
            PROMETHEUS,
            f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]

    def query(self, expr: str) -> list[dict]:
        return self.get_json("/api/v1/query", query=expr)["data"]["result"]

    def wait_for_series(self, expr: str, count: int = 1, timeout: float = 60) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query(expr)
            if len(result) >= count:
                return result
            time.sleep(0.25)
        raise AssertionError(f"Prometheus has fewer than {count} series for {expr} after {timeout:.0f} s")


class AlertmanagerServer(Daemon):
    """A lone Alertmanager (no cluster) whose route ends in a receiver that notifies nobody."""

    def __init__(self, workdir: Path):
        super().__init__(workdir)
        config = {
            "route": {"receiver": "nobody", "group_wait": "1s", "group_interval": "1s"},
            "receivers": [{"name": "nobody"}],
        }
        (workdir / "alertmanager.yml").write_text(yaml.safe_dump(config))

    def command(self) -> list[str]:
        return [
            ALERTMANAGER,
            f"--config.file={self.workdir / 'alertmanager.yml'}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",
        ]

    @property
    def alerts_url(self) -> str:
        return self.url + "/api/v2/alerts"

    def alerts(self) -> list[dict]:
        """Alertmanager's view: the alerts still active (a resolved alert leaves this list)."""
        return self.get_json("/api/v2/alerts")
