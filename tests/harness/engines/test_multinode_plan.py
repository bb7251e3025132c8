"""Plans over several hosts (plan.py, plan_rules.py, cluster_plan.py): ranks, addresses,
ports and devices consistent across hosts, the router on one host, IB devices per host, the
Node Registry's accelerator check on every host and its port claims, and the impossible
combinations refused in one line naming the dimension. Pure planning plus a real workspace
(the claims and hosts streams); the real SGLang parser's view of these argvs is
test_sglang_flags.py's (every example point, the 4-node one rank by rank)."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import pytest
from infer_forge.harness.engines.cluster_plan import BASE_STEP, plan_on_hosts
from infer_forge.harness.engines.image import ContainerRuntime, ImageUse
from infer_forge.harness.engines.plan import DIST_SPAN, LaunchPlan, plan_point, wrap_plan
from infer_forge.harness.engines.point_up import point_and_profile
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.nodes import claims
from infer_forge.harness.nodes.observe import Probe
from infer_forge.harness.nodes.registry import register_host
from infer_forge.harness.testing.fake_nvml import FakeNvml
from infer_forge.ledger import events as E
from infer_forge.ledger.specs import DeploymentPoint, RuntimeProfile

from tests.conftest import REPO, run_forge

POINTS = REPO / "examples" / "points"


def example(name: str) -> tuple[DeploymentPoint, RuntimeProfile]:
    return point_and_profile(POINTS / f"{name}.yaml")


def flag(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def check_consistent(plan: LaunchPlan) -> None:
    """What every multi-host plan must hold, whatever the point."""
    by_host: dict[str, list[int]] = {}
    for p in plan.processes:
        by_host.setdefault(p.host, []).extend(p.bound_ports())
        if p.role == "router":
            continue
        assert (flag(p.argv, "--host"), flag(p.argv, "--port")) == (p.host, str(p.port))
        assert p.url == f"http://{p.host}:{p.port}"
        if p.nnodes > 1:
            rank0 = plan.process(f"{p.role}-{p.index}")
            assert flag(p.argv, "--nnodes") == str(p.nnodes)
            assert flag(p.argv, "--node-rank") == str(p.node_rank)
            assert flag(p.argv, "--dist-init-addr") == rank0.dist_init_addr == p.dist_init_addr
            assert rank0.dist_init_addr is not None
            assert rank0.dist_init_addr.startswith(f"{rank0.host}:")
            assert p.health_url == p.url + "/health"
        else:
            assert "--nnodes" not in p.argv and "--node-rank" not in p.argv
    for host, ports in by_host.items():  # nothing binds a port twice on one host
        dup = [p for p, n in Counter(ports).items() if n > 1]
        assert not dup, (host, dup)
    used = [(p.host, d) for p in plan.processes for d in p.devices]
    assert len(used) == len(set(used)) == plan.devices_used
    router = plan.process("router")
    entries = {p.url for p in plan.processes if p.role != "router" and p.node_rank == 0}
    urls = {a for a in router.argv if a.startswith("http://")}
    assert urls == entries  # the router sees each server once, by its rank 0


def test_two_node_pd_example_plans_across_the_hosts():
    point, profile = example("deepseek-v3-pd-2x8-h200")
    plan = plan_point(point, profile, {"gpu-a": range(8), "gpu-b": range(8)},
                      ib_devices={"gpu-a": "mlx5_0,mlx5_1", "gpu-b": "mlx5_4,mlx5_5"})
    check_consistent(plan)
    prefill, decode, router = (plan.process(n) for n in ("prefill-0", "decode-0", "router"))
    assert (prefill.host, decode.host, router.host) == ("gpu-a", "gpu-b", "gpu-a")
    assert prefill.devices == decode.devices == tuple(range(8))
    assert plan.devices_used == 16 and plan.hosts() == ["gpu-a", "gpu-b"]
    # the router reaches the prefill server's bootstrap port on the prefill's host
    i = router.argv.index("--prefill")
    assert router.argv[i + 1:i + 3] == (prefill.url, str(prefill.bootstrap_port))
    assert flag(prefill.argv, "--disaggregation-bootstrap-port") == str(prefill.bootstrap_port)
    assert flag(prefill.argv, "--disaggregation-ib-device") == "mlx5_0,mlx5_1"
    assert flag(decode.argv, "--disaggregation-ib-device") == "mlx5_4,mlx5_5"
    for p in (prefill, decode):  # MTP and DeepEP as the profile asks
        assert flag(p.argv, "--speculative-algorithm") == "EAGLE"
        assert flag(p.argv, "--moe-a2a-backend") == "deepep"
        assert flag(p.argv, "--ep-size") == flag(p.argv, "--tp-size") == "8"
    # without per-host choices, the profile's one value everywhere
    plain = plan_point(point, profile, None)
    assert {flag(p.argv, "--disaggregation-ib-device") for p in plain.processes
            if p.role != "router"} == {profile.config["disaggregation_ib_device"]}


def test_a_server_given_ib_devices_gets_them_in_its_container():
    # Mooncake's transfer engine registers KV buffers with the verbs devices: in a container
    # it needs /dev/infiniband and unlimited locked memory; the router and a server with no
    # devices named get neither.
    point, profile = example("deepseek-v3-pd-2x8-h200")
    plan = plan_point(point, profile, {"gpu-a": range(8), "gpu-b": range(8)},
                      ib_devices={"gpu-a": "mlx5_0,mlx5_1", "gpu-b": "mlx5_4,mlx5_5"})
    digest = "sha256:" + "a" * 64
    use = ImageUse(runtime=ContainerRuntime(kind="docker", exe="/usr/bin/docker"),
                   ref=f"lmsysorg/sglang@{digest}", digest=digest, profile="example rev 1")
    wrapped = {p.name: p.argv for p in wrap_plan(plan, use).processes}
    for name in ("prefill-0", "decode-0"):
        argv = wrapped[name]
        head = tuple(argv[:argv.index(use.target)])  # docker's own options, before the image
        assert flag(head, "--device") == "/dev/infiniband"
        assert flag(head, "--cap-add") == "IPC_LOCK" and flag(head, "--ulimit") == "memlock=-1"
    assert "/dev/infiniband" not in wrapped["router"]
    bare = plan_point(point, profile.model_copy(update={"config": {
        k: v for k, v in profile.config.items() if k != "disaggregation_ib_device"}}), None)
    assert all("/dev/infiniband" not in p.argv for p in wrap_plan(bare, use).processes)


def test_four_node_pd_example_spans_two_hosts_per_server():
    point, profile = example("deepseek-r1-pd-4x8-h200")
    hosts = {f"h{i}": list(range(8)) for i in range(4)}
    plan = plan_point(point, profile, hosts, base_port=20000)
    check_consistent(plan)
    names = [(p.name, p.host, p.node_rank, p.nnodes) for p in plan.processes]
    assert names == [("prefill-0", "h0", 0, 2), ("prefill-0-node1", "h1", 1, 2),
                     ("decode-0", "h2", 0, 2), ("decode-0-node1", "h3", 1, 2),
                     ("router", "h0", 0, 1)]
    pre0, pre1 = plan.process("prefill-0"), plan.process("prefill-0-node1")
    assert pre0.dist_init_addr == "h0:22000" and plan.process("decode-0").dist_init_addr \
        == "h2:22000"
    assert set(range(22000, 22000 + DIST_SPAN)) <= set(pre0.bound_ports())
    assert pre1.bound_ports() == [pre1.port]  # a follower binds its own port only
    # every rank is told the server's one bootstrap port; only rank 0 binds it
    assert flag(pre1.argv, "--disaggregation-bootstrap-port") == str(pre0.bootstrap_port)
    assert pre1.bootstrap_port is None
    assert flag(pre0.argv, "--tp-size") == "16" and flag(pre0.argv, "--attn-dp-size") == "16"
    assert "node 1/2 dist-init h0:22000" in "\n".join(plan.lines())
    # the shown plan carries the ranks; a one-host plan shows (and digests) as before
    shown = plan.shown()["processes"]
    assert shown[1]["node_rank"] == 1 and shown[1]["dist_init_addr"] == "h0:22000"
    one = plan_point(*example("qwen3-235b-pd-h200"), None).shown()["processes"]
    assert not {"node_rank", "nnodes", "dist_init_addr"} & set(one[0])


def test_a_point_over_several_hosts_plans_on_its_own_host_names():
    point, profile = example("deepseek-r1-pd-4x8-h200")
    plan = plan_point(point, profile, None)
    assert plan.hosts() == ["node-0", "node-1", "node-2", "node-3"]
    assert plan.accelerator == "nvidia H200 x8 on 4 hosts 141 GB"
    assert plan.devices_available == plan.devices_used == 32


def _point(roles: list[dict[str, Any]], *, nodes: int = 2, count: int = 8,
           experts: int | None = None, arch: str = "pd") -> DeploymentPoint:
    return DeploymentPoint.model_validate({
        "name": "t", "model": {"name": "m", "source": "m",
                               **({"experts": experts} if experts else {})},
        "scenario": {"traffic": {"concurrency": 8}},
        "topology": {"architecture": arch, "roles": roles},
        "runtime_profile": {"service": "s", "rev": 1},
        "accelerator": {"vendor": "nvidia", "model": "H200", "count": count, "nodes": nodes}})


def _profile(config: dict[str, Any], version: str = "0.5.23") -> RuntimeProfile:
    return RuntimeProfile.model_validate({
        "service": "s", "rev": 1, "engine": "sglang", "config": config,
        "framework": {"kind": "sglang", "version": version}})


PD8 = [{"role": "prefill", "parallelism": {"tp": 8}},
       {"role": "decode", "parallelism": {"tp": 8, "ep": 8}}]
MTP = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
       "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}


@pytest.mark.parametrize(("roles", "kw", "config", "error"), [
    ([{"role": "prefill", "parallelism": {"tp": 12}}, {"role": "decode"}], {}, {},
     "launch plan: a prefill server needs tp 12 x pp 1 = 12 devices, more than a host's 8; "
     "across hosts tp x pp must be nnodes x 8 devices per host"),
    ([{"role": "prefill", "count": 4, "parallelism": {"tp": 6}},  # 2 left on each of 4
      {"role": "decode", "parallelism": {"tp": 16}}], {"nodes": 5}, {},
     "launch plan: a decode server needs tp 16 x pp 1 = 16 devices: 2 whole hosts of 8 "
     "devices (nnodes 2), 1 left"),
    (PD8, {"experts": 256},
     {"role_config": {"decode": {"ep_num_redundant_experts": 30, "enable_eplb": True}}},
     "decode: ep 8 does not divide the model's 256 experts + 30 redundant (model.experts)"),
    ([{"role": "prefill", "parallelism": {"tp": 8}},
      {"role": "decode", "parallelism": {"tp": 8, "dp": 2, "ep": 4}}], {},
     {"moe_a2a_backend": "deepep"},
     "prefill: moe_a2a_backend deepep needs ep = tp (SGLang sets ep_size to tp_size): ep 1, "
     "tp 8"),
    (PD8, {}, {"enable_eplb": True},
     "prefill: enable_eplb needs ep > 1 (ep 1)"),
    (PD8, {}, {**MTP, "speculative_num_draft_tokens": 8},
     "prefill: speculative_num_draft_tokens 8 with speculative_eagle_topk 1 must be "
     "speculative_num_steps + 1 = 4"),
    (PD8, {}, {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3},
     "prefill: speculative speculative_num_steps without speculative_eagle_topk, "
     "speculative_num_draft_tokens (give all three or none)"),
    (PD8, {}, {"speculative_algorithm": "MEDUSA"},
     "prefill: speculative_algorithm MEDUSA is not one of EAGLE, EAGLE3, NEXTN, "
     "STANDALONE, NGRAM, DFLASH, UNO, DSPARK, FROZEN_KV_MTP"),
    (PD8, {}, {"hicache_ratio": 2},
     "prefill: hicache_ratio needs enable_hierarchical_cache"),
    (PD8, {}, {"enable_two_batch_overlap": True},
     "prefill: enable_two_batch_overlap needs an EP all-to-all backend (moe_a2a_backend "
     "none)"),
    (PD8, {}, {"nnodes": 2},
     "engine config (prefill): nnodes is set by the point's topology, not the profile"),
])
def test_impossible_combinations_are_refused_naming_the_dimension(roles, kw, config, error):
    with pytest.raises(HarnessError) as e:
        plan_point(_point(roles, **kw), _profile(config), None)
    assert str(e.value) == error


def test_mtp_on_a_release_without_it_is_refused():
    """0.4.0's parser has no --speculative-algorithm (the flag table, which
    test_sglang_flags.py checks against the real parsers)."""
    with pytest.raises(HarnessError, match=r"^sglang 0\.4\.0 has no --speculative-"):
        plan_point(_point(PD8, nodes=1, count=16), _profile(MTP, "0.4.0"), None)


def test_ib_devices_must_name_the_plans_hosts():
    point, profile = example("deepseek-v3-pd-2x8-h200")
    with pytest.raises(HarnessError, match=r"^ib devices: host gpu-c is not one of the "
                                           r"plan's hosts \(node-0, node-1\)$"):
        plan_point(point, profile, None, ib_devices={"gpu-c": "mlx5_0"})


# --- on Node Registry hosts ------------------------------------------------------------


def _register(ws, host: str, gpus: int = 8, tag: str = "0") -> None:
    probe = Probe(nvml=FakeNvml(gpus, host_tag=tag))
    try:
        register_host(ws, host, probe.inventory())
    finally:
        probe.close()


def test_plan_on_registry_hosts_checks_each_host_and_claims_ports(workspace):
    point, profile = example("deepseek-v3-pd-2x8-h200")
    _register(workspace, "gpu-a", tag="a")
    with pytest.raises(HarnessError, match=r"^host gpu-b is not in the Node Registry"):
        plan_on_hosts(workspace, point, profile, ["gpu-a", "gpu-b"])
    _register(workspace, "gpu-b", gpus=4, tag="b")
    with pytest.raises(HarnessError, match=r"^accelerator check: count 8 .* host gpu-b "
                                           r"\(Node Registry"):
        plan_on_hosts(workspace, point, profile, ["gpu-a", "gpu-b"])
    _register(workspace, "gpu-b", tag="b")  # the host came back with all its GPUs
    with pytest.raises(HarnessError, match=r"^hosts: the point runs on 2 host\(s\)"):
        plan_on_hosts(workspace, point, profile, ["gpu-a"])

    plan, lease = plan_on_hosts(workspace, point, profile, ["gpu-a", "gpu-b"],
                                ib_devices={"gpu-b": "mlx5_4"})
    check_consistent(plan)
    assert lease is not None and plan.device_source == "Node Registry hosts gpu-a, gpu-b"
    held = {(r.host, r.kind, r.id) for r in lease.resources}
    for p in plan.processes:
        assert {(p.host, "port", str(port)) for port in p.bound_ports()} <= held
    gpus = {(h, i) for h, k, i in held if k == "gpu"}
    assert len(gpus) == 16 and {h for h, _ in gpus} == {"gpu-a", "gpu-b"}
    assert all(re.fullmatch(r"GPU-[ab]-\d\d-.*", i) for _, i in gpus)

    # a second plan of the same point: the ports are held, so the next block is claimed;
    # the GPUs are held too, which no other port block frees
    with pytest.raises(HarnessError, match=r"^the plan's GPUs are taken: refused: "):
        plan_on_hosts(workspace, point, profile, ["gpu-a", "gpu-b"])
    other, other_profile = example("qwen3-235b-pd-h200")
    _register(workspace, "gpu-c", tag="c")
    shared = claims.claim(workspace, [E.ResourceRef(host="gpu-c", kind="port", id="30000")])
    moved, lease2 = plan_on_hosts(workspace, other, other_profile, ["gpu-c"])
    assert lease2 is not None and moved.entry_url == f"http://gpu-c:{30000 + BASE_STEP}"
    for c in (lease, lease2, shared):
        claims.release(workspace, c.claim_id)
    again, lease3 = plan_on_hosts(workspace, point, profile, ["gpu-a", "gpu-b"])
    assert again.digest() == plan_point(point, profile, {"gpu-a": range(8), "gpu-b": range(8)},
                                        device_source=again.device_source).digest()
    assert lease3 is not None


def test_engine_up_plans_on_registry_hosts_at_the_cli(workspace):
    """`forge engine up --point P --plan --hosts A,B --ib-device A=...`: the plan on the
    registry's hosts, printed; malformed or impossible asks are one line, non-zero."""
    _register(workspace, "gpu-a", tag="a")
    _register(workspace, "gpu-b", tag="b")
    point = str(POINTS / "deepseek-v3-pd-2x8-h200.yaml")
    r = run_forge("engine", "up", "--point", point, "--plan", "--json", "--hosts",
                  "gpu-a,gpu-b", "--ib-device", "gpu-b=mlx5_4,mlx5_5", home=workspace.home)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    procs = {p["name"]: p for p in plan["processes"]}
    assert (procs["prefill-0"]["host"], procs["decode-0"]["host"], procs["router"]["host"]) \
        == ("gpu-a", "gpu-b", "gpu-a")
    assert plan["device_source"] == "Node Registry hosts gpu-a, gpu-b"
    ib = {n: flag(tuple(procs[n]["argv"]), "--disaggregation-ib-device")
          for n in ("prefill-0", "decode-0")}
    assert ib == {"prefill-0": "mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7",
                  "decode-0": "mlx5_4,mlx5_5"}  # the profile's, and gpu-b's own
    assert not claims.listing(workspace)  # a printed plan holds nothing

    for args, code, line in (
            (["--plan", "--ib-device", "gpu-b"], 1, "--ib-device 'gpu-b': expected HOST=VALUE"),
            (["--hosts", "gpu-a,gpu-b"], 1, "--hosts: launching on several hosts goes "
                                            "through Ray (--ray ADDRESS)"),
            ([], 1, "the point runs on 2 hosts (accelerator.nodes): this host alone cannot "
                    "deploy it"),
            (["--plan", "--hosts", "gpu-a,gpu-c"], 1, "host gpu-c is not in the Node "
                                                      "Registry")):
        r = run_forge("engine", "up", "--point", point, *args, home=workspace.home)
        assert r.returncode == code and line in r.stderr, (args, r.returncode, r.stderr)
        assert len(r.stderr.strip().splitlines()) <= 3 and "Traceback" not in r.stderr
