"""The MonoRepo root: a git repository whose members are git submodules (repos/manifest.py).

`init_root(manifest, root)` creates the root, or adopts an existing git repository (members
it already has are checked against the manifest, missing ones are added), and commits the
manifest's copy (`forge-repos.yaml`) with `.gitmodules`. A root created here that fails
half-way is removed again: nothing half-made is left behind.

`MonoRepo.open(root)` reads the root back from its own manifest copy.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .errors import RepoError
from .git import Tree, git, is_repo
from .manifest import MANIFEST_NAME, Manifest, Member, load_manifest

ROOT_NAME = "."  # a snapshot's name for the root itself


@dataclass(frozen=True)
class MonoRepo:
    root: Path
    manifest: Manifest

    @classmethod
    def open(cls, root: str | Path) -> MonoRepo:
        r = Path(root).resolve()
        if not (r / MANIFEST_NAME).is_file() or not _is_root(r):
            raise RepoError(f"no MonoRepo at {r}: run `forge repos init MANIFEST.yaml`")
        return cls(r, _manifest_at(r / MANIFEST_NAME))

    def member(self, name: str) -> Member:
        return self.manifest.member(name)

    def member_dir(self, name: str) -> Path:
        return self.root / self.member(name).rel_path

    def repos(self) -> list[tuple[str, str, Path]]:
        """(name, path relative to the root, directory) of the root and every member."""
        return [(ROOT_NAME, ".", self.root)] + [
            (m.name, m.rel_path, self.root / m.rel_path) for m in self.manifest.members]


def _is_root(root: Path) -> bool:
    """`is_repo(root)` (a git run), asked again only when its `.git` changed."""
    try:
        st = (root / ".git").stat()
    except OSError:
        return False
    return _is_repo_at(str(root), st.st_mtime_ns, st.st_ino)


@lru_cache(maxsize=16)
def _is_repo_at(root: str, _mtime_ns: int, _ino: int) -> bool:
    return is_repo(root)


def _manifest_at(path: Path) -> Manifest:
    """The root's manifest, read again only when the file changed (a loop opens the
    MonoRepo many times a block; the manifest is frozen, so sharing it is safe)."""
    st = path.stat()
    return _read_manifest(str(path), st.st_mtime_ns, st.st_size, st.st_ino)


@lru_cache(maxsize=16)
def _read_manifest(path: str, _mtime_ns: int, _size: int, _ino: int) -> Manifest:
    return load_manifest(path, resolve_urls=False)


def _submodules(root: Path) -> dict[str, str]:
    """path -> url of the root's registered submodules (.gitmodules)."""
    if not (root / ".gitmodules").is_file():
        return {}
    p = git(["config", "-f", ".gitmodules", "--get-regexp", r"^submodule\..*\.(path|url)$"],
            root, check=False)
    keys: dict[str, dict[str, str]] = {}
    for line in p.stdout.decode().splitlines():
        k, _, v = line.partition(" ")
        name, _, attr = k[len("submodule."):].rpartition(".")
        keys.setdefault(name, {})[attr] = v
    return {d["path"]: d.get("url", "") for d in keys.values() if "path" in d}


def init_root(manifest_path: str | Path, root: str | Path,
              progress: Callable[[str], None] | None = None) -> tuple[MonoRepo, bool]:
    """Create (or adopt) the root at `root` from the manifest; (MonoRepo, adopted)."""
    say = progress or (lambda _s: None)
    man = load_manifest(manifest_path)
    r = Path(root).resolve()
    adopted = is_repo(r)
    created = not r.exists()
    if r.exists() and not adopted and any(r.iterdir()):
        raise RepoError(f"{r} exists, is not empty and is not a git repository: "
                        "give an empty or new directory, or an existing git repository")
    try:
        r.mkdir(parents=True, exist_ok=True)
        if not adopted:
            git(["init", "-q", "-b", "main"], r)
        subs = _submodules(r)
        for m in man.members:
            if m.rel_path in subs:
                if subs[m.rel_path] != m.url:
                    raise RepoError(f"member {m.name}: {m.rel_path} is already a submodule of "
                                    f"{subs[m.rel_path]}, not {m.url}")
                say(f"member {m.name}: adopted at {m.rel_path}")
                continue
            if (r / m.rel_path).exists() and any((r / m.rel_path).iterdir()):
                raise RepoError(f"member {m.name}: {r / m.rel_path} exists and is not a "
                                "submodule of the root")
            say(f"member {m.name}: adding {m.url} ({m.branch}) at {m.rel_path}")
            git(["submodule", "add", "-q", "-b", m.branch, "--", m.url, m.rel_path], r)
        (r / MANIFEST_NAME).write_text(_dump(man), encoding="utf-8")
        git(["add", "--", MANIFEST_NAME] + ([".gitmodules"] if man.members else []), r)
        if git(["diff", "--cached", "--quiet"], r, check=False).returncode != 0:
            git(["commit", "-q", "--no-verify", "-m",
                 f"forge: MonoRepo {man.name} ({len(man.members)} members)"], r)
    except BaseException:
        if created:  # nothing half-made: a root this call created goes again
            shutil.rmtree(r, ignore_errors=True)
        raise
    return MonoRepo(r, man), adopted


def _dump(man: Manifest) -> str:
    import yaml

    data = man.model_dump(mode="json", exclude_none=True)
    return ("# Written by `forge repos init` from the manifest given (URLs resolved).\n"
            + yaml.safe_dump(data, sort_keys=False))


def current_branch(repo: Path) -> str | None:
    p = git(["symbolic-ref", "--quiet", "--short", "HEAD"], repo, check=False)
    return p.stdout.decode().strip() or None if p.returncode == 0 else None


def origin_url(repo: Path | Tree) -> str | None:
    p = git(["config", "--get", "remote.origin.url"], repo, check=False)
    return p.stdout.decode().strip() or None


def head_commit(repo: Path) -> str | None:
    p = git(["rev-parse", "--verify", "--quiet", "HEAD"], repo, check=False)
    return p.stdout.decode().strip() or None if p.returncode == 0 else None

