"""Weights referenced where they lie, never copied: a snapshot in the shared Hugging Face
cache, or a local directory.

Contracts:
- Hub (`org/model[@revision]`, revision default `main`): resolved by the real
  `huggingface_hub.snapshot_download` in the cache `hub_cache_dir()` names (HF_HUB_CACHE,
  else HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub, else
  ~/.cache/huggingface/hub; read at each call, as the library reads them at its import).
  The cache is asked first (`local_files_only`); the hub (HF_ENDPOINT) only when the
  snapshot, or a file an allow-pattern asks for, is not there, and never under
  HF_HUB_OFFLINE. The reference is the cache's own `snapshots/<commit>` directory; a branch
  or tag is resolved to that 40-hex commit (what the cache's `refs/<revision>` names) and
  both are recorded.
- Per-file digests are the hub's own hashes, read from the cache's blob names (a snapshot
  file links to `blobs/<etag>`): for LFS files the sha256 of the content (64 hex, kind
  `sha256`), for regular files the git blob sha1 (40 hex, kind `git-blob-sha1`). Nothing is
  read, except with `verify` (every blob re-hashed against its name) or where the cache
  holds copies instead of links (sha256 computed, `computed: true`).
- Path (`path:/abs/dir`, or an absolute directory): referenced in place. Digest kind
  `listing`: each file's (size, mtime_ns), no bytes read; with `verify`, kind `sha256`: each
  file hashed.
- The record (`reference_hub`, `reference_path`) is a small JSON file in
  `FORGE_HOME/models/` (`ref_file`; `write_ref` replaces it atomically) and the `recipe` of
  the `ModelPulled` event; `find_hub_ref` reads it back for `weights.model_path`.
- Errors are one-line HarnessErrors naming the repo and revision, or the path.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ...ledger.atomic import write_atomic
from ...ledger.clock import digest as canonical_digest
from ..errors import HarnessError

REF_SUFFIX = ".ref.json"
DEFAULT_REVISION = "main"
COMMIT = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
TRUE = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's ENV_VARS_TRUE_VALUES


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def git_blob_sha1(path: Path) -> str:
    """The git object id of a file's content (`git hash-object`): the hub's etag of a
    regular (non-LFS) file."""
    h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)  # noqa: S324 - git's id, not security
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --- where ------------------------------------------------------------------------------


def hub_cache_dir() -> Path:
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(
        env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface")
    raw = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(
        os.path.expandvars(os.path.expanduser(home)), "hub")
    return Path(os.path.expandvars(os.path.expanduser(raw))).resolve()


def _offline() -> bool:
    env = os.environ
    return (env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE") or "").upper() in TRUE


def ref_file(home: Path, kind: str, ident: str, revision: str | None = None) -> Path:
    """`models/org--model@<revision>.ref.json` (hub), `models/path-<sha256 of the path,
    16 hex>.ref.json` (a directory)."""
    root = Path(home) / "models"
    if kind == "hub":
        rev = quote(revision or DEFAULT_REVISION, safe="")
        return root / f"{ident.replace('/', '--')}@{rev}{REF_SUFFIX}"
    return root / f"path-{hashlib.sha256(ident.encode()).hexdigest()[:16]}{REF_SUFFIX}"


def write_ref(home: Path, record: dict[str, Any]) -> Path:
    path = ref_file(home, record["kind"], record["name"], record.get("revision"))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(record, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return path


def reference(home: Path, kind: str, ident: str, revision: str | None, *,
              allow_patterns: list[str] | None = None, verify: bool = False,
              refresh: bool = False) -> tuple[dict[str, Any], bool]:
    """Reference a hub snapshot (`kind` "hub") or a directory ("path") and write its record:
    (record, reused: the record there had the same digest)."""
    record = (reference_hub(ident, revision, allow_patterns=allow_patterns, verify=verify,
                            refresh=refresh) if kind == "hub"
              else reference_path(Path(ident), verify=verify))
    ref = ref_file(home, kind, ident, record.get("revision"))
    prior = read_ref(ref) if ref.is_file() else None
    write_ref(home, record)
    return record, prior is not None and prior.get("digest") == record["digest"]


def read_ref(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise HarnessError(f"{path}: unreadable weights reference: {e}") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str)
                                             for k in ("kind", "name", "path", "digest")):
        raise HarnessError(f"{path}: malformed weights reference (needs kind, name, path, "
                           "digest)")
    return data


def find_hub_ref(home: Path, repo_id: str, revision: str | None) -> dict[str, Any] | None:
    """The recorded reference of `repo_id` at `revision` (by name, or a reference whose
    commit is that revision), or None."""
    path = ref_file(home, "hub", repo_id, revision)
    if path.is_file():
        return read_ref(path)
    if revision and COMMIT.fullmatch(revision):
        for other in sorted(path.parent.glob(f"{repo_id.replace('/', '--')}@*{REF_SUFFIX}")):
            rec = read_ref(other)
            if rec.get("commit") == revision:
                return rec
    return None


def list_refs(home: Path) -> list[dict[str, Any]]:
    root = Path(home) / "models"
    return [read_ref(p) for p in sorted(root.glob(f"*{REF_SUFFIX}"))] if root.is_dir() else []


# --- a snapshot in the Hugging Face cache ------------------------------------------------


def reference_hub(repo_id: str, revision: str | None, *, allow_patterns: list[str] | None = None,
                  verify: bool = False, refresh: bool = False) -> dict[str, Any]:
    """The record of `repo_id@revision` as a snapshot of the shared cache (see the module);
    `refresh` asks the hub even when the cache has it (a branch that moved)."""
    rev = revision or DEFAULT_REVISION
    cache = hub_cache_dir()
    snap, network = _snapshot(repo_id, rev, cache, allow_patterns, refresh)
    commit = snap.name
    if not COMMIT.fullmatch(commit) or snap.parent.name != "snapshots":
        raise HarnessError(f"model {repo_id}@{rev}: {snap} is not a snapshot of the Hugging "
                           "Face cache (snapshots/<commit>)")
    files = _hub_files(snap, allow_patterns, verify, f"model {repo_id}@{rev}")
    ref = snap.parent.parent / "refs" / rev
    return {
        "kind": "hub", "name": repo_id, "repo_id": repo_id, "revision": rev, "commit": commit,
        "ref": ref.read_text(encoding="utf-8").strip() if ref.is_file() else None,
        "path": str(snap), "cache_dir": str(cache), "allow_patterns": allow_patterns,
        "network": network, "digest_kind": "hub", "verified": verify, "files": files,
        "digest": canonical_digest(sorted([rel, f["kind"], f["hash"]]
                                          for rel, f in files.items())),
    }


def _snapshot(repo_id: str, rev: str, cache: Path, patterns: list[str] | None,
              refresh: bool) -> tuple[Path, bool]:
    """(snapshot directory, whether the hub was asked)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:  # pragma: no cover - a dependency of transformers
        raise HarnessError(f"model {repo_id}@{rev}: huggingface_hub is missing ({e})") from None
    why = f"--refresh asks the hub for {rev}"
    try:
        if refresh:
            raise _Refresh
        local = Path(snapshot_download(repo_id, revision=rev, cache_dir=str(cache),
                                       local_files_only=True, allow_patterns=patterns))
        if _matching(local, patterns):
            return local, False
        why = (f"the cached snapshot of {rev} lacks files asked for (no file matching "
               f"{', '.join(patterns or [])} in {local})")
    except _Refresh:
        pass
    except Exception as e:
        names = {type(x).__name__ for x in _chain(e)}
        if not names & {"LocalEntryNotFoundError", "IncompleteSnapshotError", "EntryNotFoundError"}:
            raise HarnessError(f"model {repo_id}@{rev}: {_detail(e)}") from None
        why = (f"the cached snapshot of {rev} lacks files asked for ({_detail(e)})"
               if "IncompleteSnapshotError" in names
               else f"revision {rev} is not in the Hugging Face cache {cache}")
    if _offline():
        raise HarnessError(f"cannot download {repo_id}: no network access to the model hub "
                           f"(HF_HUB_OFFLINE) and {why}")
    try:
        got = snapshot_download(repo_id, revision=rev, cache_dir=str(cache),
                                allow_patterns=patterns,
                                endpoint=os.environ.get("HF_ENDPOINT") or None)
    except Exception as e:
        raise HarnessError(_hub_error(repo_id, rev, why, e)) from None
    return Path(got), True


class _Refresh(Exception):
    """The cache is not asked first."""


def _walk(root: Path) -> list[str]:
    """Files (and links to files) under root, posix relative paths, sorted; caches skipped."""
    out: list[str] = []
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != ".cache")
        base = Path(d)
        out += [(base / n).relative_to(root).as_posix() for n in names]
    return sorted(out)


def _matching(snap: Path, patterns: list[str] | None) -> list[str]:
    from huggingface_hub.utils import filter_repo_objects

    return list(filter_repo_objects(_walk(snap), allow_patterns=patterns))


def _hub_files(snap: Path, patterns: list[str] | None, verify: bool, what: str
               ) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for rel in _matching(snap, patterns):
        f = snap / rel
        blob = Path(os.path.realpath(f))
        if not blob.is_file():
            raise HarnessError(f"{what}: {rel} links to a missing blob {blob} (an interrupted "
                               "download: pull again with network)")
        name, size = blob.name, blob.stat().st_size
        entry: dict[str, Any]
        if f.is_symlink() and SHA256.fullmatch(name):
            entry = {"kind": "sha256", "hash": name, "size": size}
            actual = sha256_file(blob) if verify else name
        elif f.is_symlink() and COMMIT.fullmatch(name):
            entry = {"kind": "git-blob-sha1", "hash": name, "size": size}
            actual = git_blob_sha1(blob) if verify else name
        else:  # a cache of copies (no links): the content itself is hashed
            actual = sha256_file(blob)
            entry = {"kind": "sha256", "hash": actual, "size": size, "computed": True}
        if actual != entry["hash"]:
            raise HarnessError(f"{what}: {rel}: blob {name} holds other content "
                               f"({entry['kind']} {actual})")
        out[rel] = entry
    return out


def _detail(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:200]


def _hub_error(repo_id: str, rev: str, why: str, e: Exception) -> str:
    names = {type(x).__name__ for x in _chain(e)}
    offline = names & {"LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectionError",
                       "ConnectError", "ConnectTimeout", "Timeout", "ReadTimeout",
                       "NewConnectionError", "MaxRetryError", "NameResolutionError", "gaierror"}
    if offline:
        return (f"cannot download {repo_id}: no network access to the model hub and {why} "
                f"(set HF_ENDPOINT to a reachable mirror, or use a local model directory; "
                f"{_detail(e)})")
    if "RepositoryNotFoundError" in names or "RevisionNotFoundError" in names:
        return f"cannot download {repo_id}@{rev}: not found on the hub ({_detail(e)})"
    if "GatedRepoError" in names:
        return f"cannot download {repo_id}: gated repository, set HF_TOKEN ({_detail(e)})"
    return f"cannot download {repo_id}@{rev}: {_detail(e)}"


def _chain(e: BaseException) -> Iterator[BaseException]:
    seen = set()
    link: BaseException | None = e
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


# --- a local directory ------------------------------------------------------------------


def reference_path(path: Path, *, verify: bool = False) -> dict[str, Any]:
    """The record of a model directory referenced in place (see the module)."""
    if not path.is_absolute():
        raise HarnessError(f"model path {path}: give an absolute path")
    if not (path / "config.json").is_file():
        raise HarnessError(f"{path}: not a model directory (no config.json)")
    files: dict[str, dict[str, Any]] = {}
    for rel in _walk(path):
        st = (path / rel).stat()
        files[rel] = ({"kind": "sha256", "hash": sha256_file(path / rel), "size": st.st_size}
                      if verify else {"size": st.st_size, "mtime_ns": st.st_mtime_ns})
    rows = (sorted([rel, f["kind"], f["hash"]] for rel, f in files.items()) if verify else
            sorted([rel, f["size"], f["mtime_ns"]] for rel, f in files.items()))
    return {"kind": "path", "name": str(path), "path": str(path),
            "digest_kind": "sha256" if verify else "listing", "files": files,
            "digest": canonical_digest(rows)}
