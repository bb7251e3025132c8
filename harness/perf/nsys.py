"""Nsight Systems as a capture mode: the argv that wraps an SGLang server launch, and the
parser of `nsys stats`' kernel summary into the same per-phase table as a torch trace.

The range: the server runs under `nsys profile --capture-range=cudaProfilerApi
--capture-range-end=stop`, so nothing is recorded until a process calls cudaProfilerStart;
SGLang's `/start_profile` with the `CUDA_PROFILER` activity calls it on the first GPU
(`torch.cuda.cudart().cudaProfilerStart()` in the scheduler's profiler) and `/stop_profile`
calls cudaProfilerStop, which ends the capture. SGLang forks its scheduler processes, so
`--trace-fork-before-exec=true`; `--cuda-graph-trace=node` records each kernel of a graph
replay (the default, `graph`, one range per replay). The report is `<output>.nsys-rep`.

The summary: `nsys stats --report cuda_gpu_kern_sum --format csv <report>` prints (after
progress lines) a CSV with the header `"Time (%)","Total Time (ns)","Instances","Avg (ns)",
"Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"` (NVIDIA's Nsight Systems
Post-Collection Analysis Guide, report `cuda_gpu_kern_sum`; `--timeunit` changes the unit in
the header, which is read from it). Its rows become one phase `all` of kind kernel: nsys's
summary has no phases (an `:nvtx-name` variant prefixes kernel names with their NVTX range
instead).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from ..engines.nsys_launch import profile_argv
from .phases import ALL, Phase, PhaseOp
from .summary import MAX_NAME, TraceError

UNITS = {"ns": 1e-6, "us": 1e-3, "μs": 1e-3, "ms": 1.0, "s": 1e3}  # -> ms
KERN_SUM = "cuda_gpu_kern_sum"


def stats_argv(report: str, *, nsys: str = "nsys") -> list[str]:
    """`nsys stats` printing the kernel summary of `report` as CSV on stdout."""
    return [nsys, "stats", f"--report={KERN_SUM}", "--format=csv", "--output=-", report]


def _number(text: str, what: str, line: int) -> float:
    try:
        return float(text.replace(",", "").strip())
    except ValueError:
        raise TraceError(f"nsys {KERN_SUM} line {line}: {what} {text!r} is not a number"
                         ) from None


def parse_kern_sum(text: str, *, output_tokens: float | None = None, top: int = 20
                   ) -> Phase:
    """The kernel table of `nsys stats --report cuda_gpu_kern_sum --format csv` output (see
    module docstring); lines before the header (nsys's progress) are skipped. TraceError when
    there is no header or a row is malformed."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if "Total Time (" in ln and "Name" in ln),
                 None)
    if start is None:
        raise TraceError(f"nsys {KERN_SUM}: no header with \"Total Time (unit)\" and "
                         "\"Name\" (is this the kernel summary as CSV?)")
    reader = csv.reader(io.StringIO("\n".join(lines[start:])))
    header = [h.strip() for h in next(reader)]
    total_col = next(h for h in header if h.startswith("Total Time ("))
    unit = total_col[len("Total Time ("):-1]
    if unit not in UNITS or "Instances" not in header or "Name" not in header:
        raise TraceError(f"nsys {KERN_SUM}: header {','.join(header)!r}: expected Total Time "
                         f"in one of {', '.join(UNITS)}, Instances and Name")
    i_total, i_n, i_name = header.index(total_col), header.index("Instances"), \
        header.index("Name")
    rows: dict[str, list[float]] = {}
    for n, row in enumerate(reader, start + 2):
        if not row or not any(c.strip() for c in row):
            break  # the end of this report's table
        if len(row) != len(header):
            raise TraceError(f"nsys {KERN_SUM} line {n}: {len(row)} fields, expected "
                             f"{len(header)}")
        ms = _number(row[i_total], "total time", n) * UNITS[unit]
        calls = _number(row[i_n], "instances", n)
        r = rows.setdefault(row[i_name], [0.0, 0.0])
        r[0] += calls
        r[1] += ms
    if not rows:
        raise TraceError(f"nsys {KERN_SUM}: no kernels (did the capture range open? SGLang's "
                         "CUDA_PROFILER activity opens it)")
    total = sum(r[1] for r in rows.values())
    tok = output_tokens if output_tokens and output_tokens > 0 else None
    order = sorted(rows, key=lambda k: (-rows[k][1], k))[:top]
    ops = tuple(PhaseOp(name=k[:MAX_NAME], count=int(rows[k][0]),
                        total_ms=round(rows[k][1], 6),
                        mean_ms=round(rows[k][1] / rows[k][0], 6) if rows[k][0] else 0.0,
                        share=round(rows[k][1] / total, 6) if total > 0 else 0.0,
                        per_token_ms=round(rows[k][1] / tok, 6) if tok else None,
                        graph_ms=0.0) for k in order)
    return Phase(name=ALL, kind="kernel", unit="device time (ms)", total_ms=round(total, 6),
                 per_token_ms=round(total / tok, 6) if tok else None,
                 count=int(sum(r[0] for r in rows.values())), steps=0, tokens=0,
                 graph_replays=0, top=ops)


def main(argv: Sequence[str]) -> int:
    """`wrap OUTPUT -- SERVER ARGV...`: print the wrapped launch (shell-quoted);
    `summary CSV [OUTPUT_TOKENS]`: the kernel table of a saved `nsys stats` CSV as JSON."""
    import json
    import shlex
    import sys

    args = list(argv)
    if len(args) >= 4 and args[0] == "wrap" and args[2] == "--":
        print(shlex.join(profile_argv(args[3:], args[1])))
        return 0
    if len(args) in (2, 3) and args[0] == "summary":
        from pathlib import Path

        tokens = float(args[2]) if len(args) == 3 else None
        try:
            phase = parse_kern_sum(Path(args[1]).read_text(encoding="utf-8"),
                                   output_tokens=tokens)
        except (OSError, TraceError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        print(json.dumps(phase.as_dict(), indent=1))
        return 0
    print("usage: python -m infer_forge.harness.perf.nsys wrap OUTPUT -- SERVER ARGV... | "
          "summary CSV [OUTPUT_TOKENS]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
