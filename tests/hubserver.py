"""A server on 127.0.0.1 that answers as the Hugging Face Hub does for what huggingface_hub's
downloads and file listings ask: ``resolve`` (HEAD and GET, the commit and ETag headers, LFS
files' linked ETag and size, byte ranges), the revision API and ``paths-info``. Repositories
hold files the tests make; a file can be set to break its next transfer part-way."""

from __future__ import annotations

import functools
import hashlib
import json
import mmap
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LFS_MIN = 10_000  # files from this size up are stored as LFS files, as the hub does large ones


def git_sha1(data) -> str:
    digest = hashlib.sha1(b"blob %d\0" % len(data))
    digest.update(data)
    return digest.hexdigest()


class Blob:
    """A file's bytes (given, or a file on disk mapped, never read whole into memory) and its
    digests, each computed once."""

    def __init__(self, data: bytes | Path):
        if isinstance(data, Path):
            with open(data, "rb") as f:
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.data = memoryview(data)
        self.size = len(self.data)
        self.lfs = self.size >= LFS_MIN

    @functools.cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @functools.cached_property
    def git_sha1(self) -> str:
        return git_sha1(self.data)

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_sha1


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # a client that hangs up part-way (a cancelled download) is no error here


class FakeHub:
    def __init__(self) -> None:
        self.commits: dict[tuple[str, str], dict[str, Blob]] = {}  # (repo, commit) -> files
        self.branches: dict[tuple[str, str], str] = {}  # (repo, branch) -> commit
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.break_after: dict[str, int] = {}  # file path -> bytes its next GET sends before closing
        self.gated: dict[str, str] = {}  # repo -> the token it takes (a gated repository's accepted terms)
        self.server = _Server(("127.0.0.1", 0), _handler(self))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def commit(self, repo: str, files: dict[str, bytes | Path], branch: str = "main") -> str:
        """A new commit of ``repo`` holding ``files`` (bytes, or files on disk served from there;
        on top of the branch's), the branch moved to it."""
        parent = self.branches.get((repo, branch))
        tree = dict(self.commits.get((repo, parent), {})) if parent else {}
        tree.update({p: Blob(d) for p, d in files.items()})
        sha = hashlib.sha1(repr((parent, sorted((p, b.etag) for p, b in tree.items()))).encode()).hexdigest()
        self.commits[(repo, sha)] = tree
        self.branches[(repo, branch)] = sha
        return sha

    def entry(self, voice_id: str, repo: str, commit: str, paths: list[str], **fields) -> dict:
        """A catalogue entry for ``paths`` of ``repo`` at ``commit``, digests as the hub reports them."""
        files = []
        for path in paths:
            blob = self.commits[(repo, commit)][path]
            digest = {"sha256": blob.sha256} if blob.lfs else {"git_sha1": blob.git_sha1}
            files.append({"path": path, "size": blob.size, **digest})
        family = voice_id.split(":", 1)[0]
        base = {"language": "en_US", "quality": "medium", "licence": "test voice, MIT"}
        return {"id": voice_id, "family": family, **base, **fields, "repo": repo, "revision": commit, "files": files}

    def resolve(self, repo: str, revision: str) -> str | None:
        if (repo, revision) in self.commits:
            return revision
        return self.branches.get((repo, revision))


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _error(self, status: int, code: str) -> None:
            body = json.dumps({"error": code}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, value) -> None:
            body = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _commit(self, repo: str, revision: str) -> str | None:
            """The commit ``revision`` of ``repo`` names, or None with the hub's error sent."""
            if not any(r == repo for r, _ in hub.commits):
                self._error(404, "RepoNotFound")
                return None
            if repo in hub.gated and self.headers.get("Authorization") != f"Bearer {hub.gated[repo]}":
                self._error(401, "GatedRepo")
                return None
            commit = hub.resolve(repo, revision)
            if commit is None:
                self._error(404, "RevisionNotFound")
            return commit

        def _api(self, kind: str) -> tuple[str, str] | None:
            """/api/models/<repo>/<kind>/<revision>: the repository and commit it names."""
            parts = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).strip("/").split("/")
            if parts[:2] != ["api", "models"] or len(parts) < 6 or parts[4] != kind:
                return None
            repo = "/".join(parts[2:4])
            commit = self._commit(repo, "/".join(parts[5:]))
            return (repo, commit) if commit else ("", "")

        def do_HEAD(self) -> None:
            self._resolve(send_body=False)

        def do_GET(self) -> None:
            found = self._api("revision")
            if found is None:
                self._resolve(send_body=True)
            elif found[1]:
                files = hub.commits[found]
                self._json({"id": found[0], "sha": found[1], "siblings": [{"rfilename": p} for p in sorted(files)]})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            form = urllib.parse.parse_qs(self.rfile.read(length).decode())
            found = self._api("paths-info")
            if found is None:
                self._error(404, "EntryNotFound")
                return
            if not found[1]:
                return
            repo, commit = found
            out = []
            for p in form.get("paths", []):
                blob = hub.commits[(repo, commit)].get(p)
                if blob is None:
                    continue
                info = {"type": "file", "path": p, "size": blob.size, "oid": blob.git_sha1}
                if blob.lfs:
                    info["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": 134}
                out.append(info)
            self._json(out)

        def _resolve(self, send_body: bool) -> None:
            path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
            hub.requests.append((self.command, path, self.headers.get("Range")))
            parts = path.strip("/").split("/")
            if len(parts) < 5 or parts[2] != "resolve":
                self._error(404, "EntryNotFound")
                return
            repo = "/".join(parts[:2])
            commit = self._commit(repo, parts[3])
            if commit is None:
                return
            name = "/".join(parts[4:])
            blob = hub.commits[(repo, commit)].get(name)
            if blob is None:
                self._error(404, "EntryNotFound")
                return
            start = 0
            ranged = self.headers.get("Range", "")
            if ranged.startswith("bytes=") and send_body:
                start = int(ranged[len("bytes=") :].split("-")[0])
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", commit)
            self.send_header("ETag", f'"{blob.etag}"')
            if blob.lfs:
                self.send_header("X-Linked-Etag", f'"{blob.etag}"')
                self.send_header("X-Linked-Size", str(blob.size))
            self.send_header("Accept-Ranges", "bytes")
            if start:
                self.send_header("Content-Range", f"bytes {start}-{blob.size - 1}/{blob.size}")
            self.send_header("Content-Length", str(blob.size - start))
            self.end_headers()
            if not send_body:
                return
            body = blob.data[start:]
            cut = hub.break_after.pop(name, None)
            if cut is not None:  # the connection breaks part-way through the file
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

    return Handler
