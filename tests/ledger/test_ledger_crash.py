"""kill -9 of writer processes during appends, on a real SQLite file and on a real
PostgreSQL database (tests/conftest.py `backend_home`).

Each round starts a writer subprocess that saves 21-event commands (20 measurements on one
task stream + a tool call on another, in one save) and prints each command id only after its
save returned; the test SIGKILLs it mid-stream after a varying number of acknowledgements.
The next round restarts from the first unacknowledged command id, so a save that committed
without being acknowledged is retried and must not duplicate.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from infer_forge.ledger import events as E
from infer_forge.ledger.store import Ledger
from infer_forge.ledger.streams import COMMAND_PREFIX

from tests.conftest import TESTS, run_forge

WRITER = TESTS / "helpers" / "ledger_writer.py"
ROUNDS = 12


def start_writer(home: Path, start: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(WRITER), "batches", str(home), "cmd", str(start)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def test_kill9_during_appends_loses_no_acknowledged_event(backend_home):
    forge_home = backend_home
    rng = random.Random(7)
    acked: list[str] = []
    dups = 0
    for _ in range(ROUNDS):
        proc = start_writer(forge_home, len(acked))
        kill_after = rng.randint(1, 8)
        lines: list[str] = []
        for line in proc.stdout:  # wait on the writer's own output, not on time
            lines.append(line)
            if len(lines) >= kill_after:
                os.kill(proc.pid, signal.SIGKILL)
                break
        else:
            raise AssertionError(f"writer died on its own: {proc.stderr.read()}")
        # Lines printed before the kill are still in the pipe: those are acknowledged too.
        rest = proc.stdout.read()
        proc.wait()
        assert proc.returncode == -signal.SIGKILL
        for cid, kind in _acks([*lines, *rest.splitlines()]):
            # A "dup" is a save that committed before the previous kill but was never
            # acknowledged: the retry with the same command id found it and added nothing.
            assert cid not in acked
            acked.append(cid)
            dups += kind == "dup"
        proc.stdout.close()
        proc.stderr.close()

    assert len(acked) >= ROUNDS
    assert dups <= ROUNDS
    assert acked == [f"cmd-{i}" for i in range(len(acked))]

    with Ledger.open(forge_home) as ledger:
        rows = list(ledger.rows())
        # Global positions strictly increase; gap-free on SQLite (PostgreSQL's sequence
        # skips what a killed transaction drew: `forge check` notes it, no event is missing).
        positions = [r[0] for r in rows]
        assert positions == sorted(set(positions))
        if ledger.config.backend == "sqlite":
            assert positions == list(range(1, len(rows) + 1))
        markers = {r[1][len(COMMAND_PREFIX):] for r in rows if r[1].startswith(COMMAND_PREFIX)}
        markers.discard("workspace-initialized")
        per_command = Counter(r.event.command_id for r in ledger.log()
                              if r.stream in ("task:crash", "task:side"))
        crash = ledger.stream_log("task:crash")
        side = ledger.stream_log("task:side")

    # No acknowledged command lost.
    assert set(acked) <= markers
    # At most the one command in flight at each kill committed without an acknowledgement.
    assert len(markers - set(acked)) <= 1
    # No partial batch: every command present has all 21 events, every event has its marker.
    assert set(per_command) == markers
    assert all(n == 21 for n in per_command.values()), per_command
    # Versions contiguous in both streams; no duplicate measurement.
    assert [r.version for r in crash] == list(range(1, len(crash) + 1))
    assert [r.version for r in side] == list(range(1, len(side) + 1))
    runs = [r.event.run_id for r in crash if isinstance(r.event, E.MeasurementRecorded)]
    assert len(runs) == len(set(runs)) == 20 * len(markers)

    result = run_forge("check", home=forge_home)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")


def _acks(lines: list[str]) -> list[tuple[str, str]]:
    out = []
    for ln in lines:
        parts = ln.split()
        if len(parts) == 3 and parts[0] == "ACK":
            out.append((parts[1], parts[2]))
    return out
