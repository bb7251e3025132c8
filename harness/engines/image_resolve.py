"""Images pinned at first use: a profile's `image: {name: repo:tag, digest: resolve}`.

Contracts:
- `resolve_use(ws, use)`: an ImageUse whose digest is `resolve` becomes the same image by
  digest. The workspace's record for the name wins (`projections/images.resolved_image`:
  later launches use the first resolution, wherever the tag has moved since); without one,
  the runtime pulls the tag (`pull_digest`) and the digest it reports is recorded
  (`ImageResolved` on the `workspace` stream, once per name: a racing second resolution adds
  nothing and both use the recorded one). Any other ImageUse is returned as it is. A
  resolution needs a workspace to record it (a one-line refusal without one).
- The pull itself is image.py's `pull_digest`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

from ...ledger import events as E
from ...ledger.specs import RESOLVE_DIGEST
from ...ledger.streams import WORKSPACE_STREAM
from ...ledger.workspace import Workspace
from ...projections.images import resolved_image
from ..errors import HarnessError
from .image import ImageUse, Runner, pull_digest


def unresolved(use: ImageUse | None) -> bool:
    return use is not None and use.digest == RESOLVE_DIGEST


def image_name(use: ImageUse) -> str:
    """The `repo:tag` an unresolved use names (its ref is `repo:tag@resolve`)."""
    return use.ref.rpartition("@")[0]


def resolve_use(ws: Workspace | None, use: ImageUse | None, *,
                say: Callable[[str], None] | None = None,
                run: Runner = subprocess.run) -> ImageUse | None:
    if use is None or not unresolved(use):
        return use
    name = image_name(use)
    if ws is None:
        raise HarnessError(f"image {name} (digest: resolve) needs a workspace to record its "
                           "resolution (give --home, or pin image.digest)")
    known = resolved_image(ws.ledger, name)
    digest = known.digest if known is not None else record_resolution(
        ws, name, pull_digest(use, name, run=run, say=say), use.runtime.kind, say=say)
    return ImageUse(use.runtime, f"{name}@{digest}", digest, use.profile)


def record_resolution(ws: Workspace, name: str, digest: str, runtime: str, *,
                      say: Callable[[str], None] | None = None) -> str:
    """`ImageResolved` appended once per name; the digest recorded (this one, or a racing
    resolution's that came first)."""
    ws.ledger.append(WORKSPACE_STREAM, [E.ImageResolved(
        name=name, digest=digest, runtime=runtime, actor=E.Actor.tool("forge-image"))],
        command_id=f"image-resolved:{name}")
    known = resolved_image(ws.ledger, name)
    assert known is not None  # just appended, or a racing resolution's
    if say is not None:
        say(f"image {name} resolved to {known.digest} with {runtime} (recorded: later "
            "launches use this digest)")
    return known.digest
