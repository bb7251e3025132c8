"""Whole deployments under one lifecycle (harness/engines/deploy.py), on real processes:
the stand-in SGLang server (tests/data/sglang/fake_server.py) answering as prefill, decode or
encoder, and the stand-in router (harness/testing/fake_router.py) speaking the router's HTTP
interface. What is checked is the process table and the process groups, not our own state."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml
from infer_forge.harness.engines.base import request_json
from infer_forge.harness.engines.deploy import Deployment
from infer_forge.harness.engines.host_plan import plan_here, plan_with_free_ports
from infer_forge.harness.engines.plan import plan_point
from infer_forge.harness.engines.point_up import point_and_profile
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.proc import group_alive
from infer_forge.ledger import events as E
from infer_forge.ledger.specs import DeploymentPoint, RuntimeProfile
from infer_forge.ledger.streams import ENGINES_STREAM

from tests.conftest import FORGE, REPO, TESTS, run_forge

DATA = TESTS / "data" / "sglang"
FAKE = [sys.executable, str(DATA / "fake_server.py")]
FAKE_ROUTER = [sys.executable, str(REPO / "harness" / "testing" / "fake_router.py")]
PD_ROLES = [{"role": "prefill", "count": 2, "parallelism": {"tp": 4}},
            {"role": "decode", "count": 1, "parallelism": {"tp": 8}}]


def point_spec(arch: str, roles: list[dict]) -> dict:
    return {"name": f"stand-in-{arch}", "model": {"name": "m", "source": "Qwen/Qwen3-8B"},
            "scenario": {"traffic": {"concurrency": 4}},
            "topology": {"architecture": arch, "roles": roles},
            "runtime_profile": {"service": "s", "rev": 1, "file": "profile.yaml"},
            "accelerator": {"vendor": "cpu", "model": "x86_64", "count": 1}}


def config(role_config: dict | None = None) -> dict:
    return {"launcher": FAKE, "router_launcher": FAKE_ROUTER, "startup_timeout_s": 60,
            "role_config": role_config or {}}


def make_plan(arch: str = "pd", roles: list[dict] | None = None,
              role_config: dict | None = None):
    point = DeploymentPoint.model_validate(point_spec(arch, roles or PD_ROLES))
    profile = RuntimeProfile.model_validate({
        "service": "s", "rev": 1, "engine": "sglang", "config": config(role_config),
        "framework": {"kind": "sglang", "version": "0.5.23"}})
    return plan_here(point, profile, ws=None)


def groups_alive(pids) -> list[int]:
    return [p for p in pids if p is not None and group_alive(p)]


def test_pd_deployment_of_stand_ins(workspace):
    plan = make_plan()
    with Deployment(plan, ws=workspace, grace_s=5) as dep:
        pids = [dep.servers[p.name].pid for p in plan.processes]
        assert len(groups_alive(pids)) == 4
        desc = dep.describe()
        assert [(p["name"], p["disaggregation_mode"]) for p in desc["processes"]] == [
            ("prefill-0", "prefill"), ("prefill-1", "prefill"), ("decode-0", "decode"),
            ("router", None)]
        view = request_json("GET", plan.entry_url + "/workers")
        assert view["stats"] == {"prefill_count": 2, "decode_count": 1, "regular_count": 0}
        assert {w["url"]: w["bootstrap_port"] for w in view["workers"]} == {
            p.url: p.bootstrap_port for p in plan.processes if p.role != "router"}
        out = request_json("POST", plan.entry_url + "/v1/completions",
                           {"model": "m", "prompt": "one two three", "max_tokens": 2})
        assert out["disaggregation_mode"] == "decode" and out["choices"][0]["text"] == "one two"
        import urllib.request
        req = urllib.request.Request(
            plan.entry_url + "/v1/completions", method="POST",
            data=json.dumps({"model": "m", "prompt": "a b c", "max_tokens": 3,
                             "stream": True}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:  # streamed through the router
            assert r.headers["Content-Type"] == "text/event-stream"
            lines = [x for x in r.read().decode().split("\n\n") if x]
        # A chunk per token, no usage chunk (none was asked for), then [DONE].
        assert lines[-1] == "data: [DONE]" and len(lines) == 4
    assert groups_alive(pids) == []
    evs = [r.event for r in workspace.ledger.stream(ENGINES_STREAM)]
    kinds = [type(e).__name__ for e in evs]
    assert kinds[0] == "LaunchPlanned" and kinds.count("EngineLaunched") == 4
    planned = evs[0]
    assert isinstance(planned, E.LaunchPlanned) and planned.plan_digest == plan.digest()
    stopped = [e.url for e in evs if isinstance(e, E.EngineStopped)]
    assert stopped == [p.url for p in reversed(plan.processes)]  # router first, then roles


def test_epd_deployment_checks_each_role(workspace):
    roles = [{"role": "encode", "count": 2}, {"role": "prefill"}, {"role": "decode"}]
    plan = make_plan("epd", roles)
    with Deployment(plan, ws=workspace, grace_s=5) as dep:
        infos = dep.server_info
        assert infos["encode-0"] == {}  # an encoder has no info route (test_sglang_routes.py)
        assert infos["prefill-0"]["encoder_urls"] == [p.url for p in plan.by_role("encode")]
        out = request_json("POST", plan.entry_url + "/generate", {"text": "a b c"})
        assert out["meta_info"]["disaggregation_mode"] == "decode"
        pids = [s.pid for s in dep.servers.values()]
    assert groups_alive(pids) == []


def test_colocated_replicas_behind_the_router(workspace):
    plan = make_plan("colocated", [{"role": "colocated", "count": 2}])
    with Deployment(plan, ws=workspace, grace_s=5) as dep:
        assert [w["worker_type"] for w in dep.router_workers] == ["regular", "regular"]
        out = request_json("POST", plan.entry_url + "/v1/completions",
                           {"model": "m", "prompt": "x y", "max_tokens": 4})
        assert out["choices"][0]["text"] == "x y" and out["disaggregation_mode"] == "null"
        pids = [s.pid for s in dep.servers.values()]
    assert len(pids) == 3 and groups_alive(pids) == []


@pytest.mark.parametrize("role,role_config,named", [
    ("decode", {"decode": {"env": {"FAKE_SGLANG_MODE": "crash"}}}, "decode-0 (decode server)"),
    ("prefill", {"prefill": {"env": {"FAKE_SGLANG_MODE": "crash"}}},
     "prefill-0 (prefill server)"),
    ("router", {"router": {"env": {"FAKE_ROUTER_MODE": "crash"}}}, "router (router)"),
])
def test_a_crash_while_starting_tears_down_the_rest(workspace, role, role_config, named):
    plan = make_plan(role_config=role_config)
    dep = Deployment(plan, ws=workspace, grace_s=5)
    with pytest.raises(HarnessError) as err:
        dep.start()
    assert named in str(err.value) and "exited while starting" in str(err.value)
    pids = [s.pid for s in dep.servers.values()]
    assert pids and groups_alive(pids) == []
    stops = [e for e in (r.event for r in workspace.ledger.stream(ENGINES_STREAM))
             if isinstance(e, E.EngineStopped)]
    assert len(stops) == len(dep.started) and "crashed" in {e.reason for e in stops}


def test_a_crash_later_names_the_role_and_stops_the_rest(workspace):
    plan = make_plan()
    with pytest.raises(HarnessError, match=r"prefill-1 \(prefill server\) exited while running"):
        with Deployment(plan, ws=workspace, grace_s=5) as dep:
            pids = [s.pid for s in dep.servers.values()]
            victim = dep.servers["prefill-1"]
            os.killpg(victim.pid, signal.SIGKILL)
            victim.proc.wait(timeout=10)
            dep.check()
    assert groups_alive(pids) == []


def test_the_router_must_list_every_worker(workspace):
    """A router whose view lacks a planned server fails the deploy (and tears all down)."""
    point = DeploymentPoint.model_validate(point_spec("pd", PD_ROLES))
    profile = RuntimeProfile.model_validate({
        "service": "s", "rev": 1, "engine": "sglang", "config": config(),
        "framework": {"kind": "sglang", "version": "0.5.23"}})
    # a block below the ephemeral range, all free now (a free_port() base raced other tests)
    plan = plan_with_free_ports(lambda base: plan_point(point, profile, None, base_port=base))
    router = plan.processes[-1]
    argv = list(router.argv)
    i = argv.index("--prefill")
    del argv[i:i + 3]  # the router is told of one prefill server only
    bad = plan.model_copy(update={"processes": (*plan.processes[:-1], router.model_copy(
        update={"argv": tuple(argv)}))})
    dep = Deployment(bad, ws=workspace, grace_s=5, router_view_timeout_s=1)
    with pytest.raises(HarnessError) as err:
        dep.start()
    assert f"does not list {plan.processes[0].url} (prefill)" in str(err.value)
    assert groups_alive([s.pid for s in dep.servers.values()]) == []


@pytest.mark.slow
def test_ctrl_c_on_forge_engine_up_leaves_no_process(tmp_path):
    """SIGINT to a real `forge engine up --point` mid-run: every process group is gone."""
    home = tmp_path / "home"
    assert run_forge("init", home=home).returncode == 0
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump({
        "service": "s", "rev": 1, "engine": "sglang", "config": config(),
        "framework": {"kind": "sglang", "version": "0.5.23"}}))
    point = tmp_path / "point.yaml"
    point.write_text(yaml.safe_dump(point_spec("pd", PD_ROLES)))
    p = subprocess.Popen([*FORGE, "engine", "up", "--point", str(point)],
                         stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         cwd=str(REPO), env={**os.environ, "FORGE_HOME": str(home)})
    seen = []
    for line in p.stderr:  # blocks until the deployment is up (or the command died: EOF)
        seen.append(line)
        if "Ctrl-C to stop" in line:
            break
    assert "Ctrl-C to stop" in line, "".join(seen)
    r = run_forge("log", "--json", "--type", "EngineLaunched", home=home)
    pids = [json.loads(x)["pid"] for x in r.stdout.splitlines()]
    assert len(pids) == 4 and len(groups_alive(pids)) == 4
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=60) == 0
    assert groups_alive(pids) == []
    r = run_forge("log", "--json", "--type", "EngineStopped", home=home)
    assert len(r.stdout.splitlines()) == 4


def test_point_up_refuses_an_accelerator_this_host_lacks(tmp_path):
    from infer_forge.harness.engines.point_up import point_up
    from infer_forge.harness.testing.fake_nvml import FakeNvml

    spec = point_spec("pd", PD_ROLES)
    spec["accelerator"] = {"vendor": "nvidia", "model": "H100", "count": 16, "memory_gb": 80}
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump({
        "service": "s", "rev": 1, "engine": "sglang", "config": config(),
        "framework": {"kind": "sglang", "version": "0.5.23"}}))
    (tmp_path / "point.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(HarnessError, match=r"model H100 \(point: nvidia H100 x16 80 GB\) but "
                                           r"host .* has nvidia NVIDIA H200 x8 140 GB"):
        point_up(None, tmp_path / "point.yaml", nvml=FakeNvml(8), once=True)
    point, profile = point_and_profile(tmp_path / "point.yaml")
    plan = plan_here(point, profile, ws=None, plan_only=True, nvml=FakeNvml(8))
    assert "not deployable here" in plan.device_source


def test_a_tasks_deployment_is_recorded_on_its_stream(workspace, tmp_path):
    """Within a task's open block the plan and every launch and stop go on the task's
    stream, through the one task-stream writer."""
    from infer_forge.ledger.streams import task_stream

    from tests.helpers.tasks import open_task

    block = open_task(workspace, tmp_path)
    plan = make_plan()
    with Deployment(plan, ws=workspace, stream=task_stream("t1"),
                    event_fields={"task_id": "t1", "block_id": block}, grace_s=5):
        pass
    evs = [r.event for r in workspace.ledger.stream_log(task_stream("t1"))]
    kinds = [type(e).__name__ for e in evs if type(e).__name__ in (
        "LaunchPlanned", "EngineLaunched", "EngineStopped")]
    assert kinds == ["LaunchPlanned"] + ["EngineLaunched"] * 4 + ["EngineStopped"] * 4
    assert all(e.block_id == block for e in evs if isinstance(e, E.LaunchPlanned))


@pytest.mark.slow
def test_ctrl_c_while_starting_leaves_no_process(tmp_path):
    """SIGINT while the decode server is still starting (its health answers 503): the two
    ready prefill servers and the starting decode server are all stopped."""
    import time

    from infer_forge.ledger.workspace import open_workspace

    home = tmp_path / "home"
    assert run_forge("init", home=home).returncode == 0
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump({
        "service": "s", "rev": 1, "engine": "sglang",
        "config": config({"decode": {"env": {"FAKE_SGLANG_MODE": "slow:1000000"}}}),
        "framework": {"kind": "sglang", "version": "0.5.23"}}))
    point = tmp_path / "point.yaml"
    point.write_text(yaml.safe_dump(point_spec("pd", PD_ROLES)))
    p = subprocess.Popen([*FORGE, "engine", "up", "--point", str(point)],
                         stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         cwd=str(REPO), env={**os.environ, "FORGE_HOME": str(home)})
    try:
        deadline = time.monotonic() + 60
        pids: list[int] = []
        with open_workspace(home) as ws:  # read the ledger as forge writes it
            while len(pids) < 2:  # the two prefill servers are up; decode answers 503
                assert p.poll() is None and time.monotonic() < deadline, p.communicate()
                evs = [r.event for r in ws.ledger.stream(ENGINES_STREAM)]
                pids = [e.pid for e in evs if isinstance(e, E.EngineLaunched)]
                time.sleep(0.05)  # poll interval of a wait loop, not a synchronization
        plan = next(e for e in evs if isinstance(e, E.LaunchPlanned)).plan
        decode = next(x for x in plan["processes"] if x["name"] == "decode-0")
        from .test_engines_sglang import processes_with
        starting = processes_with(str(DATA / "fake_server.py"), str(decode["port"]))
        assert len(starting) == 1
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0
    assert groups_alive(pids + starting) == []
    r = run_forge("log", "--json", "--type", "EngineStopped", home=home)
    reasons = [json.loads(x)["reason"] for x in r.stdout.splitlines()]
    assert reasons == ["interrupted"] * 3, (reasons, err)


def test_flags_checked_against_each_launchers_help(workspace):
    """check_flags: the servers' flags against the stand-in's recorded --help, before any
    server starts; a flag the help lacks names the process and starts nothing."""
    plan = make_plan()
    with Deployment(plan, ws=workspace, grace_s=5, check_flags=True) as dep:
        assert len(dep.help_digests) == 1 and len(dep.started) == 4
    with pytest.raises(HarnessError, match=r"^sglang 0\.5\.23 has no --made-up-knob "):
        make_plan(role_config={"decode": {"made_up_knob": 3}})  # the flag table refuses it
    bad = make_plan(role_config={"decode": {"extra_args": ["--made-up-knob", "3"]}})
    dep = Deployment(bad, ws=workspace, grace_s=5, check_flags=True)
    with pytest.raises(HarnessError, match=r"decode-0 \(decode server\): sglang 0\.5\.23 does "
                                           r"not accept --made-up-knob"):
        dep.start()
    assert dep.started == []
