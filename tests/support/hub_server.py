"""A stand-in for the Hugging Face Hub's file API on 127.0.0.1, for tests only: the Hub cannot be reached from
the test machines. It speaks the wire format huggingface_hub reads (huggingface_hub 2.x `file_download.py`,
`hf_api.py`, `utils/_http.py`):

- `GET /api/models/{repo}[/revision/{rev}]`: the model info (`id`, `sha`, `siblings`, `gated`);
- `HEAD` and `GET /{repo}/resolve/{rev}/{file}`: `X-Repo-Commit`, `ETag` and `Content-Length` headers; a
  `Range: bytes=a-b` request is answered 206 with `Content-Range`;
- errors as the Hub words them: `X-Error-Code: RepoNotFound` (404), `GatedRepo` (401 without a token),
  `RevisionNotFound`, `EntryNotFound` (404).

Every request is recorded (method, path, range, whether a token came), so a test can check what was asked.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from tests.support.servers import BackgroundServer


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    gated: bool = False
    branches: tuple[str, ...] = ("main",)


@dataclass
class Hub:
    repos: dict[str, Repo] = field(default_factory=dict)
    token: str = "hf_test_token"
    requests: list[tuple[str, str, str | None, bool]] = field(default_factory=list)


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+?)(?:/revision/(?P<rev>[^/]+))?$")


def hub_server(hub: Hub) -> BackgroundServer:
    """The stand-in Hub on a free port: `with hub_server(hub) as server: ... server.server_port`."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            return None

        def do_HEAD(self) -> None:
            self._answer(head=True)

        def do_GET(self) -> None:
            self._answer(head=False)

        def _answer(self, head: bool) -> None:
            path = self.path.split("?", 1)[0]
            authorized = self.headers.get("authorization") == f"Bearer {hub.token}"
            hub.requests.append((self.command, path, self.headers.get("range"), authorized))
            if match := _INFO.match(path):
                self._info(match["repo"], match["rev"] or "main", head)
            elif match := _RESOLVE.match(path):
                self._resolve(match["repo"], match["rev"], match["file"], authorized, head)
            else:
                self._error(404, "RepoNotFound", "Repository not found", head)

        def _repo(self, name: str, revision: str, head: bool) -> Repo | None:
            repo = hub.repos.get(name)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found", head)
                return None
            if revision not in repo.branches and revision != repo.commit:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
                return None
            return repo

        def _info(self, name: str, revision: str, head: bool) -> None:
            repo = self._repo(name, revision, head)
            if repo is None:
                return
            body = {
                "_id": hashlib.md5(name.encode()).hexdigest()[:24],
                "id": name,
                "modelId": name,
                "sha": repo.commit,
                "private": False,
                "gated": "manual" if repo.gated else False,
                "disabled": False,
                "tags": [],
                "siblings": [{"rfilename": file} for file in sorted(repo.files)],
            }
            self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)

        def _resolve(self, name: str, revision: str, file: str, authorized: bool, head: bool) -> None:
            repo = self._repo(name, revision, head)
            if repo is None:
                return
            if repo.gated and not authorized:
                message = f"Access to model {name} is restricted. You must have access to it and be authenticated."
                self._error(401, "GatedRepo", message, head)
                return
            data = repo.files.get(file)
            if data is None:
                self._error(404, "EntryNotFound", f"{file} does not exist on {revision}", head)
                return
            headers = {
                "X-Repo-Commit": repo.commit,
                "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                "Accept-Ranges": "bytes",
                "Content-Type": "application/octet-stream",
            }
            requested = self.headers.get("range")
            if requested and (match := re.match(r"bytes=(\d+)-(\d*)$", requested)):
                start = int(match[1])
                end = min(int(match[2]) if match[2] else len(data) - 1, len(data) - 1)
                headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
                self._send(206, data[start : end + 1], headers, head)
                return
            self._send(200, data, headers, head)

        def _error(self, status: int, code: str, message: str, head: bool) -> None:
            body = json.dumps({"error": message}).encode()
            headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
            self._send(status, body, headers, head)

        def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

    return BackgroundServer(("127.0.0.1", 0), Handler)
