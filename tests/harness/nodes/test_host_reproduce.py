"""`forge reproduce` compares the host's state (harness/nodes/host_state.py `compare`): a
block recorded on a quiet host, re-run by the real CLI on the real hf engine (the tiny model)
while a busy process this test starts (outside forge's process tree, as another user's job)
holds a core, comes back `not comparable: ...` with the numbers, exit 1, in `--json` too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.models.weights import pull
from infer_forge.harness.record import append_to_task
from infer_forge.ledger import events as E
from infer_forge.ledger.workspace import init_workspace

from tests.conftest import run_forge
from tests.harness.nodes.test_host_state import PLANT, write_task

# Other processes' CPU above a tenth of the cores contaminates; load is not judged (this
# shared machine's own load average moves on its own).
CPU_BOUND = "{max_load_per_core: 1000, max_foreign_cpu: 0.1}"
QUIET = {"cores": psutil.cpu_count(), "load1": 0.1, "foreign_cpu": 0.0, "foreign_top": [],
         "gpus": [], "nvml": "ok"}


def _busy_outside_our_tree() -> int:
    """A process spinning on a core, started through a shell that exits at once (so it is
    not this process's descendant, as another user's job is not forge's); its pid."""
    out = subprocess.run(["sh", "-c", f"{sys.executable} -c 'while True: pass' "
                          ">/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                         check=True)
    pid = int(out.stdout)
    assert pid not in {c.pid for c in psutil.Process().children(recursive=True)}
    return pid


def test_reproduce_under_a_busy_process_says_not_comparable(tmp_path):
    ws, _ = init_workspace(tmp_path / "home")
    try:
        pull(ws, "tiny-llama")
        define_task(ws, write_task(tmp_path / "spec", "hr", CPU_BOUND))
        common = {"task_id": "hr", "block_id": "b1", "actor": PLANT}
        append_to_task(ws, "hr", [
            E.LoopBlockStarted(index=1, sub_goal="baseline", **common),
            E.MeasurementRecorded(run_id="b1-r1", source="forge-bench", repeat=0,
                                  metrics={"output_throughput": 50.0},
                                  meta={"host": QUIET, "contaminated": []}, **common)])
        _reproduce_busy(ws)
    finally:
        ws.close()


def _reproduce_busy(ws) -> None:
    spin = [_busy_outside_our_tree()]
    try:  # the real CLI, in this process (run_forge): the busy processes are not its own
        r = run_forge("reproduce", "hr:b1", "--repeats", "1", "--band", "5", "--json",
                      home=ws.home, timeout=300)
    finally:
        for pid in spin:
            os.kill(pid, signal.SIGKILL)
    assert r.returncode == 1, (r.stdout, r.stderr)
    out = json.loads(r.stdout)
    cores = psutil.cpu_count()
    assert out["verdict"].startswith("not comparable: recorded at other processes' CPU 0 "
                                     f"on {cores} cores, now "), out["verdict"]
    assert out["verdict"] == out["not_comparable"]


