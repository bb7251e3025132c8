"""The real SGLang router (`sglang-router` 0.3.2, `python -m sglang_router.launch_router`, and
its successor `smg` 1.13, `python -m smg.launch_router`; both from PyPI, Rust binaries that
run here) on loopback in front of the stand-in servers: a planned PD point deployed with it,
requests through it, what it forwarded as the servers logged it; the plan's router flags
against each router's own `--help`; the stand-in router (harness/testing/fake_router.py)
answering as the real one does."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from infer_forge.harness.bench.client import run_bench
from infer_forge.harness.bench.datasets import Prompt
from infer_forge.harness.bench.request import BenchConfig
from infer_forge.harness.engines.base import request_json
from infer_forge.harness.engines.deploy import Deployment
from infer_forge.harness.engines.host_plan import plan_with_free_ports
from infer_forge.harness.engines.plan import plan_point
from infer_forge.harness.engines.process import ServerProcess, free_port
from infer_forge.ledger.specs import DeploymentPoint, RuntimeProfile

from tests.conftest import REPO, TESTS, need

FAKE = [sys.executable, str(TESTS / "data" / "sglang" / "fake_server.py")]
FAKE_ROUTER = [sys.executable, str(REPO / "harness" / "testing" / "fake_router.py")]
ROUTERS = {"sglang-router": "sglang_router", "smg": "smg"}


def router_launcher(package: str) -> list[str]:
    module = ROUTERS[package]
    need(importlib.util.find_spec(module) is not None,
         f"the real router {package} is not installed (pip install -e '.[dev]')")
    return [sys.executable, "-m", f"{module}.launch_router"]


def point_of(arch: str, roles: list[dict], name: str = "real-router") -> DeploymentPoint:
    """A CPU deployment point of `arch` with `roles` (the plan tests' smallest point)."""
    return DeploymentPoint.model_validate({
        "name": f"{name}-{arch}", "model": {"name": "m", "source": "m"},
        "scenario": {"traffic": {"concurrency": 1}},
        "topology": {"architecture": arch, "roles": roles},
        "runtime_profile": {"service": "s", "rev": 1, "file": "profile.yaml"},
        "accelerator": {"vendor": "cpu", "model": "x86_64", "count": 1}})


def make_plan(router: list[str], model: Path, arch: str = "pd",
              roles: list[dict] | None = None, version: str = "0.5.23"):
    profile = RuntimeProfile.model_validate({
        "service": "s", "rev": 1, "engine": "sglang",
        "config": {"launcher": FAKE, "router_launcher": router, "startup_timeout_s": 60,
                   "env": {"FAKE_SGLANG_VERSION": version}},
        "framework": {"kind": "sglang", "version": version}})
    roles = roles or [{"role": "prefill", "count": 2}, {"role": "decode"}]
    return plan_with_free_ports(lambda base: plan_point(
        point_of(arch, roles), profile, None, model=str(model), base_port=base))


def post(url: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def seen(dep: Deployment, name: str, path: str) -> list[dict]:
    """What the stand-in server `name` logged receiving on `path` (fake_server note_request)."""
    mark = f"[fake sglang] request {path} "
    return [json.loads(line[len(mark):]) for line in
            dep.servers[name].log_path.read_text().splitlines() if line.startswith(mark)]


def _wait_workers(entry: str, n: int, timeout_s: float = 60.0) -> None:
    """Until the router lists `n` healthy workers (it registers them in the background)."""
    deadline = time.monotonic() + timeout_s
    while True:
        workers = request_json("GET", entry + "/workers").get("workers", [])
        if sum(bool(w.get("is_healthy")) for w in workers) >= n:
            return
        assert time.monotonic() < deadline, f"{entry} lists {workers}"
        time.sleep(0.05)  # poll interval of a wait loop, not a synchronization


def test_plan_router_flags_are_the_real_routers(tiny_model):
    """Every flag the plan gives a router, colocated or PD, is in each real router's help."""
    for package in ROUTERS:
        launcher = router_launcher(package)
        help_text = subprocess.run([*launcher, "--help"], capture_output=True, text=True,
                                   timeout=60, check=True).stdout
        for arch, roles in (("colocated", [{"role": "colocated", "count": 2}]), ("pd", None)):
            router = make_plan(launcher, tiny_model, arch, roles).process("router")
            flags = [a for a in router.argv[len(launcher):] if a.startswith("--")]
            assert {"--prometheus-host", "--prometheus-port"} <= set(flags)
            for flag in flags:
                assert f"  {flag} " in help_text or f"[{flag} " in help_text, (package, flag)


def test_pd_points_behind_both_real_routers_on_one_host(workspace, tiny_model):
    """Two PD points at once, one behind sglang-router, one behind smg: each router its own
    metrics port (both on 29000 would fail the second); requests carry `model`; the router
    adds the bootstrap fields to the prefill and the decode request (one room) and renames a
    chat request's max_tokens (sglang-router; smg keeps it); no /list_workers, no /metrics on
    the entry port."""
    plans = [make_plan(router_launcher(p), tiny_model) for p in ROUTERS]
    with Deployment(plans[0], ws=workspace, grace_s=5) as a, \
            Deployment(plans[1], ws=workspace, grace_s=5) as b:
        for dep in (a, b):
            plan = dep.plan
            assert sorted(w["worker_type"] for w in dep.router_workers) == [
                "decode", "prefill", "prefill"]
            entry, model = plan.entry_url, plan.model  # smg routes by the served name
            code, text = post(entry + "/v1/completions",
                              {"model": model, "prompt": "one two three", "max_tokens": 2})
            assert code == 200 and json.loads(text)["disaggregation_mode"] == "decode", text
            code, _ = post(entry + "/v1/chat/completions", {
                "model": model, "messages": [{"role": "user", "content": "a b"}],
                "max_tokens": 3})
            assert code == 200
            decode = seen(dep, "decode-0", "/v1/completions")[-1]
            prefills = [r for p in plan.by_role("prefill")
                        for r in seen(dep, p.name, "/v1/completions")]
            assert len(prefills) == 1
            boot = {p.bootstrap_port for p in plan.by_role("prefill")}
            for req in (decode, prefills[0]):
                assert req["bootstrap_host"] == "127.0.0.1" and req["bootstrap_port"] in boot
                assert req["model"] == model
            assert decode["bootstrap_room"] == prefills[0]["bootstrap_room"]
            chat = seen(dep, "decode-0", "/v1/chat/completions")[-1]
            legacy = "sglang_router.launch_router" in plan.process("router").argv
            if legacy:
                # sglang-router 0.3.2 renames max_tokens; smg 1.13 passes it on as it is
                assert chat["max_completion_tokens"] == 3 and "max_tokens" not in chat["keys"]
            else:
                assert chat["max_tokens"] == 3 and "max_completion_tokens" not in chat["keys"]
            # the real router's own answers the harness must live with
            # a request without `model`: 422 from sglang-router, 400 from smg
            assert post(entry + "/v1/completions", {"prompt": "x", "max_tokens": 1})[0] == (
                422 if legacy else 400)
            assert get_status(entry + "/list_workers") == 404
            assert get_status(entry + "/metrics") == 404
            # the harness's own bench client through the router (its bodies carry `model`)
            for endpoint in ("completions", "chat"):
                cfg = BenchConfig(url=entry, model=model, endpoint=endpoint,
                                  max_concurrency=2, warmup=1, engine="sglang")
                res = run_bench(cfg, [Prompt("one two three four", 4, 2)] * 2)
                assert [r.success for r in res.records] == [True, True], (endpoint, res.records)
            router = plan.process("router")
            page = urllib.request.urlopen(
                f"http://{router.host}:{router.metrics_port}/metrics", timeout=10).read()
            assert b"smg_" in page


def test_the_stand_in_router_answers_as_the_real_one(workspace, tiny_model, tmp_path):
    """The same servers behind the stand-in router and the real one: the same status for each
    probe, the same request forwarded (fields the harness relies on), the same worker view."""
    plan = make_plan(FAKE_ROUTER, tiny_model)
    real_argv = [*router_launcher("sglang-router"),
                 *plan.process("router").argv[len(FAKE_ROUTER):]]
    port, mport = free_port(), free_port()
    for flag, value in (("--port", port), ("--prometheus-port", mport)):
        real_argv[real_argv.index(flag) + 1] = str(value)
    with Deployment(plan, ws=workspace, grace_s=5) as dep:
        real = ServerProcess(real_argv, health_url=f"http://127.0.0.1:{port}/health",
                             name="real router", log_path=tmp_path / "real-router.log",
                             startup_timeout_s=60)
        real.start()
        try:
            real.wait_ready()
            _wait_workers(f"http://127.0.0.1:{port}", len(plan.processes) - 1)
            entries = {"stand-in": plan.entry_url, "real": f"http://127.0.0.1:{port}"}
            answers: dict[str, list] = {}
            for who, entry in entries.items():
                chat = {"model": plan.model, "messages": [{"role": "user", "content": "a"}],
                        "max_tokens": 2}
                statuses = [post(entry + "/v1/completions", {"prompt": "x"})[0],
                            post(entry + "/v1/chat/completions",
                                 {"messages": chat["messages"]})[0],
                            post(entry + "/v1/chat/completions", chat)[0],
                            get_status(entry + "/list_workers"),
                            get_status(entry + "/metrics")]
                forwarded = seen(dep, "decode-0", "/v1/chat/completions")[-1]
                workers = request_json("GET", entry + "/workers")
                answers[who] = [statuses, forwarded.get("max_completion_tokens"),
                                "max_tokens" in forwarded["keys"],
                                {k: forwarded[k] for k in ("bootstrap_host", "model")},
                                sorted((w["url"], w["worker_type"], w.get("bootstrap_port"))
                                       for w in workers["workers"]),
                                workers["stats"]]
            assert answers["stand-in"] == answers["real"]
            assert answers["real"][0] == [422, 200, 200, 404, 404]
        finally:
            real.stop()
