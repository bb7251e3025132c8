"""Phase-aware profiles: per-phase tables from real torch-profiler traces (recorded here with
SGLang's own step-span names), the stage files of `profile_by_stage`, CUDA-graph attribution,
the kernel-by-kernel compare, and SGLang's ProfileReq options through `forge perf capture`."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.perf.capture import Load
from infer_forge.harness.perf.options import ProfileOptions, parse_options
from infer_forge.harness.perf.phases import stage_of_file, summarize_phases
from infer_forge.harness.perf.summary import load_chrome_trace, summarize_chrome
from infer_forge.projections.perf import compare_phases

from tests.conftest import REPO, need, run_forge

DECODE_STEPS = 6


def record(path: Path, *, decode_steps: int = DECODE_STEPS, steps: bool = True,
           decode_width: int = 64) -> Path:
    """A real torch.profiler trace (CPU activities) of a prefill-like step (a 64-token
    batch through a linear layer, tanh), `decode_steps` decode-like steps (2 tokens, sigmoid)
    and scheduler-like work between steps (cat), each step inside a `record_function` named
    as SGLang's ModelRunner.forward names its step span (`step[EXTEND bs=2 toks=64]`,
    `step[DECODE bs=2]`; sglang/srt/utils/profile_utils.py build_step_span_name)."""
    import importlib.util

    need(importlib.util.find_spec("torch") is not None, "torch (the real profiler) is not "
         "installed")
    from contextlib import nullcontext

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    lin = torch.nn.Linear(64, decode_width)
    prompt, tok = torch.randn(64, 64), torch.randn(2, 64)

    def span(name: str):
        return record_function(name) if steps else nullcontext()

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with span("step[EXTEND bs=2 toks=64]"):
            torch.tanh(lin(prompt))
        for _ in range(decode_steps):
            torch.cat([tok, tok])  # between steps: the scheduler's own work
            with span("step[DECODE bs=2]"):
                torch.sigmoid(lin(tok))
    prof.export_chrome_trace(str(path))
    return path


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("phase-traces")
    return {"steps": record(d / "steps.json"),
            "more": record(d / "more.json", decode_steps=2 * DECODE_STEPS, decode_width=256),
            "plain": record(d / "plain.json", steps=False)}


def named(path: Path, name: str = "1.0-TP-0.trace.json.gz") -> tuple[str, dict]:
    return name, load_chrome_trace(path.read_bytes())


def ops(phase) -> dict[str, object]:
    return {op.name: op for op in phase.top}


# --- phases from a real trace ---------------------------------------------------------------


def test_step_spans_split_prefill_decode_and_other(traces):
    phases = summarize_phases([named(traces["steps"])], output_tokens=24, top=100)
    assert [p.name for p in phases] == ["prefill", "decode", "other"]
    prefill, decode, other = phases
    assert {p.kind for p in phases} == {"cpu_op"}
    assert "aten::tanh" in ops(prefill) and "aten::tanh" not in ops(decode)
    assert ops(decode)["aten::sigmoid"].count == DECODE_STEPS
    assert "aten::sigmoid" not in ops(prefill) and "aten::sigmoid" not in ops(other)
    assert ops(other)["aten::cat"].count == DECODE_STEPS
    assert ops(prefill)["aten::linear"].count == 1
    assert ops(decode)["aten::linear"].count == DECODE_STEPS
    assert (prefill.steps, prefill.tokens) == (1, 64)  # toks= of the EXTEND span
    assert (decode.steps, decode.tokens) == (DECODE_STEPS, 2 * DECODE_STEPS)  # bs sums
    assert other.steps == 0
    for p in phases:
        assert sum(op.share for op in p.top) == pytest.approx(1.0, abs=1e-4)
        assert p.per_token_ms == pytest.approx(p.total_ms / 24, abs=1e-6)
        for op in p.top:
            assert op.mean_ms == pytest.approx(op.total_ms / op.count, abs=1e-6)
            assert op.per_token_ms == pytest.approx(op.total_ms / 24, abs=1e-6)
            assert op.graph_ms == 0.0
    # the phases partition the capture: their totals add up to the whole summary's
    whole = summarize_chrome([named(traces["steps"])[1]], top=1)
    assert sum(p.total_ms for p in phases) == pytest.approx(whole.total_ms, abs=1e-3)
    assert sum(p.count for p in phases) == whole.count
    # unknown output tokens: no per-token figures
    [p0, *_] = summarize_phases([named(traces["steps"])])
    assert p0.per_token_ms is None and all(op.per_token_ms is None for op in p0.top)


def test_stage_files_and_merged_files(traces):
    """profile_by_stage writes a file per stage (names from SGLang's profiler); a trace
    without step spans takes its file's stage; a merged file is not counted twice."""
    assert stage_of_file("p-1733.5-TP-0-EXTEND.trace.json.gz") == "prefill"
    assert stage_of_file("1733.5-TP-1-DP-1-DECODE.trace.json.gz") == "decode"
    assert stage_of_file("1733.5-TP-0-decode.trace.json.gz") == "decode"  # SGLANG_PROFILE_V2
    assert stage_of_file("1733.5-TP-0.trace.json.gz") is None
    plain = traces["plain"]
    phases = summarize_phases([named(plain, "1.0-TP-0-EXTEND.trace.json.gz"),
                               named(plain, "1.0-TP-0-DECODE.trace.json.gz")], top=100)
    assert [p.name for p in phases] == ["prefill", "decode"]
    assert phases[0].total_ms == phases[1].total_ms  # the same trace in both files
    assert ops(phases[0])["aten::sigmoid"].count == DECODE_STEPS
    # no phase information at all: one phase, `all`
    [only] = summarize_phases([named(plain)], top=100)
    assert only.name == "all" and ops(only)["aten::cat"].count == DECODE_STEPS
    # two ranks add up; rank 0's merged file repeats them and is left out
    one = summarize_phases([named(traces["steps"])], top=100)
    two = summarize_phases([named(traces["steps"], "1.0-TP-0.trace.json.gz"),
                            named(traces["steps"], "1.0-TP-1.trace.json.gz"),
                            named(traces["steps"], "merged-1.0.trace.json.gz")], top=100)
    assert [ops(p)["aten::linear"].count for p in two[:2]] == [2, 2 * DECODE_STEPS]
    assert two[1].steps == one[1].steps == DECODE_STEPS  # ranks run the same steps
    [merged_only] = summarize_phases([named(traces["plain"], "merged-1.0.trace.json.gz")])
    assert merged_only.name == "all"


def test_device_kernels_by_launch_and_graph_replays():
    """Kineto's device events: a kernel has its launch's `args.correlation`; kernels of a
    graph replay carry the cudaGraphLaunch's. (No GPU here: the events are written in the
    shape torch's chrome export gives them; the CPU side is as in the real traces above.)"""
    def x(name, cat, ts, dur, tid=1, pid=1, corr=None):
        ev = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": pid,
              "tid": tid}
        if corr is not None:
            ev["args"] = {"correlation": corr}
        return ev

    trace = {"traceEvents": [
        x("step[EXTEND bs=1 toks=8]", "user_annotation", 0, 100),
        x("aten::mm", "cpu_op", 1, 20),
        x("cudaLaunchKernel", "cuda_runtime", 5, 5, corr=11),
        x("step[DECODE bs=4]", "user_annotation", 200, 50),
        x("cudaGraphLaunch", "cuda_runtime", 205, 10, corr=12),
        x("step[DECODE bs=4]", "user_annotation", 300, 50),
        x("cudaGraphLaunch", "cuda_runtime", 305, 10, corr=13),
        x("cudaLaunchKernel", "cuda_runtime", 320, 5, corr=14),
        # device rows: pid 0 (the GPU), stream 7; kernels run after the CPU spans end
        x("gemm_prefill", "kernel", 150, 40, pid=0, tid=7, corr=11),
        x("attn_decode", "kernel", 260, 30, pid=0, tid=7, corr=12),
        x("gemm_decode", "kernel", 290, 10, pid=0, tid=7, corr=12),
        x("attn_decode", "kernel", 360, 30, pid=0, tid=7, corr=13),
        x("gemm_decode", "kernel", 390, 10, pid=0, tid=7, corr=13),
        x("sample", "kernel", 400, 4, pid=0, tid=7, corr=14),
        x("Memcpy DtoH", "gpu_memcpy", 500, 6, pid=0, tid=8),  # no correlation: other
    ]}
    prefill, decode, other = summarize_phases([("r-TP-0.trace.json.gz", trace)],
                                              output_tokens=8)
    assert {p.kind for p in (prefill, decode, other)} == {"kernel"}
    assert [(o.name, o.count, o.total_ms, o.graph_ms) for o in prefill.top] == [
        ("gemm_prefill", 1, 0.04, 0.0)]
    assert [(o.name, o.count, o.total_ms, o.mean_ms, o.graph_ms) for o in decode.top] == [
        ("attn_decode", 2, 0.06, 0.03, 0.06), ("gemm_decode", 2, 0.02, 0.01, 0.02),
        ("sample", 1, 0.004, 0.004, 0.0)]
    assert decode.graph_replays == 2 and prefill.graph_replays == 0
    assert decode.per_token_ms == pytest.approx(0.084 / 8)
    assert [o.name for o in other.top] == ["Memcpy DtoH"]


# --- compare ----------------------------------------------------------------------------------


def test_compare_phases_kernel_by_kernel(traces):
    a = [p.as_dict() for p in summarize_phases([named(traces["steps"])], output_tokens=12,
                                               top=100)]
    b = [p.as_dict() for p in summarize_phases([named(traces["more"])], output_tokens=24,
                                               top=100)]
    out = compare_phases(a, b)
    assert out["basis"] == "ms per output token"
    assert [p["name"] for p in out["phases"]] == ["prefill", "decode", "other"]
    decode = out["phases"][1]
    rows = {r["name"]: r for r in decode["rows"]}
    assert (rows["aten::sigmoid"]["calls_a"], rows["aten::sigmoid"]["calls_b"]) == (
        DECODE_STEPS, 2 * DECODE_STEPS)
    deltas = [abs(r["delta"]) for r in decode["rows"]]
    assert deltas == sorted(deltas, reverse=True)  # the deltas that matter first
    for r in decode["rows"]:
        assert r["delta"] == pytest.approx((r["b"] or 0) - (r["a"] or 0), abs=1e-6)
    da = {p["name"]: p for p in a}["decode"]
    assert rows["aten::sigmoid"]["a"] == next(o["per_token_ms"] for o in da["top"]
                                              if o["name"] == "aten::sigmoid")
    # without output tokens on one side: total time
    plain = [p.as_dict() for p in summarize_phases([named(traces["steps"])], top=100)]
    assert compare_phases(a, plain)["basis"] == "ms"
    # exact ordering and absent entries
    pa = [{"name": "decode", "total_ms": 10.0, "per_token_ms": None, "top": [
        {"name": "k1", "count": 4, "total_ms": 6.0, "mean_ms": 1.5, "share": 0.6},
        {"name": "k2", "count": 2, "total_ms": 4.0, "mean_ms": 2.0, "share": 0.4}]}]
    pb = [{"name": "decode", "total_ms": 9.0, "per_token_ms": None, "top": [
        {"name": "k1", "count": 4, "total_ms": 5.5, "mean_ms": 1.375, "share": 0.61},
        {"name": "k3", "count": 1, "total_ms": 3.5, "mean_ms": 3.5, "share": 0.39}]},
          {"name": "prefill", "total_ms": 1.0, "per_token_ms": None, "top": []}]
    out = compare_phases(pa, pb)
    assert [p["name"] for p in out["phases"]] == ["prefill", "decode"]
    assert out["phases"][0] == {"name": "prefill", "a": None, "b": 1.0, "delta": 1.0,
                                "rows": []}
    assert [(r["name"], r["a"], r["b"], r["delta"], r["rel"]) for r in
            out["phases"][1]["rows"]] == [("k2", 4.0, None, -4.0, -1.0),
                                          ("k3", None, 3.5, 3.5, None),
                                          ("k1", 6.0, 5.5, -0.5, -0.083333)]


# --- ProfileReq options ----------------------------------------------------------------------


def test_profile_options_parse_check_and_body():
    from infer_forge.harness.engines import sglang_profile_req

    o = parse_options("num_steps=5,start_step=2,profile_by_stage=true,with_stack=false,"
                      "record_shapes=true,merge_profiles=1,profile_prefix=run-a,"
                      "profile_stages=prefill+decode,detailed_annotations=true",
                      "cpu,GPU,CUDA_PROFILER,MEM")
    body = o.body()
    assert body == {"activities": ["CPU", "GPU", "CUDA_PROFILER", "MEM"], "num_steps": 5,
                    "start_step": 2, "profile_by_stage": True, "with_stack": False,
                    "record_shapes": True, "merge_profiles": True,
                    "profile_prefix": "run-a", "profile_stages": ["prefill", "decode"],
                    "detailed_annotations": True}
    # every field is one the pinned release's ProfileReq reads (the table from its wheel)
    sglang_profile_req.check({**body, "output_dir": "/x"}, "0.5.23")
    with pytest.raises(HarnessError, match="does not read detailed_annotations"):
        sglang_profile_req.check(body, "0.5.3")
    with pytest.raises(HarnessError, match=r"does not read merge_profiles \(0.5.4 and"):
        sglang_profile_req.check({"activities": ["CPU"], "merge_profiles": True}, "0.5.3")
    assert o.self_stopping and o.stages() == ("prefill", "decode")
    assert ProfileOptions().body() == {"activities": ["CPU", "GPU"]}  # defaults not sent
    for text, acts, msg in (
            ("threads=2", None, "threads=2"), ("num_steps=0", None, "num_steps"),
            ("num_steps=x", None, "num_steps"), ("with_stack=maybe", None, "with_stack"),
            ("profile_by_stage=true", None, "needs num_steps"),
            ("profile_stages=prefill", None, "needs profile_by_stage"),
            ("num_steps=2,profile_by_stage=1,profile_stages=verify", None, "verify"),
            ("profile_prefix=../x", None, "profile_prefix"),
            ("", "TPU", "TPU"), ("", "CUDA_PROFILER", "write no trace")):
        with pytest.raises(HarnessError, match=msg):
            parse_options(text, acts)


@pytest.fixture
def profiling_server(traces):
    procs: list[subprocess.Popen] = []

    def start(ranks: int = 2, version: str = "0.5.23", trace: Path | None = None) -> str:
        p = subprocess.Popen([sys.executable, "-m",
                              "infer_forge.harness.testing.scripted_profiler", "--port", "0",
                              "--trace", str(trace or traces["steps"]), "--ranks", str(ranks),
                              "--version", version],
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


def test_capture_by_stage_with_num_steps(workspace, profiling_server, tiny_tokenizer_dir):
    """num_steps: SGLang stops by itself (no /stop_profile); by stage: one file per stage and
    rank; merge_profiles' merged file is kept as an artifact but not counted twice."""
    from infer_forge.harness.perf.capture import capture_profile
    from infer_forge.ledger import events as E

    url = profiling_server(ranks=2)
    opts = parse_options("num_steps=2,profile_by_stage=true,merge_profiles=true,"
                         "profile_prefix=forge")
    out = capture_profile(workspace, url=url, engine="sglang", model="scripted",
                          duration_s=0.01, options=opts, collect_timeout_s=30,
                          load=Load(concurrency=1, requests=4, input_len=8, output_len=4),
                          tokenizer_dir=str(tiny_tokenizer_dir), top=50)
    names = sorted(out["traces"])
    assert len(names) == 5 and all(n.startswith(("forge-", "merged-")) for n in names)
    assert sum(n.endswith("-EXTEND.trace.json.gz") for n in names) == 2
    assert sum(n.endswith("-DECODE.trace.json.gz") for n in names) == 2
    # rank 0 merges at each stage's stop into the same merged-<profile_id> file
    assert sum(n.startswith("merged-") for n in names) == 1
    assert out["options"] == opts.body()
    # four per-rank files (two ranks x two stages; the merged one left out), each the same
    # recorded trace: a step span's phase wins over the file's stage, and what lies outside
    # the spans (the scheduler's cat) takes its file's stage
    phases = {p["name"]: p for p in out["phases"]}
    assert set(phases) == {"prefill", "decode"}
    sig = next(o for o in phases["decode"]["top"] if o["name"] == "aten::sigmoid")
    assert sig["count"] == 4 * DECODE_STEPS
    for stage in ("prefill", "decode"):
        cat = next(o for o in phases[stage]["top"] if o["name"] == "aten::cat")
        assert cat["count"] == 2 * DECODE_STEPS
    tokens = out["bench"]["total_output_tokens"]
    assert tokens > 0 and sig["per_token_ms"] == pytest.approx(sig["total_ms"] / tokens,
                                                               abs=1e-6)
    [rec] = workspace.ledger.stream("profiles")
    ev = rec.event
    assert isinstance(ev, E.ProfileCaptured) and ev.options == opts.body()
    assert [p.name for p in ev.phases] == ["prefill", "decode"]
    assert ev.phases[1].top[0].model_dump() == phases["decode"]["top"][0]
    merged = next(d for n, d in out["traces"].items() if n.startswith("merged-"))
    assert len(orjson.loads(gzip.decompress(workspace.artifacts.get(merged)))[
        "traceEvents"]) > 0


def test_sglang_options_are_refused_for_the_hf_engine(workspace):
    from infer_forge.harness.perf.capture import capture_profile

    with pytest.raises(HarnessError, match="do not apply"):
        capture_profile(workspace, url="http://127.0.0.1:9", engine="hf", model="m",
                        tokenizer_dir="/nonexistent", pid=1,
                        options=parse_options("num_steps=3"))


def test_capture_refuses_an_option_the_release_does_not_read(workspace, profiling_server,
                                                             tiny_tokenizer_dir):
    from infer_forge.harness.perf.capture import capture_profile

    url = profiling_server(ranks=1, version="0.5.3")
    with pytest.raises(HarnessError, match="0.5.3's /start_profile does not read "
                                           "merge_profiles"):
        capture_profile(workspace, url=url, engine="sglang", model="scripted",
                        duration_s=0.01, options=parse_options("merge_profiles=true"),
                        load=Load(requests=2, input_len=8, output_len=4),
                        tokenizer_dir=str(tiny_tokenizer_dir))
    assert workspace.ledger.stream("profiles") == []


def test_a_capture_over_the_size_bound_is_refused(workspace, profiling_server,
                                                  tiny_tokenizer_dir):
    from infer_forge.harness.perf.capture import capture_profile

    url = profiling_server(ranks=1)
    with pytest.raises(HarnessError, match="over the limit of 100"):
        capture_profile(workspace, url=url, engine="sglang", model="scripted",
                        duration_s=0.01, max_trace_bytes=100,
                        load=Load(requests=2, input_len=8, output_len=4),
                        tokenizer_dir=str(tiny_tokenizer_dir))
    assert workspace.ledger.stream("profiles") == []


def test_a_secret_in_a_trace_is_redacted_in_the_stored_artifact(workspace, profiling_server,
                                                                 tiny_tokenizer_dir, traces,
                                                                 tmp_path):
    """A stack or argument recorded with `with_stack`/`record_shapes` can carry a token: the
    stored gzip is redacted inside, and the summary is the same."""
    from infer_forge.harness.perf.capture import capture_profile

    token = "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"
    trace = json.loads(traces["steps"].read_bytes())
    op = next(e for e in trace["traceEvents"] if e.get("cat") == "cpu_op")
    op.setdefault("args", {})["Call stack"] = f"serve.py(12): main HF_TOKEN={token}"
    leaky = tmp_path / "leaky.json"
    leaky.write_text(json.dumps(trace))
    out = capture_profile(workspace, url=profiling_server(ranks=1, trace=leaky),
                          engine="sglang", model="scripted", duration_s=0.001,
                          load=Load(requests=2, input_len=8, output_len=4),
                          tokenizer_dir=str(tiny_tokenizer_dir), top=100)
    [digest] = out["traces"].values()
    stored = gzip.decompress(workspace.artifacts.get(digest))
    assert token.encode() not in stored and b"HF_TOKEN=" in stored
    assert [p["name"] for p in out["phases"]] == ["prefill", "decode", "other"]


def test_version_one_captures_read_without_phases():
    from infer_forge.ledger import codec
    from infer_forge.ledger import events as E

    ev = E.ProfileCaptured(engine="sglang", url="http://h:1", method="torch-profiler",
                           duration_s=1.0, kind="cpu_op", unit="ms", total_ms=1.0, samples=1)
    payload = ev.model_dump(mode="json")
    del payload["phases"], payload["options"]
    old = codec.decode("profiles", 1, "ProfileCaptured", orjson.dumps({**payload, "_v": 1}))
    assert isinstance(old, E.ProfileCaptured) and old.phases == () and old.options == {}


def test_cli_capture_options_and_compare_per_phase(forge_home, profiling_server,
                                                   tiny_tokenizer_dir):
    assert run_forge("init", home=forge_home).returncode == 0
    url = profiling_server(ranks=1)
    ids = []
    for prof in ("with_stack=false", "record_shapes=true,profile_prefix=b"):
        r = run_forge("perf", "capture", "--url", url, "--engine", "sglang", "--model",
                      "scripted", "--tokenizer", str(tiny_tokenizer_dir), "--duration",
                      "0.001", "--load", "requests=2,input_len=8,output_len=4", "--profile",
                      prof, "--json", home=forge_home)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert [p["name"] for p in got["phases"]] == ["prefill", "decode", "other"]
        ids.append(got["event_id"])
    r = run_forge("perf", "compare", ids[0][:8], ids[1], "--json", home=forge_home)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["basis"] == "ms per output token"
    assert [p["name"] for p in out["phases"]] == ["prefill", "decode", "other"]
    for ph in out["phases"]:  # the same trace, as many output tokens: nothing moved
        assert ph["rows"] and all(row["delta"] == 0.0 for row in ph["rows"])
    r = run_forge("perf", "compare", ids[0], ids[1], home=forge_home)
    assert r.returncode == 0 and "phase decode (us/token)" in r.stdout
    assert "aten::sigmoid" in r.stdout
    r = run_forge("perf", "capture", "--url", url, "--engine", "sglang", "--model", "scripted",
                  "--tokenizer", str(tiny_tokenizer_dir), "--duration", "0.001", "--load",
                  "requests=2,input_len=8,output_len=4", home=forge_home)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    decode = lines.index(next(ln for ln in lines if ln.startswith("phase decode: ")))
    assert f"{DECODE_STEPS} steps, {2 * DECODE_STEPS} tokens, 0 graph replays" in lines[decode]
    assert "us per output token" in lines[decode] and "calls" in lines[decode + 1]
    assert any(ln.endswith("aten::sigmoid") for ln in lines[decode + 2:])
    r = run_forge("perf", "capture", "--url", url, "--engine", "sglang", "--model", "scripted",
                  "--tokenizer", str(tiny_tokenizer_dir), "--profile", "profile_by_stage=1",
                  home=forge_home)
    assert r.returncode != 0 and "needs num_steps" in r.stderr and "Traceback" not in r.stderr
