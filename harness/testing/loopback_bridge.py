"""Run a command with a loopback TCP port that leads to a Unix socket: how a client inside a
network namespace that has only loopback reaches a server of the test outside it (a Unix
socket's path crosses network namespaces; a TCP port does not).

    python loopback_bridge.py PORT SOCKET -- CMD ARGS...

The port is listening before CMD starts (no race with its first request); every connection
to 127.0.0.1:PORT is piped to SOCKET; the exit status is CMD's. Standard library only, run as a
file (nothing of the package is imported inside the namespace).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass  # either side closed: the other half ends the connection
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.connect(path)
        except OSError:
            conn.close()
            up.close()
            continue
        for a, b in ((conn, up), (up, conn)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: loopback_bridge.py PORT SOCKET -- CMD ARGS...", file=sys.stderr)
        return 2
    port, path, cmd = int(argv[0]), argv[1], argv[3:]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    try:
        return subprocess.call(cmd)
    finally:
        listener.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
