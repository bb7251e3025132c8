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


def stand_in_nsys(bin_dir, calls):
    """An `nsys` on PATH (Nsight Systems cannot run here) that answers `stats` as the real
    one prints the kernel summary (the documented CSV, tests/data/nsys) and logs its argv."""
    import os

    bin_dir.mkdir()
    exe = bin_dir / "nsys"
    exe.write_text(
        "#!/bin/sh\n"
        f"echo \"$@\" >> '{calls}'\n"
        'if [ "$1 $2 $3 $4" = "stats --report=cuda_gpu_kern_sum --format=csv --output=-" ] '
        '&& [ -f "$5" ]; then\n'
        f"  cat '{SAMPLE}'; exit 0\nfi\n"
        "echo 'ERROR: unexpected arguments' >&2; exit 1\n")
    os.chmod(exe, 0o755)
    return exe


def test_record_an_nsys_capture_and_compare(workspace, tmp_path, monkeypatch):
    from infer_forge.harness.errors import HarnessError
    from infer_forge.harness.perf.nsys_record import record_nsys
    from infer_forge.ledger import events as E
    from infer_forge.projections.perf import compare_captures

    rep = tmp_path / "sglang.nsys-rep"
    rep.write_bytes(b"\x00NSYS report bytes\x01" * 64)
    with pytest.raises(HarnessError, match="nsys not found"):
        monkeypatch.setenv("PATH", str(tmp_path / "empty"))
        record_nsys(workspace, url="http://h:30000", report=rep)
    calls = tmp_path / "calls.txt"
    stand_in_nsys(tmp_path / "bin", calls)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    a = record_nsys(workspace, url="http://h:30000", report=rep, output_tokens=1792)
    assert calls.read_text().split() == ["stats", "--report=cuda_gpu_kern_sum",
                                         "--format=csv", "--output=-", str(rep)]
    assert list(a["traces"]) == ["sglang.nsys-rep", "cuda_gpu_kern_sum.csv"]
    assert workspace.artifacts.get(a["traces"]["sglang.nsys-rep"]) == rep.read_bytes()
    [phase] = a["phases"]
    assert phase["name"] == "all" and phase["top"][0]["count"] == 3584
    assert phase["per_token_ms"] == pytest.approx(44.968704 / 1792, abs=1e-6)
    # the CSV given (no nsys run), fewer tokens: the same kernels cost more per token
    b = record_nsys(workspace, url="http://h:30000", stats_csv=SAMPLE, output_tokens=896)
    assert list(b["traces"]) == ["cuda_gpu_kern_sum.csv"] and len(calls.read_text()
                                                                  .splitlines()) == 1
    evs = [r.event for r in workspace.ledger.stream("profiles")]
    assert [e.method for e in evs] == ["nsys", "nsys"] and all(
        isinstance(e, E.ProfileCaptured) for e in evs)
    out = compare_captures(workspace.ledger, a["event_id"], b["event_id"])
    assert out["basis"] == "ms per output token"
    top = out["phases"][0]["rows"][0]
    assert top["name"].startswith("sm90_xmma_gemm") and top["rel"] == pytest.approx(1.0)
    with pytest.raises(HarnessError, match="over the limit"):
        record_nsys(workspace, url="http://h:30000", report=rep, max_report_bytes=10)
    with pytest.raises(HarnessError, match="no header"):
        record_nsys(workspace, url="http://h:30000", stats_csv=SAMPLE.parent / "README.md")
    with pytest.raises(HarnessError, match="give the report"):
        record_nsys(workspace, url="http://h:30000")
    assert len(workspace.ledger.stream("profiles")) == 2


def test_cli_perf_nsys(forge_home):
    import json

    from tests.conftest import run_forge

    assert run_forge("init", home=forge_home).returncode == 0
    r = run_forge("perf", "nsys", "--url", "http://h:30000", "--stats", str(SAMPLE),
                  "--output-tokens", "1792", home=forge_home)
    assert r.returncode == 0, r.stderr
    assert "nsys profile of sglang at http://h:30000" in r.stdout
    assert "phase all:" in r.stdout and "sm90_xmma_gemm" in r.stdout
    r = run_forge("perf", "nsys", "--url", "http://h:30000", "--stats", str(SAMPLE), "--json",
                  home=forge_home)
    assert json.loads(r.stdout)["method"] == "nsys"
    r = run_forge("perf", "nsys", "--url", "http://h:30000", "--output-tokens", "0",
                  "--stats", str(SAMPLE), home=forge_home)
    assert r.returncode != 0 and "output tokens" in r.stderr and "Traceback" not in r.stderr
