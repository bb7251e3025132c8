"""Tool calls: run a command and describe it as a `ToolInvoked` event (argv, cwd, environment
digest without secret values, exit code, duration, stdout/stderr as artifacts, repo state).

`run_tool` never raises for a command that fails or cannot start: the failure is recorded
(exit code, error). It does not save: callers put the event into their step's one save.

Every call runs through the Safety Guard's environment isolation (harness/guard/sandbox.py:
an allowlisted environment, bubblewrap where the host has it); its profile is the event's
`sandbox`. The one exception it raises: HarnessError when forge.toml requires the sandbox
and this host cannot make one (nothing runs).

Sizes (what a command prints comes from outside): its output is read in chunks and streamed
to a temporary file, then to the artifact store (redacted as a stream), never held whole:
memory stays bounded whatever it prints. The artifact keeps the first `STORE_BYTES` of each
stream; `ToolRun.stdout`/`stderr` hold the first `KEEP_BYTES` and the last `TAIL_BYTES`
(the last lines: a policy's JSON answer, a step's tail). Whatever was cut is marked in
place, `…[truncated: <size> bytes, sha256:<digest of the whole stream>]` (ledger/sizes.py),
and the call is recorded all the same. Each argv element is capped at `ARG_BYTES` alike.

What an agent reads back (`output_tail`, for `run_command`): each stream's redacted text, its
last `OUTPUT_BYTES` only (at most `OUTPUT_JSON_CHARS` as JSON), with how many bytes the
command printed and how many were cut before the part shown; the whole is the stream's
artifact.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ...ledger import events as E
from ...ledger.archives import ArchiveError
from ...ledger.clock import digest
from ...ledger.secrets.names import is_secret_name
from ...ledger.secrets.redactor import Redactor
from ...ledger.sizes import capped, tail, truncated
from ...ledger.specs import SandboxSpec
from ...ledger.workspace import Workspace
from ...repos.git import untrusted_state
from ..guard.sandbox import SandboxProfile, missing_program, prepare
from ..proc import kill_group, session_launch


@dataclass(frozen=True)
class ToolRun:
    event: E.ToolInvoked
    returncode: int | None
    stdout: str  # redacted; the head and tail when it was over KEEP_BYTES (module doc)
    stderr: str
    stdout_bytes: int = 0  # what the command printed on each stream, in bytes
    stderr_bytes: int = 0


class _NotStarted(Exception):
    pass


def env_digest(env: Mapping[str, str], secret_names: Sequence[str] = ()) -> str:
    """Digest of the environment; values of secret-named variables (configured, or by the one
    rule `ledger.secrets.names.is_secret_name`) are never hashed in (a hash of a short secret
    could be brute-forced), only the fact that they were set."""
    secret = set(secret_names)
    items = {}
    for k, v in env.items():
        looks_secret = k in secret or is_secret_name(k)
        items[k] = "<set>" if looks_secret else hashlib.sha256(v.encode()).hexdigest()
    return digest(items)


def capture_redactor(ws: Workspace | None, env: Mapping[str, str]) -> Redactor:
    """The redactor for output captured from a child process with environment `env`: the
    workspace's (configured secrets, provider patterns, secret-named variables of this
    process) plus the values of the child's own secret-named variables, so that `forge run
    -- env` stores `MY_API_KEY=[REDACTED…]` even when the variable was set for the child only.
    """
    if ws is None:
        return Redactor().for_env(env, ())
    return ws.ledger.redactor.for_env(env, tuple(ws.config.secret_env))


def repo_digest(cwd: str | Path) -> str | None:
    """Digest of HEAD + working-tree status + diff when `cwd` is inside a git work tree. The
    call that ran there may have made that repository and its config: git runs as
    repos/git.py `untrusted_state` says (no hook, fsmonitor, filter or driver of its)."""
    state = untrusted_state(cwd)
    return digest(state) if state is not None else None


KEEP_BYTES = 4 << 20  # the head of a stream kept in ToolRun.stdout / stderr
TAIL_BYTES = 64 << 10  # and its tail
STORE_BYTES = 256 << 20  # what the artifact keeps of one stream
OUTPUT_BYTES = 8 << 10  # what an agent reads back of each stream (its tail)
OUTPUT_JSON_CHARS = 16_000  # and at most, as JSON (a control byte is written as 6)
ARG_BYTES = 128 << 10  # an argv element as recorded (the kernel's own limit per argument)
_READ = 1 << 16


class _Capture:
    """One output stream of a call, read as it comes: all of it hashed and counted, its
    first STORE_BYTES in a temporary file (for the artifact store), its head and tail in
    memory."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        self.sha = hashlib.sha256()
        self.size = 0
        self.head = bytearray()
        self.tail = bytearray()
        self.keep, self.tail_keep, self.store = KEEP_BYTES, TAIL_BYTES, STORE_BYTES

    def write(self, b: bytes) -> None:
        self.sha.update(b)
        if self.size < self.store:
            self.file.write(b[:self.store - self.size])
        if len(self.head) < self.keep:
            self.head += b[:self.keep - len(self.head)]
        self.size += len(b)
        self.tail += b
        if len(self.tail) > 2 * self.tail_keep:
            del self.tail[:-self.tail_keep]

    def mark(self) -> str:
        return truncated(self.size, self.sha.hexdigest())

    def text(self) -> str:
        """All of it when it was at most KEEP_BYTES, else head + mark + tail."""
        if self.size <= self.keep:
            return bytes(self.head).decode("utf-8", "replace")
        tail = bytes(self.tail[-min(self.tail_keep, self.size - self.keep):])
        return (bytes(self.head).decode("utf-8", "ignore") + "\n" + self.mark() + "\n"
                + tail.decode("utf-8", "ignore"))

    def chunks(self) -> Iterator[bytes]:
        """What the artifact store keeps: the first STORE_BYTES, then the mark if cut."""
        self.file.seek(0)
        while chunk := self.file.read(1 << 20):
            yield chunk
        if self.size > self.store:
            yield ("\n" + self.mark() + "\n").encode()

    def close(self) -> None:
        self.file.close()


def _pump(src: IO[bytes], sink: _Capture, echo: IO[str] | None) -> None:
    raw = getattr(echo, "buffer", None)
    read = getattr(src, "read1", src.read)
    while chunk := read(_READ):
        sink.write(chunk)
        if raw is not None:
            raw.write(chunk)
            raw.flush()
        elif echo is not None:  # a text stream without bytes (a test's capture)
            echo.write(chunk.decode("utf-8", "replace"))
            echo.flush()
    src.close()


@dataclass
class Captured:
    """A process run by `run_captured`: its exit code and its two streams (close them)."""

    returncode: int | None
    stdout: _Capture
    stderr: _Capture
    timed_out: bool = False

    def close(self) -> None:
        self.stdout.close()
        self.stderr.close()


def _attend(proc: subprocess.Popen[bytes], out: _Capture, err: _Capture, input: str | None,
            tee: bool = False) -> list[threading.Thread]:
    """Pump the child's stdout and stderr into `out` and `err` (and on to forge's own when
    `tee`) and feed it `input`; the pumping threads, to join once the child has exited."""
    threads = [threading.Thread(target=_pump, args=(proc.stdout, out, sys.stdout if tee
                                                    else None), daemon=True),
               threading.Thread(target=_pump, args=(proc.stderr, err, sys.stderr if tee
                                                    else None), daemon=True)]
    for t in threads:
        t.start()
    if input is not None and proc.stdin is not None:
        try:
            proc.stdin.write(input.encode("utf-8"))
            proc.stdin.close()
        except BrokenPipeError:
            pass
    return threads


def run_captured(argv: Sequence[str], *, cwd: str | Path, env: Mapping[str, str],
                 input: str | None = None, timeout: float | None = None) -> Captured:
    """Run `argv` (already prepared: sandboxed) with its output captured as `run_tool`
    captures it, in bounded memory (module doc, Sizes); a timeout kills the process.
    OSError from starting it (a missing program) is the caller's."""
    out, err = _Capture(), _Capture()
    proc = subprocess.Popen(list(argv), cwd=cwd, env=dict(env),
                            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    threads = _attend(proc, out, err, input)
    timed_out = False
    try:
        code: int | None = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code, timed_out = None, True
    for t in threads:
        t.join()
    return Captured(code, out, err, timed_out)


def store_capture(store: Any, capture: _Capture, red: Redactor) -> str:
    """The artifact of one stream; a compressed stream that cannot be redacted (damaged,
    a bomb: ledger/archives.py) is not stored: a line saying why, with the mark, is."""
    try:
        return store.put_stream(capture.chunks(), redactor=red)
    except ArchiveError as e:
        return store.put(f"[output not stored: {e}] {capture.mark()}\n", redactor=red)


def run_tool(
    ws: Workspace | None,
    argv: Sequence[str],
    *,
    tool: str | None = None,
    cwd: str | Path | None = None,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    tee: bool = False,
    event_fields: Mapping[str, Any] | None = None,
    on_start: Callable[[int], None] | None = None,
    own_session: bool = False,
    task: str | None = None,
    sandbox: SandboxSpec | None = None,
    prepared: SandboxProfile | None = None,
) -> ToolRun:
    """Run `argv`; return the `ToolInvoked` event (not saved) and the captured output.

    `tee` streams stdout/stderr through to this process's own while capturing.
    `own_session`: the command runs in its own session and dies with this process, and a
    timeout kills its whole process group (not only `argv[0]`: a shell's children too).
    `env`: what forge sets for the child, on top of the allowlist. `task` (else
    `event_fields["task_id"]`) and `sandbox` (the task's `SandboxSpec`) shape the sandbox;
    `prepared`: `argv` and `env` come from `sandbox.prepare` already (the build's
    supervisor wraps the sandboxed command), run as they are."""
    argv = [str(a) for a in argv]
    cwd = str(Path(cwd or os.getcwd()).resolve())
    if prepared is None:
        task = task or (event_fields or {}).get("task_id")
        launch_argv, full_env, profile = prepare(ws, argv, cwd=cwd, task=task, env=env,
                                                 spec=sandbox)
    else:
        launch_argv, full_env, profile = argv, dict(env or {}), prepared
    secret_names = tuple(ws.config.secret_env) if ws is not None else ()
    out, err = _Capture(), _Capture()
    code: int | None = None
    error: str | None = None
    t0 = time.monotonic()
    launch = launch_argv
    guard: dict[str, Any] = {}
    if own_session:
        launch, guard = session_launch(launch_argv)
    # Inside a sandbox it is bwrap that would fail to start a missing program: said here.
    missing = missing_program(argv, full_env, Path(cwd)) \
        if profile.kind == "bwrap" and prepared is None else None
    try:
        if missing:
            raise _NotStarted(missing)
        # Never forge's own stdin: under `forge mcp` it carries the client's requests, under
        # `forge run` what the person types; a call reads `input` or nothing.
        proc = subprocess.Popen(launch, cwd=cwd, env=full_env,
                                stdin=subprocess.PIPE if input is not None else
                                subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, **guard)
    except _NotStarted as e:
        error = str(e)
    except OSError as e:
        error = f"cannot start {argv[0]}: {e.strerror or e}"
    else:
        if on_start:
            on_start(proc.pid)
        threads = _attend(proc, out, err, input, tee)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            if own_session:
                kill_group(proc.pid)
            else:
                proc.kill()
            code = proc.wait()
            error = f"timed out after {timeout}s"
        for t in threads:
            t.join()
    duration = time.monotonic() - t0
    # What the child saw of its environment may be in its output (and in argv, expanded by a
    # shell): redacted with the child's secret values before anything keeps it.
    red = capture_redactor(ws, full_env)
    stdout, stderr = red.text(out.text()), red.text(err.text())
    store = ws.artifacts if ws is not None else None
    try:
        stdout_digest = store_capture(store, out, red) if store is not None else None
        stderr_digest = store_capture(store, err, red) if store is not None and err.size else None
    finally:
        out.close()
        err.close()
    ev = E.ToolInvoked(
        tool=red.text(capped(tool or Path(argv[0]).name, ARG_BYTES)),
        argv=red.value([capped(a, ARG_BYTES) for a in argv]),
        cwd=cwd,
        env_digest=env_digest(full_env, secret_names),
        exit_code=code,
        duration_s=round(duration, 6),
        stdout_digest=stdout_digest,
        stderr_digest=stderr_digest,
        repo_digest=repo_digest(cwd),
        error=red.text(error) if error else error,
        sandbox=profile.record(),
        **dict(event_fields or {}),
    )
    return ToolRun(ev, code, stdout, stderr, out.size, err.size)


def output_tail(run: ToolRun, limit: int = OUTPUT_BYTES) -> dict[str, Any]:
    """What an agent reads back of a call's output, per stream (`stdout`, `stderr`): the
    redacted text's last `limit` bytes (fewer where its JSON would be over
    `OUTPUT_JSON_CHARS`: the answer stays whole in one tool result), `<stream>_bytes` (what
    the command printed) and `<stream>_cut` (the bytes before the part shown that were left
    out; 0: all of it). The whole stream is its artifact (`<stream>_digest` on the
    event)."""
    out: dict[str, Any] = {}
    for name, text, printed in (("stdout", run.stdout, run.stdout_bytes),
                                ("stderr", run.stderr, run.stderr_bytes)):
        shown, cut = tail(text, limit)
        n = limit
        while (chars := len(json.dumps(shown))) > OUTPUT_JSON_CHARS:  # controls, non-ASCII
            n = max(1, int(n * OUTPUT_JSON_CHARS / chars * 0.9))
            shown, cut = tail(text, n)
        if printed > KEEP_BYTES:  # the text is the head, a mark and the tail: count the whole
            cut = max(0, printed - len(shown.encode("utf-8", "surrogatepass")))
        out[name], out[f"{name}_bytes"], out[f"{name}_cut"] = shown, printed, cut
    return out
