"""Environment isolation of recorded tool calls: the environment a call gets, and the
bubblewrap sandbox it runs in where the host has one.

Contract:
- `prepare(ws, argv, cwd=, task=, ...)` returns `(launch_argv, env, profile)`: what to start,
  with exactly that environment (nothing of forge's own is inherited beyond it), and the
  `SandboxProfile` the call's `ToolInvoked.sandbox` records. Every recorded tool call goes
  through it: `calls.run_tool` (`forge run`, the command executor, verification steps, agent
  `run_command`), the build tool (inside its supervisor) and the command evaluator.
- The environment is built from an allowlist: `PATH`, `LANG`, `LANGUAGE`, `LC_*`, `TERM`,
  `TZ`, `USER`, `LOGNAME`, `PYTHON*`, `VIRTUAL_ENV`, `FORGE_*` (not `PRIVATE_ENV`), the
  Hugging Face cache and offline switches (`HF_HOME`, `HF_HUB_CACHE`, `HF_HUB_OFFLINE`,
  `HF_DATASETS_OFFLINE`, `TRANSFORMERS_OFFLINE`, `TOKENIZERS_PARALLELISM`), the names in
  `[guard] sandbox_env` and in the task's `sandbox.env`; a secret-named variable (the one
  rule, `ledger.secrets.names.is_secret_name`, or `[secrets] env`) among them is dropped unless the
  task names it in `sandbox.secret_env` or `sandbox.env`. On top: what forge sets for this call
  (`env=`: FORGE_CANDIDATE, FORGE_TASK_ID, ...), then `HOME` and `TMPDIR` (a scratch home and
  temp directory in the task's scratch directory), `FORGE_SCRATCH` (that directory) and
  `CUDA_VISIBLE_DEVICES` (the task's claimed GPUs, empty: none). The profile records names
  only, never a value.
- Writable: the task's worktrees and scratch directory (`task_dirs.allowed_roots`, the
  ones that exist; scratch is created), plus the directories of `[guard] sandbox_writable`;
  without a task, the call's own directory (`cwd`) and a scratch directory. A task call's
  `cwd` outside its roots is read-only, like the task file's directory and everything else;
  a task's `sandbox.writable` adds absolute directories (a graph's loop task: `{workdir}`).
  So that a call can commit in its task's worktree (an executor's candidates), the git
  directories that takes are writable too, and only those: the worktree's own admin
  directory, the member's object store and the task branches' ref and reflog directories
  (`refs/heads/forge/task/`); the member's hooks, config and other refs stay read-only.
  The committer is the user's git identity (`git config user.name/email`, read once), as
  GIT_AUTHOR_*/GIT_COMMITTER_* unless set: `HOME` is the scratch home.
- Hidden (read-only root or not, they read as empty): forge's `credentials.toml` and
  `approver.key` (a person's grants, `human_channel.py`), the key file
  `FORGE_APPROVER_KEY_FILE` names wherever it is (and the variable itself is never passed:
  `PRIVATE_ENV`), the files of `[secrets] files`, and the usual credential stores under
  forge's own home (`~/.ssh`, `~/.aws`, `~/.gnupg`, `~/.netrc`, `~/.git-credentials`,
  `~/.docker`, `~/.kube`, `~/.config/gcloud`, `~/.cache/huggingface/token`,
  `~/.huggingface`, `~/.npmrc`, `~/.pypirc`).
- With bubblewrap (`bwrap` on PATH and able to make this whole sandbox here, probed once
  per process with the full flag set): `bwrap --ro-bind / / --dev /dev --proc /proc --bind
  <writable> ... --unshare-user --unshare-pid --unshare-ipc [--unshare-net] --new-session
  --cap-drop ALL --die-with-parent --chdir <cwd> -- argv`. The call has no capability (as
  root too: no remount, no umount of a hidden file, no setns, no ptrace of forge), its own
  pid namespace and a fresh `/proc` (it sees and signals only its own processes: not forge's
  `/proc/<pid>/root` or `environ`, not the user's other processes or their command lines),
  and a new session (no controlling terminal: no TIOCSTI into the user's). bwrap's own init
  is the namespace's pid 1: when the command exits, or forge kills bwrap (a timeout, a
  teardown: `proc.kill_group` of the group forge started, which holds bwrap outside the
  namespace; `--die-with-parent` takes the init with it), the whole namespace dies, so no
  `setsid` or double-forked child outlives its call. The pids a call shows (`$$`, a pid
  file) are the namespace's, not the host's: follow a call's processes from the host by the
  pid forge started, not by what the call prints. Where the host cannot make user or pid
  namespaces, bwrap does not work here: `auto` runs unsandboxed saying so, `required`
  refuses (never a weaker sandbox). `/tmp` is not replaced by a tmpfs: task files and
  scripts may live there (it is read-only, and `TMPDIR` points into scratch). Network: off
  (`--unshare-net`: its own loopback) unless the task's `sandbox.network` is true; the
  task's `sandbox.endpoints` (servers on this host's loopback) are relayed into that
  loopback, each host:port and nothing else (`endpoint_relay.plan`: a forwarder inside
  before the command, forge's side a process before bwrap, both gone with the call), and a
  call that names servers it does not reach gets, when it fails, one line on its stderr
  with the YAML that grants them. The profile's `endpoints` records the grant. GPUs:
  `--dev /dev` shows no `/dev/nvidia*`; with claimed GPUs all existing `/dev/nvidia*` nodes
  are bound (`--dev-bind`) and `CUDA_VISIBLE_DEVICES` names the claimed ones (binding only
  some nodes would renumber the devices inside, so an index would name another GPU). Hosts
  without NVIDIA devices bind none.
- `[guard] sandbox` in forge.toml: `auto` (default) sandboxes where bwrap works and else
  runs the call unsandboxed with the allowlisted environment; `required` refuses the call
  (HarnessError, one line) where bwrap does not work; `off` is the old behaviour: forge's
  whole environment, no sandbox. Whenever a call runs unsandboxed, its profile says so
  (`kind: none` and the reason) and one warning line goes to stderr.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ...ledger.secrets.names import is_secret_name
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from ..proc import alive
from . import endpoint_relay
from .human_channel import KEY_ENV
from .task_dirs import allowed_roots, scratch_dir

Mode = Literal["auto", "off", "required"]

# Variables every call gets from forge's environment when set (patterns: fnmatch).
ALLOWLIST = ("PATH", "LANG", "LANGUAGE", "LC_*", "TERM", "TZ", "USER", "LOGNAME", "PYTHON*",
             "VIRTUAL_ENV", "FORGE_*", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE",
             "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "TOKENIZERS_PARALLELISM",
             "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME",
             "GIT_COMMITTER_EMAIL")
# Credential stores under forge's own home, hidden from every sandboxed call.
HOME_SECRETS = (".ssh", ".aws", ".gnupg", ".netrc", ".git-credentials", ".docker", ".kube",
                ".config/gcloud", ".cache/huggingface/token", ".huggingface", ".npmrc",
                ".pypirc")
# Device nodes a GPU call needs besides the GPUs' own (bound when they exist).
_NVIDIA_CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                   "/dev/nvidia-modeset", "/dev/nvidia-caps")
# forge's own variables that name a person's credentials: never passed to a call (not even
# when a task names them), and the files they name hidden from it.
PRIVATE_ENV = (KEY_ENV,)
NO_TASK_SCRATCH = "_calls"  # FORGE_HOME/scratch/_calls: no task id can take this name


class SandboxProfile(BaseModel):
    """How one tool call ran (recorded in `ToolInvoked.sandbox`): names, never values."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["bwrap", "none"]
    mode: Mode
    read_only_root: bool
    writable: list[str]
    hidden: list[str] = []  # credential files and directories that read as empty
    network: bool
    gpus: list[str]
    env: Literal["allowlist", "inherited"]
    env_names: list[str]  # the names passed (allowlist); [] when inherited
    # Secret-named variables the call got, by name (not `secrets_passed`: redaction would
    # hide the values of a field so named, and these are names worth keeping).
    secret_names: list[str]
    reason: str | None = None  # why it ran unsandboxed
    # The task's `sandbox.endpoints`: what the call reached with its network off (relayed,
    # harness/guard/endpoint_relay.py), or granted where the network was on anyway.
    endpoints: list[str] = []

    def record(self) -> dict[str, Any]:
        out = self.model_dump(mode="json")
        if not self.endpoints:  # the profile of a call without any, as it was before them
            del out["endpoints"]
        return out


# --- bubblewrap on this host --------------------------------------------------------------

_probed: dict[str, str | None] = {}


def _true() -> str:
    return shutil.which("true") or "/bin/true"


def bwrap_problem(bwrap: str) -> str | None:
    """None when `bwrap` can make this module's sandbox here, every flag of it (user and pid
    namespaces, a fresh /proc, no network); else why not (one line). Probed once per process
    and path (a container may forbid namespaces or a new /proc)."""
    if bwrap not in _probed:
        argv = bwrap_argv(bwrap, [_true()], cwd=Path("/"), writable=[], network=False,
                          gpus=[])
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=20,
                               env={"PATH": os.environ.get("PATH", "")})
            tail = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
            _probed[bwrap] = None if p.returncode == 0 else \
                f"{bwrap} cannot make a sandbox here: {tail[:200]}"
        except (OSError, subprocess.TimeoutExpired) as e:
            _probed[bwrap] = f"{bwrap} cannot run: {e}"
    return _probed[bwrap]


def find_bwrap() -> tuple[str | None, str | None]:
    """(path, None) for a working bwrap on forge's PATH; (None, why) otherwise."""
    path = shutil.which("bwrap", path=os.environ.get("PATH", os.defpath))
    if path is None:
        return None, "bubblewrap (bwrap) is not installed or not on PATH"
    problem = bwrap_problem(path)
    return (None, problem) if problem else (path, None)


# --- where a call may write ---------------------------------------------------------------

_process_scratch: list[Path] = []


def _empty_file() -> Path:
    """An empty read-only file (one per process) to bind over a hidden one."""
    d = _scratch_without_workspace()
    empty = d / "empty"
    if not empty.exists():
        empty.touch(mode=0o444)
    return empty


def _scratch_without_workspace() -> Path:
    """A scratch directory for calls made without a workspace (one per process), removed at
    exit. A process killed before its exit leaves it: the next process sweeps those of dead
    processes (`_scratch_parent`)."""
    if not _process_scratch:
        import atexit

        parent = _scratch_parent()
        d = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-" if parent else "forge-scratch-",
                                  dir=parent))
        atexit.register(shutil.rmtree, d, True)
        _process_scratch.append(d)
    return _process_scratch[0]


def _scratch_parent() -> Path | None:
    """`$TMPDIR/forge-scratch-<uid>` (0700, ours, not a link), with the scratch directories
    of processes no longer running removed (`<pid>-…`: a killed forge's); None, and a plain
    temporary directory instead, where it cannot be trusted."""
    base = Path(tempfile.gettempdir()) / f"forge-scratch-{os.getuid()}"
    try:
        base.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(base)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None  # another user's, or a link: not a place to sweep or to write in
    for child in base.iterdir():
        pid = child.name.split("-", 1)[0]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(child, ignore_errors=True)
    return base


def scratch_of(ws: Workspace | None, task: str | None) -> Path:
    """The call's scratch directory (created): the task's, else one for calls without one."""
    if ws is None:
        d = _scratch_without_workspace()
    elif task is not None:
        d = scratch_dir(ws, task)
    else:
        d = ws.home / "scratch" / NO_TASK_SCRATCH
    d.mkdir(parents=True, exist_ok=True)
    return d.resolve()


def worktree_git_dirs(ws: Workspace, worktree: Path) -> list[Path]:
    """What a commit in a task's `worktree` writes (module contract): its admin directory,
    the object store, the task branches' ref and reflog directories; [] when it is no
    worktree forge made of a member. Found as forge made them (repos/worktrees.py `locate`),
    never from the worktree's `.git` file or the admin's `commondir`: an earlier call may
    have rewritten those to name any directory, which this call would then get writable."""
    # In the function for start-up time: MonoRepo modules (~30 ms), for worktrees only.
    from ...repos.commands import maybe_monorepo
    from ...repos.errors import RepoError
    from ...repos.worktrees import BRANCH_PREFIX, locate

    try:
        mono = maybe_monorepo(ws)
        if mono is None:
            return []
        tree = locate(mono.member_dir(worktree.name), worktree)
    except RepoError:
        return []  # not one forge can vouch for: the call commits nothing there
    common = tree.common
    if not (common / "objects").is_dir():
        return []
    out = [tree.admin, common / "objects"]
    for sub in ("refs/heads/", "logs/refs/heads/"):
        d = common / (sub + BRANCH_PREFIX.rstrip("/"))
        d.mkdir(parents=True, exist_ok=True)  # where git makes the branch's lock file
        out.append(d)
    return out


def writable_dirs(ws: Workspace | None, task: str | None, cwd: Path, scratch: Path,
                  extra: Sequence[str] = ()) -> list[Path]:
    """The directories a call may write (module contract), existing ones, outermost first."""
    dirs: list[Path] = [scratch]
    if ws is not None and task is not None:
        dirs = [r for r in allowed_roots(ws, task) if r.is_dir()]
        if scratch not in dirs:
            dirs.append(scratch)
        trees = dirs[0] if dirs and dirs[0] != scratch else None
        for wt in sorted(trees.iterdir()) if trees is not None else ():
            dirs += worktree_git_dirs(ws, wt)
    else:
        dirs.append(cwd)
    wanted = [*(ws.config.settings.guard.sandbox_writable if ws is not None else ()), *extra]
    for w in wanted:
        p = Path(w).expanduser()
        if not p.is_absolute():  # forge.toml's: relative to FORGE_HOME
            if ws is None:
                continue
            p = ws.home / p
        if p.resolve().is_dir():
            dirs.append(p.resolve())
    out: list[Path] = []
    for d in sorted(set(dirs), key=lambda p: (len(p.parts), str(p))):
        if not any(d == o or d.is_relative_to(o) for o in out):  # bound by its parent already
            out.append(d)
    return out


def hidden_paths(ws: Workspace | None) -> list[Path]:
    """Credential files and directories no call reads (module contract), existing ones."""
    home = Path(os.environ.get("HOME") or Path.home())
    paths = [home / p for p in HOME_SECRETS]
    if ws is not None:
        paths.append(ws.home / "credentials.toml")
        paths.append(ws.home / "approver.key")  # the human channel's (guard/human_channel.py)
        paths += [Path(f) for f in ws.config.secret_files]
    paths += [Path(os.path.abspath(os.environ[k])) for k in PRIVATE_ENV if os.environ.get(k)]
    return [p for p in paths if p.exists()]


_identity: dict[str, str] = {}


def git_identity() -> dict[str, str]:
    """The user's git identity as GIT_AUTHOR_*/GIT_COMMITTER_* (read once per process)."""
    if not _identity:
        found = {}
        for key, names in (("user.name", ("GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME")),
                           ("user.email", ("GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"))):
            try:
                p = subprocess.run(["git", "config", "--get", key], capture_output=True,
                                   text=True, timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                return {}  # no git to ask now (not cached: it may be found later)
            if p.returncode == 0 and p.stdout.strip():
                found.update(dict.fromkeys(names, p.stdout.strip()))
        _identity.update(found or {"": ""})  # none configured: asked once
    return {k: v for k, v in _identity.items() if k}


# --- the environment ----------------------------------------------------------------------


def _allowed(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatchcase(name, p) for p in patterns)


def child_env(ws: Workspace | None, *, forge_env: Mapping[str, str] | None,
              passthrough: Sequence[str], secrets: Sequence[str], scratch: Path,
              gpus: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """The call's environment (module contract) and the secret-named names it holds."""
    secret_env = set(ws.config.secret_env) if ws is not None else set()
    extra = list(ws.config.settings.guard.sandbox_env) if ws is not None else []
    named = set(secrets) | set(passthrough)  # what the task names: it gets them
    patterns = (*ALLOWLIST, *extra)
    env: dict[str, str] = dict(git_identity())
    for k, v in os.environ.items():
        if k in PRIVATE_ENV:
            continue
        looks_secret = k in secret_env or is_secret_name(k)
        if k in named or (_allowed(k, patterns) and not looks_secret):
            env[k] = v
    env.update(forge_env or {})
    home, tmp = scratch / ".home", scratch / ".tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    env.update({"HOME": str(home), "TMPDIR": str(tmp), "FORGE_SCRATCH": str(scratch),
                "CUDA_VISIBLE_DEVICES": ",".join(gpus)})
    passed_secrets = sorted(k for k in env if k in secret_env or is_secret_name(k))
    return env, passed_secrets


def settings_key(ws: Workspace | None, spec: Any = None) -> dict[str, Any]:
    """What of the sandbox can change a call's outcome, without paths that differ per task
    (a build's cache key: a build refused by the sandbox is not a hit once it is allowed)."""
    guard = ws.config.settings.guard if ws is not None else None
    mode = guard.sandbox if guard is not None else "auto"
    return {"mode": mode, "bwrap": mode != "off" and find_bwrap()[0] is not None,
            "env": sorted(guard.sandbox_env) if guard is not None else [],
            "writable": sorted(guard.sandbox_writable) if guard is not None else [],
            "task": spec.model_dump(mode="json") if spec is not None else None}


# --- the launch ---------------------------------------------------------------------------


def _gpu_nodes(gpus: Sequence[str]) -> list[str]:
    if not gpus:
        return []
    dev = Path("/dev")
    nodes = sorted(str(p) for p in dev.glob("nvidia[0-9]*"))
    return nodes + [n for n in _NVIDIA_CONTROL if os.path.exists(n)]


# What every sandboxed call gets besides its binds (module contract): no capability, its
# own user, pid and IPC namespaces, a new session, and it dies with bwrap (and so with forge).
ISOLATION = ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--new-session",
             "--cap-drop", "ALL", "--die-with-parent")


def bwrap_argv(bwrap: str, argv: Sequence[str], *, cwd: Path, writable: Sequence[Path],
               network: bool, gpus: Sequence[str], hidden: Sequence[Path] = ()) -> list[str]:
    # A fresh /proc (the namespace's processes only) over the host's, which `--ro-bind / /`
    # brings along; locked under it, it cannot be unmounted from inside.
    out = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for d in writable:
        out += ["--bind", str(d), str(d)]
    for h in hidden:  # after the binds: hidden even inside a writable directory
        # (a file: an empty file bound over it; /dev/null would be refused, nodev)
        out += ["--tmpfs", str(h)] if h.is_dir() else ["--ro-bind", str(_empty_file()), str(h)]
    for node in _gpu_nodes(gpus):
        out += ["--dev-bind", node, node]
    if not network:
        out.append("--unshare-net")
    out += [*ISOLATION, "--chdir", str(cwd), "--", *argv]
    return out


def missing_program(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> str | None:
    """Why `argv[0]` cannot start (not found, not executable), or None: said before a
    sandbox would start it (inside, it is bwrap that fails, with its own words)."""
    prog = argv[0]
    if "/" in prog:
        p = Path(prog) if os.path.isabs(prog) else cwd / prog
        if not p.exists():
            return f"cannot start {prog}: No such file or directory"
        if not os.access(p, os.X_OK) or p.is_dir():
            return f"cannot start {prog}: Permission denied"
        return None
    if shutil.which(prog, path=env.get("PATH", os.defpath)) is None:
        return f"cannot start {prog}: No such file or directory"
    return None


def _say_unsandboxed(reason: str) -> None:
    sys.stderr.write(f"forge: warning: tool call runs unsandboxed: {reason}\n")
    sys.stderr.flush()


def prepare(ws: Workspace | None, argv: Sequence[str], *, cwd: str | Path,
            task: str | None = None, allow_network: bool = False,
            gpus: Sequence[str] = (), secrets: Sequence[str] = (),
            env: Mapping[str, str] | None = None, passthrough: Sequence[str] = (),
            spec: Any = None) -> tuple[list[str], dict[str, str], SandboxProfile]:
    """`(launch_argv, env, profile)` for running `argv` in `cwd` (module contract).

    `spec`: the task's `SandboxSpec` (its network, gpus, secrets and env add to the keyword
    arguments); `env`: what forge sets for this call. Raises HarnessError when the sandbox
    is required and cannot be made (nothing runs)."""
    argv = [str(a) for a in argv]
    cwd = Path(cwd).resolve()
    endpoints: list[str] = []
    if spec is not None:
        allow_network = allow_network or bool(spec.network)
        gpus = [*gpus, *spec.gpus]
        secrets = [*secrets, *spec.secret_env]
        passthrough = [*passthrough, *spec.env]
        endpoints = list(spec.endpoints)
    mode: Mode = ws.config.settings.guard.sandbox if ws is not None else "auto"
    if mode == "off":
        reason = 'sandbox off ([guard] sandbox = "off" in forge.toml): forge\'s whole ' \
                 "environment, no isolation"
        full = {**os.environ, **(env or {})}
        secret_env = set(ws.config.secret_env) if ws is not None else set()
        passed = sorted(k for k in full if k in secret_env or is_secret_name(k))
        _say_unsandboxed(reason)
        return argv, full, SandboxProfile(
            kind="none", mode=mode, read_only_root=False, writable=["/"], network=True,
            gpus=sorted(set(gpus)), env="inherited", env_names=[], secret_names=passed,
            reason=reason, endpoints=endpoints)
    scratch = scratch_of(ws, task)
    gpus = list(dict.fromkeys(gpus))
    child, passed = child_env(ws, forge_env=env, passthrough=passthrough, secrets=secrets,
                              scratch=scratch, gpus=gpus)
    bwrap, problem = find_bwrap()
    if bwrap is None:
        problem = problem or "bubblewrap unavailable"
        if mode == "required":
            raise HarnessError(f'tool call refused: [guard] sandbox = "required" in forge.toml '
                               f"and {problem}")
        reason = f"{problem} ([guard] sandbox = \"auto\"): allowlisted environment only"
        _say_unsandboxed(reason)
        return argv, child, SandboxProfile(
            kind="none", mode=mode, read_only_root=False, writable=["/"],
            network=True, gpus=gpus, env="allowlist", env_names=sorted(child),
            secret_names=passed, reason=reason, endpoints=endpoints)
    writable = writable_dirs(ws, task, cwd, scratch,
                             extra=spec.writable if spec is not None else ())
    hidden = hidden_paths(ws)
    relay = endpoint_relay.plan(ws, argv, endpoints, network=allow_network, task=task)
    launch = bwrap_argv(bwrap, [*relay.inner, *argv], cwd=cwd, writable=writable,
                        network=allow_network, gpus=gpus, hidden=hidden)
    return [*relay.outer, *launch], child, SandboxProfile(
        kind="bwrap", mode=mode, read_only_root=True, writable=[str(d) for d in writable],
        hidden=[str(h) for h in hidden],
        network=allow_network, gpus=gpus, env="allowlist", env_names=sorted(child),
        secret_names=passed, endpoints=endpoints)
