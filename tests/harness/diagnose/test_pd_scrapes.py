"""Diagnosing and monitoring a disaggregated point through its entry URL: the real router
(`sglang-router` 0.3.2) has no `/metrics` on its entry port, so each server behind it (its
`/workers` view) is scraped and every finding names the server it came from
(harness/diagnose/targets.py). The servers are the stand-ins (SGLang needs a GPU); the
router, and so what the entry URL answers, is the real one."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from infer_forge.harness.diagnose.collect import diagnose
from infer_forge.harness.diagnose.monitor import monitor
from infer_forge.harness.engines.deploy import Deployment
from infer_forge.harness.engines.host_plan import plan_with_free_ports
from infer_forge.harness.engines.plan import plan_point
from infer_forge.ledger import events as E
from infer_forge.ledger.specs import DeploymentPoint, RuntimeProfile
from infer_forge.ledger.streams import ENDPOINTS_STREAM

from tests.conftest import TESTS, need

DATA = TESTS / "data" / "sglang"
FAKE = [sys.executable, str(DATA / "fake_server.py")]


@pytest.fixture(scope="module")
def pd_point(tmp_path_factory):
    """A PD point (one prefill, one decode) behind the real router; the decode server's
    /metrics page holds a NaN gauge (legal Prometheus, which `nonfinite_metrics` names)."""
    need(importlib.util.find_spec("sglang_router") is not None,
         "the real router sglang-router is not installed (pip install -e '.[dev]')")
    tmp = tmp_path_factory.mktemp("pd-scrapes")
    page = tmp / "decode-metrics.txt"
    page.write_text("\n".join(
        line.rsplit(" ", 1)[0] + " NaN" if line.startswith("sglang:gen_throughput{") else line
        for line in (DATA / "metrics.txt").read_text().splitlines()) + "\n")
    point = DeploymentPoint.model_validate({
        "name": "pd-scrapes", "model": {"name": "m", "source": "m"},
        "scenario": {"traffic": {"concurrency": 1}},
        "topology": {"architecture": "pd", "roles": [{"role": "prefill"}, {"role": "decode"}]},
        "runtime_profile": {"service": "s", "rev": 1, "file": "profile.yaml"},
        "accelerator": {"vendor": "cpu", "model": "x86_64", "count": 1}})
    profile = RuntimeProfile.model_validate({
        "service": "s", "rev": 1, "engine": "sglang",
        "config": {"launcher": FAKE, "startup_timeout_s": 60,
                   "role_config": {"decode": {"env": {"FAKE_SGLANG_METRICS": str(page)}}}},
        "framework": {"kind": "sglang", "version": "0.5.23"}})
    plan = plan_with_free_ports(lambda base: plan_point(point, profile, None, base_port=base))
    with Deployment(plan, logs=tmp, grace_s=5) as dep:
        yield dep


def test_a_pd_entry_is_diagnosed_server_by_server(workspace, pd_point):
    plan = pd_point.plan
    prefill, decode = plan.process("prefill-0"), plan.process("decode-0")
    ev = diagnose(workspace, plan.entry_url, samples=2, interval_s=0.05)
    assert ev.url == plan.entry_url and ev.samples == 2
    labels = {f"prefill-0 {prefill.url}", f"decode-0 {decode.url}"}
    # every finding names its server (the static page's other findings fire on both)
    assert {f.summary.split(": ")[0] for f in ev.findings} <= labels
    assert {f.summary.split(": ")[0] for f in ev.findings
            if f.rule == "nonfinite_metrics"} == {f"decode-0 {decode.url}"}
    assert all(k.split("/")[0] in ("prefill-0", "decode-0") for f in ev.findings
               for k in f.metrics)
    assert not ev.healthy
    # each server's window under its own name
    assert ev.window["prefill-0/num_running_reqs"] == (8.0, 8.0)
    assert ev.window["decode-0/num_running_reqs"] == (8.0, 8.0)


def test_a_pd_entry_is_monitored_server_by_server(workspace, pd_point):
    plan = pd_point.plan
    lines: list[str] = []
    res = monitor(workspace, plan.entry_url, interval_s=0.05, window_s=10, count=2,
                  echo=lines.append)
    assert (res.samples, res.errors, res.summaries) == (4, 0, 2)
    evs = [r.event for r in workspace.ledger.stream(ENDPOINTS_STREAM)]
    assert all(isinstance(e, E.EndpointSummarized) for e in evs)
    assert sorted(e.url for e in evs) == sorted(p.url for p in plan.processes
                                                if p.role != "router")
    assert sorted(ln.split(":")[0] for ln in lines) == ["decode-0", "prefill-0"]
    assert all(e.samples == 2 and e.stats["num_running_reqs"][0] == 8.0 for e in evs)
