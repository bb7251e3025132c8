"""The sandbox's side of an endpoint relay: run inside bubblewrap (its own network namespace,
loopback only) as the call's first process, it listens on the granted endpoints' host:port
on the sandbox's loopback, starts the call's command, and hands each connection to forge's
side through a UNIX socket (harness/guard/endpoint_relay.py). Standard library only, run as
a script (`python -I -S endpoint_forward.py CONFIG -- argv...`): nothing of forge loads in
the sandbox.

Contract:
- CONFIG (JSON): `relay`: `[[host, port, socket name, required], ...]`; `hint`: a line or
  null. Every listener is bound before the command starts (no race with it); a required one
  that cannot be bound ends the call (exit 126, one line on stderr), the command unstarted
  (one that is not: `localhost`'s ::1 on a host without IPv6, left out).
- A connection to a listener is joined, byte for byte both ways, to a new connection to
  `$FORGE_RELAY_DIR/<socket name>` (the variable is removed from the command's environment).
- `hint` (the servers the call names that its sandbox does not reach, and how a task grants
  them) goes to the call's stderr when the command fails: said where the failure is read,
  and no port of the sandbox taken to say it (the command may serve on it itself).
- Exit: the command's exit code (a signal's death as 128 + its number). The listeners die
  with this process, and it with the sandbox (bwrap's pid namespace).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable

RELAY_DIR_ENV = "FORGE_RELAY_DIR"
CHUNK = 64 * 1024


def copy(src: socket.socket, dst: socket.socket, half_close: bool = True) -> None:
    """Copy bytes from `src` to `dst` until `src` ends, then half-close `dst` (unless not
    `half_close`: the caller still writes to it)."""
    try:
        while data := src.recv(CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    if not half_close:
        return
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways between `a` and `b` until both directions end, then close both
    (a half-close is passed on as one)."""
    t = threading.Thread(target=copy, args=(b, a), daemon=True)
    t.start()
    copy(a, b)
    t.join()
    a.close()
    b.close()


def unix_path(path: str) -> str:
    """`path`, or where it is reached through an open descriptor of its directory when it is
    longer than a UNIX socket address holds (108 bytes; a deep TMPDIR)."""
    if len(path.encode()) < 100:
        return path
    fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)  # kept for the process
    return f"/proc/self/fd/{fd}/{os.path.basename(path)}"


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _listen(host: str, port: int) -> socket.socket:
    s = socket.socket(_family(host), socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen(64)
    return s


def _serve(listener: socket.socket, handle: Callable[[socket.socket], None]) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def _relay_to(path: str) -> Callable[[socket.socket], None]:
    def handle(conn: socket.socket) -> None:
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.connect(path)
        except OSError as e:
            sys.stderr.write(f"forge: endpoint relay: {e}\n")
            conn.close()
            up.close()
            return
        pipe(conn, up)
    return handle


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: endpoint_forward.py CONFIG -- argv...\n")
        return 126
    config = json.loads(argv[0])
    command = argv[2:]
    relay_dir = os.environ.pop(RELAY_DIR_ENV, "")
    servers = []
    try:
        for host, port, name, required in config.get("relay", []):
            path = unix_path(os.path.join(relay_dir, name))
            try:
                servers.append((_listen(host, port), _relay_to(path)))
            except OSError:
                if required:
                    raise
    except OSError as e:
        sys.stderr.write(f"forge: endpoint relay: cannot listen in the sandbox: {e}\n")
        return 126
    for listener, handle in servers:
        threading.Thread(target=_serve, args=(listener, handle), daemon=True).start()
    try:
        proc = subprocess.Popen(command)
    except OSError as e:
        sys.stderr.write(f"cannot start {command[0]}: {e.strerror or e}\n")
        return 127
    code = proc.wait()
    if code != 0 and config.get("hint"):
        sys.stderr.write(config["hint"] + "\n")
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(sys.argv[1:]))
