"""Engine servers started for an agent run in the tool-call sandbox.

An agent bound to a task can write files (its worktrees, its scratch directory) and ask for
an engine; an engine started on the user's behalf from anything the agent wrote (a runtime
profile whose `config.env.PYTHONPATH` names a `sitecustomize.py`, a model directory with
remote code, a launcher) would run that code as the user, outside every guard. So:

- `for_launch(ws, fields)`: the sandbox an engine server's processes run in, decided from the
  launch's recorded actor (`fields["actor"]`, the `EngineLaunched` event's): an agent's launch
  gets an `EngineSandbox`; a person's or forge's own (`forge engine up`, the loop's evaluator
  on the task's contract-pinned profile) gets None and runs as before.
- `EngineSandbox.wrap(argv, env, cwd)`: `(argv, env)` to start instead: `guard.sandbox.prepare`
  with the network on (the server listens, forge polls it), the GPUs the launch names in
  `CUDA_VISIBLE_DEVICES` (else every GPU of the host), writable only the task's directories
  (a launch naming no task: the workspace's no-task scratch, where it runs), credential files
  hidden, the allowlisted environment
  plus what the engine sets. Every process of an engine's launch goes through it: the server,
  the router of a whole point, the launcher's `--help` that checks flags.
- Where the sandbox cannot be made (`[guard] sandbox = "off"`, or no working bubblewrap under
  `auto`), `wrap` refuses (HarnessError, one line) unless the launch is a task's (its fields
  name the task: the session tool then launches the task's contract-pinned profile with a
  candidate in its scope): nothing an agent supplied starts unsandboxed.

The session tool (`mcp/session_tools.engine_up`) also refuses an agent-supplied profile or
point that runs in a container image: the container runtime's daemon is outside any sandbox
forge can make.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from . import sandbox as S

_GPU_NODE = re.compile(r"nvidia(\d+)$")


def host_gpus() -> list[str]:
    """The indices of this host's NVIDIA devices (`/dev/nvidia<N>`)."""
    try:
        names = os.listdir("/dev")
    except OSError:
        return []
    return sorted((m.group(1) for n in names if (m := _GPU_NODE.match(n))), key=int)


def launch_gpus(env: Mapping[str, str]) -> list[str]:
    """The GPUs an engine process is given: its `CUDA_VISIBLE_DEVICES` (the launch's, else
    forge's), else every GPU of the host."""
    named = env.get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
    if named is not None:
        return [g.strip() for g in named.split(",") if g.strip()]
    return host_gpus()


@dataclass(frozen=True)
class EngineSandbox:
    """How one agent's engine launch is sandboxed (module contract)."""

    ws: Workspace | None
    task_id: str | None
    pinned: bool = False

    def wrap(self, argv: Sequence[str], env: Mapping[str, str] | None,
             cwd: str | Path | None = None) -> tuple[list[str], dict[str, str]]:
        engine_env = dict(env or {})
        gpus = launch_gpus(engine_env)
        if gpus:
            engine_env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        mode = self.ws.config.settings.guard.sandbox if self.ws is not None else "auto"
        problem = 'sandbox off ([guard] sandbox = "off" in forge.toml)' if mode == "off" \
            else S.find_bwrap()[1]
        if problem is not None:
            if not self.pinned:
                raise HarnessError(f"engine for an agent refused: it would run unsandboxed "
                                   f"({problem}); start it from the task's own runtime "
                                   "profile, or make the sandbox available")
            return [str(a) for a in argv], {**os.environ, **engine_env}
        # It runs in its scratch directory, never forge's own (a call without a task may
        # write its cwd).
        scratch = S.scratch_of(self.ws, self.task_id)
        launch, child, _profile = S.prepare(
            self.ws, argv, cwd=cwd or scratch, task=self.task_id, allow_network=True,
            gpus=gpus, env=engine_env)
        return launch, child


def for_launch(ws: Workspace | None, fields: Mapping[str, Any]) -> EngineSandbox | None:
    """The sandbox of an engine launch recorded with `fields` (module contract)."""
    actor = fields.get("actor")
    if not isinstance(actor, E.Actor) or actor.kind != "agent":
        return None
    task_id = fields.get("task_id")
    return EngineSandbox(ws, task_id, pinned=task_id is not None)
