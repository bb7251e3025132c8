"""Server process lifecycle: start, wait ready, watch, stop — and never leave an orphan.

`ServerProcess` contract:
- The command runs in its own session (`start_new_session=True`: its pid is its process group
  id), stdout+stderr go to a log file, and the exact command line (`shlex.join`) is the log's
  first line.
- `wait_ready()` polls the health URL *and* `proc.poll()` together: a server that dies while
  starting fails at once with a HarnessError carrying its exit code and the last log lines; a
  server not healthy by the deadline is stopped and fails the same way.
- `check()` raises the same kind of error when the server died later (mid-benchmark).
- `stop()` sends SIGTERM to the whole process group, then SIGKILL after `grace_s`, and waits.
  It runs on leaving the `with` block — normal exit, exception or KeyboardInterrupt — and from
  a safety net: SIGTERM/SIGHUP raise SystemExit (so `with` blocks unwind and record the stop;
  a second signal stops every live server and dies at once), and an atexit hook stops any
  server still live. On Linux the child also gets PR_SET_PDEATHSIG(SIGKILL), so even a forge process
  killed with SIGKILL takes its server's leader with it.
- With an artifact store, the log is stored on stop (`log_digest`).
- With a `sandbox` (an agent's engine, `guard/engine_sandbox.py`), the command starts through
  it: in the tool-call sandbox with its allowlisted environment plus `env`; `cmd` (what the
  log and the events show) stays the engine's own command line.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from ..errors import HarnessError
from ..guard.engine_sandbox import EngineSandbox
from ..guard.outbound import fetch
from ..proc import die_with_parent, group_alive

TAIL_LINES = 20
HEALTH_MAX_BYTES = 1 << 20  # a health answer is small; a server streaming one is cut

_LIVE: dict[int, ServerProcess] = {}
_LIVE_LOCK = threading.Lock()
_SAFETY_NET_INSTALLED = False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET -> (status, body); a connection failure, or an answer that is not HTTP, is status
    0 (not an exception). The second happens while a server is starting: polling a port in
    the ephemeral range before anything listens on it can connect the socket to itself, and
    the poll then reads its own request back (`BadStatusLine: GET /health HTTP/1.1`)."""
    try:
        r = fetch("GET", url, timeout_s=timeout, max_bytes=HEALTH_MAX_BYTES)
    except HarnessError:
        return 0, b""
    return r.status, r.body


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        data = path.read_bytes()[-64_000:]
    except OSError:
        return "(no log)"
    text = data.decode("utf-8", errors="replace").rstrip("\n").splitlines()
    return "\n".join(text[-lines:])


def _wait_group_gone(pgid: int, seconds: float) -> None:
    """Return when no member of the group is alive, or after `seconds`."""
    deadline = time.monotonic() + seconds
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)


class ServerProcess:
    """One server subprocess. Use as a context manager, or call start/wait_ready/stop."""

    def __init__(
        self,
        cmd: Sequence[str],
        *,
        health_url: str,
        log_path: Path,
        name: str = "server",
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        startup_timeout_s: float = 180.0,
        grace_s: float = 10.0,
        ready: Callable[[int, bytes], bool] | None = None,
        artifacts=None,
        sandbox: EngineSandbox | None = None,
    ):
        self.cmd = [str(c) for c in cmd]
        self.sandbox = sandbox
        self.health_url = health_url
        self.log_path = Path(log_path)
        self.name = name
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.startup_timeout_s = startup_timeout_s
        self.grace_s = grace_s
        self.ready = ready or (lambda status, _body: status == 200)
        self.artifacts = artifacts
        self.proc: subprocess.Popen | None = None
        self.exit_code: int | None = None
        self.log_digest: str | None = None
        self.startup_s: float | None = None
        self._log: BinaryIO | None = None

    # --- lifecycle ------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def command_line(self) -> str:
        return shlex.join(self.cmd)

    def start(self) -> ServerProcess:
        if self.proc is not None:
            raise HarnessError(f"{self.name}: already started (pid {self.proc.pid})")
        _install_safety_net()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log = self.log_path.open("ab", buffering=0)
        log.write(f"$ {self.command_line}\n".encode())
        env = {**os.environ, **self.env} if self.env is not None else None
        argv = self.cmd
        if self.sandbox is not None:  # an agent's engine (guard/engine_sandbox.py)
            try:
                argv, env = self.sandbox.wrap(self.cmd, self.env, self.cwd)
            except HarnessError:
                log.close()
                raise
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=env, cwd=self.cwd, preexec_fn=die_with_parent(),
            )
        except OSError as e:
            log.close()
            raise HarnessError(f"{self.name}: cannot run {self.cmd[0]!r}: {e.strerror}") from None
        with _LIVE_LOCK:
            _LIVE[self.proc.pid] = self
        return self

    def wait_ready(self) -> float:
        """Block until healthy; returns seconds taken. Fails at once if the server dies."""
        if self.proc is None:
            raise HarnessError(f"{self.name}: not started")
        t0 = time.monotonic()
        deadline = t0 + self.startup_timeout_s
        interval = 0.02
        try:
            while True:
                code = self.proc.poll()
                if code is not None:
                    self.exit_code = code
                    raise HarnessError(self._died_message("while starting"))
                status, body = http_get(self.health_url, timeout=2.0)
                if status and self.ready(status, body):
                    self.startup_s = time.monotonic() - t0
                    return self.startup_s
                if time.monotonic() > deadline:
                    raise HarnessError(
                        f"{self.name} (pid {self.proc.pid}) not healthy at {self.health_url} "
                        f"after {self.startup_timeout_s:.0f}s; log {self.log_path}:\n"
                        f"{tail(self.log_path)}")
                time.sleep(interval)  # poll interval of a wait loop, not a synchronization
                # At most 0.1 s between polls: a refused connect to a port on this host
                # costs microseconds, and a 0.5 s cap added up to half a second to every
                # start (and made start times coarse to measure).
                interval = min(0.1, interval * 1.5)
        except BaseException as e:
            self.stop(reason="failed-start" if isinstance(e, Exception) else exit_reason(type(e)))
            raise

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self, grace_s: float = 0.0) -> None:
        """Raise a HarnessError with the log tail if the server is no longer running.

        `grace_s`: after a failed request, the server may be dying but not yet reaped (a
        connection reset arrives before the exit status); wait up to this long for it."""
        if self.proc is None:
            raise HarnessError(f"{self.name}: not started")
        code = self.proc.poll()
        if code is None and grace_s > 0:
            try:
                code = self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                code = None
        if code is not None:
            self.exit_code = code
            raise HarnessError(self._died_message("while running"))

    def _died_message(self, when: str) -> str:
        code = self.exit_code
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        return (f"{self.name} (pid {self.pid}) exited {when} ({how}); last lines of "
                f"{self.log_path}:\n{tail(self.log_path)}")

    def stop(self, reason: str = "teardown") -> int | None:
        """Terminate the process group (TERM, then KILL after grace); idempotent."""
        proc = self.proc
        if proc is None:
            return None
        pgid = proc.pid  # start_new_session: pid == pgid
        try:
            if proc.poll() is None or group_alive(pgid):
                _signal_group(pgid, signal.SIGTERM)
                try:
                    proc.wait(timeout=self.grace_s)
                except subprocess.TimeoutExpired:
                    pass
                _wait_group_gone(pgid, self.grace_s)  # members other than the leader
                if group_alive(pgid) or proc.poll() is None:
                    _signal_group(pgid, signal.SIGKILL)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=5)
                    # The other members are killed too, but may still be exiting (on a busy
                    # host, for a moment): a stop returns when the group is gone, so the
                    # next start finds its port and its GPU memory free.
                    _wait_group_gone(pgid, 5.0)
            self.exit_code = proc.poll() if self.exit_code is None else self.exit_code
        finally:
            with _LIVE_LOCK:
                _LIVE.pop(proc.pid, None)
            if self._log is not None and not self._log.closed:
                with contextlib.suppress(OSError):
                    self._log.write(f"[forge] stopped ({reason}), exit code {self.exit_code}\n"
                                    .encode())
                self._log.close()
            if self.artifacts is not None and self.log_digest is None:
                with contextlib.suppress(Exception):
                    # The server may print its own environment's secrets (a profile's
                    # `config.env.MY_API_KEY`): redact their values too.
                    red = getattr(self.artifacts, "redactor", None)
                    red = red.for_env(self.env) if red is not None and self.env else None
                    self.log_digest = self.artifacts.put_file(self.log_path, redactor=red)
        return self.exit_code

    def __enter__(self) -> ServerProcess:
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, exc_type, *_exc: object) -> None:
        self.stop(reason=exit_reason(exc_type))


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def live_servers() -> list[ServerProcess]:
    with _LIVE_LOCK:
        return list(_LIVE.values())


def stop_all(reason: str = "exit") -> None:
    """Stop every server this process started and has not stopped yet."""
    for server in live_servers():
        with contextlib.suppress(Exception):
            server.stop(reason=reason)


def _die(signum, _frame) -> None:
    stop_all(reason=f"signal {signal.Signals(signum).name}")
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def exit_reason(exc_type: type[BaseException] | None) -> str:
    """The EngineStopped reason for leaving a `with` block with this exception (or none)."""
    if exc_type is None:
        return "teardown"
    if issubclass(exc_type, KeyboardInterrupt):
        return "interrupted"
    if issubclass(exc_type, SystemExit):
        return "terminated"
    return "error"


def _install_safety_net() -> None:
    global _SAFETY_NET_INSTALLED
    if _SAFETY_NET_INSTALLED:
        return
    _SAFETY_NET_INSTALLED = True
    atexit.register(stop_all, "exit")
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        previous = signal.getsignal(sig)
        if previous not in (signal.SIG_DFL, None):
            continue  # someone else handles it; atexit still covers a clean exit

        def handler(signum, _frame, _sig=sig):
            # First signal: unwind like Ctrl-C, so `with` blocks stop their servers and record
            # it; a second one (or a stuck unwind) stops every server and dies at once.
            signal.signal(_sig, _die)
            raise SystemExit(128 + signum)

        signal.signal(sig, handler)
