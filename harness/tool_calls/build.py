"""`forge build`: run a member's build command (its manifest `build:`) as a tool call, with a
cache of outcomes keyed by the digest of the build's inputs.

Contract:
- The key (`build_key`) is the digest of the tree's content (commit, digest of the uncommitted
  diff, each untracked file's path, digest and mode: `repos.snapshot.member_state` of the
  build directory, a checkout or a task's worktree alike; its URL and branch are left out, a
  tree is the same tree on any branch), the build command, and the environment's digest
  (`calls.env_digest`: secret values never hashed in) without the shell's bookkeeping of
  where forge was started (`PWD`, `OLDPWD`, `SHLVL`, `_`). Build outputs must be git-ignored:
  an untracked output is an input of the next build, whose key then differs.
- The cache holds outcomes, not output files: `FORGE_HOME/build-cache/<hex of key>.json`
  (success, exit code, stdout/stderr artifact digests, duration, when). A hit returns
  `cached=True` with the same log digests and runs nothing. A failed build is cached too
  (the same inputs fail the same way); `force` rebuilds and replaces the entry. A build that
  did not finish by itself (could not start, killed by a signal) is not cached.
- An entry is written atomically (a temp file in the same directory, fsync, `os.replace`),
  only after the build finished, under an exclusive `flock` on `<hex>.lock` held from the
  cache check to the write: two builds of one key run it once (the second waits, then hits).
  A `kill -9` mid-build leaves no entry (the lock dies with the process); a temp file left by
  a writer killed between write and rename is swept by the next holder of that key's lock.
- The command runs through `calls.run_tool` (outputs redacted and stored as artifacts) in
  its own session (`proc.session_launch`): when forge dies (even by `kill -9`) the session's
  leader kills the whole process group, grandchildren included.
- The build command itself runs in the Safety Guard's sandbox (`guard.sandbox.prepare`: an
  allowlisted environment, bubblewrap where the host has it; the session's leader, outside it,
  holds the group); the profile is the event's `sandbox`. The key takes forge's own
  environment (a superset of what the sandbox passes: a change can only miss) and the
  sandbox's settings (`settings_key`: mode, bwrap or not, forge.toml's and the task's
  allowances), so a build the sandbox refused is built again once it is allowed.
- `build` returns the `ToolInvoked(tool="build", input_digests={build: key})` event unsaved;
  `build_command` (the CLI's) records it in the task's open block when given a task (and
  then builds in the task's worktree of the member), and refuses before building when the
  task has no open block.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.atomic import write_atomic
from ...ledger.clock import digest, utcnow
from ...ledger.errors import NotFoundError
from ...ledger.payloads import Digest, MemberState
from ...ledger.specs import SandboxSpec
from ...ledger.workspace import Workspace
from ...projections.memory import read_memory
from ...repos import worktrees
from ...repos.commands import open_monorepo, worktree_base
from ...repos.root import MonoRepo
from ...repos.snapshot import member_state
from ...repos.worktrees import locate
from ..errors import HarnessError
from ..guard.sandbox import PRIVATE_ENV, prepare, settings_key
from ..proc import last_line
from ..record import append_to_task
from ..task import human_actor, load_task_from_ledger
from .calls import capture_redactor, env_digest, run_tool

Progress = Callable[[str], None]
CACHE_DIR = "build-cache"
ENTRY_VERSION = 1
# Where and how forge was started, not what the build is: a key must not change with them;
# nor with forge's own private variables, which no build is ever given (sandbox.PRIVATE_ENV).
_SHELL_BOOKKEEPING = frozenset({"PWD", "OLDPWD", "SHLVL", "_", *PRIVATE_ENV})


@dataclass(frozen=True)
class BuildOutcome:
    member: str
    key: str
    success: bool
    cached: bool
    exit_code: int | None
    duration_s: float  # this call's wall time (a hit: the lookup)
    build_duration_s: float  # the build that produced the result (a hit: the cached one's)
    stdout_digest: str | None
    stderr_digest: str | None
    error: str | None
    workdir: str
    tool_event: E.ToolInvoked

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tool_event"] = self.tool_event.model_dump(mode="json")
        return out


def build_argv(command: str | Sequence[str] | None, member: str) -> list[str]:
    """The argv of a manifest `build:` (text runs under `bash -c`, a list is the argv)."""
    if command is None:
        raise HarnessError(f"member {member} has no build command in the manifest "
                           "(add `build:` to its entry in forge-repos.yaml)")
    return ["bash", "-c", command] if isinstance(command, str) else [str(a) for a in command]


def build_key(ws: Workspace, state: MemberState, command: str | Sequence[str],
              env: Mapping[str, str], sandbox: Mapping[str, Any] | None = None) -> str:
    """Digest of the tree's content, the command, the environment and the sandbox's settings
    (`guard.sandbox.settings_key`) (module contract)."""
    argv = build_argv(command, state.name)
    tree = {"commit": state.commit, "diff": state.diff_digest,
            "untracked": [[f.path, f.digest, f.executable] for f in state.untracked]}
    kept = {k: v for k, v in env.items() if k not in _SHELL_BOOKKEEPING}
    key = {"v": ENTRY_VERSION, "tree": tree, "argv": argv,
           "env": env_digest(kept, tuple(ws.config.secret_env))}
    if sandbox is not None:
        key["sandbox"] = dict(sandbox)
    return digest(key)


def cache_dir(ws: Workspace) -> Path:
    return ws.home / CACHE_DIR


def _hex(key: str) -> str:
    return key.split(":")[-1]


@contextmanager
def held_lock(path: Path, say: Progress, what: str) -> Iterator[None]:
    """Hold an exclusive flock on `path` (released when the process dies, however)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another build of {what} with the same inputs ({path.name})")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _sweep(d: Path, key: str) -> None:
    """Temp files of this key: left by a writer killed before its rename (we hold the lock)."""
    for p in d.glob(f".{_hex(key)}.*.tmp"):
        with suppress(FileNotFoundError):
            p.unlink()


def _read_entry(ws: Workspace, d: Path, key: str, say: Progress) -> dict[str, Any] | None:
    """The cached outcome of `key`, or None (absent, or unusable: then rebuilt and replaced)."""
    path = d / f"{_hex(key)}.json"
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        say(f"build cache entry {path} is unreadable ({e}); building again")
        return None
    if not isinstance(entry, dict) or entry.get("key") != key \
            or entry.get("version") != ENTRY_VERSION:
        say(f"build cache entry {path} is not for this key; building again")
        return None
    for name in ("stdout_digest", "stderr_digest"):
        dg = entry.get(name)
        if dg is not None and not ws.artifacts.exists(dg):
            say(f"build cache entry {path}: its {name[:6]} artifact is gone; building again")
            return None
    return entry


def _write_entry(d: Path, key: str, entry: dict[str, Any]) -> None:
    # Named `.<hex>.json.<random>.tmp`: `_sweep` finds what a killed writer left.
    write_atomic(d / f"{_hex(key)}.json", json.dumps(entry, indent=2, sort_keys=True),
                 mode=0o644, fsync=True)
    dfd = os.open(d, os.O_RDONLY)  # the rename itself survives a crash
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _failure(member: str, code: int | None, error: str | None, stderr: str) -> str | None:
    if error:
        return f"build of {member}: {error}"
    if code == 0:
        return None
    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exited {code}"
    tail = last_line(stderr)
    return f"build of {member} {how}" + (f": {tail}" if tail else "")


def build(ws: Workspace, mono: MonoRepo, member: str, workdir: Path, *, force: bool = False,
          tee: bool = False, progress: Progress | None = None, task: str | None = None,
          sandbox: SandboxSpec | None = None) -> BuildOutcome:
    """Build `member` in `workdir` (its checkout or a worktree of it), or return the cached
    outcome of the same inputs (module contract). The tool event is returned, not saved.
    `task`, `sandbox` (its `SandboxSpec`): the task whose directories the build may write."""
    say = progress or (lambda _s: None)
    t0 = time.monotonic()
    m = mono.member(member)
    argv = build_argv(m.build, member)
    workdir = Path(workdir).resolve()
    env = dict(os.environ)
    # A task's worktree (anything but the member's own checkout) is read as forge made it
    # (repos/worktrees.py `locate`): its calls may have rewritten its .git file.
    where = workdir if workdir == mono.member_dir(member).resolve() else \
        locate(mono.member_dir(member), workdir)
    key = build_key(ws, member_state(m.name, m.rel_path, where, ws.artifacts), argv, env,
                    settings_key(ws, sandbox))
    shown_argv = capture_redactor(ws, env).value(argv)
    inputs = {Digest.BUILD: key}
    d = cache_dir(ws)
    d.mkdir(parents=True, exist_ok=True)
    with held_lock(d / f"{_hex(key)}.lock", say, member):
        _sweep(d, key)
        entry = None if force else _read_entry(ws, d, key, say)
        if entry is not None:
            took = time.monotonic() - t0
            ev = E.ToolInvoked(tool="build", argv=shown_argv, cwd=str(workdir),
                               env_digest=env_digest(env, tuple(ws.config.secret_env)),
                               exit_code=entry["exit_code"], duration_s=round(took, 6),
                               stdout_digest=entry["stdout_digest"],
                               stderr_digest=entry["stderr_digest"], input_digests=inputs)
            return BuildOutcome(member, key, bool(entry["success"]), True, entry["exit_code"],
                                took, float(entry["duration_s"]), entry["stdout_digest"],
                                entry["stderr_digest"], entry["error"], str(workdir), ev)
        say(f"building {member} in {workdir} (key {_hex(key)[:12]})")
        launch, child_env, profile = prepare(ws, argv, cwd=workdir, task=task, spec=sandbox)
        run = run_tool(ws, launch, tool="build", cwd=workdir, tee=tee, own_session=True,
                       env=child_env, prepared=profile,
                       event_fields={"input_digests": inputs})
        ev = run.event.model_copy(update={"argv": shown_argv})  # not the sandbox's argv
        code = run.returncode
        error = _failure(member, code, ev.error, run.stderr)
        took = time.monotonic() - t0
        if code is not None and code >= 0 and ev.error is None:  # it finished by itself
            _write_entry(d, key, {
                "version": ENTRY_VERSION, "key": key, "member": member, "argv": shown_argv,
                "workdir": str(workdir), "success": code == 0, "exit_code": code,
                "duration_s": ev.duration_s, "stdout_digest": ev.stdout_digest,
                "stderr_digest": ev.stderr_digest, "error": error,
                "when": utcnow().isoformat()})
        return BuildOutcome(member, key, code == 0 and ev.error is None, False, code, took,
                            float(ev.duration_s or 0.0), ev.stdout_digest, ev.stderr_digest,
                            error, str(workdir), ev)


def _open_block(ws: Workspace, task_id: str) -> str:
    """The task's open block, or a HarnessError saying why a build cannot be recorded."""
    try:
        mem, _ = read_memory(ws.ledger, task_id)
    except NotFoundError as e:
        raise HarnessError(str(e)) from None
    if mem.status == "exited":
        raise HarnessError(f"task {task_id} has exited ({mem.exit_state}); nothing more is "
                           "recorded in it")
    if mem.current_block is None:
        raise HarnessError(f"task {task_id}: no open loop block; a build is recorded in a "
                           f"block (forge block start {task_id} --sub-goal ...)")
    return mem.current_block.block_id


def _task_sandbox(ws: Workspace, task_id: str) -> Any:
    return load_task_from_ledger(ws, task_id).task.sandbox


def build_command(ws: Workspace, member: str, task_id: str | None = None, *,
                  force: bool = False, tee: bool = False, progress: Progress | None = None
                  ) -> BuildOutcome:
    """`forge build MEMBER [--task T]`: without a task, build the member's checkout in the
    root (nothing recorded on a task); with one, build the task's worktree of the member and
    record the tool call in the task's open block (checked before building)."""
    mono = open_monorepo(ws)
    build_argv(mono.member(member).build, member)  # no command: say so before anything
    if task_id is None:
        return build(ws, mono, member, mono.member_dir(member), force=force, tee=tee,
                     progress=progress)
    block = _open_block(ws, task_id)
    wt = worktrees.ensure(mono, worktree_base(ws), member, task_id)
    out = build(ws, mono, member, wt.path, force=force, tee=tee, progress=progress,
                task=task_id, sandbox=_task_sandbox(ws, task_id))
    ev = out.tool_event.model_copy(update={"task_id": task_id, "block_id": block,
                                           "actor": human_actor()})
    append_to_task(ws, task_id, [ev], command_id=f"{task_id}:{block}:build:{ev.event_id}")
    return replace(out, tool_event=ev)
