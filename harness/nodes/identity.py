"""This process's host name in the registry: `FORGE_NODE` when set (several simulated hosts on
one machine, or a name steadier than the hostname), else the machine's hostname."""

from __future__ import annotations

import os
import re
import socket

from ..errors import HarnessError

_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


def check_host(name: str, what: str = "host") -> str:
    """A host name the registry can hold (letters, digits, '.', '_', '-'); else one line."""
    if not _HOST.fullmatch(name):
        raise HarnessError(f"{what} {name!r}: a host name is letters, digits, '.', '_' or "
                           "'-' (at most 253, starting with a letter or digit)")
    return name


def local_host() -> str:
    name = os.environ.get("FORGE_NODE") or socket.gethostname() or "localhost"
    return check_host(name, "FORGE_NODE" if os.environ.get("FORGE_NODE") else "hostname")
