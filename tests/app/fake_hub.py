"""A stand-in for the Hugging Face Hub on 127.0.0.1, answering what huggingface_hub and app.downloader ask:

- ``GET /api/models?search=&filter=&pipeline_tag=...``: a model list
- ``GET /api/models/{repo}[/revision/{rev}]``: model info with siblings (size, blobId, lfs sha256)
- ``HEAD|GET /{repo}/resolve/{rev}/{path}``: small files answer 200 with ETag (git blob id), X-Repo-Commit and
  Content-Length; LFS files (weights) answer 302 to a second origin (the "CDN") with X-Linked-Etag (sha256),
  X-Linked-Size and X-Repo-Commit, as the Hub does
- ``HEAD|GET /cdn/{sha256}`` on the CDN origin: the bytes, with Range support (206)

Knobs for tests: ``rate`` (bytes per second the CDN sends; 0 = unthrottled), ``corrupt`` (set of paths
whose served bytes have one byte flipped), ``requests`` (every request seen: method, path, Range header).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self, repos: dict[str, Path], extra_info: dict[str, dict] | None = None):
        """``repos``: repo id -> a local folder whose files the repo holds; ``extra_info``: repo id -> more
        model-info fields (e.g. ``{"safetensors": {"parameters": {...}, "total": n}}``)."""
        self.extra_info = extra_info or {}
        self.repos: dict[str, dict[str, bytes]] = {}
        for repo_id, folder in repos.items():
            self.repos[repo_id] = {p.relative_to(folder).as_posix(): p.read_bytes()
                                   for p in sorted(folder.rglob("*")) if p.is_file()}
        self.by_sha: dict[str, tuple[str, str]] = {}
        for repo_id, files in self.repos.items():
            for path, data in files.items():
                if path.endswith(LFS_SUFFIXES):
                    self.by_sha[hashlib.sha256(data).hexdigest()] = (repo_id, path)
        self.rate = 0
        self.corrupt: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        self.hub = self._server(_HubHandler)
        self.cdn = self._server(_CdnHandler)

    def _server(self, handler) -> ThreadingHTTPServer:
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        srv.fake = self  # type: ignore[attr-defined]
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.hub.server_address[1]}"

    @property
    def cdn_url(self) -> str:
        return f"http://127.0.0.1:{self.cdn.server_address[1]}"

    def close(self) -> None:
        for srv in (self.hub, self.cdn):
            srv.shutdown()
            srv.server_close()

    def served_bytes(self, repo_id: str, path: str) -> bytes:
        data = self.repos[repo_id][path]
        if path in self.corrupt:
            i = len(data) // 2
            data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
        return data

    def model_info(self, repo_id: str) -> dict:
        files = self.repos[repo_id]
        siblings = []
        for path, data in files.items():
            s = {"rfilename": path, "size": len(data), "blobId": git_blob_id(data)}
            if path.endswith(LFS_SUFFIXES):
                s["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
            siblings.append(s)
        config = json.loads(files["config.json"]) if "config.json" in files else {}
        tags = ["text-generation", "safetensors" if any(p.endswith(".safetensors") for p in files) else "gguf"]
        return {"id": repo_id, "modelId": repo_id, "sha": COMMIT, "private": False, "gated": False,
                "downloads": 1234, "likes": 5, "tags": tags, "pipeline_tag": "text-generation",
                "lastModified": "2026-01-01T00:00:00.000Z", "siblings": siblings, "config": config,
                **self.extra_info.get(repo_id, {})}


class _Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    @property
    def fake(self) -> FakeHub:
        return self.server.fake  # type: ignore[attr-defined]

    def _record(self) -> None:
        with self.fake.lock:
            self.fake.requests.append((self.command, self.path, self.headers.get("Range")))

    def _json(self, obj, status: int = 200) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, code: str = "EntryNotFound") -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


class _HubHandler(_Base):
    def do_GET(self) -> None:
        self._route()

    def do_HEAD(self) -> None:
        self._route()

    def _route(self) -> None:
        self._record()
        url = urlsplit(self.path)
        path = unquote(url.path)
        if path == "/api/models":
            q = parse_qs(url.query)
            search = (q.get("search") or [""])[0].lower()
            wanted = set(q.get("filter") or [])
            out = [self.fake.model_info(r) for r in self.fake.repos if search in r.lower()]
            out = [m for m in out if wanted <= set(m["tags"])]
            self._json([{k: m[k] for k in ("id", "downloads", "likes", "tags", "lastModified", "gated")}
                        for m in out])
            return
        if path.startswith("/api/models/"):
            rest = path.removeprefix("/api/models/")
            repo_id = "/".join(rest.split("/")[:2])
            if repo_id not in self.fake.repos:
                self._error(404, "Repository not found", "RepoNotFound")
                return
            self._json(self.fake.model_info(repo_id))
            return
        parts = path.strip("/").split("/")
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id = "/".join(parts[:2])
            file_path = "/".join(parts[4:])
            files = self.fake.repos.get(repo_id)
            if files is None:
                self._error(404, "Repository not found", "RepoNotFound")
                return
            if file_path not in files:
                self._error(404, "Entry not found", "EntryNotFound")
                return
            data = files[file_path]
            if file_path.endswith(LFS_SUFFIXES):
                sha = hashlib.sha256(data).hexdigest()
                self.send_response(302)
                self.send_header("Location", f"{self.fake.cdn_url}/cdn/{sha}?sig=abc")
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("ETag", f'"{git_blob_id(data)}"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = self.fake.served_bytes(repo_id, file_path)
            self.send_response(200)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("ETag", f'"{git_blob_id(data)}"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command == "GET":
                self.wfile.write(body)
            return
        self._error(404, "Not found")


class _CdnHandler(_Base):
    def do_GET(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def _serve(self) -> None:
        self._record()
        sha = urlsplit(self.path).path.rsplit("/", 1)[-1]
        if sha not in self.fake.by_sha:
            self._error(404, "Not found")
            return
        repo_id, file_path = self.fake.by_sha[sha]
        data = self.fake.served_bytes(repo_id, file_path)
        start = 0
        rng = self.headers.get("Range")
        if rng and rng.startswith("bytes="):
            start = int(rng.removeprefix("bytes=").split("-")[0])
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        self.send_header("ETag", f'"{sha}"')
        self.end_headers()
        if self.command == "HEAD":
            return
        view = memoryview(data)[start:]
        step = 64 * 1024
        try:
            for i in range(0, len(view), step):
                self.wfile.write(view[i:i + step])
                if self.fake.rate:
                    time.sleep(step / self.fake.rate)
        except (BrokenPipeError, ConnectionResetError):
            pass
