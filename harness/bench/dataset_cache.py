"""Dataset cache: an accuracy suite's datasets carried to a host without network.

lm_eval loads a task's dataset with `datasets.load_dataset(dataset_path, dataset_name)`,
which on an offline host (`HF_DATASETS_OFFLINE=1`, as accuracy.py sets it) reads the
Hugging Face datasets cache only: `<cache>/<namespace>___<name>/<config>/<version>/<hash>/`
(its Arrow files and `dataset_info.json`; `<hash>` is the hub commit of a hub dataset).
The cache root is `datasets.config.HF_DATASETS_CACHE`: `$HF_DATASETS_CACHE`, else
`$HF_HOME/datasets`, else `~/.cache/huggingface/datasets`.

Contracts:
- `prefetch(suites, out)` loads each suite's lm_eval tasks (a named suite's task,
  `ledger.correctness.SUITES`; a shipped task of `include_path`; else lm_eval's registry; a
  group is all its tasks), which fills the cache
  on a host with network, and writes ONE gzip tarball `out`: `manifest.json` first, then
  each dataset's cache folder under `datasets/<folder relative to the cache root>`. The
  manifest (`FORMAT`) lists per dataset the suite, the lm_eval task, `dataset_path`,
  `dataset_name`, its cache folder, `revision` (the folder's hash), and every file's path,
  byte count and sha256, plus `digest`, the sha256 of those file lines. A task whose dataset
  is not in the cache root (held in memory) is a HarnessError naming it.
- `import_cache(file, cache_dir=None)` checks the whole tarball before writing anything:
  the manifest's format, every file listed present once with its byte count and sha256, no
  member the manifest does not list, no path outside `datasets/` (absolute, `..`, links).
  Any mismatch is a HarnessError, one line naming the file. Then it writes each file into
  the cache root (`cache_dir`, else the datasets cache), atomically; a file already there
  with the same digest is kept, one with other content is refused (naming it) before any
  write. Returns a summary (datasets, files, bytes written, kept, the cache root).
- `read_manifest(file)` returns the manifest (checked) without importing.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import orjson

from ...ledger.correctness import SUITES
from ..errors import HarnessError
from .accuracy import task_config

FORMAT = "forge-dataset-cache/1"
MANIFEST = "manifest.json"
PREFIX = "datasets"
MAX_MANIFEST_BYTES = 16 << 20


def cache_root() -> Path:
    """The datasets cache the environment names (HF_DATASETS_CACHE, HF_HOME, default)."""
    import datasets.config  # type: ignore[import-untyped]

    return Path(datasets.config.HF_DATASETS_CACHE)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def files_digest(files: Iterable[dict[str, Any]]) -> str:
    """sha256 of `path bytes sha256` lines, sorted by path: one dataset's content."""
    lines = sorted(f"{f['path']} {f['bytes']} {f['sha256']}" for f in files)
    return "sha256:" + hashlib.sha256("\n".join(lines).encode()).hexdigest()


def suite_tasks(suite: str, include_path: str | Path | None) -> list[Any]:
    """The lm_eval Task objects of `suite` (datasets loaded: from the network where there
    is one, else from the cache)."""
    try:
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise HarnessError(f"the dataset cache needs lm_eval (pip install "
                           f"'infer-forge[accuracy]'): {e}") from None
    shipped = task_config(suite, include_path) if include_path else None
    manager = TaskManager(include_defaults=shipped is None)
    try:
        loaded = manager.load([shipped or suite])
    except Exception as e:  # lm_eval's and datasets' own errors (unknown task, no network)
        raise HarnessError(f"suite {suite}: {type(e).__name__}: {str(e).splitlines()[0]}"
                           if str(e) else f"suite {suite}: {type(e).__name__}") from None
    tasks = list(loaded["tasks"].values())
    if not tasks:
        raise HarnessError(f"suite {suite}: lm_eval loaded no task")
    return tasks


def task_folders(task: Any, root: Path) -> list[Path]:
    """The cache folders (…/<version>/<hash>) that hold `task`'s dataset splits."""
    ds: Any = getattr(task, "dataset", None)
    splits = ds.values() if hasattr(ds, "values") else [ds] if ds is not None else []
    folders: list[Path] = []
    for split in splits:
        for cf in getattr(split, "cache_files", None) or []:
            d = Path(cf["filename"]).resolve().parent
            if not d.is_relative_to(root.resolve()):
                raise HarnessError(f"task {task.config.task}: its dataset is cached at {d}, "
                                   f"outside the datasets cache {root}")
            if d not in folders:
                folders.append(d)
    if not folders:
        raise HarnessError(f"task {task.config.task}: its dataset is not in the datasets "
                           f"cache {root} (held in memory): nothing to carry")
    return folders


def dataset_entry(suite: str, task: Any, folder: Path, root: Path) -> dict[str, Any]:
    """One manifest entry: where the folder is, what it is, every file's digest."""
    rel = folder.resolve().relative_to(root.resolve())
    files = [{"path": str(PurePosixPath(*rel.parts, *f.relative_to(folder).parts)),
              "bytes": f.stat().st_size, "sha256": _sha256_file(f)}
             for f in sorted(folder.rglob("*")) if f.is_file() and not f.is_symlink()
             and not f.name.endswith(".lock")]
    return {"suite": suite, "task": str(task.config.task),
            "dataset_path": task.config.dataset_path, "dataset_name": task.config.dataset_name,
            "folder": str(PurePosixPath(*rel.parts)), "revision": folder.name,
            "files": files, "digest": files_digest(files)}


def prefetch(suites: Sequence[str], out: str | Path, *,
             include_path: str | Path | None = None) -> dict[str, Any]:
    """Fill the cache with `suites`' datasets and export them as one tarball (contract)."""
    if not suites:
        raise HarnessError("name at least one suite (gsm8k, mmlu_generative, arith, ...)")
    root = cache_root()
    entries: list[dict[str, Any]] = []
    seen: set[str] = set()
    for suite in suites:
        named = SUITES.get(suite)  # a named suite (gsm8k-quick) is its lm_eval task's data
        for task in suite_tasks(named.task if named else suite, include_path):
            for folder in task_folders(task, root):
                e = dataset_entry(suite, task, folder, root)
                if e["folder"] not in seen:  # mmlu's subjects share nothing; gsm8k variants do
                    seen.add(e["folder"])
                    entries.append(e)
    manifest = {"format": FORMAT, "suites": list(suites), "datasets": entries,
                "versions": _versions()}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    os.close(fd)
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            data = orjson.dumps(manifest, option=orjson.OPT_INDENT_2)
            info = tarfile.TarInfo(MANIFEST)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            for e in entries:
                for f in e["files"]:
                    tar.add(root / f["path"], arcname=f"{PREFIX}/{f['path']}",
                            recursive=False)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return {"out": str(out), "cache": str(root), "datasets": len(entries),
            "files": sum(len(e["files"]) for e in entries),
            "bytes": sum(f["bytes"] for e in entries for f in e["files"]),
            "revisions": {e["folder"]: e["revision"] for e in entries}}


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("datasets", "lm_eval"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def _safe_rel(name: str, file: Path) -> str:
    """`name` as a path relative to the cache root, or a one-line error."""
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise HarnessError(f"{file}: {name}: not a relative path inside the cache")
    return str(p)


def _manifest(tar: tarfile.TarFile, file: Path) -> dict[str, Any]:
    try:
        m = tar.getmember(MANIFEST)
    except KeyError:
        raise HarnessError(f"{file}: no {MANIFEST} (not a forge dataset cache)") from None
    if not m.isfile() or m.size > MAX_MANIFEST_BYTES:
        raise HarnessError(f"{file}: {MANIFEST}: not a file of at most {MAX_MANIFEST_BYTES} "
                           "bytes")
    fh = tar.extractfile(m)
    assert fh is not None  # a regular file
    try:
        manifest = orjson.loads(fh.read())
    except orjson.JSONDecodeError as e:
        raise HarnessError(f"{file}: {MANIFEST}: not JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else None
        raise HarnessError(f"{file}: {MANIFEST}: format {got!r}, expected {FORMAT}")
    ds = manifest.get("datasets")
    if not isinstance(ds, list) or not all(
            isinstance(x, dict) and isinstance(x.get("files"), list) for x in ds):
        raise HarnessError(f"{file}: {MANIFEST}: datasets: expected a list of entries with "
                           "files")
    for entry in ds:
        for f in entry["files"]:
            if not (isinstance(f, dict) and isinstance(f.get("path"), str)
                    and isinstance(f.get("sha256"), str) and isinstance(f.get("bytes"), int)):
                raise HarnessError(f"{file}: {MANIFEST}: a file entry of {entry.get('folder')} "
                                   "lacks path, bytes or sha256")
            _safe_rel(f["path"], file)
        if entry.get("digest") != files_digest(entry["files"]):
            raise HarnessError(f"{file}: {MANIFEST}: {entry.get('folder')}: digest "
                               f"{entry.get('digest')} does not match its files")
    return manifest


def read_manifest(file: str | Path) -> dict[str, Any]:
    """The tarball's manifest, checked (contract)."""
    file = Path(file)
    try:
        with tarfile.open(file, "r:gz") as tar:
            return _manifest(tar, file)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise HarnessError(f"{file}: not a readable gzip tarball: {e}") from None


def import_cache(file: str | Path, cache_dir: str | Path | None = None) -> dict[str, Any]:
    """Check the tarball whole, then write its datasets into the cache (contract)."""
    file = Path(file)
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    try:
        tar = tarfile.open(file, "r:gz")
    except (tarfile.TarError, OSError, EOFError) as e:
        raise HarnessError(f"{file}: not a readable gzip tarball: {e}") from None
    root.mkdir(parents=True, exist_ok=True)
    # Members are checked into a staging folder on the cache's filesystem (renames there are
    # atomic), so a tarball that fails a check leaves the cache as it was.
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".forge-import-"))
    try:
        with tar:
            manifest = _manifest(tar, file)
            want = {f["path"]: f for e in manifest["datasets"] for f in e["files"]}
            staged = _stage(tar, file, want, staging)
        kept = []
        for rel, f in want.items():
            dest = root / rel
            if dest.is_file():
                if _sha256_file(dest) != f["sha256"]:
                    raise HarnessError(f"{dest}: already in the cache with other content; "
                                       "nothing imported (remove that folder to replace it)")
                kept.append(rel)
        written = 0
        for rel, tmp in staged.items():
            if rel in kept:
                continue
            dest = root / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dest)
            written += want[rel]["bytes"]
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"file": str(file), "cache": str(root), "datasets": len(manifest["datasets"]),
            "files": len(want), "kept": len(kept), "bytes": written,
            "suites": manifest.get("suites", []),
            "revisions": {e.get("folder"): e.get("revision") for e in manifest["datasets"]}}


def _stage(tar: tarfile.TarFile, file: Path, want: dict[str, dict[str, Any]],
           staging: Path) -> dict[str, Path]:
    """Every listed member written into `staging`, its size and sha256 checked; the first
    problem is a HarnessError naming the member."""
    staged: dict[str, Path] = {}
    try:
        for i, m in enumerate(tar):
            if m.name == MANIFEST:
                continue
            head, _, rel = m.name.partition("/")
            if head != PREFIX or not m.isfile():
                raise HarnessError(f"{file}: {m.name}: not a file under {PREFIX}/ (the "
                                   "manifest lists only those)")
            rel = _safe_rel(rel, file)
            if rel not in want:
                raise HarnessError(f"{file}: {m.name}: not listed in {MANIFEST}")
            if rel in staged:
                raise HarnessError(f"{file}: {m.name}: present twice")
            f = want[rel]
            if m.size != f["bytes"]:  # checked before reading: no unbounded member is staged
                raise HarnessError(f"{file}: {m.name}: {m.size} bytes, the manifest says "
                                   f"{f['bytes']}")
            fh = tar.extractfile(m)
            assert fh is not None  # a regular file
            h, n = hashlib.sha256(), 0
            tmp = staging / str(i)
            with tmp.open("wb") as out:
                while chunk := fh.read(1 << 20):
                    h.update(chunk)
                    n += len(chunk)
                    out.write(chunk)
            if n != f["bytes"] or h.hexdigest() != f["sha256"]:
                raise HarnessError(f"{file}: {m.name}: sha256 {h.hexdigest()[:16]}… ({n} "
                                   f"bytes) does not match the manifest's {f['sha256'][:16]}… "
                                   f"({f['bytes']} bytes)")
            staged[rel] = tmp
    except (tarfile.TarError, OSError, EOFError) as e:
        raise HarnessError(f"{file}: not a readable gzip tarball: {e}") from None
    if missing := sorted(set(want) - set(staged)):
        raise HarnessError(f"{file}: {PREFIX}/{missing[0]}: listed in {MANIFEST} but not in "
                           "the tarball")
    return staged
