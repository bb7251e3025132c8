"""A Hugging Face Hub on 127.0.0.1 for the tests (no hub is reachable here): the routes the
real `huggingface_hub` client asks for a snapshot, so that the real library writes a real
cache (blobs, snapshot links, refs) the way it does from huggingface.co.

Served: `GET /api/models/<repo>/revision/<rev>` (the commit a branch, tag or commit names;
404 `RevisionNotFound` otherwise), `GET /api/models/<repo>/tree/<commit>` (each file's git
blob id, and for an LFS file its sha256 and size), `HEAD|GET /<repo>/resolve/<rev>/<path>`
(`X-Repo-Commit`, the `ETag`: the git blob sha1 of a regular file, `X-Linked-Etag` /
`X-Linked-Size` the sha256 and size of an LFS file, as the hub answers). `requests` counts
what was asked, so a test can tell whether the hub was used at all.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324


def lfs_pointer(data: bytes) -> bytes:
    return (f"version https://git-lfs.github.com/spec/v1\noid sha256:"
            f"{hashlib.sha256(data).hexdigest()}\nsize {len(data)}\n").encode()


@dataclass
class Repo:
    """files per commit: {path: (content, is_lfs)}; refs: {branch or tag: commit}."""

    commits: dict[str, dict[str, tuple[bytes, bool]]]
    refs: dict[str, str]

    def commit_of(self, rev: str) -> str | None:
        return rev if rev in self.commits else self.refs.get(rev)


@dataclass
class FakeHub:
    repos: dict[str, Repo]
    requests: list[str] = field(default_factory=list)
    url: str = ""

    def __enter__(self) -> FakeHub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_HEAD(self):
                self._answer(body=False)

            def do_GET(self):
                self._answer(body=True)

            def _send(self, code, payload=b"", headers=(), body=True, ctype="application/json"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(payload)))
                for k, v in headers:
                    self.send_header(k, v)
                self.end_headers()
                if body:
                    self.wfile.write(payload)

            def _answer(self, body: bool):
                path = unquote(urlsplit(self.path).path)
                hub.requests.append(f"{self.command} {path}")
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) >= 6:
                    repo_id, kind, rev = "/".join(parts[2:4]), parts[4], "/".join(parts[5:])
                    return self._api(repo_id, kind, rev, body)
                if len(parts) >= 5 and parts[2] == "resolve":
                    return self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]), body)
                self._send(404, b"{}", body=body)

            def _missing(self, what: str, code: str, body: bool):
                self._send(404, json.dumps({"error": what}).encode(),
                           [("X-Error-Code", code), ("X-Error-Message", what)], body)

            def _api(self, repo_id, kind, rev, body):
                repo = hub.repos.get(repo_id)
                if repo is None:
                    return self._missing("Repository not found", "RepoNotFound", body)
                commit = repo.commit_of(rev)
                if commit is None:
                    return self._missing(f"Invalid rev id: {rev}", "RevisionNotFound", body)
                files = repo.commits[commit]
                if kind == "revision":
                    data = {"id": repo_id, "sha": commit,
                            "siblings": [{"rfilename": p} for p in sorted(files)]}
                else:  # tree
                    data = [_tree_entry(p, c, lfs) for p, (c, lfs) in sorted(files.items())]
                self._send(200, json.dumps(data).encode(), body=body)

            def _resolve(self, repo_id, rev, path, body):
                repo = hub.repos.get(repo_id)
                commit = repo.commit_of(rev) if repo else None
                if commit is None or path not in repo.commits[commit]:
                    return self._missing("Entry not found", "EntryNotFound", body)
                content, lfs = repo.commits[commit][path]
                headers = [("X-Repo-Commit", commit)]
                if lfs:
                    sha = hashlib.sha256(content).hexdigest()
                    headers += [("ETag", f'"{git_blob_sha1(lfs_pointer(content))}"'),
                                ("X-Linked-Etag", f'"{sha}"'),
                                ("X-Linked-Size", str(len(content)))]
                else:
                    headers.append(("ETag", f'"{git_blob_sha1(content)}"'))
                self._send(200, content, headers, body, ctype="application/octet-stream")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _tree_entry(path: str, content: bytes, lfs: bool) -> dict:
    entry = {"type": "file", "path": path, "size": len(content),
             "oid": git_blob_sha1(lfs_pointer(content) if lfs else content)}
    if lfs:
        entry["lfs"] = {"oid": hashlib.sha256(content).hexdigest(), "size": len(content),
                        "pointerSize": len(lfs_pointer(content))}
    return entry
