"""`forge demo` — the main job.

Interim version (until the embedded-engine loop lands): records a small, realistic task
history through the ledger, one atomic save per loop step, then replays it.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ledger import events as E
from ..ledger.clock import digest
from ..ledger.replay import replay_task
from ..ledger.state import fingerprint
from ..ledger.store import Append, task_stream
from ..ledger.workspace import Workspace

TASK_ID = "demo-ledger"


def run_demo(ws: Workspace, echo: Callable[[str], None] = print) -> None:
    ledger = ws.ledger
    stream = task_stream(TASK_ID)
    point = {"model": {"name": "tiny-llama"}, "accelerator": {"vendor": "cpu"}}
    point_hash = digest(point)
    actor = E.Actor.tool("forge-demo")
    common = {"task_id": TASK_ID, "actor": actor, "input_digests": {"point": point_hash}}
    echo(f"recording a sample task history into {ws.home}")
    ledger.append("workspace", [E.DeploymentPointPinned(name="tiny-cpu", point_hash=point_hash,
                                                        point=point, actor=actor)],
                  command_id=f"{TASK_ID}:pin")
    definition = {"type": "deployment-tuning", "goal": "Raise output throughput"}
    ledger.append(stream, [E.TaskDefined(title="demo", task_type="deployment-tuning",
                                         goal=definition["goal"], definition=definition,
                                         definition_hash=digest(definition),
                                         point_hash=point_hash, **common)],
                  command_id=f"{TASK_ID}:define")
    for i, (cb, tput) in enumerate([(False, 460.0), (True, 170.0)], start=1):
        block = f"b{i}"
        cand = {"engine.continuous_batching": cb}
        step = [
            E.LoopBlockStarted(index=i, sub_goal=f"try continuous_batching={cb}",
                               routing={"model_tier": "none", "agent_topology": "single"},
                               candidate=cand, block_id=block, **common),
            E.MeasurementRecorded(run_id=f"{block}-r1", source="forge-demo",
                                  metrics={"output_throughput": tput}, candidate=cand,
                                  block_id=block, **common),
            E.LoopBlockHandedOff(state_reached=f"{tput} tok/s", block_id=block, **common),
        ]
        ledger.save(Append(stream, step), command_id=f"{TASK_ID}:block:{i}")
    ledger.append(stream, [E.TaskExited(state="follow-up-handoff",
                                        reason="sample history recorded", **common)],
                  command_id=f"{TASK_ID}:exit")
    state = replay_task(ledger, TASK_ID)
    echo(f"replayed {TASK_ID}: {len(state.blocks)} blocks, {state.measurements} measurements, "
         f"status {state.status} ({state.exit_state})")
    echo(f"fingerprint {fingerprint(state)}")
    echo(f"explore: forge --home {ws.home} log; forge --home {ws.home} replay {TASK_ID}")
