"""`forge diagnose`: the rules over a real scripted server's SGLang-shaped /metrics (made to
misbehave between scrapes) and a real log file, recorded in a real ledger and index."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from infer_forge.harness.diagnose import collect
from infer_forge.harness.diagnose.rules import (
    RULES,
    LogLine,
    Scrape,
    apply_rules,
    window_latency_ms,
)
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.testing.scripted_server import Script, ScriptedServer
from infer_forge.harness.testing.sglang_metrics import sglang_metrics
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import DIAGNOSES_STREAM, GUARD_STREAM, task_stream
from infer_forge.projections.index import open_index

from tests.conftest import run_forge
from tests.helpers.tasks import open_task

OOM_LINE = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
            "has a total capacity of 79.10 GiB of which 1.2 GiB is free.")


def healthy(k: int) -> str:
    """Scrape k of a server keeping up: tokens generated between scrapes, a small queue
    that comes and goes, KV cache at 40 %, fast first tokens."""
    return sglang_metrics(running=4, queue=k % 2, token_usage=0.4, gen_tokens=1000 + 250 * k,
                          requests=10 + 5 * k, ttft_s=(0.05,) * (10 + 5 * k))


def growing_queue(k: int) -> str:
    return sglang_metrics(running=8, queue=6 * k, token_usage=0.6, gen_tokens=1000 + 300 * k,
                          requests=10 + 5 * k, ttft_s=(0.05,) * (10 + 5 * k))


def kv_full(k: int) -> str:
    return sglang_metrics(running=30, queue=1, token_usage=0.99, gen_tokens=1000 + 300 * k,
                          requests=10 + 5 * k, ttft_s=(0.05,) * (10 + 5 * k))


@contextmanager
def server(metrics: Callable[[int], str] | None) -> Iterator[ScriptedServer]:
    with ScriptedServer(Script(metrics=metrics)) as s:
        yield s


def log_file(tmp_path: Path, bad: str | None = None, at: int = 40) -> Path:
    lines = [f"[2026-12-01 08:00:{i % 60:02d}] Decode batch. #running-req: 4, #token: 9000, "
             f"gen throughput (token/s): 1500.0, #queue-req: 0" for i in range(100)]
    if bad is not None:
        lines[at - 1] = bad
    p = tmp_path / "server.log"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("metrics,bad_line,rule", [
    (growing_queue, None, "queue_growing"),
    (kv_full, None, "kv_cache_full"),
    (healthy, OOM_LINE, "oom"),
])
def test_a_misbehaving_server_fires_its_rule_and_only_that_one(workspace, tmp_path, metrics,
                                                               bad_line, rule):
    log = log_file(tmp_path, bad_line, at=40)
    with server(metrics) as s:
        ev = collect.diagnose(workspace, s.url, samples=5, interval_s=0.01, log=log)
        assert s.scrapes == 5
    assert [f.rule for f in ev.findings] == [rule] and not ev.healthy
    (f,) = ev.findings
    if rule == "queue_growing":
        assert f.metrics["num_queue_reqs"] == (0, 6, 12, 18, 24)
    elif rule == "kv_cache_full":
        assert f.metrics["token_usage"] == (0.99,) * 5
    else:
        assert [(x.line, x.text) for x in f.log_lines] == [(40, OOM_LINE)]
    (stored,) = [r.event for r in workspace.ledger.stream(DIAGNOSES_STREAM)]
    assert stored.findings == ev.findings and stored.log_lines_read == 100
    assert stored.rules == tuple(RULES) and stored.window["num_queue_reqs"][0] is not None
    with open_index(workspace) as q:
        assert q.con.execute("SELECT healthy, rules_fired FROM diagnoses").fetchall() == [
            (False, [rule])]


def test_a_healthy_server_fires_no_rule_and_exits_0(workspace, tmp_path):
    log = log_file(tmp_path)
    with server(healthy) as s:
        r = run_forge("diagnose", s.url, "--samples", "4", "--interval", "0.01", "--log",
                      str(log), "--slo", "ttft_ms=500,tpot_ms=100", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["healthy"] and out["findings"] == [] and out["samples"] == 4
    assert out["slo_ms"] == {"ttft_ms.p99": 500.0, "tpot_ms.p99": 100.0}


def test_cli_exit_1_when_a_rule_fires_and_2_when_it_cannot_diagnose(workspace, tmp_path):
    with server(growing_queue) as s:
        r = run_forge("diagnose", s.url, "--samples", "4", "--interval", "0.01")
        assert r.returncode == 1, r.stderr
        assert "UNHEALTHY" in r.stdout and "queue_growing" in r.stdout
        r = run_forge("diagnose", s.url, "--slo", "ttft_ms=fast")
        assert r.returncode == 2 and "'fast'" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        r = run_forge("diagnose", s.url, "--samples", "0")
        assert r.returncode == 2 and "--samples 0" in r.stderr
    with server(None) as s:  # no /metrics: 404, not a diagnosis
        r = run_forge("diagnose", s.url, "--samples", "1")
    assert r.returncode == 2 and "HTTP 404" in r.stderr
    assert workspace.ledger.version(DIAGNOSES_STREAM) == 1


def test_the_window_slo_judges_latency_in_the_window_only(workspace):
    """Slow first tokens long ago, fast ones in the window: the window's p99 is judged."""
    def m(k: int) -> str:
        return sglang_metrics(gen_tokens=1000 + 100 * k, ttft_s=(5.0,) * 50 + (0.05,) * (5 * k))

    with server(m) as s:
        ev = collect.diagnose(workspace, s.url, samples=3, interval_s=0.01,
                              slo={"ttft_ms.p99": 500})
        assert ev.healthy
        slow = collect.diagnose(workspace, s.url, samples=1, slo={"ttft_ms.p99": 500})
    assert [f.rule for f in slow.findings] == ["ttft_over_slo"]  # since start: 5 s


def test_production_endpoint_is_read_and_nothing_is_refused(forge_home, tmp_path):
    from infer_forge.ledger.workspace import init_workspace, open_workspace

    with server(healthy) as s:
        ws, _ = init_workspace(forge_home)
        ws.close()
        cfg = forge_home / "forge.toml"
        cfg.write_text(cfg.read_text().replace(
            "production_endpoints = []", f"production_endpoints = [{json.dumps(s.url)}]", 1))
        with open_workspace(forge_home) as ws:
            from infer_forge.harness.guard.production import is_production

            assert is_production(ws, s.url)
            ev = collect.diagnose(ws, s.url, samples=2, interval_s=0.01)
            assert ev.healthy and ws.ledger.version(GUARD_STREAM) == 0


def test_diagnosis_goes_to_the_task_stream_with_task(workspace, tmp_path):
    block = open_task(workspace, tmp_path)
    with server(kv_full) as s:
        collect.diagnose(workspace, s.url, samples=2, interval_s=0.01, task_id="t1")
    evs = [r.event for r in workspace.ledger.stream_log(task_stream("t1"))
           if r.type == "DiagnosisRecorded"]
    assert [(e.block_id, [f.rule for f in e.findings]) for e in evs] == [
        (block, ["kv_cache_full"])]
    assert workspace.ledger.version(DIAGNOSES_STREAM) == 0


def test_metrics_url_of_a_base_url():
    assert collect.metrics_url("http://h:30000/") == "http://h:30000/metrics"
    assert collect.metrics_url("http://h:30000/v1") == "http://h:30000/metrics"
    assert collect.metrics_url("https://h/x/metrics") == "https://h/x/metrics"
    with pytest.raises(HarnessError, match="http://host:port"):
        collect.metrics_url("h:30000")


def test_log_tail_is_bounded_and_numbered_as_in_the_whole_file(tmp_path):
    p = tmp_path / "big.log"
    p.write_text("".join(f"line {i:05d}\n" for i in range(1, 10001)))  # 11 bytes a line
    lines = collect.read_log_tail(p, tail_bytes=11 * 3 + 5)  # 3 whole lines, 1 partial
    assert [(x.number, x.text) for x in lines] == [(9998, "line 09998"), (9999, "line 09999"),
                                                   (10000, "line 10000")]
    assert len(collect.read_log_tail(p)) == 10000
    with pytest.raises(HarnessError, match="--log .*missing"):
        collect.read_log_tail(tmp_path / "missing.log")


def test_secrets_in_log_evidence_are_redacted_on_write(workspace, tmp_path):
    token = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
    log = log_file(tmp_path, f"CUDA error: an illegal memory access (token={token})", at=7)
    with server(healthy) as s:
        collect.diagnose(workspace, s.url, samples=2, interval_s=0.01, log=log)
    (row,) = workspace.ledger.stream_log(DIAGNOSES_STREAM)
    assert token not in json.dumps(row.event.model_dump(mode="json"))
    assert [f.rule for f in row.event.findings] == ["cuda_error"]


# --- the rules alone (pure) ------------------------------------------------------------------


def _scrapes(**series: tuple[float, ...]) -> list[Scrape]:
    n = len(next(iter(series.values())))
    base = {"num_running_reqs": 2.0, "num_queue_reqs": 0.0, "token_usage": 0.3}
    return [Scrape(float(i), {**base, "generation_tokens_total": 100.0 * i,
                              **{k: v[i] for k, v in series.items()}}) for i in range(n)]


@pytest.mark.parametrize("scrapes,log,rule", [
    (_scrapes(num_queue_reqs=(0, 2, 2, 9)), [], "queue_growing"),
    (_scrapes(token_usage=(0.985, 0.99, 1.0)), [], "kv_cache_full"),
    (_scrapes(num_retracted_reqs=(0, 3, 0)), [], "retractions"),
    (_scrapes(token_usage=(0.5, 0.5)), [LogLine(3, "KV cache pool is full. Retract requests. "
                                                   "#retracted_reqs: 1")], "retractions"),
    (_scrapes(token_usage=(0.5, 0.5)), [LogLine(9, "[Rank 1] Watchdog caught collective "
                                                   "operation timeout: WorkNCCL(SeqNum=7)")],
     "nccl_timeout"),
    (_scrapes(token_usage=(0.5, 0.5)), [LogLine(2, "NCCL communicator timed out on rank 3")],
     "nccl_timeout"),
    (_scrapes(token_usage=(0.5, 0.5)), [LogLine(5, "RuntimeError: CUDA error: an illegal "
                                                   "memory access was encountered")],
     "cuda_error"),
    (_scrapes(token_usage=(0.5, 0.5)), [LogLine(5, "RuntimeError: CUDA error: out of memory")],
     "oom"),
    (_scrapes(generation_tokens_total=(500, 500, 500)), [], "scheduler_stalled"),
    (_scrapes(token_usage=(0.5, 0.5)), [LogLine(8, "Scheduler watchdog timeout "
                                                   "(self.watchdog_timeout=300)")],
     "scheduler_stalled"),
])
def test_each_rule_fires_alone(scrapes, log, rule):
    assert [f.rule for f in apply_rules(scrapes, log)] == [rule]


def test_rules_do_not_fire_below_their_thresholds():
    assert apply_rules(_scrapes(num_queue_reqs=(0, 2, 4))) == []  # grew by 4 < 5
    assert apply_rules(_scrapes(num_queue_reqs=(0, 9, 8, 20))) == []  # fell once
    assert apply_rules(_scrapes(token_usage=(0.99, 0.97, 0.99))) == []
    assert apply_rules(_scrapes(num_running_reqs=(0, 0, 0),
                                generation_tokens_total=(5, 5, 5))) == []  # idle, not stalled
    assert apply_rules([Scrape(0.0, {"num_running_reqs": 3.0,
                                     "generation_tokens_total": 5.0})]) == []  # one scrape


def test_parse_slo_names_the_bad_item():
    assert collect.parse_slo("ttft_ms=200, tpot_ms.p50=20") == {"ttft_ms.p99": 200.0,
                                                                 "tpot_ms.p50": 20.0}
    for bad, word in (("e2e_ms=5", "e2e_ms=5"), ("ttft_ms.p42=5", "p42"),
                      ("ttft_ms=-1", "'-1'"), ("ttft_ms=nan", "'nan'"), ("ttft_ms", "ttft_ms")):
        with pytest.raises(HarnessError, match=word):
            collect.parse_slo(bad)


def test_evidence_refuses_non_finite_values():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="finite"):
        E.DiagnosisFinding(rule="x", summary="y", metrics={"a": (float("nan"),)})


def test_slo_from_a_deployment_point(workspace):
    from tests.conftest import REPO

    point = REPO / "examples" / "points" / "qwen-h200.yaml"
    assert collect.slo_of_point(point) == {"ttft_ms.p99": 2000.0, "tpot_ms.p50": 30.0}

    def slow(k: int) -> str:  # every first token in 3 s
        return sglang_metrics(gen_tokens=100 * k, ttft_s=(3.0,) * (5 * k))

    with server(slow) as s:
        r = run_forge("diagnose", s.url, "--samples", "3", "--interval", "0.01", "--point",
                      str(point), "--json")
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    assert [f["rule"] for f in out["findings"]] == ["ttft_over_slo"]
    assert "p99" in out["findings"][0]["summary"] and "2000 ms" in out["findings"][0]["summary"]


# --- non-finite samples (issue 27, item 6) -------------------------------------------------

def nonfinite_page(k: int) -> str:
    """A legal Prometheus page with `NaN`, `+Inf` and `-Inf` samples under SGLang's own names
    (a histogram's sum among them) on even scrapes; odd scrapes are healthy."""
    page = healthy(k)
    if k % 2:
        return page
    for name, value in (("token_usage", "NaN"), ("num_queue_reqs", "+Inf"),
                        ("num_running_reqs", "-Inf"),
                        ("time_to_first_token_seconds_sum", "+Inf")):
        page = re.sub(rf"^(sglang:{name}{{[^}}]*}}) .*$", rf"\g<1> {value}", page, flags=re.M)
    return page


def test_nan_and_inf_samples_are_skipped_and_named_never_a_traceback(workspace, tmp_path):
    with server(nonfinite_page) as s:
        assert all(v in nonfinite_page(0) for v in ("} NaN\n", "} +Inf\n", "} -Inf\n"))
        ev = collect.diagnose(workspace, s.url, samples=3, interval_s=0.01,
                              slo={"ttft_ms.p99": 1000.0})
        r = run_forge("diagnose", s.url, "--samples", "3", "--interval", "0.01", "--json",
                      home=workspace.home)
    assert [f.rule for f in ev.findings] == ["nonfinite_metrics"] and not ev.healthy
    (f,) = ev.findings
    for name in ("sglang:token_usage", "sglang:num_queue_reqs", "sglang:num_running_reqs",
                 "sglang:time_to_first_token_seconds_sum"):
        assert f"{name} (2 of 3 scrapes)" in f.summary
    # The skipped values are holes; the finite ones in between are kept.
    assert ev.window["token_usage"] == (None, 0.4, None)
    assert ev.window["num_queue_reqs"] == (None, 1.0, None)
    (stored,) = [x.event for x in workspace.ledger.stream(DIAGNOSES_STREAM)][:1]
    assert stored.window == ev.window
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    out = json.loads(r.stdout)
    assert [x["rule"] for x in out["findings"]] == ["nonfinite_metrics"]


def test_computed_numbers_that_overflow_are_not_judged():
    """Finite samples whose window sum overflows: the latency is not judged, not a crash."""
    big = 1.7e308
    a = Scrape(0.0, {"time_to_first_token_seconds_count": 0.0,
                     "time_to_first_token_seconds_sum": -big})
    b = Scrape(1.0, {"time_to_first_token_seconds_count": 1.0,
                     "time_to_first_token_seconds_sum": big})
    assert window_latency_ms([a, b], "ttft_ms", "mean") is None  # not inf
    assert apply_rules([a, b], [], {"ttft_ms.mean": 1.0}) == []
