"""The sandbox (harness/guard/sandbox.py) attacked from inside a real sandboxed call, as a
hostile agent's command would: each escape runs as root and as an unprivileged user made for
the test (`useradd`, removed after; skipped locally where that cannot be done, a failure under
CI=true). The caller is a real forge process (`calls.run_tool`, started as that user, with a
planted API key in its environment and credentials in its workspace); the attack is told the
caller's pid, as a process on the host could find it.

Refused, each: remounting the root read-write, writing through `/proc/<forge>/root`, reading
`/proc/<forge>/environ`, unmounting the hidden credentials file, joining forge's network
namespace, pushing keystrokes into the terminal (TIOCSTI), signalling the user's other
processes, reading their command lines, and a `setsid` double-forked child outliving its call
(when the command returns, and when forge kills it on a timeout)."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import termios
import time
import tty
from dataclasses import dataclass
from pathlib import Path

import pytest
from infer_forge.harness.guard import sandbox as S
from infer_forge.ledger.workspace import init_workspace

from tests.conftest import need
from tests.helpers.sandboxed import processes_naming, still_alive

from .test_sandbox import Listener

SITE = sysconfig.get_paths()["purelib"]  # the venv's: the package and its dependencies

# The caller: forge's own tool-call path, run as the test's user, printing what it saw. The
# attack's argv names the caller's pid as {forge_pid} and its interpreter as {python}.
DRIVER = """\
import json, os, site, sys
site.addsitedir(sys.argv[1])
from pathlib import Path
from infer_forge.harness.tool_calls.calls import run_tool
from infer_forge.ledger.workspace import open_workspace
home, cwd, timeout, *argv = sys.argv[2:]
argv = [a.replace("{forge_pid}", str(os.getpid())).replace("{python}", sys.executable)
        for a in argv]
ws = open_workspace(Path(home))
run = run_tool(ws, argv, cwd=cwd, timeout=float(timeout) or None)
print(json.dumps({"code": run.returncode, "stdout": run.stdout, "stderr": run.stderr,
                  "error": run.event.error, "sandbox": run.event.sandbox}))
"""

API_KEY = "REDTEAM_API_KEY"  # planted in the caller's environment; never given to the call


@dataclass
class User:
    name: str
    uid: int
    gid: int
    python: str  # an interpreter this user may run


def _as(user: User | None) -> list[str]:
    if user is None:
        return []
    return ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--"]


def _python_for(user: User) -> str | None:
    """sys.executable when the user can run it with the package, else the system's Python of
    the same version (a venv under /root is not the user's to run)."""
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    for exe in (sys.executable, f"/usr/bin/python{ver}", f"/usr/local/bin/python{ver}"):
        if not os.path.exists(exe):
            continue
        # (exec may find a path the process then cannot stat: forge checks it does exist)
        p = subprocess.run([*_as(user), exe, "-c", f"import site; site.addsitedir({SITE!r}); "
                            "import infer_forge.harness.tool_calls.calls, os, sys; "
                            "assert os.access(sys.executable, os.X_OK)"],
                           capture_output=True, cwd="/", timeout=60)
        if p.returncode == 0:
            return exe
    return None


@pytest.fixture(scope="module")
def redteam_user():
    """An unprivileged user of its own (None, with why, where one cannot be made here)."""
    if os.geteuid() != 0:
        yield None, "making a user for the test needs root"
        return
    if not (shutil.which("useradd") and shutil.which("userdel") and shutil.which("setpriv")):
        yield None, "useradd, userdel and setpriv are needed to run as another user"
        return
    name = "forge-redteam-" + secrets.token_hex(3)
    p = subprocess.run(["useradd", "--system", "--no-create-home", "--shell",
                        "/usr/sbin/nologin", name], capture_output=True, text=True)
    if p.returncode != 0:
        yield None, f"useradd failed: {p.stderr.strip()}"
        return
    pw = pwd.getpwnam(name)
    try:
        user = User(name, pw.pw_uid, pw.pw_gid, "")
        python = _python_for(user)
        if python is None:
            yield None, f"no Python that {name} may run can import infer_forge"
        else:
            user.python = python
            yield user, ""
    finally:
        # Whatever of its processes a failed test left (the user is the test's alone), then
        # the user; a user that cannot be removed fails the run rather than piling up.
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and d.stat().st_uid == pw.pw_uid:
                    os.kill(int(d.name), signal.SIGKILL)
            except OSError:
                pass
        for _ in range(100):
            p = subprocess.run(["userdel", name], capture_output=True, text=True)
            if p.returncode != 8:  # 8: still used by a process (a dying one)
                break
            time.sleep(0.05)
        assert p.returncode == 0, f"userdel {name}: {p.stderr.strip()}"


class Box:
    """A workspace owned by `user` (None: root), with planted credentials, and the caller."""

    def __init__(self, user: User | None) -> None:
        self.user = user
        self.python = user.python if user else sys.executable
        self.dir = Path(tempfile.mkdtemp(prefix="forge-redteam-")).resolve()
        self.home, self.work, self.outside = (self.dir / "home", self.dir / "work",
                                              self.dir / "outside")
        ws, _ = init_workspace(self.home)
        ws.close()
        self.work.mkdir()
        self.outside.mkdir()  # the user's own directory: writable to them, not to the call
        self.key = "sk-" + secrets.token_hex(16)
        self.cred = "cred-" + secrets.token_hex(16)
        (self.home / "credentials.toml").write_text(f'[hf]\ntoken = "{self.cred}"\n')
        if user is not None:
            for p in [self.dir, *self.dir.rglob("*")]:
                os.lchown(p, user.uid, user.gid)
        os.chmod(self.dir, 0o755)
        self.procs: list[subprocess.Popen] = []

    def spawn(self, argv: list[str], **kw) -> subprocess.Popen:
        """A process of the user's (their other work on this machine)."""
        p = subprocess.Popen([*_as(self.user), *argv], cwd=self.dir, **kw)
        self.procs.append(p)
        return p

    def call(self, attack: str, *, timeout: float = 0, tty_fd: int | None = None) -> dict:
        """Run `attack` (Python) as a sandboxed tool call of a forge process of the user's;
        returns what the call printed last (its JSON verdict) with the run's record."""
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(self.dir),
               "LANG": "C.UTF-8", API_KEY: self.key, "FORGE_HOME": str(self.home)}
        argv = [*_as(self.user), self.python, "-c", DRIVER, SITE, str(self.home),
                str(self.work), str(timeout), "{python}", "-c", attack]
        if tty_fd is None:
            p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=self.dir,
                               stdin=subprocess.DEVNULL, start_new_session=True, timeout=120)
        else:  # the terminal is the caller's controlling one, as in a user's shell
            def ctty() -> None:
                os.setsid()
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)

            p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=self.dir,
                               stdin=tty_fd, preexec_fn=ctty, timeout=120)
        assert p.returncode == 0 and p.stdout.strip(), p.stderr
        run = json.loads(p.stdout.strip().splitlines()[-1])
        assert run["sandbox"]["kind"] == "bwrap", run["sandbox"]  # it ran sandboxed
        lines = run["stdout"].strip().splitlines()
        run["verdict"] = json.loads(lines[-1]) if lines else None
        return run

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(params=["root", "user"])
def box(request, redteam_user):
    need(shutil.which("bwrap") is not None and S.find_bwrap()[0] is not None,
         "bubblewrap (bwrap) with working namespaces is required (.ci/run installs it)")
    if request.param == "root":
        need(os.geteuid() == 0, "the escapes as root need the tests to run as root")
        b = Box(None)
    else:
        user, why = redteam_user
        need(user is not None, f"the escapes as an unprivileged user: {why}")
        b = Box(user)
    yield b
    b.close()


def verdict(code: str) -> str:
    """An attack's body (it sets `escaped` and `how`) as a program printing its verdict."""
    return ("import json, os, subprocess, sys\nescaped, how = False, ''\n" + code
            + "\nprint(json.dumps({'escaped': escaped, 'how': str(how)[-300:]}))\n")


def refused(run: dict) -> None:
    assert run["verdict"] is not None, run
    assert run["verdict"]["escaped"] is False, run["verdict"]


# --- the escapes, as root and as the user --------------------------------------------------


def test_remounting_the_root_read_write_is_refused(box):
    target = box.outside / "planted-by-remount"
    run = box.call(verdict(f"""
target = {str(target)!r}
mp = os.path.dirname(target)
while not os.path.ismount(mp):
    mp = os.path.dirname(mp)
for cmd in (["mount", "-o", "remount,rw", "/"], ["mount", "-o", "remount,bind,rw", mp],
            ["unshare", "-Um", "mount", "-o", "remount,bind,rw", mp]):
    r = subprocess.run(cmd, capture_output=True, text=True)
    how += f"{{cmd[-2:]}}: {{r.returncode}} {{r.stderr.strip()}}; "
    try:
        open(target, "w").write("x")
        escaped = True
        break
    except OSError:
        pass
"""))
    refused(run)
    assert not target.exists()


def test_writing_through_forges_proc_root_is_refused(box):
    target = box.outside / "planted-through-proc"
    run = box.call(verdict(f"""
try:
    open("/proc/{{forge_pid}}/root" + {str(target)!r}, "w").write("x")
    escaped = True
except OSError as e:
    how = e
"""))
    refused(run)
    assert not target.exists()


def test_reading_forges_environment_is_refused(box):
    run = box.call(verdict(f"""
assert {API_KEY!r} not in os.environ  # never given to the call
for pid in ["{{forge_pid}}"] + [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        env = open(f"/proc/{{pid}}/environ", "rb").read()
    except OSError as e:
        how = e
        continue
    if b{API_KEY!r} in env:
        escaped, how = True, pid
        break
"""))
    refused(run)
    assert box.key not in run["stdout"] + run["stderr"]


def test_unmounting_the_hidden_credentials_is_refused(box):
    cred = box.home / "credentials.toml"
    run = box.call(verdict(f"""
cred = {str(cred)!r}
assert open(cred).read() == ""  # hidden: it reads as empty
for cmd in (["umount", cred], ["umount", "-l", cred], ["unshare", "-Um", "umount", cred]):
    r = subprocess.run(cmd, capture_output=True, text=True)
    how += f"{{cmd[0:2]}}: {{r.returncode}} {{r.stderr.strip()}}; "
    if open(cred).read():
        escaped = True
        break
"""))
    refused(run)
    assert str(cred) in run["sandbox"]["hidden"]


def test_joining_forges_network_namespace_is_refused(box):
    srv = Listener()
    try:
        connect = (f"import socket; s = socket.create_connection(('127.0.0.1', {srv.port}), "
                   "timeout=5); print(s.recv(16).decode().strip())")
        run = box.call(verdict(f"""
r = subprocess.run(["nsenter", "--net=/proc/{{forge_pid}}/ns/net", sys.executable, "-c",
                    {connect!r}], capture_output=True, text=True)
escaped, how = r.stdout.strip() == "hello", (r.returncode, r.stderr.strip())
"""))
        refused(run)
        assert srv.accepted == 0
    finally:
        srv.close()


def test_pushing_keystrokes_into_the_terminal_is_refused(box):
    """TIOCSTI on the caller's controlling terminal (the call's stdin, and /dev/tty) would
    queue input that the user's shell reads after forge exits."""
    master, slave = os.openpty()
    try:
        tty.setraw(slave)  # a queued byte is readable as it is
        run = box.call(verdict("""
import fcntl, termios
for name in ("stdin", "/dev/tty"):
    try:
        fd = 0 if name == "stdin" else os.open(name, os.O_RDWR)
        fcntl.ioctl(fd, termios.TIOCSTI, b"Z")
        escaped, how = True, name
    except OSError as e:
        how += f"{name}: {e}; "
"""), tty_fd=slave)
        refused(run)
        os.set_blocking(slave, False)
        try:
            queued = os.read(slave, 64)
        except BlockingIOError:
            queued = b""
        assert queued == b""  # nothing waits for the user's shell
    finally:
        os.close(master)
        os.close(slave)


def test_signalling_the_users_other_processes_is_refused(box):
    victim = box.spawn(["sleep", "300"])
    run = box.call(verdict(f"""
import signal
try:
    os.kill({victim.pid}, signal.SIGKILL)
    escaped = True
except OSError as e:
    how = e
"""))
    refused(run)
    assert victim.poll() is None  # it still runs


def test_the_users_other_command_lines_are_not_visible(box):
    marker = "redteam-marker-" + secrets.token_hex(6)
    box.spawn([box.python, "-c", "import time; time.sleep(300)", marker])  # one process
    deadline = time.monotonic() + 10
    while not processes_naming(marker):  # on the host it is there to see, once started
        assert time.monotonic() < deadline, "the marker process never started"
        time.sleep(0.02)
    run = box.call(verdict(f"""
marker = {marker[::-1]!r}[::-1]  # not spelled out in this program's own command line
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        if marker.encode() in open(f"/proc/{{pid}}/cmdline", "rb").read():
            escaped, how = True, pid
    except OSError:
        pass
r = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True)
escaped = escaped or marker in r.stdout
how = how or f"{{len(r.stdout.splitlines())}} lines of ps"
"""))
    refused(run)


LINGER = """
marker = {marker!r}
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(107)",
                                  marker])
    os._exit(0)
os.wait()
how = "left a setsid grandchild"
"""


def test_a_setsid_child_does_not_outlive_its_call(box):
    marker = "redteam-linger-" + secrets.token_hex(6)
    try:
        run = box.call(verdict(LINGER.format(marker=marker)))
        assert run["code"] == 0 and run["verdict"]["how"] == "left a setsid grandchild"
        assert still_alive(processes_naming(marker)) == []  # gone when the call returned
    finally:
        for pid in still_alive(processes_naming(marker)):
            os.kill(pid, signal.SIGKILL)


def test_a_setsid_child_does_not_outlive_a_call_killed_on_timeout(box):
    marker = "redteam-linger-" + secrets.token_hex(6)
    try:
        run = box.call(verdict(LINGER.format(marker=marker))
                       + "\nimport time\ntime.sleep(300)\n", timeout=3)
        assert run["code"] is not None and run["error"] == "timed out after 3.0s"
        deadline = time.monotonic() + 10  # killed with the call; reaped by the kernel
        while still_alive(processes_naming(marker)):
            assert time.monotonic() < deadline, "the setsid child outlived its killed call"
            time.sleep(0.02)
    finally:
        for pid in still_alive(processes_naming(marker)):
            os.kill(pid, signal.SIGKILL)


# --- a host where the whole sandbox cannot be made ------------------------------------------


def test_a_host_without_pid_namespaces_gets_no_weaker_sandbox(workspace, tmp_path, monkeypatch,
                                                              capsys):
    """A bwrap that can make every namespace but a pid one (a container that forbids it): the
    probe tries the whole flag set, so `auto` runs the call unsandboxed saying why, and
    `required` refuses; no call runs in a sandbox without its pid namespace."""
    real = shutil.which("bwrap")
    need(real is not None, "bubblewrap (bwrap) is required (.ci/run installs it)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "bwrap"
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do\n  if [ \"$a\" = --unshare-pid ]; then\n"
                    "    echo 'bwrap: Creating new namespace failed: Operation not permitted'"
                    " >&2\n    exit 1\n  fi\ndone\n"
                    f"exec {real} \"$@\"\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    from infer_forge.harness.errors import HarnessError
    from infer_forge.harness.tool_calls.calls import run_tool

    from .test_sandbox import set_guard

    run = run_tool(workspace, ["true"], cwd=tmp_path)
    assert run.returncode == 0 and run.event.sandbox["kind"] == "none"
    assert "Creating new namespace failed" in run.event.sandbox["reason"]
    assert "tool call runs unsandboxed" in capsys.readouterr().err
    set_guard(workspace, sandbox="required")
    with pytest.raises(HarnessError, match='sandbox = "required".*Creating new namespace'):
        run_tool(workspace, ["true"], cwd=tmp_path)
