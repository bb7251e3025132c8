"""Server lifecycle: crash during start, crash mid-run, Ctrl-C/SIGTERM/SIGKILL of the forge
process — a clear error every time and no orphan (checked in the process table)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from infer_forge.harness.engines.base import request_json
from infer_forge.harness.engines.process import ServerProcess, free_port, http_get
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.proc import group_alive

from tests.conftest import REPO, TESTS

DATA = TESTS / "data"
FAKE = DATA / "sglang" / "fake_server.py"
DRIVER = DATA / "engines" / "driver.py"


def wait_gone(pgid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        time.sleep(0.05)
    return False


def fake_server(tmp_path: Path, mode: str = "ok", **kw) -> ServerProcess:
    port = free_port()
    return ServerProcess([sys.executable, str(FAKE), "--port", str(port)],
                         health_url=f"http://127.0.0.1:{port}/health_generate",
                         log_path=tmp_path / "server.log", env={"FAKE_SGLANG_MODE": mode},
                         name="fake sglang", **kw)


def test_crash_during_start_fails_at_once_with_log_tail(tmp_path):
    server = fake_server(tmp_path, "crash", startup_timeout_s=120)
    t0 = time.monotonic()
    with pytest.raises(HarnessError) as e, server:
        server.wait_ready()
    assert time.monotonic() - t0 < 30  # not the 120 s deadline
    msg = str(e.value)
    assert "exited while starting (exit code 1)" in msg
    assert "torch.OutOfMemoryError: CUDA out of memory" in msg
    assert not group_alive(server.pid)
    log = (tmp_path / "server.log").read_text()
    assert log.startswith("$ " + server.command_line)
    assert "[forge] stopped (failed-start)" in log


def test_not_healthy_by_deadline_is_stopped(tmp_path):
    server = fake_server(tmp_path, "slow:100000", startup_timeout_s=1.5)
    with pytest.raises(HarnessError, match=r"not healthy at .*/health_generate after 2s"):
        server.start().wait_ready()
    assert not group_alive(server.pid)


def test_stop_kills_the_whole_group_and_escalates_to_sigkill(tmp_path):
    """A server that ignores SIGTERM and has a child: both are gone after stop()."""
    port = free_port()
    script = (
        "import signal, subprocess, sys, http.server\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal,time;"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        "print('CHILD' + 'PID', child.pid, flush=True)\n"
        f"http.server.HTTPServer(('127.0.0.1', {port}), http.server.SimpleHTTPRequestHandler)"
        ".serve_forever()\n")
    server = ServerProcess([sys.executable, "-c", script], health_url=f"http://127.0.0.1:{port}/",
                           log_path=tmp_path / "s.log", cwd=tmp_path, grace_s=1.0)
    with server:
        server.wait_ready()
        child = int((tmp_path / "s.log").read_text().split("CHILDPID ")[1].split()[0])
        assert os.getpgid(child) == server.pid
    assert server.exit_code == -signal.SIGKILL
    assert not group_alive(server.pid)


def test_crash_mid_run_is_a_clear_error(tmp_path):
    """The server dies while a request loop runs: the loop's failure turns into an error
    naming the dead server and its log, not a bare connection error."""
    server = fake_server(tmp_path)
    with server:
        server.wait_ready()
        url = server.health_url.rsplit("/", 1)[0]
        seen = 0
        with pytest.raises(HarnessError) as e:
            while True:
                try:
                    request_json("GET", url + "/model_info", timeout=5)
                    seen += 1
                except HarnessError:
                    # The request failed: is the server still there? (It may be dying.)
                    server.check(grace_s=5)
                    raise
                if seen == 3:
                    os.kill(server.pid, signal.SIGKILL)
    assert seen == 3
    assert "exited while running (killed by signal 9)" in str(e.value)
    assert "[fake sglang]" in str(e.value)  # the log tail
    assert not group_alive(server.pid)


def start_driver(kind: str, target: Path, logs: Path) -> tuple[subprocess.Popen, int]:
    p = subprocess.Popen([sys.executable, str(DRIVER), kind, str(target), str(logs)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=str(REPO))
    line = p.stdout.readline()  # blocks until the engine is ready (or the driver died)
    if not line.startswith("READY "):
        p.kill()
        pytest.fail(f"driver did not start: {line!r} {p.stderr.read()}")
    return p, int(line.split()[1])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_orphan_when_forge_process_is_signalled(tmp_path, sig):
    """Ctrl-C (KeyboardInterrupt unwinds the with-block), SIGTERM (the safety-net handler),
    SIGKILL (PR_SET_PDEATHSIG): the server's process group is gone each time."""
    p, server_pid = start_driver("sglang", FAKE, tmp_path)
    assert group_alive(server_pid)
    p.send_signal(sig)
    p.wait(timeout=30)
    assert wait_gone(server_pid), f"server group {server_pid} survived {sig.name}"
    log = next(tmp_path.glob("sglang-*.log")).read_text()
    if sig == signal.SIGINT:
        assert "[forge] stopped (interrupted)" in log
    elif sig == signal.SIGTERM:
        assert "[forge] stopped (terminated)" in log  # unwound through the with-block


def test_ctrl_c_with_a_real_hf_server(tmp_path, tiny_model):
    p, server_pid = start_driver("hf", tiny_model, tmp_path)
    port = int(next(tmp_path.glob("hf-*.log")).name.split("-")[1])
    assert request_json("GET", f"http://127.0.0.1:{port}/health") == {"status": "ok"}
    p.send_signal(signal.SIGINT)
    p.wait(timeout=60)
    assert wait_gone(server_pid)
    assert "[forge] stopped (interrupted)" in next(tmp_path.glob("hf-*.log")).read_text()


def test_a_health_poll_answered_by_something_not_http_is_not_ready(tmp_path):
    """A health poll that reads something other than an HTTP status line (its own request,
    when the socket connected to itself on a port nobody listens on yet) is "not ready",
    never an exception out of the poll."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def answer() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")

    t = threading.Thread(target=answer)
    t.start()
    try:
        assert http_get(f"http://127.0.0.1:{port}/health", timeout=5) == (0, b"")
    finally:
        t.join(10)
        srv.close()
