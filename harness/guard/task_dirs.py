"""Where an agent may write and run: a task's directories, its worktrees
(`<worktree base>/<task>`) and its scratch directory (`FORGE_HOME/scratch/<task>`), and the
one way to write there.

Contract:
- `allowed_roots(ws, task)`: the task's roots, resolved; nothing else is the agent's to
  change (the sandbox makes them its only writable directories, guard/sandbox.py).
- `inside_task(ws, task, path, what)`: a path (relative: to the scratch directory) resolved
  when inside the roots, else HarnessError naming it and the roots (a check of names only).
- `dir_in_task` / `write_in_task`: a directory made, a file written, beneath a held
  descriptor of its root, each directory opened without following a link (O_NOFOLLOW): what
  an agent's processes swap in meanwhile (a link to elsewhere) is refused, never followed;
  a file is replaced by a rename, never written through a link; `..` is refused.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from ...ledger.workspace import Workspace
from ..errors import HarnessError


def scratch_dir(ws: Workspace, task_id: str) -> Path:
    return ws.home / "scratch" / task_id


def worktree_root(ws: Workspace, task_id: str) -> Path:
    """The directory of the task's worktrees (as configured, not resolved)."""
    # In the function for start-up time: a sandbox without a task (every `forge run`)
    # does not load the MonoRepo commands (~20 ms).
    from ...repos.commands import worktree_base

    return worktree_base(ws) / task_id


def allowed_roots(ws: Workspace, task_id: str) -> list[Path]:
    """The task's worktrees and its scratch directory: the only places an agent writes."""
    return [worktree_root(ws, task_id).resolve(), scratch_dir(ws, task_id).resolve()]


def inside_task(ws: Workspace, task_id: str, path: str | Path, what: str) -> Path:
    """`path` (relative: to the scratch directory) resolved, when inside the task's roots;
    else HarnessError naming the path and the roots. A check of names only: a file or
    directory an agent's process can change may be swapped for a link after it, so writes
    and directories made go through `write_in_task` and `dir_in_task`, not this."""
    roots = allowed_roots(ws, task_id)
    p = Path(path)
    p = (p if p.is_absolute() else roots[1] / p).resolve()
    if not any(p == r or p.is_relative_to(r) for r in roots):
        raise _outside(what, path, roots)
    return p


def _outside(what: str, path: str | Path, roots: list[Path]) -> HarnessError:
    return HarnessError(f"{what} {str(path)[:200]!r} is outside the task's directories "
                        f"({', '.join(str(r) for r in roots)}): the task definition, its "
                        "contract and everything else are not the agent's to change")


def _below_root(ws: Workspace, task_id: str, path: str | Path, what: str
                ) -> tuple[Path, Path, tuple[str, ...]]:
    """`(root, shown, names)`: the task's root `path` is under, the path as reported, and the
    names below the root, by the path's text alone (nothing on disk is followed); `..` and
    paths outside the roots are refused."""
    roots = allowed_roots(ws, task_id)
    raw = Path(path)
    if "\0" in str(path):
        raise HarnessError(f"{what} {str(path)[:200]!r} holds a NUL byte")
    if ".." in raw.parts:
        raise HarnessError(f"{what} {str(path)[:200]!r} has a '..' component: name a path "
                           "inside the task's directories without one")
    if not raw.is_absolute():
        return roots[1], roots[1] / raw, raw.parts
    unresolved = [(worktree_root(ws, task_id), roots[0]), (scratch_dir(ws, task_id), roots[1])]
    for form, root in [*((r, r) for r in roots), *unresolved]:
        if raw == form or raw.is_relative_to(form):
            names = raw.relative_to(form).parts
            return root, root.joinpath(*names), names
    raise _outside(what, path, roots)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_dirs(root: Path, names: tuple[str, ...], shown: Path, what: str) -> int:
    """A descriptor of the directory `names` lead to below `root`, each made when missing and
    each opened beneath the one before without following a link (an agent's process may
    swap any of them for a link to elsewhere at any time: openat with O_NOFOLLOW holds)."""
    root.mkdir(parents=True, exist_ok=True)  # forge's own directories, out of a call's reach
    fd = os.open(root, _DIR_FLAGS)
    try:
        for name in names:
            try:
                os.mkdir(name, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                raise _refused(what, shown, name, e) from None
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refused(what: str, shown: Path, name: str, e: OSError) -> HarnessError:
    if e.errno in (errno.ELOOP, errno.ENOTDIR):  # O_NOFOLLOW met a link (or a file)
        why = "is a symbolic link or not a directory: no write follows a link (it could " \
              "lead outside the task's directories)"
    else:
        why = f"cannot be written: {e.strerror or e}"
    return HarnessError(f"{what} {str(shown)[:200]!r}: {name!r} {why}")


def dir_in_task(ws: Workspace, task_id: str, path: str | Path, what: str) -> Path:
    """The task's directory `path` (relative: to the scratch directory), made when missing
    without following a link; HarnessError when outside the roots or through a link."""
    root, shown, names = _below_root(ws, task_id, path, what)
    os.close(_open_dirs(root, names, shown, what))
    return shown


def write_in_task(ws: Workspace, task_id: str, path: str | Path, data: bytes) -> Path:
    """Write `data` to the task's file `path` (relative: to the scratch directory): its
    directories opened beneath the root without following links (`_open_dirs`), the bytes
    into a new file beside it, renamed over the name in that directory: a link or hard link
    there is replaced, never written through, and a reader sees the old bytes or the new.
    An existing file keeps its permission bits. HarnessError for a path outside the roots,
    through a link, or that cannot be written; nothing half-written is left."""
    root, shown, names = _below_root(ws, task_id, path, "path")
    if not names:
        raise HarnessError(f"path {str(path)[:200]!r} is a directory of the task, not a file")
    parent = _open_dirs(root, names[:-1], shown, "path")
    name = names[-1]
    tmp = f".{name[:200]}.{secrets.token_hex(6)}.forge-tmp"
    try:
        try:
            old = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            old = None
        if old is not None and stat.S_ISDIR(old.st_mode):
            raise HarnessError(f"path {str(shown)[:200]!r} is a directory, not a file")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o666, dir_fd=parent)
        except OSError as e:
            raise _refused("path", shown, name, e) from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                if old is not None and stat.S_ISREG(old.st_mode):
                    os.fchmod(f.fileno(), stat.S_IMODE(old.st_mode))
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException as e:
            try:
                os.unlink(tmp, dir_fd=parent)
            except OSError:
                pass
            if isinstance(e, OSError):
                raise _refused("path", shown, name, e) from None
            raise
    finally:
        os.close(parent)
    return shown
