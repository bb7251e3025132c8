"""The git CLI behind one small function: every git call forge makes goes through `git()`.

- Never interactive (`GIT_TERMINAL_PROMPT=0`, no editor, no pager), never the user's global
  hooks or templates for repositories forge creates.
- Local paths may be used as submodule URLs (`protocol.file.allow=always`): tests and the demo
  use local bare repositories as remotes.
- A failure is a `GitError` (a `RepoError`): one line with the command and git's own last
  line of stderr; `check=False` returns the result instead.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from .errors import RepoError

_CONFIG = ("-c", "protocol.file.allow=always", "-c", "core.quotepath=off",
           "-c", "advice.detachedHead=false", "-c", "init.defaultBranch=main")


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


def git(args: Sequence[str], cwd: str | Path | None = None, *, check: bool = True,
        input: bytes | None = None, env: Mapping[str, str] | None = None,
        timeout: float | None = 600) -> subprocess.CompletedProcess[bytes]:
    """Run `git ARGS` in `cwd` and return the completed process (bytes out). Raises GitError
    when git exits non-zero and `check` is set, and RepoError when git is missing."""
    argv = ["git", *_CONFIG, *args]
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


def out(args: Sequence[str], cwd: str | Path | None = None, **kw: object) -> str:
    """git's stdout as text, stripped of the trailing newline."""
    return git(args, cwd, **kw).stdout.decode("utf-8", "replace").rstrip("\n")  # type: ignore[arg-type]


def commit_of(rev: str, cwd: str | Path) -> str | None:
    """The full commit id `rev` names in the repository at `cwd`, or None."""
    p = git(["rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd, check=False)
    return p.stdout.decode().strip() if p.returncode == 0 else None


def is_ancestor(a: str, b: str, cwd: str | Path) -> bool:
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
