"""Streaming OpenAI SSE over HTTP/1.1: the parsing both bench transports share, and a lean
asyncio transport.

Why a second transport: aiohttp wakes a task and runs its flow control once per HTTP chunk —
servers send one chunk per token — which costs tens of microseconds per token and delays the
reading of other streams under load. `RawClient` reads each socket itself (`recvmsg` on the
event loop's readiness callback) and parses the response there, once per socket read. It
speaks plain `http://` with keep-alive (Content-Length, chunked, or close-delimited bodies);
anything else uses aiohttp.

Timestamps: on Linux each read carries the kernel's receive time of its data (SO_TIMESTAMPNS:
when the last segment in the read reached the socket, converted to the perf_counter clock), so
a client that is scheduled late — 64 streams on a busy 2-core machine — still dates each
token when it arrived, not when Python got to it. Tokens that arrive in one read share that
time (the last segment's). Elsewhere, or when the kernel gives no timestamp, the time the read
returned is used: the first socket to ask on a machine where none had turns stamping on through
a deferred kernel work item, so reads just after it can come unstamped (warm-up absorbs them).

`StreamState.feed(data, now)` implements bench_serving's timing on SSE bytes: TTFT at the first
`data:` event with non-empty text (completions `text` or chat `delta.content`), ITL between
consecutive non-empty events, E2E at the last `data:` line, output_len from usage.

Where it connects: only to the addresses of guard/addresses.py's `resolve` (the process's one
lookup of a host, the one the run's production check judged), never a lookup of its own. It
follows no redirect (a 3xx is a failed request).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import time
from urllib.parse import urlsplit

import orjson

from ..errors import HarnessError
from ..guard import addresses
from .metrics import RequestRecord


class StreamState:
    """Per-request SSE parsing and timing (see module doc)."""

    __slots__ = ("rec", "chat", "st", "first", "prev", "last_line", "parts", "buf", "error")

    def __init__(self, rec: RequestRecord, chat: bool, st: float):
        self.rec, self.chat, self.st = rec, chat, st
        self.first = True
        self.prev = st
        self.last_line = st
        self.parts: list[str] = []
        self.buf = b""
        self.error: str | None = None

    def feed(self, data: bytes, now: float) -> None:
        buf = self.buf + data if self.buf else data
        if b"\n" not in data:
            self.buf = buf
            return
        lines = buf.split(b"\n")
        self.buf = lines.pop()
        rec = self.rec
        for line in lines:
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, event:/id: lines
            self.last_line = now
            payload = line[5:].strip()
            if not payload or payload == b"[DONE]":
                continue
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                self.error = f"bad SSE payload: {payload[:200]!r}"
                return
            if not isinstance(obj, dict):
                continue
            choices = obj.get("choices")
            if choices:
                c0 = choices[0]
                text = (c0.get("delta") or {}).get("content") if self.chat else c0.get("text")
                if text:
                    if self.first:
                        rec.ttft = now - self.st
                        self.first = False
                    else:
                        rec.itl.append(now - self.prev)
                    self.prev = now
                    self.parts.append(text)
            elif "error" in obj:
                self.error = f"server error in stream: {orjson.dumps(obj['error'])[:300]!r}"
                return
            usage = obj.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                rec.output_len = int(usage["completion_tokens"])

    def finish(self, now: float) -> None:
        """The body ended: the record is complete (success unless an error was seen)."""
        if self.buf.startswith(b"data:"):
            self.feed(b"\n", now)
        rec = self.rec
        rec.generated_text = "".join(self.parts)
        if self.error:
            rec.error = self.error
            return
        rec.e2e = self.last_line - self.st
        rec.success = True


# --- the raw transport -------------------------------------------------------------------

_HEAD, _BODY_LEN, _BODY_CHUNKED, _BODY_CLOSE, _IDLE = range(5)


class _Conn:
    """One keep-alive HTTP/1.1 connection carrying one request at a time (the parser; its
    `_Sock` reads and writes)."""

    def __init__(self) -> None:
        self.transport: _Sock | None = None
        self.closed = False
        self.reused = False
        self._reset()

    def _reset(self) -> None:
        self.state = _IDLE
        self.sse: StreamState | None = None
        self.fut: asyncio.Future | None = None
        self.raw = b""
        self.status = 0
        self.keep_alive = True
        self.left = 0  # body bytes (Content-Length) or current chunk bytes still to come
        self.crlf = False  # a chunk's trailing CRLF is still to come
        self.err_body = b""
        self.got_bytes = False

    # called by _Sock -------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.closed = True
        if self.fut is not None and not self.fut.done():
            if self.state == _BODY_CLOSE and self.sse is not None:
                self._complete(time.perf_counter())
            else:
                reason = f"{type(exc).__name__}: {exc}" if exc else "connection closed by server"
                self.fut.set_exception(ConnectionError(reason))

    def data_received(self, data: bytes, now: float) -> None:
        self.got_bytes = True
        if self.state == _HEAD:
            self.raw += data
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self.raw[:end], self.raw[end + 4:]
            self.raw = b""
            self._head(head)
        if self.state == _BODY_LEN:
            take = data[:self.left]
            self.left -= len(take)
            self._body(take, now)
            if self.left <= 0:
                self._complete(now)
        elif self.state == _BODY_CHUNKED:
            self._chunked(data, now)
        elif self.state == _BODY_CLOSE:
            self._body(data, now)

    # parsing -------------------------------------------------------------------------------

    def _head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        try:
            self.status = int(parts[1])
        except (IndexError, ValueError):
            self._fail(f"bad HTTP status line {lines[0][:100]!r}")
            return
        length = None
        chunked = False
        # HTTP/1.0 closes after the response unless it says keep-alive (RFC 9112, 9.3):
        # reusing such a connection raced the server's close.
        self.keep_alive = not parts[0].upper().startswith("HTTP/1.0")
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value:
                chunked = True
            elif name == "connection" and value in ("close", "keep-alive"):
                self.keep_alive = value == "keep-alive"
        if chunked:
            self.state = _BODY_CHUNKED
        elif length is not None:
            self.state, self.left = _BODY_LEN, length
            if length == 0:
                self._complete(time.perf_counter())
        else:
            self.state, self.keep_alive = _BODY_CLOSE, False

    def _body(self, data: bytes, now: float) -> None:
        if not data:
            return
        if self.status != 200:
            if len(self.err_body) < 1000:
                self.err_body += data
            return
        assert self.sse is not None  # a body arrives only for a request start() sent
        self.sse.feed(data, now)

    def _chunked(self, data: bytes, now: float) -> None:
        buf = self.raw + data if self.raw else data
        pos, n = 0, len(buf)
        out = []
        while pos < n:
            if self.left:
                take = min(self.left, n - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self.left -= take
                if self.left:
                    break
                self.crlf = True
            if self.crlf:
                if n - pos < 2:
                    break
                pos += 2
                self.crlf = False
            nl = buf.find(b"\r\n", pos)
            if nl < 0:
                break
            try:
                size = int(buf[pos:nl].split(b";", 1)[0], 16)
            except ValueError:
                self._fail(f"bad chunk size line {buf[pos:nl][:50]!r}")
                return
            pos = nl + 2
            if size == 0:
                # Last chunk (trailers, if any, are ignored; we close on them if unread).
                if out:
                    self._body(b"".join(out), now)
                if buf.find(b"\r\n", pos) != pos:
                    self.keep_alive = False
                self.raw = b""
                self._complete(now)
                return
            self.left = size
        self.raw = buf[pos:]
        if out:
            self._body(b"".join(out), now)

    def _fail(self, msg: str) -> None:
        self.keep_alive = False
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(ConnectionError(msg))
        if self.transport is not None:
            self.transport.close()

    def _complete(self, now: float) -> None:
        fut, sse, status, err = self.fut, self.sse, self.status, self.err_body
        keep = self.keep_alive
        self._reset()
        self.keep_alive = keep
        if fut is None or fut.done():
            return
        assert sse is not None  # start() sets it with fut
        if status != 200:
            text = " ".join(err[:300].decode("utf-8", "replace").split())
            sse.rec.error = f"HTTP {status}: {text}"
        else:
            sse.finish(now)
        fut.set_result(None)

    # sending -------------------------------------------------------------------------------

    def start(self, request: bytes, sse: StreamState, fut: asyncio.Future) -> None:
        self.state, self.sse, self.fut = _HEAD, sse, fut
        assert self.transport is not None  # a connected protocol
        self.transport.write(request)


# Linux's SO_TIMESTAMPNS (socket does not name it): each recvmsg carries a struct timespec
# (CLOCK_REALTIME) of when the read's last segment reached the socket.
_SO_TIMESTAMPNS = 35 if sys.platform == "linux" else None
# False: date each read when it returned (bench/client.py's comparison; read at connect).
KERNEL_STAMPS = True
_TIMESPEC = struct.Struct("@ll")
_READ_SIZE = 256 * 1024  # as asyncio's socket transport
_ANC_SIZE = socket.CMSG_SPACE(_TIMESPEC.size)


class _Sock:
    """A connected non-blocking socket read on the event loop with `recvmsg`, so each read
    is dated by the kernel (see module doc); what asyncio's socket transport does for this
    client, minus flow control (requests are small, responses are read as they come)."""

    __slots__ = ("loop", "sock", "conn", "fd", "pending", "closed", "stamped")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, conn: _Conn):
        self.loop, self.sock, self.conn = loop, sock, conn
        self.fd = sock.fileno()
        self.pending = b""  # unsent request bytes (a full send buffer)
        self.closed = False
        self.stamped = _stamp(sock)
        conn.connection_made(self)
        loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        try:
            data, anc, _, _ = self.sock.recvmsg(_READ_SIZE, _ANC_SIZE if self.stamped else 0)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._lost(e)
            return
        now = time.perf_counter()
        if not data:
            self._lost(None)
            return
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(raw) >= 16:
                sec, ns = _TIMESPEC.unpack_from(raw)
                # realtime → perf_counter (CLOCK_MONOTONIC): the offset read now, so a step of
                # the wall clock between reads does not matter. Never later than now.
                at = (sec * 1_000_000_000 + ns - time.time_ns() + time.perf_counter_ns()) / 1e9
                if at < now:
                    now = at
        self.conn.data_received(data, now)

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if self.pending:
            self.pending += data
            return
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as e:
            self._lost(e)
            return
        if sent < len(data):
            self.pending = data[sent:]
            self.loop.add_writer(self.fd, self._writable)

    def _writable(self) -> None:
        try:
            sent = self.sock.send(self.pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._lost(e)
            return
        self.pending = self.pending[sent:]
        if not self.pending:
            self.loop.remove_writer(self.fd)

    def _lost(self, exc: BaseException | None) -> None:
        if not self.closed:
            self._shut()
            self.conn.connection_lost(exc)

    def _shut(self) -> None:
        self.closed = True
        self.loop.remove_reader(self.fd)
        if self.pending:
            self.loop.remove_writer(self.fd)
        self.sock.close()

    def close(self) -> None:
        """Close now; the parser hears of it on the next loop turn (as asyncio's close)."""
        if not self.closed:
            self._shut()
            self.loop.call_soon(self.conn.connection_lost, None)


def _stamp(sock: socket.socket) -> bool:
    """Ask the kernel to date each read; False where it cannot."""
    if _SO_TIMESTAMPNS is None or not KERNEL_STAMPS:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


async def _open(loop: asyncio.AbstractEventLoop, host: str, port: int) -> _Conn:
    """A connected `_Conn` (TCP_NODELAY, as asyncio sets it), trying each of the
    resolved addresses for `host` in turn (module docstring)."""
    try:
        infos = addresses.resolve(host, port)  # cached: the production check resolved it
    except HarnessError as e:
        raise ConnectionError(str(e)) from None
    err: BaseException | None = None
    for family, ip in infos:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, (ip, port))
        except BaseException as e:  # closed on cancel too
            sock.close()
            if not isinstance(e, OSError):
                raise
            err = e
            continue
        conn = _Conn()
        _Sock(loop, sock, conn)
        return conn
    assert err is not None
    raise err


class RawClient:
    """Keep-alive connections to one `http://host:port`; `request()` never raises."""

    def __init__(self, url: str, timeout_s: float):
        u = urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise HarnessError(f"raw transport needs an http:// URL, got {url!r}")
        self.host, self.port = u.hostname, u.port or 80
        self.path = u.path or "/"
        self.timeout_s = timeout_s
        self.idle: list[_Conn] = []
        self.all: list[_Conn] = []
        host = f"[{self.host}]" if ":" in self.host else self.host  # IPv6 literal
        hostport = f"{host}:{self.port}" if u.port else host
        self.prefix = (f"POST {self.path} HTTP/1.1\r\nHost: {hostport}\r\n"
                       "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                       "Content-Length: ").encode()

    async def _connect(self) -> _Conn:
        conn = await _open(asyncio.get_running_loop(), self.host, self.port)
        self.all.append(conn)
        return conn

    async def request(self, payload: bytes, rec: RequestRecord, chat: bool) -> None:
        loop = asyncio.get_running_loop()
        req = self.prefix + str(len(payload)).encode() + b"\r\n\r\n" + payload
        for attempt in (0, 1):
            st = time.perf_counter()
            rec.start_time = st
            conn = None
            try:
                while attempt == 0 and self.idle and conn is None:  # a retry: a new one
                    conn = self.idle.pop()
                    if conn.closed:
                        conn = None
                if conn is None:
                    conn = await self._connect()
                fut = loop.create_future()
                conn.start(req, StreamState(rec, chat, st), fut)
                await asyncio.wait_for(fut, self.timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # failures are data
                # An idle keep-alive connection the server closed: retry once on a new one.
                if (attempt == 0 and conn is not None and conn.reused and not conn.got_bytes
                        and isinstance(e, ConnectionError)):
                    continue
                rec.error = f"{type(e).__name__}: {' '.join(str(e).split())}"[:500]
                if conn is not None and conn.transport is not None:
                    conn.transport.close()
                return
            if conn.keep_alive and not conn.closed:
                conn.reused = True
                self.idle.append(conn)
            elif conn.transport is not None:
                conn.transport.close()
            return

    def close(self) -> None:
        for c in self.all:
            if c.transport is not None:
                c.transport.close()
        self.idle.clear()
        self.all.clear()
