"""Where a host name leads: resolved addresses and their canonical endpoint names, shared by
the production guard (production.py: is this a production endpoint?) and the one outbound
client (outbound.py: connect where the check looked).

Contracts (addresses, not spellings):
- `resolve(host, port)` is getaddrinfo's answer (so `localhost`, `127.1`, `2130706433` and
  `0x7f.1` are what the C library makes of them: inet_aton's rules), kept for the process's
  life: the address the production guard checked is the address connected to (a DNS answer
  that changes between the check and the connect reaches nothing unchecked). `pin` takes the
  answer of the process that resolved (a bench worker).
- `canonical(ip)` names an endpoint's host: an IPv4-mapped IPv6 address as its IPv4, and
  every address of this machine (loopback `127.0.0.0/8`, `::1`, the unspecified
  `0.0.0.0`/`::`, an own interface's address: one a socket can bind) as `LOCAL`, since a
  server listening on all interfaces is reached through each of them.
- `host_addresses(host)`: the canonical names of what `host` resolves to (empty when it does
  not resolve); asked once per process.
"""

from __future__ import annotations

import ipaddress
import socket
import threading

from ..errors import HarnessError

LOCAL = "local"  # canonical() of any address of this machine

_RESOLVED: dict[tuple[str, int], tuple[tuple[int, str], ...]] = {}
_RESOLVED_LOCK = threading.Lock()
_CANONICAL: dict[str, str] = {}
_HOSTS: dict[str, frozenset[str]] = {}


def resolve(host: str, port: int) -> tuple[tuple[int, str], ...]:
    """(family, ip) of each address `host` resolves to, in getaddrinfo's order; the first
    answer is kept for the process's life (module contract). Raises HarnessError."""
    key = (host.lower(), port)
    with _RESOLVED_LOCK:
        got = _RESOLVED.get(key)
    if got is not None:
        return got
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise HarnessError(f"{host}: cannot resolve ({getattr(e, 'strerror', None) or e})"
                           ) from None
    out = tuple(dict.fromkeys((fam, str(sa[0]).split("%", 1)[0]) for fam, _, _, _, sa in infos
                              if fam in (socket.AF_INET, socket.AF_INET6)))
    if not out:
        raise HarnessError(f"{host}: resolves to no IP address")
    with _RESOLVED_LOCK:
        return _RESOLVED.setdefault(key, out)


def pin(host: str, port: int, addrs: tuple[tuple[int, str], ...]) -> None:
    """Take `resolve`'s answer from the process that resolved `host` (a bench worker spawned
    after its parent's production check connects where the check looked)."""
    with _RESOLVED_LOCK:
        _RESOLVED[(host.lower(), port)] = tuple((int(f), str(ip)) for f, ip in addrs)


def canonical(ip: str) -> str:
    """The endpoint name of `ip` (module contract): IPv4 for a mapped address, `local` for
    any address of this machine."""
    got = _CANONICAL.get(ip)
    if got is None:
        a: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(ip)
        if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
            a = a.ipv4_mapped
        got = LOCAL if a.is_loopback or a.is_unspecified or _is_own(a) else str(a)
        _CANONICAL[ip] = got
    return got


def _is_own(a: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether `a` is an address of this machine: binding to it succeeds (no packet sent)."""
    fam = socket.AF_INET6 if a.version == 6 else socket.AF_INET
    try:
        with socket.socket(fam, socket.SOCK_STREAM) as s:
            s.bind((str(a), 0))
        return True
    except OSError:
        return False


def host_addresses(host: str) -> frozenset[str]:
    """The canonical names of what `host` resolves to; empty when it does not resolve (a
    production entry naming an unknown host still matches by its spelling)."""
    got = _HOSTS.get(host.lower())
    if got is None:
        try:
            got = frozenset(canonical(ip) for _, ip in resolve(host, 0))
        except HarnessError:
            got = frozenset()
        _HOSTS[host.lower()] = got  # a failed lookup too: asked once per process
    return got
