"""A server launched under Nsight Systems: the `nsys profile` argv (perf/nsys.py reads what
it records; the engines wrap a launch with it: `sglang.nsys_wrap`, engine config `nsys`).

The range: nothing is recorded until a process calls cudaProfilerStart (SGLang's
`/start_profile` with the CUDA_PROFILER activity) and the capture ends at its
cudaProfilerStop (`--capture-range=cudaProfilerApi --capture-range-end=stop`); SGLang forks
its scheduler processes (`--trace-fork-before-exec=true`); `--cuda-graph-trace=node` records
each kernel of a graph replay. The report is `<output>.nsys-rep`.
"""

from __future__ import annotations

from collections.abc import Sequence


def profile_argv(server: Sequence[str], output: str, *, nsys: str = "nsys",
                 trace: Sequence[str] = ("cuda", "nvtx"), cuda_graph_trace: str = "node"
                 ) -> list[str]:
    """`nsys profile ... <server argv>`: the server launched under Nsight Systems, recording
    from SGLang's CUDA_PROFILER start to its stop into `<output>.nsys-rep`."""
    if not server:
        raise ValueError("nsys: no server command to wrap")
    if cuda_graph_trace not in ("node", "graph"):
        raise ValueError(f"cuda_graph_trace {cuda_graph_trace!r}: expected node or graph")
    return [nsys, "profile", f"--trace={','.join(trace)}",
            "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
            "--trace-fork-before-exec=true", f"--cuda-graph-trace={cuda_graph_trace}",
            "--force-overwrite=true", f"--output={output}", *server]
