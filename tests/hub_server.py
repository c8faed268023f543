"""A loopback server that speaks the Hugging Face Hub's download protocol, for tests: `HF_ENDPOINT=<its url>`.

It answers what `huggingface_hub`'s downloads ask (`snapshot_download`, `hf_hub_download`, and open_clip and
transformers through them): a repository's info (`GET /api/models/{repo}[/revision/{rev}]`: its commit sha and
files), its file tree (`GET /api/models/{repo}/tree/{rev}`), and its files (`HEAD`/`GET /{repo}/resolve/{rev}/{path}`)
with the hub's headers: X-Repo-Commit, ETag (the git blob sha1) or X-Linked-Etag (an LFS file's sha256),
X-Linked-Size, Content-Length, and ranges for resumed downloads. Errors carry the hub's X-Error-Code
(RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo), from which the client raises its own error types.
Repositories are made in memory from files a test gives (bytes or paths); tests start the server in-process
(`LoopbackHub`), and every request it saw is in `requests`.
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union
from urllib.parse import unquote, urlsplit

FileSource = Union[bytes, Path]
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".npz")


@dataclass
class HubFile:
    """One file of a repository: where its bytes are, and the ids the hub gives it."""

    source: FileSource
    size: int
    git_sha1: str  # the git blob id (a small file's ETag)
    sha256: str  # an LFS file's id (its X-Linked-Etag)
    lfs: bool

    @classmethod
    def of(cls, path: str, source: FileSource) -> "HubFile":
        """A file's ids, computed once from its bytes."""
        data = source.read_bytes() if isinstance(source, Path) else source
        git = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        return cls(source, len(data), git, hashlib.sha256(data).hexdigest(), path.endswith(LFS_SUFFIXES))

    def read(self, start: int = 0, end: Optional[int] = None) -> bytes:
        """Bytes [start, end] (inclusive, as HTTP ranges count)."""
        stop = self.size if end is None else end + 1
        if isinstance(self.source, bytes):
            return self.source[start:stop]
        with open(self.source, "rb") as f:
            f.seek(start)
            return f.read(stop - start)


@dataclass
class HubRepo:
    """A model repository at one commit; `token`: a bearer token it requires (a gated repository)."""

    files: Dict[str, HubFile]
    token: Optional[str] = None
    commit: str = field(init=False)

    def __post_init__(self) -> None:
        digest = hashlib.sha1()
        for path in sorted(self.files):
            digest.update(path.encode() + b"\0" + self.files[path].sha256.encode())
        self.commit = digest.hexdigest()


class LoopbackHub:
    """The server: `add` repositories, `start` it (returns its url for HF_ENDPOINT), `stop` it."""

    def __init__(self) -> None:
        self.repos: Dict[str, HubRepo] = {}
        self.requests: List[Tuple[str, str]] = []  # (method, path) of every request, in order
        self._server: Optional[ThreadingHTTPServer] = None
        self._url: Optional[str] = None
        self._thread: Optional[threading.Thread] = None

    def add(self, repo_id: str, files: Dict[str, FileSource], token: Optional[str] = None) -> str:
        """Publish a repository (replacing any of that id); returns its commit sha."""
        repo = HubRepo({p: HubFile.of(p, src) for p, src in files.items()}, token)
        self.repos[repo_id] = repo
        return repo.commit

    @property
    def url(self) -> str:
        """Where it listens (after `stop`: where it listened, now a refused port)."""
        assert self._url is not None, "the hub was never started"
        return self._url

    def start(self) -> str:
        """Listen on a free loopback port in a daemon thread; returns the url."""
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self._url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="loopback-hub", daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop listening: later requests are refused (a hub that is down)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "LoopbackHub":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    hub: LoopbackHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet: tests read hub.requests instead
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    # ------------------------------------------------------------------ routing
    def _answer(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.requests.append((self.command, path))
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            repo_id, rest = "/".join(parts[2:4]), parts[4:]
            if not rest:
                return self._info(repo_id, "main", body)
            if rest[0] == "revision" and len(rest) == 2:
                return self._info(repo_id, rest[1], body)
            if rest[0] == "tree" and len(rest) >= 2:
                return self._tree(repo_id, rest[1], "/".join(rest[2:]), body)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._file(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), body)
        self._error(404, None, f"no route {path}", body)

    def _repo(self, repo_id: str, revision: str, body: bool) -> Optional[HubRepo]:
        """The repository, or None after answering the hub's error (not found, gated, no such revision)."""
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository Not Found for {repo_id}", body)
            return None
        if repo.token is not None:
            sent = self.headers.get("Authorization", "")
            if sent != f"Bearer {repo.token}":
                code = 403 if sent else 401
                self._error(code, "GatedRepo", f"Access to model {repo_id} is restricted", body, repo.commit)
                return None
        if revision not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", body)
            return None
        return repo

    # ------------------------------------------------------------------ endpoints
    def _info(self, repo_id: str, revision: str, body: bool) -> None:
        repo = self._repo(repo_id, revision, body)
        if repo is not None:
            self._json({"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False,
                        "gated": "manual" if repo.token else False, "disabled": False, "tags": [],
                        "siblings": [{"rfilename": p} for p in sorted(repo.files)]}, body, repo.commit)

    def _tree(self, repo_id: str, revision: str, under: str, body: bool) -> None:
        repo = self._repo(repo_id, revision, body)
        if repo is None:
            return
        entries = []
        for p in sorted(repo.files):
            if under and not p.startswith(under.rstrip("/") + "/"):
                continue
            f = repo.files[p]
            entry = {"type": "file", "path": p, "size": f.size, "oid": f.git_sha1}
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
            entries.append(entry)
        self._json(entries, body, repo.commit)

    def _file(self, repo_id: str, revision: str, path: str, body: bool) -> None:
        repo = self._repo(repo_id, revision, body)
        if repo is None:
            return
        f = repo.files.get(path)
        if f is None:
            self._error(404, "EntryNotFound", f"{path} does not exist on {revision}", body, repo.commit)
            return
        start, end, status = 0, f.size - 1, 200
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes=") and f.size:
            first, _, last = ranged[len("bytes="):].partition("-")
            start, end, status = int(first or 0), int(last) if last else f.size - 1, 206
        headers = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if f.lfs:
            headers.update({"X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": str(f.size), "ETag": f'"{f.sha256}"'})
        else:
            headers["ETag"] = f'"{f.git_sha1}"'
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{end}/{f.size}"
        self._send(status, headers, f.read(start, end) if body else b"", length=end - start + 1)

    # ------------------------------------------------------------------ responses
    def _json(self, data, body: bool, commit: Optional[str] = None) -> None:
        raw = json.dumps(data).encode()
        headers = {"Content-Type": "application/json"}
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send(200, headers, raw if body else b"", length=len(raw))

    def _error(self, status: int, code: Optional[str], message: str, body: bool, commit: Optional[str] = None) -> None:
        raw = json.dumps({"error": message}).encode()
        headers = {"Content-Type": "application/json", "X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        if commit:
            headers["X-Repo-Commit"] = commit
        self._send(status, headers, raw if body else b"", length=len(raw))

    def _send(self, status: int, headers: Dict[str, str], payload: bytes, length: int) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if payload:
            self.wfile.write(payload)
