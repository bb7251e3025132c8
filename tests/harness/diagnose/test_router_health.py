"""The router's own health, judged from the real routers' Prometheus pages: a colocated
point of two stand-in servers behind `sglang-router` 0.3.2 and `smg` 1.13 (the real binaries,
one health check a second), diagnosed healthy, then with one server killed: the router's
page says that worker is unhealthy, and the server that no longer answers is a finding of
its own instead of a failed diagnosis."""

from __future__ import annotations

import os
import signal
import time
import urllib.request

import pytest
from infer_forge.harness.diagnose.collect import diagnosis
from infer_forge.harness.diagnose.router_health import to_router_scrape
from infer_forge.harness.engines.deploy import Deployment
from infer_forge.harness.errors import HarnessError

from ..engines.test_real_router import ROUTERS, make_plan, router_launcher

CHECKS = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1"]


def _router_page(url: str) -> str:
    return urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()


@pytest.mark.parametrize("package", list(ROUTERS))
def test_a_dead_worker_is_seen_from_the_routers_own_page(workspace, tiny_model, package):
    plan = make_plan(router_launcher(package) + CHECKS, tiny_model, arch="colocated",
                     roles=[{"role": "colocated", "count": 2}])
    router = plan.process("router")
    metrics = f"http://{router.host}:{router.metrics_port}"
    with Deployment(plan, ws=workspace, grace_s=5) as dep:
        ev = diagnosis(workspace, plan.entry_url, samples=1, interval_s=0.1,
                       router_metrics=metrics)
        assert ev.healthy, ev.findings
        assert "router_unhealthy_workers" in ev.rules
        victim = plan.by_role("colocated")[0]
        os.killpg(dep.servers[victim.name].pid, signal.SIGKILL)
        deadline = time.monotonic() + 30  # the router's next health checks (1 s apart)
        while True:
            health = to_router_scrape(0, _router_page(metrics), metrics).ranks
            if health.get("worker_health", {}).get(victim.url) == 0:
                break
            assert time.monotonic() < deadline, health
            time.sleep(0.2)  # poll interval of a wait for the router's own health check
        ev = diagnosis(workspace, plan.entry_url, samples=1, interval_s=0.1,
                       router_metrics=metrics)
    found = {f.rule: f for f in ev.findings}
    assert set(found) == {"router_unhealthy_workers", "server_unreachable"}
    assert f"unhealthy worker(s) {victim.url}" in found["router_unhealthy_workers"].summary
    assert found["router_unhealthy_workers"].summary.startswith(f"router {metrics}: ")
    # named as the router lists it (a colocated server is a "regular" worker there)
    assert found["server_unreachable"].summary.startswith("regular-")
    assert f" {victim.url}: its /metrics could not be read" in found["server_unreachable"].summary
    assert found["router_unhealthy_workers"].metrics[f"router/worker_health:{victim.url}"] == (0.0,)


def test_router_metrics_must_be_a_routers_page(workspace, tiny_model):
    """A server's own page given as the router's: one line naming it."""
    plan = make_plan(router_launcher("sglang-router"), tiny_model, arch="colocated",
                     roles=[{"role": "colocated", "count": 2}])
    with Deployment(plan, ws=workspace, grace_s=5):
        server = plan.by_role("colocated")[0].url
        with pytest.raises(HarnessError, match="no smg_\\* metrics"):
            diagnosis(workspace, plan.entry_url, samples=1, router_metrics=server)
        with pytest.raises(HarnessError, match="serves its own /metrics"):
            diagnosis(workspace, server, samples=1, router_metrics=plan.entry_url)
