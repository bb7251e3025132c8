"""The one outbound HTTP client: every request forge makes to a server (engines' reads and
controls, deploy checks, health polls, profiling, diagnose, monitor) goes through `fetch`.

Contracts:
- Addresses, not spellings: every hop connects to `addresses.resolve`'s answer, the address
  the production guard checked (addresses.py: resolution kept for the process's life,
  canonical endpoint names).
- `fetch(method, url, ...)` -> `Response` (any status; `ok()` raises on >= 400):
  - `http://` and `https://` only; the connection goes to the resolved address (TLS still
    checks the certificate against the URL's host).
  - `guard` (a `Guard`: the workspace and who is calling): every hop passes
    `production.check` with its own method and path before a byte is sent to it; a refusal
    is recorded there (`ProductionRefused`) and raised. `first_checked=True`: the caller
    already passed the first hop through the guard (so an approval is not used twice).
  - Redirects are followed here, by hand, at most `max_redirects`: 301/302/303 as GET without
    a body (HEAD stays HEAD), 307/308 with the method and body. Each hop is resolved and
    checked again; without a guard, a redirect to another origin (scheme, canonical address,
    port) is refused; with one, it goes without the caller's credential headers.
    `max_redirects=0` follows none: the 3xx is the response (`ok()` refuses it).
  - `timeout_s` is the deadline of the whole exchange (connect, every hop, headers, body):
    past it the socket is shut, whatever the server is still dripping, and the error is
    `METHOD URL: no complete response within N s (the deadline)`. A body over `max_bytes` is
    cut there: `METHOD URL: response over N bytes (the cap)`. Both one line (HarnessError).
- Model tiers keep the official `openai` client (harness/agents/models.py) on
  `httpx_client`: no redirect followed, the byte cap, the body's deadline. They are not
  passed through the production guard: a tier is the agent's own model, named in forge.toml
  (a production-class one has its prompts stored as lengths and digests, data_policy.py).
- The journal's model calls (wiki/chat.py: narratives, concept syntheses, phrased answers;
  the wiki may not import this floor) are `fetch` on the same rules, handed to the wiki by
  cli.py (`wiki_post`): POST, `max_redirects=0`, MODEL_MAX_BYTES, the tier's `timeout_s` as
  the deadline.
- Where the transport differs: the bench client's streaming path (harness/bench/sse_client.py:
  raw sockets, kernel receive timestamps per read) keeps its own transport for timing, but
  connects only to `resolve`'s addresses, the ones its run's production check saw.
- A library with its own client (lm_eval, `forge eval accuracy`) is given a loopback relay
  (guard/relay.py) that sends each of its requests on through `fetch`.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from ..errors import HarnessError
from .addresses import canonical, resolve

if TYPE_CHECKING:
    from ...ledger import events as E
    from ...ledger.workspace import Workspace

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
MAX_REDIRECTS = 5
_DEFAULT_PORTS = {"http": 80, "https": 443}
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_CHUNK = 1 << 20  # one read of up to 1 MiB: fewer calls on a big page (2 MB: 2.5 -> 1.7 ms)

# --- targets ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One hop's URL split and resolved."""

    url: str
    scheme: str
    host: str
    port: int
    path: str  # with the query, as sent
    addrs: tuple[tuple[int, str], ...]

    @property
    def origin(self) -> tuple[str, frozenset[str], int]:
        return self.scheme, frozenset(canonical(ip) for _, ip in self.addrs), self.port

    @property
    def ips(self) -> tuple[str, ...]:
        return tuple(ip for _, ip in self.addrs)


def target(url: str, method: str = "GET") -> Target:
    """`url` split and its host resolved; a URL forge cannot send to is a one-line error."""
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError:
        raise HarnessError(f"{method} {url}: not a URL") from None
    scheme = u.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not u.hostname:
        raise HarnessError(f"{method} {url}: give an http:// or https:// URL with a host")
    port = port or _DEFAULT_PORTS[scheme]
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    try:
        addrs = resolve(u.hostname, port)
    except HarnessError as e:
        raise HarnessError(f"{method} {_shown(url)}: {e}") from None
    return Target(url, scheme, u.hostname, port, path, addrs)


# --- requests -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Guard:
    """Who makes a call, for the production guard (production.check's arguments)."""

    ws: Workspace
    actor: E.Actor
    task_id: str | None = None
    block_id: str | None = None
    in_step: bool = False


@dataclass
class Response:
    url: str  # the last hop's
    status: int
    reason: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def ok(self, method: str) -> Response:
        """Self, or a one-line HarnessError for a status >= 400 (a 3xx left here is one)."""
        if self.status >= 300:
            text = self.body[:400].decode("utf-8", errors="replace")
            raise HarnessError(f"{method} {_shown(self.url)}: HTTP {self.status}: "
                               f"{' '.join(text.split())[:200]}")
        return self

    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def _shown(url: str) -> str:
    # In the function for start-up time: the production guard brings the task reads
    # (projections.memory, record), which a call without a guard never needs.
    from .production import shown_url  # no user info, query or fragment in an error

    return shown_url(url)


def fetch(method: str, url: str, *, body: bytes | None = None,
          headers: Mapping[str, str] | None = None, timeout_s: float = 30.0,
          max_bytes: int = DEFAULT_MAX_BYTES, guard: Guard | None = None,
          first_checked: bool = False, max_redirects: int = MAX_REDIRECTS) -> Response:
    """One request and its redirects (module contract)."""
    method = method.upper()
    first, first_method = url, method
    deadline = time.monotonic() + timeout_s
    origin: tuple[str, frozenset[str], int] | None = None
    for hop in range(max_redirects + 1):
        t = target(url, method)
        if guard is not None and (hop or not first_checked):
            from . import production  # in the function for start-up time (see `_shown`)

            production.check(guard.ws, url, f"{method} {t.path.split('?', 1)[0]}",
                             actor=guard.actor, task_id=guard.task_id,
                             block_id=guard.block_id, in_step=guard.in_step, resolved=t.ips)
        elif guard is None and origin is not None and t.origin != origin:
            raise HarnessError(f"{method} {_shown(first)}: redirected to another origin "
                               f"({_shown(url)}): refused (no guard to check it against)")
        if origin is not None and t.origin != origin and headers:  # no credentials to it
            headers = {k: v for k, v in headers.items()
                       if k.lower() not in ("authorization", "cookie", "proxy-authorization")}
        origin = origin or t.origin
        resp = _exchange(t, method, body, headers, deadline, timeout_s, max_bytes, first)
        location = resp.headers.get("location")
        if resp.status not in _REDIRECTS or not location or not max_redirects:
            return resp
        url = urljoin(url, location)
        if resp.status in (301, 302, 303) and method != "HEAD":
            method, body = "GET", None
    raise HarnessError(f"{first_method} {_shown(first)}: more than {max_redirects} redirects")


def _exchange(t: Target, method: str, body: bytes | None, headers: Mapping[str, str] | None,
              deadline: float, timeout_s: float, max_bytes: int, first: str) -> Response:
    """One HTTP exchange with `t`'s resolved address, cut at the deadline and the cap."""
    def late() -> HarnessError:
        return HarnessError(f"{method} {_shown(first)}: no complete response within "
                            f"{timeout_s:g} s (the deadline)")

    left = deadline - time.monotonic()
    if left <= 0:
        raise late()
    cls = http.client.HTTPSConnection if t.scheme == "https" else http.client.HTTPConnection
    conn = cls(t.host, t.port, timeout=left)

    def connect(_addr: Any, timeout: Any = None, source: Any = None) -> socket.socket:
        err: OSError | None = None
        for fam, ip in t.addrs:  # the addresses checked, never a second lookup
            s = socket.socket(fam, socket.SOCK_STREAM)
            try:
                s.settimeout(max(0.001, deadline - time.monotonic()))
                s.connect((ip, t.port))
                return s
            except OSError as e:
                s.close()
                err = e
        assert err is not None
        raise err

    conn._create_connection = connect  # type: ignore[attr-defined]
    cut = threading.Event()

    def shut() -> None:  # the deadline: end whatever read or write is blocked
        cut.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(left, shut)
    timer.daemon = True
    timer.start()
    resp: http.client.HTTPResponse | None = None
    try:
        hdrs = {"Connection": "close", **(headers or {})}
        if body is not None:
            hdrs.setdefault("Content-Type", "application/json")
        conn.request(method, t.path, body=body, headers=hdrs)
        resp = conn.getresponse()
        chunks: list[bytes] = []
        size = 0
        while method != "HEAD":
            chunk = resp.read1(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise HarnessError(f"{method} {_shown(first)}: response over {max_bytes} "
                                   "bytes (the cap): cut there")
            chunks.append(chunk)
            if time.monotonic() >= deadline:
                raise late()
        if cut.is_set():
            raise late()
        return Response(t.url, resp.status, resp.reason or "", b"".join(chunks),
                        {k.lower(): v for k, v in resp.getheaders()})
    except (OSError, http.client.HTTPException, ValueError) as e:
        if cut.is_set() or time.monotonic() >= deadline:
            raise late() from None
        why = " ".join(str(getattr(e, "strerror", None) or e or type(e).__name__).split())
        raise HarnessError(f"{method} {_shown(first)}: {why}") from None
    finally:
        timer.cancel()
        if resp is not None:  # it holds the socket too: a response cut here is closed now
            resp.close()
        conn.close()


# --- a library's client under the same rules ----------------------------------------------


def httpx_client(timeout_s: float, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """An httpx client (the `openai` client's transport: model tiers) under this module's
    rules where httpx allows them: no redirect followed (openai's default client follows
    them, unchecked), the body cut at `max_bytes`, and the body's last byte due `timeout_s`
    after the request started (httpx's own timeout is per read, which a drip never trips;
    the headers are held to that per-read timeout only)."""
    try:
        import httpx2 as httpx  # what openai >= 3 is built on
    except ImportError:  # pragma: no cover - older openai releases
        import httpx  # type: ignore[no-redef,import-not-found,unused-ignore]

    class Bounded(httpx.SyncByteStream):
        def __init__(self, inner: Any, url: str, deadline: float):
            self.inner, self.url, self.deadline = inner, url, deadline

        def __iter__(self) -> Any:
            size = 0
            for chunk in self.inner:
                size += len(chunk)
                if size > max_bytes:
                    raise HarnessError(f"POST {_shown(self.url)}: response over {max_bytes} "
                                       "bytes (the cap): cut there")
                if time.monotonic() > self.deadline:
                    raise HarnessError(f"POST {_shown(self.url)}: no complete response "
                                       f"within {timeout_s:g} s (the deadline)")
                yield chunk

        def close(self) -> None:
            self.inner.close()

    class Transport(httpx.BaseTransport):
        def __init__(self) -> None:
            self.inner = httpx.HTTPTransport()

        def handle_request(self, request: Any) -> Any:
            deadline = time.monotonic() + timeout_s
            r = self.inner.handle_request(request)
            return httpx.Response(r.status_code, headers=r.headers, request=request,
                                  stream=Bounded(r.stream, str(request.url), deadline),
                                  extensions=r.extensions)

        def close(self) -> None:
            self.inner.close()

    return httpx.Client(transport=Transport(), follow_redirects=False, timeout=timeout_s)
