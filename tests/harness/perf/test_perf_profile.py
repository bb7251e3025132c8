"""`forge perf capture`: the summaries of real profiler output, the embedded engine profiled
end to end with py-spy, the SGLang path against a server speaking SGLang's profiler protocol."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.perf.capture import Load, parse_load
from infer_forge.harness.perf.summary import (
    TraceError,
    load_chrome_trace,
    self_times,
    summarize_chrome,
    summarize_pyspy_raw,
)
from infer_forge.projections.perf import compare

from tests.conftest import REPO, need, run_forge


@pytest.fixture(scope="module")
def torch_trace(tmp_path_factory) -> Path:
    """A chrome trace recorded by torch.profiler on a few CPU operators (real, not written)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    lin = torch.nn.Linear(64, 64)
    x = torch.randn(32, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            torch.relu(lin(x)).sum()
    path = tmp_path_factory.mktemp("trace") / "cpu.trace.json"
    prof.export_chrome_trace(str(path))
    return path


# --- summaries ----------------------------------------------------------------------------


def test_chrome_summary_ranks_cpu_ops_by_self_time(torch_trace):
    raw = torch_trace.read_bytes()
    s = summarize_chrome([load_chrome_trace(raw)], top=50)
    assert s.kind == "cpu_op"
    names = [op.name for op in s.top]
    assert "aten::addmm" in names and "aten::linear" in names
    assert [op.total_ms for op in s.top] == sorted((op.total_ms for op in s.top), reverse=True)
    # self times: shares of the whole add up to 1 (inclusive times would exceed it)
    assert sum(op.share for op in s.top) == pytest.approx(1.0, abs=1e-4)
    # aten::linear calls addmm: its self time is less than its duration
    trace = json.loads(raw)
    linear = [e for e in trace["traceEvents"] if e.get("name") == "aten::linear"]
    lin = next(op for op in s.top if op.name == "aten::linear")
    assert lin.count == len(linear) == 5
    assert lin.total_ms < sum(e["dur"] for e in linear) / 1000
    # gzipped (as SGLang writes it) reads the same
    assert summarize_chrome([load_chrome_trace(gzip.compress(raw))], top=50) == s


def test_chrome_summary_prefers_device_kernels():
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 10, "dur": 30, "pid": 0, "tid": 7},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 50, "dur": 30, "pid": 0, "tid": 7},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 90, "dur": 20,
         "pid": 0, "tid": 8},
    ]}
    s = summarize_chrome([trace, trace])  # two ranks add up
    assert s.kind == "kernel" and s.count == 6
    assert [(op.name, op.total_ms, op.share, op.count) for op in s.top] == [
        ("gemm", 0.12, 0.75, 4), ("Memcpy HtoD", 0.04, 0.25, 2)]


def test_self_times_nesting():
    evs = [{"ts": 0.0, "dur": 10.0, "tid": 1}, {"ts": 1.0, "dur": 4.0, "tid": 1},
           {"ts": 2.0, "dur": 1.0, "tid": 1}, {"ts": 6.0, "dur": 3.0, "tid": 1},
           {"ts": 1.0, "dur": 50.0, "tid": 2}]
    assert self_times(evs) == [3.0, 3.0, 1.0, 3.0, 50.0]


@pytest.mark.parametrize("data, msg", [
    (b"not json", "not JSON"), (b'{"x": 1}', "traceEvents"),
    (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 0}]}', "dur"),
    (b'{"traceEvents": [{"ph": "X", "cat": "python_function", "name": "a", "ts": 0, '
     b'"dur": 1}]}', "no kernel or cpu_op"),
    (b"\x1f\x8b\x08broken", "gzip"),
])
def test_chrome_summary_refuses_bad_traces(data, msg):
    with pytest.raises(TraceError, match=msg):
        summarize_chrome([load_chrome_trace(data)])


def test_pyspy_summary_and_compare():
    text = ("<module> (serve.py:1);generate (gen.py:10);forward (llama.py:40) 30\n"
            "<module> (serve.py:1);generate (gen.py:10) 10\n"
            "<module> (serve.py:1);sample (gen.py:90) 10\n")
    s = summarize_pyspy_raw(text, rate_hz=100)
    assert s.kind == "py-spy" and s.count == 50 and s.total_ms == pytest.approx(500.0)
    assert [(op.name, op.share) for op in s.top] == [
        ("forward (llama.py:40)", 0.6), ("generate (gen.py:10)", 0.2),
        ("sample (gen.py:90)", 0.2)]
    other = summarize_pyspy_raw("a;forward (llama.py:40) 1\nb;sample (gen.py:90) 3\n", 100)
    rows = compare(s.as_dict(), other.as_dict())
    assert rows[:2] == [
        {"name": "sample (gen.py:90)", "share_a": 0.2, "share_b": 0.75, "delta": 0.55},
        {"name": "forward (llama.py:40)", "share_a": 0.6, "share_b": 0.25, "delta": -0.35}]
    assert {r["name"]: r["share_b"] for r in rows}["generate (gen.py:10)"] is None
    with pytest.raises(TraceError, match="line 1"):
        summarize_pyspy_raw("no count here\n", 100)
    with pytest.raises(TraceError, match="line 1"):
        summarize_pyspy_raw("42\n", 100)
    empty = summarize_pyspy_raw(" 3\na (x.py:1) 1\n", 100)  # a sample with no Python frame
    assert [(op.name, op.count) for op in empty.top] == [("(no Python frame)", 3),
                                                         ("a (x.py:1)", 1)]
    with pytest.raises(TraceError, match="no samples"):
        summarize_pyspy_raw("", 100)


def test_parse_load():
    assert parse_load("concurrency=2, requests=8") == Load(concurrency=2, requests=8)
    assert parse_load(None) == Load()
    for bad, msg in (("threads=2", "threads=2"), ("requests=0", "requests"),
                     ("concurrency=x", "concurrency"), ("requests", "requests")):
        with pytest.raises(HarnessError, match=msg):
            parse_load(bad)


# --- the SGLang path against a server speaking its profiler protocol ---------------------


@pytest.fixture
def profiling_server(torch_trace):
    procs: list[subprocess.Popen] = []

    def start(ranks: int = 2) -> str:
        p = subprocess.Popen([sys.executable, "-m",
                              "infer_forge.harness.testing.scripted_profiler", "--port", "0",
                              "--trace", str(torch_trace), "--ranks", str(ranks)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=str(REPO))
        procs.append(p)
        line = p.stdout.readline() if p.stdout else ""
        if not line.startswith("listening on "):
            p.kill()
            raise RuntimeError(f"profiling server did not start: {line!r}")
        return line.split()[-1]

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


def test_sglang_capture_records_traces_and_summary(workspace, profiling_server,
                                                   tiny_tokenizer_dir, torch_trace):
    from infer_forge.harness.perf.capture import capture_profile
    from infer_forge.ledger import events as E

    url = profiling_server(ranks=2)
    out = capture_profile(workspace, url=url, engine="sglang", model="scripted",
                          duration_s=0.01, load=Load(concurrency=2, requests=4, input_len=8,
                                                     output_len=4),
                          tokenizer_dir=str(tiny_tokenizer_dir), top=5)
    assert out["method"] == "torch-profiler" and out["stream"] == "profiles"
    assert len(out["traces"]) == 2 and all(n.endswith("-TP-0.trace.json.gz") or
                                           n.endswith("-TP-1.trace.json.gz")
                                           for n in out["traces"])
    digest = next(iter(out["traces"].values()))
    assert gzip.decompress(workspace.artifacts.get(digest)) == torch_trace.read_bytes()
    assert out["summary"]["kind"] == "cpu_op" and len(out["summary"]["top"]) == 5
    assert out["bench"]["completed"] >= 4 and out["bench"]["failed"] == 0
    [rec] = workspace.ledger.stream("profiles")
    ev = rec.event
    assert isinstance(ev, E.ProfileCaptured) and ev.method == "torch-profiler"
    assert ev.traces == tuple(out["traces"].values())
    assert [op.name for op in ev.top] == [op["name"] for op in out["summary"]["top"]]
    assert ev.top[0].share > 0 and ev.load["concurrency"] == 2
    # both ranks' traces are summed: twice one trace's events
    single = summarize_chrome([load_chrome_trace(torch_trace.read_bytes())], top=5)
    assert ev.samples == 2 * single.count


def test_sglang_capture_refusals(workspace, profiling_server, tiny_tokenizer_dir):
    from infer_forge.harness.perf.capture import capture_profile

    url = profiling_server(ranks=1)
    kw = dict(url=url, engine="sglang", model="scripted", duration_s=0.01,
              tokenizer_dir=str(tiny_tokenizer_dir), load=Load(requests=2))
    with pytest.raises(HarnessError, match="unknown task"):
        capture_profile(workspace, task_id="no-such-task", **kw)
    with pytest.raises(HarnessError, match="activities"):
        capture_profile(workspace, activities=("TPU",), **kw)
    with pytest.raises(HarnessError, match="duration"):
        capture_profile(workspace, **{**kw, "duration_s": 0})
    assert workspace.ledger.stream("profiles") == []


def test_cli_perf_capture_sglang_and_compare(forge_home, profiling_server,
                                            tiny_tokenizer_dir):
    assert run_forge("init", home=forge_home).returncode == 0
    url = profiling_server(ranks=1)
    ids = []
    for conc in ("1", "2"):
        r = run_forge("perf", "capture", "--url", url, "--engine", "sglang", "--model",
                      "scripted", "--tokenizer", str(tiny_tokenizer_dir), "--duration",
                      "0.01", "--load", f"concurrency={conc},requests=2,input_len=8,"
                      "output_len=4", "--json", home=forge_home)
        assert r.returncode == 0, r.stderr
        ids.append(json.loads(r.stdout)["event_id"])
    r = run_forge("perf", "compare", ids[0][:8], ids[1], "--json", home=forge_home)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert rows and all(row["share_a"] == row["share_b"] for row in rows)  # same trace
    r = run_forge("perf", "capture", "--url", url, "--engine", "sglang", "--model", "scripted",
                  "--tokenizer", str(tiny_tokenizer_dir), "--load", "threads=3",
                  home=forge_home)
    assert r.returncode != 0 and "threads=3" in r.stderr and "Traceback" not in r.stderr


# --- the embedded engine end to end (py-spy on transformers serve) ------------------------


@pytest.mark.slow
def test_hf_capture_with_py_spy(workspace, hf_server):
    from infer_forge.harness.perf.capture import capture_profile, py_spy_binary
    from infer_forge.ledger import events as E

    try:
        py_spy_binary()
    except HarnessError as e:
        need(False, str(e))
    out = capture_profile(workspace, url=hf_server.base_url, engine="hf",
                          model=str(hf_server.model_dir), pid=hf_server.engine.pid,
                          duration_s=2.0, load=Load(concurrency=2, requests=4, input_len=16,
                                                    output_len=16), top=10)
    assert out["method"] == "py-spy"
    [(name, digest)] = out["traces"].items()
    assert name == "py-spy.raw.txt" and workspace.artifacts.get(digest).strip()
    top = out["summary"]["top"]
    assert top and all(op["share"] > 0 and op["count"] > 0 for op in top)
    assert out["summary"]["count"] > 10  # sampled at 100 Hz over >= 2 s of load
    assert out["bench"]["completed"] >= 4 and out["bench"]["failed"] == 0
    [rec] = workspace.ledger.stream("profiles")
    assert isinstance(rec.event, E.ProfileCaptured) and rec.event.traces == (digest,)
    assert [op.name for op in rec.event.top] == [op["name"] for op in top]


def test_two_blocks_profiles_on_the_task_stream_compare(workspace, profiling_server,
                                                       tiny_tokenizer_dir, tmp_path):
    from infer_forge.harness.loop.manual import handoff_block, start_block
    from infer_forge.harness.perf.capture import capture_profile
    from infer_forge.ledger.streams import task_stream
    from infer_forge.projections.errors import ProjectionError
    from infer_forge.projections.perf import compare_captures

    from tests.helpers.tasks import open_task

    url = profiling_server(ranks=1)
    kw = dict(url=url, engine="sglang", model="scripted", duration_s=0.01,
              tokenizer_dir=str(tiny_tokenizer_dir), load=Load(requests=2, input_len=8,
                                                               output_len=4))
    b1 = open_task(workspace, tmp_path, "t1")
    first = capture_profile(workspace, task_id="t1", block_id=b1, **kw)
    with pytest.raises(HarnessError, match="no-such-block"):
        capture_profile(workspace, task_id="t1", block_id="no-such-block", **kw)
    handoff_block(workspace, "t1", state_reached="first")
    b2 = start_block(workspace, "t1", "second",
                     candidate={"engine.continuous_batching": True})["block_id"]
    second = capture_profile(workspace, task_id="t1", block_id=b2, **kw)
    assert first["stream"] == second["stream"] == task_stream("t1")
    evs = [r.event for r in workspace.ledger.stream(task_stream("t1"))
           if r.type == "ProfileCaptured"]
    assert [e.block_id for e in evs] == [b1, b2]
    out = compare_captures(workspace.ledger, first["event_id"], second["event_id"][:8])
    assert (out["a"]["block_id"], out["b"]["block_id"]) == (b1, b2)
    assert out["rows"] and {r["delta"] for r in out["rows"]} == {0.0}  # one recorded trace
    with pytest.raises(ProjectionError, match="no recorded profile"):
        compare_captures(workspace.ledger, "ffffffff", first["event_id"])
    assert workspace.ledger.stream("profiles") == []


def test_hf_pid_from_the_recorded_launch(workspace):
    from infer_forge.harness.perf.capture import capture_profile
    from infer_forge.ledger import events as E
    from infer_forge.projections.perf import running_engine_pid

    url = "http://127.0.0.1:9"

    def launched(pid: int) -> E.EngineLaunched:
        return E.EngineLaunched(engine="hf", command=["x"], url=url, pid=pid)

    assert running_engine_pid(workspace.ledger, url) is None
    workspace.ledger.append("engines", [launched(101)])
    assert running_engine_pid(workspace.ledger, url + "/") == 101
    workspace.ledger.append("engines", [E.EngineStopped(engine="hf", url=url)])
    assert running_engine_pid(workspace.ledger, url) is None
    with pytest.raises(HarnessError, match="--pid"):
        capture_profile(workspace, url=url, engine="hf", model="m", tokenizer_dir="/nonexistent")
    workspace.ledger.append("engines", [launched(102)])
    assert running_engine_pid(workspace.ledger, url) == 102


def test_profile_ops_in_the_index(workspace):
    """A ProfileCaptured appended through the real writer: its top list becomes ranked rows
    of `profile_ops`; a rebuild gives the same index as the incremental catch-up."""
    from infer_forge.ledger import events as E
    from infer_forge.ledger.streams import PROFILES_STREAM
    from infer_forge.projections.index import open_index, rebuild
    from infer_forge.projections.index.schema import fingerprint

    top = (E.ProfileOp(name="aten::mm", total_ms=30.0, share=0.6, count=12),
           E.ProfileOp(name="aten::softmax", total_ms=15.0, share=0.3, count=4),
           E.ProfileOp(name="aten::add", total_ms=5.0, share=0.1, count=40))
    ev = E.ProfileCaptured(engine="sglang", url="http://h:1", method="torch-profiler",
                           duration_s=1.0, kind="cpu_op", unit="ms", total_ms=50.0,
                           samples=56, top=top, task_id="t-prof", block_id="b1")
    other = E.ProfileCaptured(engine="hf", url="http://h:2", method="py-spy", duration_s=1.0,
                              kind="function", unit="ms", total_ms=1.0, samples=1)
    workspace.ledger.append(PROFILES_STREAM, [ev, other])
    with open_index(workspace) as q:
        rows = q.con.execute(
            "SELECT event_id, task_id, block_id, engine, method, kind, rank, name, total_ms, "
            "share, count FROM profile_ops ORDER BY rank").fetchall()
        assert rows == [(str(ev.event_id), "t-prof", "b1", "sglang", "torch-profiler",
                         "cpu_op", i, op.name, op.total_ms, op.share, op.count)
                        for i, op in enumerate(top, 1)]
        incremental = fingerprint(q.con)
    rebuild(workspace)
    with open_index(workspace) as q:
        assert fingerprint(q.con) == incremental
        assert q.con.execute("SELECT count(*) FROM profile_ops").fetchone() == (3,)
