"""How a person proves they are the one granting an approval: a channel an agent's process
cannot reach, not a flag any process can pass.

Contract:
- `confirm(ws, approval, key_file=None, tty=None) -> str`: the channel that confirmed, or a
  HarnessError (one line) and nothing granted.
  - `"key"`: `key_file` (`forge approve --key-file`, or `FORGE_APPROVER_KEY_FILE`) holds the
    workspace's approver key (`FORGE_HOME/approver.key`, 64 hex characters, mode 0600, made by
    `approver_key` the first time it is needed). The tool-call sandbox hides the file (it reads
    as empty there), so neither an agent's tool call nor an engine started for an agent can
    read it; the key is compared in constant time.
  - `"tty"`: without a key file, the controlling terminal (`/dev/tty`) shows the action bound
    to the approval (kind, target, arguments, who asked) and the person types the approval's
    last six characters. A sandboxed process has no controlling terminal (a new session), nor
    does a process an agent client starts without one.
- `actor(by, channel) -> Actor`: who granted, as recorded: the OS user, the channel, and `--by`
  only as what they said (`"ana via key, says alice"`): `--by` is a label, not an identity.

Anything running as the user outside forge's sandbox can read the key file as the user can;
docs/red-team.md says so. Where bubblewrap is unavailable (`[guard] sandbox = "auto"` runs
calls unsandboxed), only the terminal keeps an agent's call from granting.
"""

from __future__ import annotations

import getpass
import hmac
import os
import secrets
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.atomic import replacing
from ...ledger.text import printable
from ...ledger.workspace import Workspace
from ...projections.approvals import bound_action
from ..errors import HarnessError

KEY_FILE = "approver.key"
KEY_ENV = "FORGE_APPROVER_KEY_FILE"
_KEY_BYTES = 32


def key_path(ws: Workspace) -> Path:
    return Path(ws.home) / KEY_FILE


def approver_key(ws: Workspace) -> str:
    """The workspace's approver key, made (0600) when missing."""
    path = key_path(ws)
    if not path.exists():
        with replacing(path, mode=0o600, fsync=True) as f:
            f.write(secrets.token_hex(_KEY_BYTES).encode() + b"\n")
    return path.read_text(encoding="ascii", errors="replace").strip()


def _key_matches(ws: Workspace, key_file: Path) -> bool:
    want = approver_key(ws)  # made first: a person may name the file before it exists
    try:
        with key_file.open("rb") as f:
            given = f.read(4 * _KEY_BYTES).decode("ascii", errors="replace").strip()
    except OSError as e:
        raise HarnessError(f"approver key file {key_file}: {e.strerror}") from None
    return bool(given) and hmac.compare_digest(given.encode(), want.encode())


def _ask_on_tty(prompt: str) -> str | None:
    """What the person typed on the controlling terminal after `prompt` (one line), or None
    when there is no controlling terminal (a sandboxed or detached process)."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return None
    try:
        os.write(fd, prompt.encode("utf-8", errors="replace"))
        typed = b""
        while not typed.endswith(b"\n") and len(typed) < 200:
            chunk = os.read(fd, 200)
            if not chunk:
                break
            typed += chunk
        return typed.decode("utf-8", errors="replace").strip()
    finally:
        os.close(fd)


def _describe(approval: dict[str, Any]) -> str:
    """The bound action and who asked, as `forge approvals` shows them (the one sanitiser:
    stored text cannot move the cursor on the person's terminal)."""
    who = (approval.get("requested_by") or {}).get("name", "?")
    return "\n".join([
        f"approval {printable(approval['approval_id'])}",
        "  action: " + bound_action(approval["kind"], approval["target"],
                                    approval.get("arguments") or {}),
        f"  asked by: {printable(str(who))}",
        f"  summary: {printable(str(approval.get('summary', '')))}"])


def confirm(ws: Workspace, approval: dict[str, Any], key_file: str | Path | None = None
            ) -> str:
    """The channel a person confirmed this grant on (module contract)."""
    key_file = key_file or os.environ.get(KEY_ENV) or None
    if key_file:
        if not _key_matches(ws, Path(key_file)):
            raise HarnessError(f"approve {approval['approval_id']}: {key_file} does not hold "
                               f"this workspace's approver key ({key_path(ws)}); nothing "
                               "granted")
        return "key"
    code = approval["approval_id"][-6:]
    typed = _ask_on_tty(_describe(approval) + f"\nType {code} to grant it: ")
    if typed is None:
        approver_key(ws)  # so the message can name a file that exists
        raise HarnessError(f"approve {approval['approval_id']}: no terminal to confirm on; a "
                           f"person runs it in a terminal, or gives --key-file "
                           f"{key_path(ws)} (the sandbox cannot read it); nothing granted")
    if not hmac.compare_digest(typed.encode(), code.encode()):
        raise HarnessError(f"approve {approval['approval_id']}: confirmation did not match; "
                           "nothing granted")
    return "tty"


def os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return os.environ.get("USER", "unknown")


def actor(by: str | None, channel: str) -> E.Actor:
    """The recorded human (module contract)."""
    name = f"{os_user()} via {channel}"
    if by is not None and by.strip() and by.strip() != os_user():
        name += f", says {by.strip()[:100]}"
    return E.Actor.human(name)
