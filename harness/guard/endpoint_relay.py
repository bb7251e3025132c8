"""Listed endpoints: the narrow network allowance of a sandboxed tool call. A task's
`sandbox.endpoints` (servers on this host's loopback, `ledger.specs.SandboxSpec`) lets its
calls reach exactly those host:ports while the call keeps its own network namespace
(bubblewrap's `--unshare-net`: loopback only, nothing else).

Contract:
- `plan(ws, argv, endpoints, network=, task=)` (used by `sandbox.prepare` on the bubblewrap
  path) returns `Wrapped(outer, inner)`: `inner` replaces the call's argv inside bwrap (the
  forwarder, harness/guard/endpoint_forward.py, before the command), `outer` goes before
  bwrap (this module's `main`, forge's side). Both are empty when nothing is relayed and
  there is nothing to say. Raises HarnessError (one line) for an endpoint it cannot relay.
- Inside: the forwarder listens on each endpoint's host:port on the sandbox's loopback
  (`localhost`: 127.0.0.1 and ::1), bound before the command starts, and hands each
  connection to forge's side through a UNIX socket in a private directory (`relay_parent`:
  0700, outside every writable directory of the call, read-only inside).
- Outside (`main`): forge's side holds the sockets and joins each connection to the real
  endpoint, at the address resolved once when the call was prepared; a TCP relay, so
  streaming (SSE) and TLS pass as they are. An endpoint marked production (`[guard]
  production_endpoints`) gets what the production guard allows: each request's head is read
  and `production.check`ed before it is passed on (reads pass; anything else refused,
  recorded as ProductionRefused on the `guard` stream naming the task, and answered 403 with
  the guard's line); production over https is refused at `plan` (its requests cannot be
  read). An endpoint that does not answer: one line on the call's stderr, the connection
  closed.
- Lifetime: forge's side is the process forge starts for the call; bwrap is its child
  (`--die-with-parent`), the forwarder bwrap's. When the command exits the forwarder exits
  with its code, bwrap with it, then forge's side (same code) after closing its sockets and
  removing their directory. A kill of forge's side (a timeout, a teardown) takes bwrap and
  the whole sandbox with it; nothing of the call outlives it (its socket directory, left by a
  SIGKILL, is removed by the next relayed call).
- A call whose network is off that names servers it does not reach (`reach.named_endpoints`:
  URLs in its arguments, SGLang's bench client's target) gets, when it fails, one line on its
  stderr naming them and the YAML that grants them (`hint`).
- Without bubblewrap there is no relay: `[guard] sandbox = "auto"` runs the call unsandboxed
  (network on, as every unsandboxed call), `required` refuses it, `off` is forge's own
  environment; the profile says which.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import HarnessError
from ..proc import alive
from . import endpoint_forward as F
from . import reach
from .addresses import resolve

FORWARDER = Path(F.__file__).resolve()
_MODULE = __name__  # run as `python -m` for forge's side
_CONNECT_TIMEOUT_S = 10.0
_HEAD_MAX = 64 * 1024


@dataclass(frozen=True)
class Wrapped:
    outer: list[str]  # before bwrap: forge's side ([] when nothing is relayed)
    inner: list[str]  # inside bwrap, before the command ([] when there is nothing to do)


def listen_addresses(endpoint: str) -> list[tuple[str, int]]:
    """Where the forwarder listens for `endpoint` inside the sandbox."""
    host, port = reach.host_port(endpoint)
    if host == "localhost":
        return [("127.0.0.1", port), ("::1", port)]
    return [(host, port)]


def _connect_address(endpoint: str) -> tuple[str, int]:
    """Where a client naming `endpoint` connects (0.0.0.0 and localhost: 127.0.0.1)."""
    host, port = reach.host_port(endpoint)
    return ("127.0.0.1" if host in ("localhost", "0.0.0.0") else host), port


def grant_yaml(endpoints: Sequence[str]) -> str:
    return f"sandbox: {{endpoints: [{', '.join(endpoints)}]}}"


def hint(argv: Sequence[str], endpoints: Sequence[str]) -> str | None:
    """The line a failed call with its network off gets (module contract), or None."""
    reached = {a for e in endpoints for a in listen_addresses(e)}
    missing = [e for e in reach.named_endpoints(argv) if _connect_address(e) not in reached]
    if not missing:
        return None
    local = [e.replace("://0.0.0.0:", "://127.0.0.1:") for e in missing
             if reach.is_loopback(reach.host_port(e)[0])]
    remote = [e for e in missing if not reach.is_loopback(reach.host_port(e)[0])]
    ways = ([f"for a server on this host add to the task file `{grant_yaml(local)}`"]
            if local else [])
    if remote:
        ways.append(f"for {', '.join(remote)} (another host) `sandbox: {{network: true}}`")
    return (f"forge: the sandbox kept this call off the network; it names "
            f"{', '.join(missing)}, which its task does not grant: {'; '.join(ways)}")


def plan(ws: Any, argv: Sequence[str], endpoints: Sequence[str], *, network: bool,
         task: str | None) -> Wrapped:
    """The relay of one call (module contract)."""
    if network:
        return Wrapped([], [])
    say = hint(argv, endpoints)
    if not endpoints and say is None:
        return Wrapped([], [])
    relay: list[list[Any]] = []  # [host, port, socket name, required] (the forwarder's)
    outer_eps: list[dict[str, Any]] = []
    for i, ep in enumerate(endpoints):
        host, port = reach.host_port(ep)
        name = f"{i}.sock"
        for j, (h, p) in enumerate(listen_addresses(ep)):
            if not any(r[:2] == [h, p] for r in relay):  # localhost and 127.0.0.1: one
                relay.append([h, p, name, j == 0])
        production = ws is not None and _is_production(ws, ep)
        if production and ep.startswith("https:"):
            raise HarnessError(f"sandbox.endpoints: {ep} is a production endpoint ([guard] "
                               "production_endpoints) over https: forge cannot read its "
                               "requests to hold them to the production guard")
        outer_eps.append({"endpoint": ep, "socket": name, "port": port,
                          "addresses": [list(a) for a in resolve(host, port)],
                          "production": production})
    inner = [sys.executable, "-I", "-S", str(FORWARDER),
             json.dumps({"relay": relay, "hint": say}), "--"]
    if not outer_eps:
        return Wrapped([], inner)
    config = {"endpoints": outer_eps, "home": str(ws.home) if ws is not None else None,
              "task": task, "parent": str(relay_parent())}
    return Wrapped([sys.executable, "-I", "-m", _MODULE, json.dumps(config), "--"], inner)


def relay_parent() -> Path:
    """`$TMPDIR/forge-relay-<uid>` (0700, ours, not a link), where forge's side of each call
    makes its socket directory `<pid>-…`; those of sides no longer running (killed: a
    timeout's SIGKILL runs no cleanup) are removed here. Raises HarnessError where it cannot
    be trusted (another user's, a link, too open)."""
    base = Path(tempfile.gettempdir()) / f"forge-relay-{os.getuid()}"
    try:
        base.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(base)
    except OSError as e:
        raise HarnessError(f"endpoint relay: cannot make {base}: {e.strerror or e}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise HarnessError(f"endpoint relay: {base} is not a private directory of this user")
    for child in base.iterdir():
        pid = child.name.split("-", 1)[0]
        if pid.isdigit() and not alive(int(pid)):
            shutil.rmtree(child, ignore_errors=True)
    return base


def _is_production(ws: Any, endpoint: str) -> bool:
    # In the function for start-up time: forge's side imports this module too, and loads
    # the production guard (the ledger) only for an endpoint marked production.
    from .production import is_production

    return is_production(ws, endpoint)


# --- forge's side (a process of its own) ---------------------------------------------------


class _Side:
    def __init__(self, config: dict[str, Any]):
        self.config = config
        self.dir = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=config["parent"]))
        self.listeners: list[tuple[socket.socket, dict[str, Any]]] = []
        self._ws: Any = None
        self._ws_lock = threading.Lock()
        for ep in config["endpoints"]:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(F.unix_path(str(self.dir / ep["socket"])))
            s.listen(64)
            self.listeners.append((s, ep))

    def serve(self) -> None:
        for s, ep in self.listeners:
            threading.Thread(target=self._accept, args=(s, ep), daemon=True).start()

    def close(self) -> None:
        for s, _ in self.listeners:
            s.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _accept(self, s: socket.socket, ep: dict[str, Any]) -> None:
        while True:
            try:
                conn, _ = s.accept()
            except OSError:
                return
            threading.Thread(target=self._join, args=(conn, ep), daemon=True).start()

    def _join(self, conn: socket.socket, ep: dict[str, Any]) -> None:
        up = _connect(ep)
        if up is None:
            conn.close()
            return
        if ep["production"]:
            self._guarded(conn, up, ep)
        else:
            F.pipe(conn, up)

    def _workspace(self) -> Any:
        with self._ws_lock:
            if self._ws is None:
                from .production import workspace_for_guard  # start-up time, as in _is_production

                self._ws = workspace_for_guard(self.config["home"])
            return self._ws

    def _guarded(self, conn: socket.socket, up: socket.socket, ep: dict[str, Any]) -> None:
        """Requests to a production endpoint, each head checked before it is passed on; the
        answers flow back as they come. A refused request ends the connection: the upstream
        is cut first, so the 403 is the last thing the client reads."""
        back = threading.Thread(target=F.copy, args=(up, conn, False), daemon=True)
        back.start()
        refused = None
        try:
            refused = self._pass_requests(conn, up, ep)
        except OSError:
            pass
        finally:
            try:
                up.shutdown(socket.SHUT_RDWR if refused else socket.SHUT_WR)
            except OSError:
                pass
            back.join()
            if refused is not None:
                self._refuse(conn, refused)
            conn.close()
            up.close()

    def _pass_requests(self, conn: socket.socket, up: socket.socket,
                       ep: dict[str, Any]) -> str | None:
        """Pass the client's requests on until it stops (None) or one is refused (why)."""
        buf = b""
        while True:
            while b"\r\n\r\n" not in buf:
                data = conn.recv(F.CHUNK)
                if not data:
                    return None
                buf += data
                if len(buf) > _HEAD_MAX:
                    return "a request head over 64 KiB"
            head, buf = buf.split(b"\r\n\r\n", 1)
            n = _body_length(head)
            if n is None:
                return "a chunked request body (not relayed to a production endpoint)"
            refused = self._check(head, ep)
            if refused is not None:
                return refused
            up.sendall(head + b"\r\n\r\n")
            while n > 0:
                if not buf:
                    buf = conn.recv(F.CHUNK)
                    if not buf:
                        return None
                part, buf = buf[:n], buf[n:]
                up.sendall(part)
                n -= len(part)

    def _check(self, head: bytes, ep: dict[str, Any]) -> str | None:
        from ...ledger import events as E  # start-up time (production only), as above
        from .production import check

        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split()
        if len(parts) != 3:
            return f"not an HTTP request line: {line[:80]!r}"
        method, target = parts[0].upper(), parts[1]
        path = target.split("?", 1)[0] or "/"
        try:
            check(self._workspace(), ep["endpoint"] + path, f"{method} {path}",
                  actor=E.SYSTEM, task_id=self.config["task"], in_step=True)
        except HarnessError as e:
            return str(e)
        return None

    @staticmethod
    def _refuse(conn: socket.socket, why: str) -> None:
        line = " ".join(why.split())
        sys.stderr.write(f"forge: endpoint relay: {line}\n")
        sys.stderr.flush()
        body = (line + "\n").encode()
        try:
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\n"
                         b"Connection: close\r\nContent-Length: " + str(len(body)).encode()
                         + b"\r\n\r\n" + body)
        except OSError:
            pass


def _body_length(head: bytes) -> int | None:
    """The request body's length by its Content-Length (0 without one); None for a chunked
    one."""
    n = 0
    for raw in head.split(b"\r\n")[1:]:
        name, _, value = raw.decode("latin-1").partition(":")
        name = name.strip().lower()
        if name == "transfer-encoding":
            return None
        if name == "content-length":
            try:
                n = max(int(value.strip()), 0)
            except ValueError:
                return None
    return n


def _connect(ep: dict[str, Any]) -> socket.socket | None:
    """A connection to the endpoint at the addresses resolved when the call was prepared;
    None after one line on stderr when none answers."""
    err: OSError | None = None
    for family, ip in ep["addresses"]:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(_CONNECT_TIMEOUT_S)
        try:
            s.connect((ip, ep["port"]))
        except OSError as e:
            err = e
            s.close()
            continue
        s.settimeout(None)
        return s
    sys.stderr.write(f"forge: endpoint relay: {ep['endpoint']} does not answer: "
                     f"{getattr(err, 'strerror', None) or err}\n")
    sys.stderr.flush()
    return None


def main(argv: list[str]) -> int:
    """forge's side of one call: `CONFIG -- bwrap ...` (module contract)."""
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: python -m ...endpoint_relay CONFIG -- bwrap ...\n")
        return 126
    side = _Side(json.loads(argv[0]))
    try:
        side.serve()
        env = {**os.environ, F.RELAY_DIR_ENV: str(side.dir)}
        try:
            proc = subprocess.Popen(argv[2:], env=env)
        except OSError as e:
            sys.stderr.write(f"cannot start {argv[2]}: {e.strerror or e}\n")
            return 127
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # passed on to bwrap
            signal.signal(sig, lambda n, _f: proc.send_signal(n))
        code = proc.wait()
        return 128 - code if code < 0 else code
    finally:
        side.close()


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))
