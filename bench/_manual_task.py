"""A manual task on the tiny CPU point, laid out like examples/ (points/, profiles/, tasks/):
what the per-call benchmarks (MCP round trip, sandbox overhead) record into. Also `pct`."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

TASK = """\
id: {task_id}
type: deployment-tuning
goal: {goal}
point: ../points/tiny-cpu.yaml
scope:
  engine.continuous_batching: [false, true]
contract:
  gates:
    - {{name: stability, repeats: 3, max_cv: 0.5}}
executor: {{kind: manual}}
"""


def manual_task_dir(root: Path, task_id: str, goal: str) -> Path:
    """The task file of a manual task `task_id` under `root` (with its point and profile)."""
    for sub in ("points", "profiles", "tasks"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for rel in ("points/tiny-cpu.yaml", "profiles/tiny-cpu.yaml"):
        (root / rel).write_text((REPO / "examples" / rel).read_text())
    path = root / f"tasks/{task_id}.yaml"
    path.write_text(TASK.format(task_id=task_id, goal=goal))
    return path


def pct(xs: list[float], q: float) -> float:
    """The q-quantile of `xs` (nearest rank)."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]
