"""Production read-only (issue 13, item 3): against a local server marked production in
forge.toml, forge refuses and records what would change it or load it past the probe budget
(before anything reaches the server), allows reads, and holds a run within budget to its
rate; only forge.toml plus an approval lifts a refusal."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from infer_forge.harness.bench.client import bench_command
from infer_forge.harness.engines import engine_for
from infer_forge.harness.guard import production
from infer_forge.harness.guard.production import ProductionRefusedError
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import GUARD_STREAM, task_stream
from infer_forge.ledger.workspace import init_workspace, open_workspace

from tests.conftest import run_forge
from tests.helpers.sglang_like import SGLangLike
from tests.helpers.tasks import open_task

AGENT = E.Actor.agent("tester", "m")


def configure(home: Path, endpoints: list[str], *, max_rps: float = 1.0,
              max_duration_s: float = 30, max_requests: int = 30,
              allow: list[str] | None = None) -> None:
    """forge.toml with these production endpoints, probe budget and production_allow."""
    ws, _ = init_workspace(home)
    ws.close()
    path = home / "forge.toml"
    text = path.read_text()
    text = text.replace("production_endpoints = []", f"production_endpoints = "
                        f"{json.dumps(endpoints)}", 1)
    text = text.replace("production_allow = []", f"production_allow = "
                        f"{json.dumps(allow or [])}", 1)
    text = text.replace(
        "production_probe = {max_rps = 1.0, max_duration_s = 30, max_requests = 30}",
        f"production_probe = {{max_rps = {float(max_rps)}, max_duration_s = "
        f"{float(max_duration_s)}, max_requests = {max_requests}}}", 1)
    path.write_text(text)


def refusals(ws, stream: str = GUARD_STREAM) -> list[E.ProductionRefused]:
    return [r.event for r in ws.ledger.stream_log(stream) if r.type == "ProductionRefused"]


def prompts_file(tmp_path: Path, n: int) -> Path:
    p = tmp_path / "probe.jsonl"
    p.write_text("".join(json.dumps({"prompt": f"probe {i} hello", "output_len": 2}) + "\n"
                         for i in range(n)))
    return p


# --- matching endpoints -------------------------------------------------------------------


def test_endpoints_match_by_url_prefix_or_host_and_port():
    m = production.endpoint_matches
    assert m("http://prod:30000", "http://prod:30000/v1")
    assert m("http://PROD:30000/", "http://prod:30000")
    assert m("https://prod/v1", "https://prod:443/v1/completions")
    assert not m("https://prod/v1", "https://prod/v10")  # a segment boundary, not a prefix
    assert not m("http://prod:30000", "http://prod:30001")
    assert not m("http://prod:30000", "https://prod:30000")
    assert m("prod", "https://prod:8443/x") and m("prod:8443", "http://prod:8443")
    assert not m("prod:8443", "http://prod:8444") and not m("prod", "http://production")
    assert m("postgresql://db.internal:5432", "postgresql://u@db.internal/ledger")


# --- refused calls, allowed reads ---------------------------------------------------------


def test_flush_cache_profiling_and_weight_updates_are_refused_and_recorded(forge_home):
    with SGLangLike() as srv:
        configure(forge_home, [srv.url])
        ws = open_workspace(forge_home)
        try:
            # read_only: false in the engine config does not lift production read-only.
            eng = engine_for("external").launch(
                {"base_url": srv.url, "api": "sglang", "read_only": False}, ws=ws,
                event_fields={"actor": AGENT})
            assert eng.describe()["version"] == "0.5.4"  # reads: /v1/models, /server_info
            assert eng.metrics()["gen_throughput"] == 12.5  # /metrics
            for call in (eng.flush_cache, eng.start_profile, eng.stop_profile):
                with pytest.raises(ProductionRefusedError, match="refused"):
                    call()
            for action in ("update_weights_from_disk", "GET /flush_cache",
                           "POST /release_memory_occupation", "GET /forge/anything"):
                with pytest.raises(ProductionRefusedError):
                    production.check(ws, srv.url, action, actor=AGENT)
            for read in ("GET /health", "GET /metrics", "/server_info", "GET /get_server_info",
                         "GET /v1/models"):
                assert production.check(ws, srv.url + "/v1", read, actor=AGENT) is None
            got = refusals(ws)
        finally:
            ws.close()
        seen = srv.paths()
    assert [e.action for e in got] == [
        "POST /flush_cache", "POST /start_profile", "POST /stop_profile",
        "POST /update_weights_from_disk", "GET /flush_cache",
        "POST /release_memory_occupation", "GET /forge/anything"]
    assert all(e.url == srv.url and e.actor == AGENT and e.reason for e in got)
    assert "cache" in got[0].reason and "profiling" in got[1].reason
    assert "weight" in got[3].reason
    # Nothing mutating reached the server; the reads did.
    assert not [p for p in seen if "flush" in p or "profile" in p or "weights" in p]
    assert {"GET /v1/models", "GET /server_info", "GET /metrics"} <= set(seen)


def test_not_production_goes_through(forge_home):
    """The control: the same server, not marked production, gets the flush (so the refusal
    above is the guard's, not the server's)."""
    with SGLangLike() as srv:
        configure(forge_home, ["http://127.0.0.1:1"])  # another endpoint
        ws = open_workspace(forge_home)
        try:
            eng = engine_for("external").launch(
                {"base_url": srv.url, "api": "sglang", "read_only": False}, ws=ws)
            assert eng.flush_cache()["message"] == "done"
            assert refusals(ws) == []
        finally:
            ws.close()
        assert "POST /flush_cache" in srv.paths()


def test_production_by_host_port_and_refusal_on_the_task_stream(forge_home, tmp_path):
    with SGLangLike() as srv:
        configure(forge_home, [f"127.0.0.1:{srv.port}"])
        ws = open_workspace(forge_home)
        try:
            block = open_task(ws, tmp_path, "prodt")
            eng = engine_for("external").launch(
                {"base_url": srv.url, "api": "sglang", "read_only": False}, ws=ws,
                stream=task_stream("prodt"), event_fields={"actor": AGENT, "task_id": "prodt"})
            with pytest.raises(ProductionRefusedError):
                eng.flush_cache()
            on_task = refusals(ws, task_stream("prodt"))
            assert refusals(ws) == []
        finally:
            ws.close()
    assert len(on_task) == 1
    assert on_task[0].task_id == "prodt" and on_task[0].block_id == block


# --- load: refused above budget before anything is sent; paced within it ------------------


def test_bench_above_budget_is_refused_before_any_request(forge_home, tmp_path):
    data = prompts_file(tmp_path, 40)
    with SGLangLike() as srv:
        configure(forge_home, [srv.url], max_rps=2.0, max_duration_s=5, max_requests=10)
        # The real CLI, without --record: forge.toml still rules.
        r = run_forge("bench", "--url", srv.url, "--model", "prod", "--dataset", "custom",
                      "--dataset-path", str(data), "--num-prompts", "4", "--request-rate", "50",
                      "--engine", "external", "--max-concurrency", "4")
        assert r.returncode != 0
        assert "refused" in r.stderr and "max_rps 2" in r.stderr, r.stderr
        plans = [dict(request_rate=float("inf")),  # closed loop: no finite rate
                 dict(request_rate=2.0, num_prompts=20),  # 21 requests > 10
                 dict(request_rate=0.5, num_prompts=4)]  # 5 requests at 0.5/s: 10 s > 5 s
        ws = open_workspace(forge_home)
        try:
            for plan in plans:
                kw = {"num_prompts": 4, **plan}
                with pytest.raises(ProductionRefusedError):
                    bench_command(url=srv.url, model="prod", dataset="custom",
                                  dataset_path=str(data), engine="external", guard_ws=ws,
                                  actor=AGENT, **kw)  # type: ignore[arg-type]
            got = refusals(ws)
        finally:
            ws.close()
        assert srv.log == []  # not one request of any kind reached the server
    assert len(got) == 4
    assert all(e.action == "POST /v1/completions" for e in got)
    reasons = [e.reason for e in got]
    assert "50 requests/s > max_rps 2" in reasons[0]
    assert "no finite request rate" in reasons[1]
    assert "21 requests > max_requests 10" in reasons[2]
    assert "10 s > max_duration_s 5" in reasons[3]


def test_bench_within_budget_runs_and_never_exceeds_max_rps(forge_home, tmp_path):
    data = prompts_file(tmp_path, 8)
    with SGLangLike() as srv:
        configure(forge_home, [srv.url], max_rps=5.0, max_duration_s=10, max_requests=10)
        ws = open_workspace(forge_home)
        try:
            # Poisson arrivals at 5/s burst above 5/s; warmup requests go out together: the
            # guard's pacing holds every start to ≥ 1/max_rps apart.
            out = bench_command(url=srv.url, model="prod", dataset="custom",
                                dataset_path=str(data), num_prompts=8, request_rate=5.0,
                                warmup=2, engine="external", ws=ws, actor=AGENT)
            assert refusals(ws) == []
        finally:
            ws.close()
        arrivals = srv.completions()
    assert out["metrics"]["completed"] == 8 and out["metrics"].get("failed", 0) == 0
    assert out["config"]["probe"] == {"max_rps": 5.0, "max_duration_s": 10.0,
                                      "max_requests": 10}
    assert len(arrivals) == 10  # 2 warmup + 8, nothing more
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    assert min(gaps) >= 0.9 / 5.0, gaps  # the server's own clock (0.9: its scheduling jitter)
    assert (len(arrivals) - 1) / (arrivals[-1] - arrivals[0]) <= 5.0 * 1.02


def test_the_pacer_holds_the_gap_on_the_clock_after_a_late_wake_up():
    """Slots are 0.1 s apart; the event loop is then blocked past one slot (a loaded
    machine): the late sender and the next on-time one must still start 0.1 s apart."""
    from infer_forge.harness.bench.client import Pacer

    pacer = Pacer(production.ProbeLimits(max_rps=10.0, max_duration_s=30.0, max_requests=10))
    starts: list[float] = []

    async def send() -> None:
        assert await pacer.slot() is None
        # The start the pacer took (its own clock read as it let the sender go): a second
        # clock read here may come late whenever the process is preempted in between.
        starts.append(pacer.last)

    async def main() -> None:
        tasks = [asyncio.create_task(send()) for _ in range(4)]  # slots at 0, .1, .2, .3 s
        await asyncio.sleep(0.15)
        time.sleep(0.12)  # the loop blocked: the .2 s sender wakes at ~.27 s, the next at .3
        await asyncio.gather(*tasks)

    asyncio.run(main())
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert len(starts) == 4 and min(gaps) >= 0.1 - 0.002, gaps


def test_a_probe_still_running_at_max_duration_is_cut_off(forge_home, tmp_path):
    data = prompts_file(tmp_path, 2)
    with SGLangLike(delay_s=20) as srv:
        configure(forge_home, [srv.url], max_rps=10.0, max_duration_s=1.0, max_requests=5)
        ws = open_workspace(forge_home)
        try:
            t0 = time.monotonic()
            out = bench_command(url=srv.url, model="prod", dataset="custom",
                                dataset_path=str(data), num_prompts=2, request_rate=5.0,
                                warmup=0, engine="external", ws=ws, actor=AGENT,
                                records_out=str(tmp_path / "records.jsonl"))
            took = time.monotonic() - t0
        finally:
            ws.close()
    assert took < 5, took  # not the server's 20 s
    assert out["metrics"]["completed"] == 0 and out["metrics"]["failed"] == 2
    errors = [json.loads(line)["error"] for line in (tmp_path / "records.jsonl").open()]
    assert errors == ["cut off at the probe budget's max_duration_s (1 s)"] * 2


def test_the_agent_bench_tool_is_refused_and_recorded(forge_home, tiny_tokenizer_dir):
    from infer_forge.harness.agents import tool_registry as tools
    from infer_forge.harness.mcp.loop_tools import TOOLS
    from infer_forge.harness.mcp.session_tools import AgentSession, session_tools

    with SGLangLike() as srv:
        configure(forge_home, [srv.url])
        ws = open_workspace(forge_home)
        try:
            ctx = tools.ToolContext(ws=ws, actor=AGENT,
                                    extra=session_tools(AgentSession(ws)), tools=TOOLS)
            res = tools.call(ctx, "bench", {"url": srv.url, "model": "prod",
                                            "tokenizer": str(tiny_tokenizer_dir),
                                            "num_prompts": 3, "input_len": 4, "output_len": 2,
                                            "request_rate": 100})
            got = refusals(ws)
        finally:
            ws.close()
        assert srv.log == []
    assert not res.ok and "refused" in (res.error or "")
    assert len(got) == 1 and got[0].actor == AGENT


def test_a_loop_evaluation_of_a_production_profile_sends_no_load(forge_home, tmp_path,
                                                                  tiny_tokenizer_dir):
    """A runtime profile on a production endpoint (closed-loop traffic at concurrency 8): the
    engine evaluator's runs are refused before a request is sent, as failed runs; the refusal
    names the task and block but goes on the `guard` stream (the step's save owns the
    task's)."""
    from infer_forge.harness.loop.engine_evaluator import EngineEvaluator
    from infer_forge.harness.loop.evaluator_protocol import EvalContext
    from infer_forge.ledger.specs import RuntimeProfile, load_point

    from tests.conftest import REPO

    point = load_point(REPO / "examples/points/tiny-cpu.yaml")
    with SGLangLike() as srv:
        configure(forge_home, [srv.url])
        profile = RuntimeProfile(service="prod", rev=1, engine="external", endpoint=srv.url,
                                 config={"api": "sglang", "model": "prod"})
        ws = open_workspace(forge_home)
        try:
            ev = EngineEvaluator(ws, None)
            ev._model_dir = tiny_tokenizer_dir  # the point's workload is built with it
            runs = ev.evaluate({}, repeats=2, ctx=EvalContext(
                workspace=ws, task_id="prodt", block_id="b1", point=point, profile=profile))
            got = refusals(ws)
        finally:
            ws.close()
        assert srv.completions() == []  # reads only (describe)
    assert len(runs) == 1 and not runs[0].success and "refused" in (runs[0].error or "")
    assert [(e.task_id, e.block_id, e.action) for e in got] == [
        ("prodt", "b1", "POST /v1/completions")]
    assert "no finite request rate" in got[0].reason


# --- lifting: forge.toml plus an approval, for one call -----------------------------------


def test_only_forge_toml_plus_an_approval_lifts_a_refusal(forge_home):
    from infer_forge.harness.guard import approvals

    with SGLangLike() as srv:
        configure(forge_home, [srv.url], allow=["flush_cache"])
        ws = open_workspace(forge_home)
        try:
            eng = engine_for("external").launch(
                {"base_url": srv.url, "api": "sglang", "read_only": False}, ws=ws,
                event_fields={"actor": AGENT})
            with pytest.raises(ProductionRefusedError, match="not approved"):
                eng.flush_cache()  # listed, not approved: a pending request now
            with pytest.raises(ProductionRefusedError):
                eng.start_profile()  # not listed: no approval helps
            [waiting] = approvals.pending(ws)
            assert waiting.kind == "production-call" and waiting.target == srv.url
            approvals.decide(ws, waiting.approval_id, True, "maintenance window",
                             approvals.person("ops"))
            assert eng.flush_cache()["message"] == "done"  # approved: once
            with pytest.raises(ProductionRefusedError, match="not approved"):
                eng.flush_cache()  # the approval is spent
            got = refusals(ws)
        finally:
            ws.close()
        assert srv.paths().count("POST /flush_cache") == 1
    assert [e.action for e in got] == ["POST /flush_cache", "POST /start_profile",
                                       "POST /flush_cache"]
