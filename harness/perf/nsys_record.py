"""`forge perf nsys`: an Nsight Systems capture recorded like any other profile.

Given the report (`.nsys-rep`, written when the server that ran under `nsys profile` stops;
nsys.py builds that launch) and/or its kernel summary (`nsys stats --report
cuda_gpu_kern_sum --format csv`): the report is stored as an artifact (bounded:
`max_report_bytes`), the summary is taken from the given CSV or, without one, from running
`nsys stats` on the report (nsys looked up on PATH; its absence is a one-line error), stored
through the redactor, parsed into one phase (`all`) and recorded as a `ProfileCaptured` with
method `nsys` on the task's stream (with `task_id`/`block_id`, checked as for a capture) or on
`profiles`. `output_tokens` (the window's, e.g. from the capture that opened the range) gives
the per-token figures that `forge perf compare` uses across captures.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.artifacts import ArtifactTooLargeError
from ...ledger.ids import check_optional_id
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from ..record import check_measurement_target
from .capture import event, record
from .nsys import parse_kern_sum, stats_argv
from .summary import Op, Summary, TraceError

MAX_REPORT_BYTES = 4 << 30  # a long nsys capture of a TP-8 server runs to gigabytes


def kern_sum_of(report: Path, *, nsys: str | None = None, timeout_s: float = 600.0) -> str:
    """`nsys stats`' kernel summary CSV of `report` (HarnessError naming what failed)."""
    exe = nsys or shutil.which("nsys")
    if exe is None:
        raise HarnessError("nsys not found on PATH (Nsight Systems): give the kernel summary "
                           "as --stats CSV (nsys stats --report=cuda_gpu_kern_sum --format=csv)")
    try:
        done = subprocess.run(stats_argv(str(report), nsys=exe), capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"nsys stats on {report}: no answer in {timeout_s:.0f} s") from None
    if done.returncode != 0:
        last = " ".join((done.stderr or done.stdout).split())[-300:] or "(no output)"
        raise HarnessError(f"nsys stats on {report} exited {done.returncode}: {last}")
    return done.stdout


def record_nsys(ws: Workspace, *, url: str, report: str | Path | None = None,
                stats_csv: str | Path | None = None, engine: str = "sglang",
                output_tokens: float | None = None, top: int = 20,
                task_id: str | None = None, block_id: str | None = None,
                actor: E.Actor | None = None, nsys: str | None = None,
                max_report_bytes: int = MAX_REPORT_BYTES) -> dict[str, Any]:
    """Record an Nsight Systems capture (see module docstring); returns what
    `capture_profile` returns, less the load."""
    if report is None and stats_csv is None:
        raise HarnessError("give the report (.nsys-rep), its kernel summary CSV, or both")
    if output_tokens is not None and not output_tokens > 0:
        raise HarnessError(f"output tokens {output_tokens!r}: expected a positive number")
    check_optional_id(task_id, "task id")
    check_optional_id(block_id, "block id")
    if block_id is not None and task_id is None:
        raise HarnessError("a block needs its task (--task)")
    check_measurement_target(ws, task_id, block_id)
    names, digests = [], []
    if report is not None:
        rep = Path(report)
        if not rep.is_file():
            raise HarnessError(f"{rep}: no such report")
        try:
            digests.append(ws.artifacts.put_file(rep, limit=max_report_bytes))
        except ArtifactTooLargeError as e:
            raise HarnessError(str(e)) from None
        names.append(rep.name)
    if stats_csv is not None:
        path = Path(stats_csv)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise HarnessError(f"{path}: {e.strerror}") from None
        name = path.name
    else:
        assert report is not None
        text, name = kern_sum_of(Path(report), nsys=nsys), "cuda_gpu_kern_sum.csv"
    digests.append(ws.artifacts.put(text))
    names.append(name)
    try:
        phase = parse_kern_sum(text, output_tokens=output_tokens, top=top)
    except TraceError as e:
        raise HarnessError(f"{name}: {e}") from None
    summary = Summary(kind=phase.kind, unit=phase.unit, total_ms=phase.total_ms,
                      count=phase.count,
                      top=tuple(Op(name=o.name, total_ms=o.total_ms, share=o.share,
                                   count=o.count) for o in phase.top))
    bench = {"total_output_tokens": float(output_tokens)} if output_tokens else {}
    ev = event(engine=engine, url=url, method="nsys", duration_s=0.0, load={}, bench=bench,
               names=tuple(names), digests=tuple(digests), summary=summary, phases=(phase,),
               options={}, task_id=task_id, block_id=block_id,
               actor=actor or E.Actor.tool("forge-perf"))
    stream = record(ws, ev)
    return {"event_id": str(ev.event_id), "stream": stream, "method": "nsys",
            "engine": engine, "url": url, "traces": dict(zip(names, digests, strict=True)),
            "summary": summary.as_dict(), "phases": [phase.as_dict()], "options": {},
            "bench": bench, "load": {}}
