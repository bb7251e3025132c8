"""Process plumbing shared by engine servers, graph workers and graph node commands.

- `stat_fields`: a process's `/proc/<pid>/stat` fields; `start_time` its start time, recorded
  with a pid so that a reused pid is not mistaken for the process.
- The one liveness check: `alive(pid, start)` for a process, `group_alive(pgid)` for a
  process group (zombies excepted).
- `die_with_parent`: a preexec_fn giving the child PR_SET_PDEATHSIG(SIGKILL), so a kill -9 of
  a runner takes its children with it.
- `session_launch`: a command in its own session under a small leader that kills the whole
  session (grandchildren included) when this process dies, even by kill -9.
- `run_in_session`: run a command in its own session, dying with this process, with a
  timeout that kills its whole group; the outcome is data, never an exception. `last_line`:
  the last line of its output (the error a failed command printed).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1


def stat_fields(pid: int) -> list[str] | None:
    """The fields of `/proc/<pid>/stat` after the command name (the state first: field 3 of
    proc(5) is index 0), or None when the process (or /proc) is not there."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()


def start_time(pid: int) -> str:
    """The process's start time (clock ticks after boot, as text); "" when unknown."""
    fields = stat_fields(pid)
    return fields[19] if fields and len(fields) > 19 else ""


def alive(pid: int, start: str = "") -> bool:
    """True while process `pid` exists, has not exited (a zombie has) and, given its recorded
    `start` time, is still that process (a reused pid is not). A process we may not signal
    counts as alive."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = stat_fields(pid)
    if fields and fields[0] == "Z":
        return False  # a zombie has exited; where no one reaps it, it lingers as a pid
    return not start or start_time(pid) == start


def group_members(pgid: int) -> list[int]:
    """The live (non-zombie) processes of a process group, from /proc."""
    proc = Path("/proc")
    out = []
    if proc.is_dir():
        for d in proc.iterdir():
            if d.name.isdigit():
                fields = stat_fields(int(d.name))
                if fields and len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
                    out.append(int(d.name))
    return sorted(out)


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists (zombies of our own children excepted)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # killpg succeeds on zombies too: look for a live (non-zombie) member in /proc.
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        fields = stat_fields(int(d.name))
        if fields and len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def die_with_parent() -> Callable[[], None] | None:
    """preexec_fn: the child gets SIGKILL when this process dies (Linux PR_SET_PDEATHSIG); a
    child whose parent died before that took effect exits at once. None where it cannot work:
    not Linux, or not the main thread (the signal fires when the *thread* that forked exits).
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(137)

    return preexec


def last_line(text: str, limit: int = 200) -> str:
    """The last non-empty line of a command's output (its error, usually), cut to `limit`."""
    lines = text.strip().splitlines()
    return lines[-1][:limit] if lines else ""


@dataclass
class CommandOutcome:
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    error: str | None = None


_SETPRIV = shutil.which("setpriv")

# The session leader of an own-session command (argv: forge's pid, whether to set its own
# parent-death signal, the command). It holds the process group: when forge dies, even by
# kill -9, it gets SIGTERM (its parent-death signal) and SIGKILLs the whole group, so the
# command's children die too (a parent-death signal reaches only the direct child: a
# shell's `cat` would outlive it). Signals meant for the command reach it through its group
# (a timeout, a teardown: `kill_group`), so the leader only waits; it reports the command's
# status as its own, an exit code or death by the same signal. Only builtin modules under
# `-I -S`: ~12 ms a command, nearly all of it the interpreter's start.
_SUPERVISOR = """\
import os, sys
import _signal as signal  # the module without its enums: 1 ms to import, not 14
parent = int(sys.argv[1])
def down(*_):
    os.killpg(0, signal.SIGKILL)
def term(*_):
    if os.getppid() != parent:
        down()
signal.signal(signal.SIGTERM, term)
reset = [signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM]
for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
    if signal.getsignal(s) != signal.SIG_IGN:  # as the command would have inherited
        reset.append(s)
        signal.signal(s, signal.SIG_IGN)
if sys.argv[2] == "1":
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError, ImportError):
        pass
if os.getppid() != parent:  # forge died before the parent-death signal was set
    down()
try:  # the environment as given: Python's own start may have added LC_CTYPE (PEP 538)
    with open("/proc/self/environ", "rb") as f:
        env = dict(e.split(b"=", 1) for e in f.read().split(b"\\0") if b"=" in e)
except OSError:
    env = os.environ
try:
    pid = os.posix_spawnp(sys.argv[3], sys.argv[3:], env, setsigdef=reset)
except OSError as e:
    sys.stderr.write("cannot start %s: %s\\n" % (sys.argv[3], e.strerror or e))
    sys.exit(127)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
if code < 0:  # die as the command died, without a core file of our own
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (ImportError, OSError, ValueError):
        pass
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


def session_launch(argv: list[str]) -> tuple[list[str], dict[str, Any]]:
    """The argv and Popen keywords that start a command in its own session, under a leader
    (`_SUPERVISOR`) that kills the whole session when this process dies (module contract).
    `setpriv` sets the leader's parent-death signal without a Python preexec_fn (which
    forces a slow fork: ~45 ms); without it, the leader sets its own."""
    leader = [sys.executable, "-I", "-S", "-c", _SUPERVISOR, str(os.getpid())]
    if _SETPRIV:
        return [_SETPRIV, "--pdeathsig", "TERM", "--", *leader, "0", *argv], \
            {"start_new_session": True}
    return [*leader, "1", *argv], {"start_new_session": True}


def kill_group(pgid: int) -> None:
    """SIGKILL a session's whole process group (gone already: nothing to do)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_in_session(argv: list[str], cwd: Path, env: dict[str, str], timeout_s: float
                   ) -> CommandOutcome:
    """Run a command in its own session (`session_launch`); it dies with this process."""
    t0 = time.monotonic()
    program = argv[0]
    launch, guard = session_launch(argv)
    try:
        p = subprocess.Popen(launch, cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, **guard)
    except OSError as e:
        return CommandOutcome(None, "", "", time.monotonic() - t0,
                              f"cannot start {program} in {cwd}: "
                              f"{e.strerror or e}")
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(p.pid)
        out, err = p.communicate()
        return CommandOutcome(p.returncode, out, err, time.monotonic() - t0,
                              f"timed out after {timeout_s:g}s")
    return CommandOutcome(p.returncode, out, err, time.monotonic() - t0)
