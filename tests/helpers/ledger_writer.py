"""Writer processes for the ledger reliability tests (run as scripts, never imported).

  ledger_writer.py batches HOME PREFIX START
      Saves command PREFIX-START, PREFIX-START+1, … forever: 20 measurements on task:crash plus
      one tool call on task:side, in one save. Prints `ACK <command id> <new|dup>` only after
      the save returned, so every printed id is an acknowledged command.
  ledger_writer.py contend HOME STREAM WRITER N
      Prints READY, waits for a line on stdin, then appends N events to STREAM one by one with
      an expected version, re-reading the version and retrying after each ConflictError.
      Prints one JSON line: {"ok": N, "conflicts": C, "message": first conflict message}.
  ledger_writer.py free HOME STREAM WRITER N
      Like contend without expected versions (the store appends at the end): all must succeed.
  ledger_writer.py hold DBFILE
      Takes SQLite's write lock (BEGIN IMMEDIATE), prints HOLDING, holds it until stdin closes.
"""

from __future__ import annotations

import json
import sqlite3
import sys


def _ledger(home: str):
    from infer_forge.ledger.store import Ledger

    return Ledger.open(home)


def batches(home: str, prefix: str, start: int) -> None:
    from infer_forge.ledger import events as E
    from infer_forge.ledger.store import Append

    ledger = _ledger(home)
    i = start
    while True:
        cid = f"{prefix}-{i}"
        measurements = [
            E.MeasurementRecorded(task_id="crash", block_id="b0", run_id=f"{cid}/{j}",
                                  source="kill9", metrics={"output_throughput": float(j)})
            for j in range(20)
        ]
        tool = E.ToolInvoked(task_id="side", tool="bench", argv=["bench", cid])
        result = ledger.save(Append("task:crash", measurements), Append("task:side", [tool]),
                             command_id=cid)
        sys.stdout.write(f"ACK {cid} {'dup' if result.duplicate else 'new'}\n")
        sys.stdout.flush()
        i += 1


def appenders(home: str, stream: str, writer: str, n: int, expect: bool) -> None:
    from infer_forge.ledger import events as E
    from infer_forge.ledger.errors import ConflictError

    ledger = _ledger(home)
    print("READY", flush=True)
    sys.stdin.readline()
    ok = conflicts = 0
    message = None
    for i in range(n):
        ev = E.DirectionRejected(task_id=stream, reason=f"{writer}:{i}")
        while True:
            expected = ledger.version(stream) if expect else None
            try:
                ledger.append(stream, [ev], expected_version=expected,
                              command_id=f"{writer}-{i}")
                ok += 1
                break
            except ConflictError as e:
                conflicts += 1
                message = message or str(e)
    print(json.dumps({"ok": ok, "conflicts": conflicts, "message": message}), flush=True)


def hold(dbfile: str) -> None:
    conn = sqlite3.connect(dbfile, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("HOLDING", flush=True)
    sys.stdin.read()
    conn.rollback()
    conn.close()


def main(argv: list[str]) -> None:
    cmd, *args = argv
    if cmd == "batches":
        batches(args[0], args[1], int(args[2]))
    elif cmd in ("contend", "free"):
        appenders(args[0], args[1], args[2], int(args[3]), expect=cmd == "contend")
    elif cmd == "hold":
        hold(args[0])
    else:
        raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
