"""Nsight Systems mode: the argv wrapping an SGLang server launch, and `nsys stats`' kernel
summary (tests/data/nsys: its documented CSV shape) parsed into the per-phase table."""

from __future__ import annotations

import pytest
from infer_forge.harness.perf.nsys import parse_kern_sum, profile_argv, stats_argv
from infer_forge.harness.perf.options import parse_options
from infer_forge.harness.perf.summary import TraceError
from infer_forge.projections.perf import compare_phases

from tests.conftest import REPO

SAMPLE = REPO / "tests" / "data" / "nsys" / "cuda_gpu_kern_sum.csv"
SERVER = ["python", "-m", "sglang.launch_server", "--model-path", "/models/llama",
          "--port", "30000"]


def test_profile_argv_wraps_the_server_launch():
    argv = profile_argv(SERVER, "/runs/r1/sglang")
    assert argv[:2] == ["nsys", "profile"]
    assert argv[-len(SERVER):] == SERVER  # the launch itself, unchanged, last
    flags = argv[2:-len(SERVER)]
    assert "--capture-range=cudaProfilerApi" in flags  # opened by SGLang's CUDA_PROFILER
    assert "--capture-range-end=stop" in flags
    assert "--trace-fork-before-exec=true" in flags  # the scheduler runs in child processes
    assert "--cuda-graph-trace=node" in flags
    assert "--output=/runs/r1/sglang" in flags and "--trace=cuda,nvtx" in flags
    assert profile_argv(SERVER, "o", nsys="/opt/nsys/bin/nsys",
                        cuda_graph_trace="graph")[0] == "/opt/nsys/bin/nsys"
    with pytest.raises(ValueError, match="no server"):
        profile_argv([], "o")
    with pytest.raises(ValueError, match="cuda_graph_trace"):
        profile_argv(SERVER, "o", cuda_graph_trace="all")
    assert stats_argv("r.nsys-rep") == ["nsys", "stats", "--report=cuda_gpu_kern_sum",
                                        "--format=csv", "--output=-", "r.nsys-rep"]
    # the request that opens the range: CUDA_PROFILER with the torch profiler's CPU side
    body = parse_options("", "CPU,CUDA_PROFILER").body()
    assert body == {"activities": ["CPU", "CUDA_PROFILER"]}


def test_kern_sum_parses_into_the_phase_table():
    phase = parse_kern_sum(SAMPLE.read_text(encoding="utf-8"), output_tokens=1792, top=3)
    assert (phase.name, phase.kind, phase.count) == ("all", "kernel", 9016)
    assert phase.total_ms == pytest.approx(44.968704)
    assert len(phase.top) == 3
    gemm = phase.top[0]
    assert gemm.name.startswith("sm90_xmma_gemm_bf16") and gemm.count == 3584
    assert gemm.total_ms == pytest.approx(21.905664)
    assert gemm.mean_ms == pytest.approx(0.0061121, abs=1e-6)  # the CSV's Avg (ns)
    assert gemm.share == pytest.approx(0.487, abs=5e-4)  # the CSV's Time (%)
    assert gemm.per_token_ms == pytest.approx(21.905664 / 1792, abs=1e-6)
    assert phase.top[1].name.startswith("void flashinfer::BatchDecodeWithPagedKVCache")
    long = ('"Time (%)","Total Time (ns)","Instances","Name"\n'
            f'"100.0","10","1","void k<{"int, " * 80}int>()"\n')
    assert len(parse_kern_sum(long).top[0].name) == 200  # cut like every profile's names
    # another time unit in the header, and two captures compared as any others
    us = SAMPLE.read_text(encoding="utf-8").replace("Total Time (ns)", "Total Time (us)")
    assert parse_kern_sum(us).total_ms == pytest.approx(44968.704)
    a, b = parse_kern_sum(SAMPLE.read_text(encoding="utf-8")), parse_kern_sum(us)
    out = compare_phases([a.as_dict()], [b.as_dict()])
    assert out["basis"] == "ms" and out["phases"][0]["rows"][0]["name"] == gemm.name


@pytest.mark.parametrize("text, msg", [
    ("Processing [x.sqlite]...\n", "no header"),
    ('"Time (%)","Total Time (ns)","Instances","Name"\n', "no kernels"),
    ('"Time (%)","Total Time (ns)","Instances","Name"\n"1","x","1","k"\n', "not a number"),
    ('"Time (%)","Total Time (ns)","Instances","Name"\n"1","2","k"\n', "3 fields"),
    ('"Time (%)","Total Time (min)","Instances","Name"\n"1","2","3","k"\n', "min"),
])
def test_kern_sum_refuses_malformed_output(text, msg):
    with pytest.raises(TraceError, match=msg):
        parse_kern_sum(text)


def test_module_entry_points(capsys):
    import json
    import shlex

    from infer_forge.harness.perf.nsys import main

    assert main(["wrap", "/runs/o", "--", *SERVER]) == 0
    assert shlex.split(capsys.readouterr().out) == profile_argv(SERVER, "/runs/o")
    assert main(["summary", str(SAMPLE), "1792"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert table["name"] == "all" and table["count"] == 9016 and len(table["top"]) == 5
    assert main(["summary", str(SAMPLE.parent / "README.md")]) == 1
    assert "no header" in capsys.readouterr().err
    assert main(["wrap"]) == 2
