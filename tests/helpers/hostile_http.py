"""A hostile HTTP server on 127.0.0.1 (raw sockets, a thread per connection), for the outbound
client's tests: what a server can do to a client that trusts it.

Modes (`HostileHTTP(mode, ...)`), for any method and path:
- `redirect`: `302` (or `status`) with `Location: <to> + the request's path`.
- `endless`: `200`, no length, Prometheus lines written until the client goes away.
- `drip`: `200` with a Content-Length, then one byte of the body every `gap_s` seconds.
- `drip_head`: the status line, then a header line one byte every `gap_s` seconds.
- `page`: `200` with `body` (one page, Content-Length set).
`requests` lists each request line received (`GET /metrics`), in order; `written` counts the
bytes the endless mode got out.
"""

from __future__ import annotations

import socket
import threading
import time


class HostileHTTP:
    def __init__(self, mode: str, *, to: str = "", status: int = 302, gap_s: float = 0.5,
                 body: str = ""):
        self.mode, self.to, self.status, self.gap_s, self.body = mode, to, status, gap_s, body
        self.requests: list[str] = []
        self.written = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> HostileHTTP:
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (close does not)
        except OSError:
            pass
        self._sock.close()
        for t in self._threads:
            t.join(timeout=5)

    def served(self, timeout: float = 5.0) -> bool:
        """Whether every connection's handler has ended (the client closed it) by `timeout`."""
        end = time.monotonic() + timeout
        for t in self._threads[1:]:
            t.join(max(0.0, end - time.monotonic()))
        return not any(t.is_alive() for t in self._threads[1:])

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                got = conn.recv(65536)
                if not got:
                    return
                head += got
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            method, path = line.split(" ")[:2]
            self.requests.append(f"{method} {path}")
            try:
                getattr(self, "_" + self.mode)(conn, path)
            except OSError:  # the client went away (as it should, cut at its cap or deadline)
                pass

    def _redirect(self, conn: socket.socket, path: str) -> None:
        conn.sendall(f"HTTP/1.1 {self.status} Found\r\nLocation: {self.to}{path}\r\n"
                     "Content-Length: 0\r\nConnection: close\r\n\r\n".encode())

    def _endless(self, conn: socket.socket, path: str) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
        line = b'sglang:num_running_reqs{model_name="x"} 1.0\n' * 1000
        while not self._stop.is_set():
            conn.sendall(line)
            self.written += len(line)

    def _drip(self, conn: socket.socket, path: str) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000"
                     b"\r\nConnection: close\r\n\r\n")
        while not self._stop.is_set():
            conn.sendall(b"#")
            time.sleep(self.gap_s)  # the attack itself: a byte per gap, never done

    def _drip_head(self, conn: socket.socket, path: str) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        while not self._stop.is_set():
            conn.sendall(b"a")
            time.sleep(self.gap_s)  # the attack itself: headers that never end

    def _page(self, conn: socket.socket, path: str) -> None:
        data = self.body.encode()
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                     f"{len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
