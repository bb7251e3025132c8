"""A defined task with an open block, for tests that record measurements: every append to a
task stream goes through `harness.record`, which refuses an unknown task or a block that is
not open."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import start_block
from infer_forge.ledger.streams import task_stream

from ..harness.loop.test_loop import make_task_dir


def open_task(ws: Any, root: Path, task_id: str = "t1") -> str:
    """Define task `task_id` (the tiny example task) and start a block; returns its id."""
    define_task(ws, make_task_dir(root / f"specs-{task_id}", task_id))
    return start_block(ws, task_id, "record measurements")["block_id"]


def measurements(ws: Any, task_id: str) -> list:
    """The task's MeasurementRecorded events, in order."""
    return [r.event for r in ws.ledger.stream_log(task_stream(task_id))
            if r.type == "MeasurementRecorded"]
