"""Local git repositories for MonoRepo tests: bare remotes made in a temp dir, never the
network. Every call is the real git CLI (through repos/git.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml
from infer_forge.repos.git import git, out


def make_remote(base: Path, name: str, files: dict[str, str | bytes],
                branches: dict[str, dict[str, str | bytes]] | None = None) -> Path:
    """A bare repository `base/remotes/<name>.git` whose `main` holds `files`; each entry of
    `branches` adds a branch from main with those files changed."""
    bare = base / "remotes" / f"{name}.git"
    work = base / "seed" / name
    work.mkdir(parents=True)
    git(["init", "-q", "-b", "main"], work)
    _write(work, files)
    git(["add", "-A"], work)
    git(["commit", "-q", "-m", f"{name}: initial"], work)
    for br, changes in (branches or {}).items():
        git(["checkout", "-q", "-b", br, "main"], work)
        _write(work, changes)
        git(["add", "-A"], work)
        git(["commit", "-q", "-m", f"{name}: {br}"], work)
        git(["checkout", "-q", "main"], work)
    bare.parent.mkdir(parents=True, exist_ok=True)
    git(["clone", "-q", "--bare", str(work), str(bare)], base)
    return bare


def _write(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)


def write_manifest(path: Path, members: list[dict[str, Any]], name: str = "test-stack") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"name": name, "members": members}, sort_keys=False))
    return path


def alpha_monorepo(tmp_path: Path, ws: Any, files: dict[str, str | bytes]) -> Any:
    """A MonoRepo of one member, `alpha` (branch main), cloned from a bare remote at
    `tmp_path/remotes/alpha.git` holding `files`; the opened MonoRepo."""
    from infer_forge.repos import commands as C

    make_remote(tmp_path, "alpha", files)
    C.init(ws, write_manifest(tmp_path / "manifests" / "stack.yaml", [
        {"name": "alpha", "url": "../remotes/alpha.git", "branch": "main"}]))
    return C.open_monorepo(ws)


def tree_digest(root: Path) -> dict[str, str]:
    """path -> sha256 (and mode) of every file under `root`, .git excluded: byte-exact trees."""
    outd: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        if ".git" in p.relative_to(root).parts:
            continue
        if p.is_symlink():
            outd[str(p.relative_to(root))] = "link:" + str(p.readlink())
        elif p.is_file():
            mode = "x" if p.stat().st_mode & 0o111 else "-"
            outd[str(p.relative_to(root))] = mode + hashlib.sha256(p.read_bytes()).hexdigest()
    return outd


def head(repo: Path) -> str:
    return out(["rev-parse", "HEAD"], repo)
