"""The git CLI behind one small function: every git call forge makes goes through `git()`.

- Never interactive (`GIT_TERMINAL_PROMPT=0`, no editor, no pager), never the user's global
  hooks or templates for repositories forge creates.
- Local paths may be used as submodule URLs (`protocol.file.allow=always`): tests and the demo
  use local bare repositories as remotes.
- A failure is a `GitError` (a `RepoError`): one line with the command and git's own last
  line of stderr; `check=False` returns the result instead.
- A task's worktree (a `Tree`, where `cwd` is given as one) is ground an agent's calls may have
  written: its `.git` file, its admin directory (HEAD, index, `config.worktree`, `commondir`,
  `gitdir`) and every file in it. Git runs there only with the admin and common directories
  forge knows (`GIT_DIR`, `GIT_COMMON_DIR`, `GIT_WORK_TREE`: the `.git` file and `commondir`
  are never read), without system or global config, with every key through which git runs a
  program overridden (`_TREE_CONFIG`), no transport (a lazy fetch included), no submodule
  recursion, and refused (one line) when the admin directory carries a per-worktree config git
  would read that sets anything else than sparse checkout. The repository's own config is the
  user's (read-only to a sandboxed call): its filters and drivers are the user's.
- `untrusted_state(cwd)`: HEAD, status and the diff's digest of whatever repository `cwd` is
  in, where a call may have made that repository itself (`git init`, a config of its own: a
  recorded call's `repo_digest`). Git runs as in a task's worktree, and besides every filter
  and diff driver the repository's config names is emptied (its names listed first, without
  running anything); a name git could not take back on a command line is refused (None).
- `read_small(path, limit, what)`: a file forge reads whole from ground an agent may have
  written: a regular file opened without following a link, refused past `limit` bytes.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .errors import RepoError

_CONFIG = ("-c", "protocol.file.allow=always", "-c", "core.quotepath=off",
           "-c", "advice.detachedHead=false", "-c", "init.defaultBranch=main")


# Every config key through which git starts a program (or reads one more file), as it may be
# set in a config git reads inside a task's worktree, overridden on the command line (which
# wins over every file). Filters and diff/merge drivers have names of the config's choosing:
# those come only from the repository's own config (the user's), see `_check_admin`.
_TREE_CONFIG = tuple(a for kv in (
    "core.fsmonitor=false", f"core.hooksPath={os.devnull}", "core.untrackedCache=false",
    "core.pager=cat", "core.editor=true", "sequence.editor=true", "core.askPass=true",
    "core.sshCommand=false", "core.gitProxy=false", "credential.helper=",
    "diff.external=false", "diff.ignoreSubmodules=all", "status.submoduleSummary=false",
    "submodule.recurse=false", "fetch.recurseSubmodules=false", "protocol.allow=never",
    "gpg.program=false", "gpg.x509.program=false", "gpg.ssh.program=false",
    "commit.gpgSign=false", "tag.gpgSign=false", "log.showSignature=false",
    "gc.auto=0", "maintenance.auto=false", "core.alternateRefsCommand=false",
    "uploadpack.packObjectsHook=false", "remote.origin.uploadpack=false",
    "remote.origin.receivepack=false", "core.attributesFile=" + os.devnull,
    "protocol.file.allow=never")
    for a in ("-c", kv))
_TREE_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
             "GIT_ATTR_NOSYSTEM": "1", "GIT_NO_LAZY_FETCH": "1", "GIT_NO_REPLACE_OBJECTS": "1",
             "GIT_OPTIONAL_LOCKS": "0"}
# What a per-worktree config may set: sparse checkout only (git writes it there itself).
_SAFE_WORKTREE_KEYS = ("core.sparsecheckout", "core.sparsecheckoutcone", "core.bare",
                       "core.worktree")
SMALL_LIMIT = 64 * 1024  # bytes: a .git file, a gitdir file, a per-worktree config


@dataclass(frozen=True)
class Tree:
    """A linked worktree forge made: its work tree, its admin directory
    (`<common>/worktrees/<name>`) and the repository's common git directory, all three as
    forge knows them (repos/worktrees.py `locate`), never as the worktree's files say."""

    work: Path
    admin: Path
    common: Path

    def __str__(self) -> str:
        return str(self.work)


def read_small(path: Path, limit: int = SMALL_LIMIT, what: str = "file") -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes opened without following
    a link (and without blocking on a FIFO); RepoError naming the file otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise RepoError(f"{what} {path}: cannot open it ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RepoError(f"{what} {path}: not a regular file")
        if st.st_size > limit:
            raise RepoError(f"{what} {path}: {st.st_size} bytes, over the limit of {limit}")
        data = os.read(fd, limit + 1)
        if len(data) > limit:
            raise RepoError(f"{what} {path}: over the limit of {limit} bytes")
        return data
    finally:
        os.close(fd)


_DRIVER = re.compile(r"^(filter|diff|merge)\.(.+)\.([a-z]+)$", re.IGNORECASE)
_DRIVER_KEYS = {"filter": ("clean", "smudge", "process"), "diff": ("textconv", "command"),
                "merge": ("driver",)}


def _hostile(args: Sequence[str], cwd: Path, overrides: Sequence[str] = (),
             timeout: float = 20) -> subprocess.CompletedProcess[bytes] | None:
    env = _env(_TREE_ENV)
    argv = ["git", *_CONFIG, *_TREE_CONFIG, *overrides, *args]
    try:
        return subprocess.run(argv, cwd=cwd, capture_output=True, env=env, timeout=timeout,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def untrusted_state(cwd: str | Path) -> dict[str, str] | None:
    """{"head", "status", "diff": sha256 of the diff against HEAD} of the repository `cwd`
    is in, git run as the module contract says for a repository a call may have made; None
    when `cwd` is in none (or git cannot tell safely)."""
    where = Path(cwd)
    head = _hostile(["rev-parse", "HEAD"], where, timeout=10)
    if head is None or head.returncode != 0:
        return None
    names = _hostile(["config", "--list", "--name-only", "-z"], where, timeout=10)
    if names is None or names.returncode != 0:
        return None
    overrides: list[str] = []
    for raw in names.stdout.split(b"\0"):
        m = _DRIVER.match(raw.decode("utf-8", "replace"))
        if m is None:
            continue
        kind, name = m.group(1).lower(), m.group(2)
        if "=" in name or "\n" in name:
            return None  # a name `-c` cannot carry: no git run with it unneutralised
        for key in _DRIVER_KEYS[kind]:
            overrides += ["-c", f"{kind}.{name}.{key}="]
        if kind == "filter":
            overrides += ["-c", f"filter.{name}.required=false"]
    status = _hostile(["status", "--porcelain", "--ignore-submodules=all"], where, overrides)
    diff = _hostile(["diff", "--no-ext-diff", "--no-textconv", "--ignore-submodules=all",
                     "HEAD"], where, overrides)
    if status is None or diff is None:
        return None
    return {"head": head.stdout.decode("utf-8", "replace").strip(),
            "status": status.stdout.decode("utf-8", "replace"),
            "diff": hashlib.sha256(diff.stdout).hexdigest()}


def _check_admin(tree: Tree) -> None:
    """Refuse a per-worktree config git would read (extensions.worktreeConfig) that sets
    more than sparse checkout: the admin directory is writable to a sandboxed call, and a
    filter or driver defined there would run on the next status, add or diff."""
    cfg = tree.admin / "config.worktree"
    if not os.path.lexists(cfg):
        return
    on = git(["config", "--file", str(tree.common / "config"), "--no-includes", "--type=bool",
              "--get", "extensions.worktreeConfig"], None, check=False)
    if on.stdout.decode().strip() != "true":
        return  # git never reads it
    read_small(cfg, what="per-worktree config")  # a regular file of a sane size
    keys = git(["config", "--file", str(cfg), "--no-includes", "--name-only", "--list"],
               None, check=False)
    if keys.returncode != 0:
        raise RepoError(f"per-worktree config {cfg}: git cannot read it; refusing to run git "
                        f"in {tree.work}")
    bad = [k for k in keys.stdout.decode("utf-8", "replace").split()
           if k.lower() not in _SAFE_WORKTREE_KEYS]
    if bad:
        raise RepoError(f"per-worktree config {cfg} sets {bad[0]} (only sparse checkout is "
                        f"allowed there): refusing to run git in {tree.work}")


class GitError(RepoError):
    def __init__(self, argv: Sequence[str], cwd: Path | str | None, code: int, stderr: str):
        last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()),
                    f"exit {code}")
        self.code, self.stderr = code, stderr
        super().__init__(f"git {shlex.join(argv)} (in {cwd}): {last}")


def _env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GIT_") or k in ("GIT_SSH_COMMAND", "GIT_SSH")}
    env.update({"GIT_TERMINAL_PROMPT": "0", "GIT_EDITOR": "true", "GIT_PAGER": "cat",
                "GIT_AUTHOR_NAME": env.get("GIT_AUTHOR_NAME", "forge"),
                "GIT_AUTHOR_EMAIL": env.get("GIT_AUTHOR_EMAIL", "forge@localhost"),
                "GIT_COMMITTER_NAME": env.get("GIT_COMMITTER_NAME", "forge"),
                "GIT_COMMITTER_EMAIL": env.get("GIT_COMMITTER_EMAIL", "forge@localhost"),
                "LC_ALL": "C"})
    env.update(extra or {})
    return env


def git(args: Sequence[str], cwd: str | Path | Tree | None = None, *, check: bool = True,
        input: bytes | None = None, env: Mapping[str, str] | None = None,
        timeout: float | None = 600) -> subprocess.CompletedProcess[bytes]:
    """Run `git ARGS` in `cwd` and return the completed process (bytes out). Raises GitError
    when git exits non-zero and `check` is set, and RepoError when git is missing. A `Tree`
    as `cwd` runs git in that task worktree as the module contract says."""
    argv = ["git", *_CONFIG, *args]
    if isinstance(cwd, Tree):
        _check_admin(cwd)
        argv = ["git", *_CONFIG, *_TREE_CONFIG, *args]
        env = {**(env or {}), **_TREE_ENV, "GIT_DIR": str(cwd.admin),
               "GIT_COMMON_DIR": str(cwd.common), "GIT_WORK_TREE": str(cwd.work)}
        cwd = cwd.work
    try:
        proc = subprocess.run(argv, cwd=cwd, input=input, capture_output=True,
                              env=_env(env), timeout=timeout, check=False)
    except FileNotFoundError:
        raise RepoError("git is not installed (the MonoRepo needs the git CLI)") from None
    except subprocess.TimeoutExpired:
        raise RepoError(f"git {shlex.join(args)} (in {cwd}): timed out after "
                        f"{timeout}s") from None
    if check and proc.returncode != 0:
        raise GitError(list(args), cwd, proc.returncode,
                       proc.stderr.decode("utf-8", "replace"))
    return proc


def out(args: Sequence[str], cwd: str | Path | Tree | None = None, **kw: object) -> str:
    """git's stdout as text, stripped of the trailing newline."""
    return git(args, cwd, **kw).stdout.decode("utf-8", "replace").rstrip("\n")  # type: ignore[arg-type]


def commit_of(rev: str, cwd: str | Path | Tree) -> str | None:
    """The full commit id `rev` names in the repository at `cwd`, or None."""
    p = git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd, check=False)
    return p.stdout.decode().strip() if p.returncode == 0 else None


def commit_or_origin(rev: str, cwd: str | Path | Tree) -> str | None:
    """`commit_of(rev)`, else the commit of the branch `rev` on `origin` (a pushed branch a
    checkout has fetched but not checked out), else None."""
    return commit_of(rev, cwd) or commit_of(f"refs/remotes/origin/{rev}", cwd)


def is_ancestor(a: str, b: str, cwd: str | Path | Tree) -> bool:
    return git(["merge-base", "--is-ancestor", a, b], cwd, check=False).returncode == 0


def is_repo(path: str | Path) -> bool:
    p = Path(path)
    if not p.is_dir():
        return False
    r = git(["rev-parse", "--show-toplevel"], p, check=False)
    return r.returncode == 0 and Path(r.stdout.decode().strip()).resolve() == p.resolve()


def git_path(name: str, cwd: str | Path) -> Path:
    """`git rev-parse --git-path NAME` (a submodule's or worktree's own hooks dir, …)."""
    p = Path(out(["rev-parse", "--git-path", name], cwd))
    return p if p.is_absolute() else Path(cwd) / p
