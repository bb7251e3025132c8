"""A multi-node plan launched through Ray (harness/engines/ray_launch.py) on a real local Ray
cluster of two nodes (two raylets on this machine, `ray.cluster_utils.Cluster`, each node
offering the custom resource `host:<its plan host>`): the plan's two hosts are 127.0.0.1 and
127.0.0.2 (both the loopback, so each host's ports count from the same base without
colliding). The stand-in SGLang server and router speak the real HTTP protocol
(test_deploy_lifecycle.py). What is checked is Ray's placement (the node of each process's
agent), the process table (by PID) and the ledger's events."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from infer_forge.harness.engines.host_plan import plan_with_free_ports
from infer_forge.harness.engines.plan import LaunchPlan, plan_point
from infer_forge.harness.engines.ray_launch import match_nodes
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.proc import alive, group_alive
from infer_forge.ledger import events as E
from infer_forge.ledger.specs import DeploymentPoint, RuntimeProfile
from infer_forge.ledger.streams import ENGINES_STREAM

from tests.conftest import REPO, TESTS, need, run_forge
from tests.helpers import fake_docker

HAS_RAY = importlib.util.find_spec("ray") is not None
FAKE = [sys.executable, str(TESTS / "data" / "sglang" / "fake_server.py")]
FAKE_ROUTER = [sys.executable, str(REPO / "harness" / "testing" / "fake_router.py")]
HOSTS = ("127.0.0.1", "127.0.0.2")
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_TMPDIR": ""}


# A server whose process group holds more than its leader (as SGLang's scheduler and
# detokenizer children): a shell leader with the stand-in server as its child.
GROUP = ["sh", "-c", '"$@" & wait', "sh", *FAKE]


PD_ROLES = [{"role": "prefill", "count": 1, "parallelism": {"tp": 2}},
            {"role": "decode", "count": 1, "parallelism": {"tp": 2}}]


def point_spec(arch: str = "pd", roles: list[dict] = PD_ROLES) -> dict:
    """On 2 hosts x 2 GPUs; by default PD: prefill (tp 2) on the first, decode (tp 2) on the
    second, the router on the first."""
    return {
        "name": "stand-in-pd-2-hosts", "model": {"name": "m", "source": "Qwen/Qwen3-8B"},
        "scenario": {"traffic": {"concurrency": 4}},
        "topology": {"architecture": arch, "roles": roles},
        "runtime_profile": {"service": "s", "rev": 1, "file": "profile.yaml"},
        "accelerator": {"vendor": "nvidia", "model": "H200", "count": 2, "nodes": 2}}


def profile_spec(launcher: list[str] = FAKE, router: list[str] = FAKE_ROUTER) -> dict:
    return {"service": "s", "rev": 1, "engine": "sglang",
            "config": {"launcher": launcher, "router_launcher": router,
                       "startup_timeout_s": 60},
            "framework": {"kind": "sglang", "version": "0.5.23"}}


def two_host_plan(base_port: int | None = None, launcher: list[str] = FAKE,
                  arch: str = "pd", roles: list[dict] = PD_ROLES,
                  router: list[str] = FAKE_ROUTER, model: str | None = None) -> LaunchPlan:
    """The plan on HOSTS (2 GPUs each); without `base_port`, on a block of ports free here."""
    point = DeploymentPoint.model_validate(point_spec(arch, roles))
    profile = RuntimeProfile.model_validate(profile_spec(launcher, router))

    def build(base: int) -> LaunchPlan:
        return plan_point(point, profile, {h: [0, 1] for h in HOSTS}, base_port=base,
                          model=model)

    return build(base_port) if base_port is not None else plan_with_free_ports(build)


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on this machine (1 CPU each), sessions under a short temp dir; every
    process the cluster started is gone at the end."""
    need(HAS_RAY, "ray is not installed: pip install 'infer-forge[ray]'")
    import psutil

    tmp = tempfile.mkdtemp(prefix="forge-rl-")
    # Ray on the loopback; its sessions and its "current cluster" file under our temp dir,
    # not the machine's /tmp/ray (another user's Ray must not see this cluster).
    saved = {k: os.environ.get(k) for k in (*ENV, "PATH")}
    os.environ.update(ENV, RAY_TMPDIR=tmp)
    # The hosts' container runtime: a stand-in docker first on the raylets' PATH (their
    # workers, the agents, inherit it); its state shared, as both "hosts" are this machine.
    docker_state = Path(tmp) / "docker"
    docker_state.mkdir()
    fake_docker.install(Path(tmp) / "bin", docker_state)
    os.environ["PATH"] = f"{Path(tmp) / 'bin'}:{os.environ['PATH']}"
    import ray
    from ray.cluster_utils import Cluster

    others = {p.pid for p in psutil.Process().children(recursive=True)}
    c = None
    try:
        # Each node says which plan host it is, and that it has 2 H200s (Ray's node table
        # is what `--ray` registers in the Node Registry; the plan's processes use no GPU).
        c = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "num_gpus": 2, "include_dashboard": False,
            "resources": {f"host:{HOSTS[0]}": 1, "accelerator_type:H200": 1},
            "node_ip_address": "127.0.0.1"})
        c.add_node(num_cpus=1, num_gpus=2, node_ip_address="127.0.0.1",
                   resources={f"host:{HOSTS[1]}": 1, "accelerator_type:H200": 1})
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False)
        c.forge_docker_state = docker_state  # type: ignore[attr-defined]
        yield c
    finally:
        procs = [p for p in psutil.Process().children(recursive=True) if p.pid not in others]
        ray.shutdown()
        if c is not None:
            c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _, left = psutil.wait_procs(procs, timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"Ray processes left behind: {left}"


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids (process groups) still alive after waiting up to `seconds` for them."""
    deadline = time.monotonic() + seconds
    while True:
        left = [p for p in pids if alive(p) or group_alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)  # poll interval of a wait loop, not a synchronization


def test_hosts_map_to_nodes_by_resource_then_name():
    rows = [{"NodeID": "a", "Alive": True, "NodeManagerHostname": "gpu-1",
             "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 8}},
            {"NodeID": "b", "Alive": True, "NodeManagerHostname": "gpu-2",
             "NodeManagerAddress": "10.0.0.2", "Resources": {"host:node-0": 1}},
            {"NodeID": "c", "Alive": False, "NodeManagerHostname": "gpu-3",
             "NodeManagerAddress": "10.0.0.3", "Resources": {}}]
    assert match_nodes(["node-0", "gpu-1", "10.0.0.1"], rows) == {
        "node-0": "b", "gpu-1": "a", "10.0.0.1": "a"}
    with pytest.raises(HarnessError, match=r"host gpu-3: no Ray node .*alive nodes: gpu-1"):
        match_nodes(["gpu-3"], rows)


def test_two_node_pd_plan_through_ray(cluster, workspace, tmp_path):
    import ray
    from infer_forge.harness.engines.base import request_json
    from infer_forge.harness.engines.ray_launch import RayDeployment, ray_nodes

    from .test_deploy_lifecycle import groups_alive

    nodes = ray_nodes(HOSTS)
    assert len(set(nodes.values())) == 2
    assert set(nodes.values()) == {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    plan = two_host_plan()
    assert [(p.name, p.host) for p in plan.processes] == [
        ("prefill-0", HOSTS[0]), ("decode-0", HOSTS[1]), ("router", HOSTS[0])]
    with RayDeployment(plan, nodes, ws=workspace, grace_s=5, logs=tmp_path) as dep:
        desc = dep.describe()
        pids = [p["pid"] for p in desc["processes"]]
        assert len(groups_alive(pids)) == 3
        # each process ran in the agent Ray placed on its host's node
        assert {h: i["node_id"] for h, i in dep.agent_info.items()} == nodes
        assert [(p["name"], p["ray_node"]) for p in desc["processes"]] == [
            (p.name, nodes[p.host]) for p in plan.processes]
        assert [(p["name"], p["disaggregation_mode"]) for p in desc["processes"]] == [
            ("prefill-0", "prefill"), ("decode-0", "decode"), ("router", None)]
        assert {w["url"] for w in dep.router_workers} == {
            p.url for p in plan.processes if p.role != "router"}
        out = request_json("POST", plan.entry_url + "/v1/completions",
                           {"model": "m", "prompt": "one two three", "max_tokens": 2})
        assert out["disaggregation_mode"] == "decode"
    assert groups_alive(pids) == []
    evs = [r.event for r in workspace.ledger.stream(ENGINES_STREAM)]
    assert isinstance(evs[0], E.LaunchPlanned) and evs[0].plan_digest == plan.digest()
    launched = [e.url for e in evs if isinstance(e, E.EngineLaunched)]
    stopped = [e.url for e in evs if isinstance(e, E.EngineStopped)]
    # launched as each became healthy (the servers in any order, the router after them)
    assert sorted(launched[:2]) == sorted(p.url for p in plan.processes[:2])
    assert launched[2] == plan.entry_url
    assert stopped == [p.url for p in reversed(plan.processes)]  # reverse start order
    assert not dep.agents
    # each host's log came back through its agent, stored as the stop's artifact
    for e in evs:
        if isinstance(e, E.EngineStopped):
            assert e.log_digest, e
            log = workspace.artifacts.get(e.log_digest).decode()
            assert log.rstrip().endswith(
                f"[forge] stopped (teardown), exit code {e.exit_code}"), log[-300:]
            assert log.startswith("$ ") and e.url.rsplit(":", 1)[1] in log.splitlines()[0]
            if e.url == plan.entry_url:  # the router's own lines: the request it routed
                assert '"POST /v1/completions HTTP/1.1" 200' in log, log


def test_flags_are_checked_against_each_hosts_own_help(cluster, workspace, tmp_path):
    """check_flags through Ray: each host's agent runs its launcher's `--help` (the shell
    wrapper writes down who asked: its parent, the agent) and every server's flags are checked
    against its own host's; a flag the help lacks starts nothing, naming the process."""
    from infer_forge.harness.engines.ray_launch import RayDeployment, ray_nodes

    asked = tmp_path / "helps"
    who = ["sh", "-c", f'case " $* " in *" --help "*) echo $PPID >> {asked};; esac; exec "$@"',
           "sh", *FAKE]
    plan = two_host_plan(launcher=who)
    with RayDeployment(plan, ray_nodes(HOSTS), ws=workspace, grace_s=5, logs=tmp_path,
                       check_flags=True) as dep:
        agents = sorted(i["pid"] for i in dep.agent_info.values())
        assert sorted(int(x) for x in asked.read_text().split()) == agents  # once per host
        assert sorted(dep.help_digests) == ["decode-0", "prefill-0"]
        assert len(dep.started) == 3
    decode = plan.process("decode-0")
    bad = decode.model_copy(update={"argv": (*decode.argv, "--made-up-knob", "3")})
    plan = plan.model_copy(update={"processes": tuple(
        bad if p.name == "decode-0" else p for p in plan.processes)})
    dep = RayDeployment(plan, ray_nodes(HOSTS), ws=workspace, grace_s=5, logs=tmp_path,
                        check_flags=True)
    with pytest.raises(HarnessError, match=r"decode-0 \(decode server\): sglang 0\.5\.23 does "
                                           r"not accept --made-up-knob"):
        dep.start()
    assert dep.started == [] and not dep.agents  # the agents that answered are gone


def test_each_agent_holds_its_hosts_gpus_of_the_plan_in_ray(cluster, tmp_path):
    """An agent reserves in Ray the GPUs the plan uses on its host (a Ray task wanting one
    waits); GPU ids Ray gives that are not the plan's (other Ray work holds one) refuse the
    start, naming both, before anything runs."""
    import ray
    from infer_forge.harness.engines.ray_launch import RayDeployment, ray_nodes
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = ray_nodes(HOSTS)
    plan = two_host_plan()
    with RayDeployment(plan, nodes, grace_s=5, logs=tmp_path) as dep:
        assert {h: i["gpu_ids"] for h, i in dep.agent_info.items()} == {
            h: [0, 1] for h in HOSTS}

    class Holder:  # other Ray work on one GPU of the second host (pickled by value)
        def gpus(self) -> list[int]:
            return [int(g) for g in ray.get_gpu_ids()]

    holder = ray.remote(num_gpus=1, num_cpus=0)(Holder).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[HOSTS[1]], soft=False)).remote()
    try:
        held = ray.get(holder.gpus.remote(), timeout=60)
        free = [g for g in (0, 1) if g not in held]
        decode = plan.process("decode-0").model_copy(update={"devices": tuple(held)})
        clash = plan.model_copy(update={"processes": tuple(
            decode if p.name == "decode-0" else p for p in plan.processes)})
        dep = RayDeployment(clash, nodes, grace_s=5, logs=tmp_path)
        with pytest.raises(HarnessError, match=(
                rf"^host {re.escape(HOSTS[1])}: Ray gave its agent GPUs {free[0]}, the plan "
                rf"uses {held[0]} \(other Ray work holds")):
            dep.start()
        assert not dep.agents and not any(s.pid for s in dep.servers.values())
    finally:
        ray.kill(holder)


IMAGE_DIGEST = "sha256:" + "ab" * 32
IMAGE = {"name": "lmsysorg/sglang:v0.5.23-cu129", "digest": IMAGE_DIGEST}
IMAGE_REF = f"{IMAGE['name']}@{IMAGE_DIGEST}"


def _docker_calls(state: Path) -> list[list[str]]:
    path = state / "calls.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_pinned_image_runs_on_each_host_through_its_agent(cluster, workspace):
    """`--ray` with a profile's image: each host pulls it by digest and checks it (a Ray task
    on that host), its servers run in containers labelled with their agent as owner, every
    server is checked against the pin, and the containers are removed on their hosts."""
    from infer_forge.harness.engines.ray_launch import ray_point_up

    state = cluster.forge_docker_state
    (state / "registry.json").write_text(json.dumps({IMAGE_REF: [IMAGE_DIGEST]}))
    (state / "images.json").write_text("{}")
    before = len(_docker_calls(state))
    point = DeploymentPoint.model_validate(point_spec())
    profile = RuntimeProfile.model_validate({**profile_spec(), "image": IMAGE, "config": {
        "router_launcher": FAKE_ROUTER, "startup_timeout_s": 60}})
    base = two_host_plan().processes[-1].port  # a free block of ports here
    said: list[str] = []
    out = ray_point_up(workspace, point, profile, list(HOSTS), cluster.address, once=True,
                       base_port=base, echo=said.append)
    desc = out["deployment"]
    assert desc["image"] == {"ref": IMAGE_REF, "digest": IMAGE_DIGEST, "runtime": "docker"}
    assert [(p["name"], p["version"]) for p in desc["processes"]] == [
        ("prefill-0", "0.5.23"), ("decode-0", "0.5.23"), ("router", None)]
    calls = _docker_calls(state)[before:]
    pulls = [c for c in calls if c[:1] == ["pull"]]
    assert pulls and all(c == ["pull", IMAGE_REF] for c in pulls)  # by digest, per host
    runs = [c for c in calls if c[:1] == ["run"]]
    assert sorted(c[c.index("--name") + 1] for c in runs) == sorted(
        f"forge-{p['name']}-{p['url'].rsplit(':', 1)[1]}" for p in desc["processes"])
    owners = {c[c.index("--label", c.index("--label") + 1) + 1] for c in runs}
    assert all(o.startswith("org.infer-forge.owner=") for o in owners)
    assert str(os.getpid()) not in {o.split(":")[1] for o in owners}  # the agents, not here
    assert len(owners) == 2  # one agent a host
    assert json.loads((state / "containers.json").read_text()) == {}  # removed there
    assert [c[1] for c in calls if c[:1] == ["rm"]].count("-f") == 3


def test_digest_resolve_is_pinned_on_the_first_host_and_recorded(cluster, workspace):
    """`digest: resolve` through Ray: the first plan host pulls the tag (a Ray task there),
    the driver records the digest, every host runs that digest."""
    from infer_forge.harness.engines.ray_launch import ray_point_up

    state = cluster.forge_docker_state
    name = IMAGE["name"]
    (state / "registry.json").write_text(json.dumps({name: [IMAGE_DIGEST],
                                                     IMAGE_REF: [IMAGE_DIGEST]}))
    (state / "images.json").write_text("{}")
    before = len(_docker_calls(state))
    point = DeploymentPoint.model_validate(point_spec())
    profile = RuntimeProfile.model_validate({
        **profile_spec(), "image": {"name": name, "digest": "resolve"},
        "config": {"router_launcher": FAKE_ROUTER, "startup_timeout_s": 60}})
    base = two_host_plan().processes[-1].port
    out = ray_point_up(workspace, point, profile, list(HOSTS), cluster.address, once=True,
                       base_port=base, echo=lambda _: None)
    assert out["deployment"]["image"]["digest"] == IMAGE_DIGEST
    (rec,) = [r.event for r in workspace.ledger.stream("workspace")
              if r.type == "ImageResolved"]
    assert (rec.name, rec.digest) == (name, IMAGE_DIGEST)
    calls = _docker_calls(state)[before:]
    assert [c for c in calls if c[:1] == ["pull"]][0] == ["pull", name]  # the tag, once
    runs = [c for c in calls if c[:1] == ["run"]]
    assert len(runs) == 3 and all(IMAGE_REF in c for c in runs)


def test_an_image_whose_digest_differs_on_a_host_starts_nothing(cluster, workspace):
    from infer_forge.harness.engines.ray_launch import ray_point_up

    state = cluster.forge_docker_state
    other = "sha256:" + "cd" * 32
    (state / "registry.json").write_text(json.dumps({IMAGE_REF: [other]}))
    (state / "images.json").write_text("{}")
    before = len(_docker_calls(state))
    point = DeploymentPoint.model_validate(point_spec())
    profile = RuntimeProfile.model_validate({**profile_spec(), "image": IMAGE})
    base = two_host_plan().processes[-1].port
    with pytest.raises(HarnessError, match=(
            rf"^host 127\.0\.0\.[12]: runtime profile s rev 1: image\.digest pins "
            rf"{IMAGE_DIGEST}, docker reports {other}")):
        ray_point_up(workspace, point, profile, list(HOSTS), cluster.address, once=True,
                     base_port=base, echo=lambda _: None)
    assert not [c for c in _docker_calls(state)[before:] if c[:1] == ["run"]]
    r = run_forge("log", "--json", "--type", "EngineLaunched", home=workspace.home)
    assert r.stdout.strip() == ""


def test_a_crash_on_the_second_host_fails_the_deploy_naming_it(cluster, tmp_path):
    from infer_forge.harness.engines.ray_launch import RayDeployment, ray_nodes

    plan = two_host_plan()
    decode = plan.process("decode-0")
    crashed = decode.model_copy(update={"env": {**decode.env, "FAKE_SGLANG_MODE": "crash"}})
    plan = plan.model_copy(update={"processes": tuple(
        crashed if p.name == "decode-0" else p for p in plan.processes)})
    dep = RayDeployment(plan, ray_nodes(HOSTS), grace_s=5, logs=tmp_path)
    with pytest.raises(HarnessError, match=r"(?s)decode-0 \(decode\) on host 127\.0\.0\.2 exited"
                       r" while starting \(exit code 1\).*OutOfMemoryError"):
        dep.start()
    pids = [s.pid for s in dep.servers.values()]
    assert pids and _gone_within([p for p in pids if p], 10) == []
    agents = [i["pid"] for i in dep.agent_info.values()]
    assert len(agents) == 2 and _gone_within(agents, 10) == []  # the agents end too


DRIVER = """
import json, sys
from infer_forge.harness.engines.ray_launch import ray_deploy
from infer_forge.harness.engines.plan import LaunchPlan
plan = LaunchPlan.model_validate_json(sys.argv[2])
dep = ray_deploy(plan, sys.argv[1], logs=__import__("pathlib").Path(sys.argv[3]), grace_s=5)
print(json.dumps({"pids": [s.pid for s in dep.servers.values()],
                  "agents": [i["pid"] for i in dep.agent_info.values()]}), flush=True)
sys.stdin.read()  # until killed
"""


def test_killing_the_driver_leaves_no_process_on_any_host(cluster, tmp_path):
    """SIGKILL of the driver: Ray ends its agents, and every process group of the plan,
    leader and children alike, is gone (the agents' keepers)."""
    import psutil

    plan = two_host_plan(launcher=GROUP)
    env = dict(os.environ)  # the fixture's RAY_TMPDIR and loopback setting
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, cluster.address, plan.model_dump_json(), str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        cwd=REPO, start_new_session=True)
    try:
        line = driver.stdout.readline() if driver.stdout else b""
        assert line, driver.stderr.read().decode() if driver.stderr else ""
        started = json.loads(line)
        pids, agents = started["pids"], started["agents"]
        assert len(pids) == 3 and all(alive(p) for p in pids)
        children = [c.pid for p in pids for c in psutil.Process(p).children(recursive=True)]
        assert len(children) == 2  # each server's stand-in under its shell leader
        # (the agents' own pids are not asserted alive here: one was seen exiting at this
        # point in 1 run of ~6 while its servers ran on; they must be gone at the end)
        assert len(agents) == 2
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=10)
        assert _gone_within(pids + children + agents, 30) == []
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(timeout=10)


def test_a_plan_host_without_a_node_is_refused(tmp_path):
    from infer_forge.harness.engines.ray_launch import RayDeployment

    with pytest.raises(HarnessError, match="host 127.0.0.2 of the plan has no Ray node"):
        RayDeployment(two_host_plan(31700), {HOSTS[0]: "x"}, logs=Path(tmp_path))


def test_forge_engine_up_over_ray(cluster, backend_home, tmp_path):
    """The CLI: Ray's nodes registered as the hosts they name, the plan's ports claimed, the
    plan launched through Ray, described, stopped (`--once`), the claim released; on SQLite
    and on PostgreSQL (the ledger a real cluster's hosts share)."""
    from infer_forge.ledger.workspace import open_workspace
    from infer_forge.projections.nodes import read_claims, read_hosts

    (tmp_path / "point.yaml").write_text(json.dumps(point_spec()))
    (tmp_path / "profile.yaml").write_text(json.dumps(profile_spec()))
    base = two_host_plan().processes[-1].port  # a free block here
    args = ["engine", "up", "--point", str(tmp_path / "point.yaml"), "--hosts",
            ",".join(HOSTS), "--once", "--json", "--base-port", str(base)]
    r = run_forge(*args, "--ray", cluster.address, home=backend_home)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    procs = out["deployment"]["processes"]
    assert [(p["name"], p["host"]) for p in procs] == [
        ("prefill-0", HOSTS[0]), ("decode-0", HOSTS[1]), ("router", HOSTS[0])]
    assert len({p["ray_node"] for p in procs}) == 2
    assert all(not alive(p["pid"]) for p in procs)
    with open_workspace(backend_home) as ws:
        hosts = read_hosts(ws.ledger).hosts
        assert {h: len(hosts[h].inventory.gpus) for h in HOSTS} == {h: 2 for h in HOSTS}
        book = read_claims(ws.ledger)
        assert book.claims and not book.active()
        launched = [r.event for r in ws.ledger.stream(ENGINES_STREAM)
                    if isinstance(r.event, E.EngineLaunched)]
        assert sorted(e.pid for e in launched) == sorted(p["pid"] for p in procs)
        assert launched[-1].pid == procs[-1]["pid"]  # the router last, after the servers
    bad = run_forge(*args, "--ray", cluster.address, "--plan", home=backend_home)
    assert bad.returncode != 0 and "--ray launches a plan over --hosts" in bad.stderr


def test_an_agent_killed_takes_its_hosts_processes_and_is_reported(cluster, tmp_path):
    """The second host's agent dies (its worker SIGKILLed, as a lost node's would): its
    process groups go with it (the keeper), `check()` names the process and host, and the
    teardown stops the rest without error."""
    import psutil
    from infer_forge.harness.engines.ray_launch import RayDeployment, ray_nodes

    plan = two_host_plan(launcher=GROUP)
    dep = RayDeployment(plan, ray_nodes(HOSTS), grace_s=5, logs=tmp_path).start()
    try:
        decode = dep.servers["decode-0"].pid
        assert decode is not None
        children = [c.pid for c in psutil.Process(decode).children(recursive=True)]
        assert len(children) == 1
        os.kill(dep.agent_info[HOSTS[1]]["pid"], signal.SIGKILL)
        assert _gone_within([decode, *children], 30) == []
        with pytest.raises(HarnessError, match=r"decode-0 \(decode\) on host 127\.0\.0\.2 "
                                               r"exited while running \(killed by signal 9\)"):
            dep.check()
        prefill = dep.servers["prefill-0"].pid
        assert prefill is not None and alive(prefill)
    finally:
        dep.stop()
    assert _gone_within([s.pid for s in dep.servers.values() if s.pid], 10) == []


def test_a_server_over_both_hosts_rank_0_and_its_follower(cluster, workspace, tmp_path):
    """One tp 4 server over 2 hosts x 2 GPUs: rank 0 on the first host, its follower (node
    rank 1, /health only, as SGLang's) on the second, each started by its host's agent and
    healthy; the server checked by its rank 0 (the follower has no /server_info)."""
    from infer_forge.harness.engines.base import request_json
    from infer_forge.harness.engines.process import http_get
    from infer_forge.harness.engines.ray_launch import RayDeployment, ray_nodes
    from infer_forge.harness.engines.whole import PinnedDeployment

    class Pinned(PinnedDeployment, RayDeployment):
        pass

    plan = two_host_plan(arch="colocated",
                         roles=[{"role": "colocated", "count": 1, "parallelism": {"tp": 4}}])
    rank0, follower = plan.processes
    assert (rank0.host, follower.host, follower.node_rank) == (HOSTS[0], HOSTS[1], 1)
    assert follower.health_url.endswith("/health") and plan.entry_url == rank0.url
    profile = RuntimeProfile.model_validate(profile_spec())
    nodes = ray_nodes(HOSTS)
    with Pinned(plan, profile, None, nodes=nodes, ws=workspace, grace_s=5,
                logs=tmp_path) as dep:
        desc = dep.describe()
        assert [(p["name"], p["ray_node"], p["version"]) for p in desc["processes"]] == [
            ("colocated-0", nodes[HOSTS[0]], "0.5.23"),
            ("colocated-0-node1", nodes[HOSTS[1]], None)]
        assert http_get(follower.url + "/server_info")[0] == 404
        assert request_json("GET", rank0.url + "/server_info")["node_rank"] == 0
    assert [e.url for e in (r.event for r in workspace.ledger.stream(ENGINES_STREAM))
            if isinstance(e, E.EngineStopped)] == [follower.url, rank0.url]


def test_the_real_router_in_front_of_both_hosts(cluster, tiny_model, tmp_path):
    """The real router (`smg`, a Rust binary from PyPI) started by the first host's agent
    lists the second host's decode server in its worker view, and a completion goes
    through it to both hosts' servers."""
    from infer_forge.harness.engines.base import request_json
    from infer_forge.harness.engines.ray_launch import RayDeployment, ray_nodes

    from .test_real_router import router_launcher, seen

    plan = two_host_plan(router=router_launcher("smg"), model=str(tiny_model))
    with RayDeployment(plan, ray_nodes(HOSTS), grace_s=5, logs=tmp_path) as dep:
        assert {(w["url"], w["worker_type"]) for w in dep.router_workers} == {
            (plan.process("prefill-0").url, "prefill"), (plan.process("decode-0").url,
                                                           "decode")}
        out = request_json("POST", plan.entry_url + "/v1/completions",
                           {"model": plan.model, "prompt": "one two three", "max_tokens": 2})
        assert out["choices"][0]["text"]
        assert seen(dep, "prefill-0", "/v1/completions")
        assert seen(dep, "decode-0", "/v1/completions")


@pytest.mark.parametrize(("sig", "clean", "reason"), [
    (signal.SIGINT, True, "teardown"), (signal.SIGTERM, False, "terminated")])
def test_ctrl_c_on_forge_engine_up_over_ray_stops_every_host(cluster, tmp_path, sig, clean,
                                                               reason):
    """SIGINT (or SIGTERM) to a real `forge engine up --ray` mid-run: the reverse teardown
    recorded (Ctrl-C ends the watch, as on one host; SIGTERM unwinds as "terminated"),
    every process of the plan gone."""
    from tests.conftest import FORGE

    home = tmp_path / "home"
    assert run_forge("init", home=home).returncode == 0
    plan = two_host_plan()
    base = plan.processes[-1].port  # the router's: the entry port is the base
    (tmp_path / "point.yaml").write_text(json.dumps(point_spec()))
    (tmp_path / "profile.yaml").write_text(json.dumps(profile_spec()))
    p = subprocess.Popen([*FORGE, "engine", "up", "--point", str(tmp_path / "point.yaml"),
                          "--hosts", ",".join(HOSTS), "--ray", cluster.address,
                          "--base-port", str(base)],
                         stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         cwd=str(REPO), env={**os.environ, "FORGE_HOME": str(home)})
    try:
        seen = []
        assert p.stderr is not None
        for line in p.stderr:  # until the deployment is up (or the command died: EOF)
            seen.append(line)
            if "Ctrl-C to stop" in line:
                break
        assert "Ctrl-C to stop" in "".join(seen), "".join(seen)
        r = run_forge("log", "--json", "--type", "EngineLaunched", home=home)
        pids = [json.loads(x)["pid"] for x in r.stdout.splitlines()]
        assert len(pids) == 3 and all(alive(x) for x in pids)
        p.send_signal(sig)
        code = p.wait(timeout=60)
        assert (code == 0) is clean, f"exit {code}: " + "".join(seen) + p.stderr.read()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=10)
    assert _gone_within(pids, 10) == []
    r = run_forge("log", "--json", "--type", "EngineStopped", home=home)
    stops = [json.loads(x) for x in r.stdout.splitlines()]
    assert [s["reason"] for s in stops] == [reason] * 3
    assert [s["url"] for s in stops] == [
        x.url for x in reversed(plan.processes)]
