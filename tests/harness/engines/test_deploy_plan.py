"""Launch plans of whole deployment points (harness/engines/plan.py), flag by flag, for SGLang
versions whose flags were renamed (0.4.10, 0.5.21 and 0.5.23); device placement; refusals;
purity; the accelerator check against a simulated NVML; `forge engine up --plan`."""

from __future__ import annotations

import builtins
import json
import socket
import sys
from pathlib import Path

import pytest
import yaml
from infer_forge.harness.engines.accelerators import check_accelerator, model_matches
from infer_forge.harness.engines.plan import plan_point
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.nodes.observe import Probe
from infer_forge.harness.testing.fake_nvml import FakeNvml
from infer_forge.ledger.specs import Accelerator, DeploymentPoint, RuntimeProfile

from tests.conftest import REPO

PY = sys.executable
SERVER = [PY, "-m", "sglang.launch_server"]
ROUTER = [PY, "-m", "sglang_router.launch_router"]
MODEL = "deepseek-ai/DeepSeek-V3"
PCI = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # nvidia: indices as nvidia-smi and NVML number them


def make_point(arch: str, roles: list[dict], *, count: int = 16, vendor: str = "nvidia",
               parallelism: dict | None = None) -> DeploymentPoint:
    return DeploymentPoint.model_validate({
        "name": f"test-{arch}", "model": {"name": "m", "source": MODEL},
        "scenario": {"traffic": {"concurrency": 8}},
        "topology": {"architecture": arch, "roles": roles,
                     **({"parallelism": parallelism} if parallelism else {})},
        "runtime_profile": {"service": "s", "rev": 1},
        "accelerator": {"vendor": vendor, "model": "H200", "count": count,
                        "memory_gb": 141}})


def make_profile(config: dict, version: str = "0.5.23") -> RuntimeProfile:
    return RuntimeProfile.model_validate({
        "service": "s", "rev": 1, "engine": "sglang", "config": config,
        "framework": {"kind": "sglang", "version": version}})


PD_ROLES = [{"role": "prefill", "count": 2, "parallelism": {"tp": 4}},
            {"role": "decode", "count": 1, "parallelism": {"tp": 8, "dp": 8, "ep": 8}}]
PD_CONFIG = {"cuda_graph_max_bs": 64, "mem_fraction_static": 0.8,
             "role_config": {"decode": {"enable_dp_attention": True}}}


def server(port: int, *flags: str) -> list[str]:
    return [*SERVER, "--model-path", MODEL, "--host", "127.0.0.1", "--port", str(port), *flags]


@pytest.mark.parametrize("version", ["0.5.23", "0.5.21", "0.4.10"])
def test_pd_plan_flag_by_flag(version):
    """Spelled per the release's parser (the flag table): --cuda-graph-max-bs-decode from
    0.5.14, --attn-dp-size from 0.5.22 (test_sglang_flags.py parses these for real)."""
    plan = plan_point(make_point("pd", PD_ROLES), make_profile(PD_CONFIG, version), None)
    new = version == "0.5.23"
    graph = (["--cuda-graph-max-bs", "64"] if version == "0.4.10"
             else ["--cuda-graph-max-bs-decode", "64"])
    names = [p.name for p in plan.processes]
    assert names == ["prefill-0", "prefill-1", "decode-0", "router"]
    p0, p1, d0, router = plan.processes
    assert list(p0.argv) == server(
        30001, *graph, "--disaggregation-bootstrap-port", "31000",
        "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "mooncake",
        "--enable-metrics", "--mem-fraction-static", "0.8", "--tp-size", "4")
    assert list(p1.argv) == server(
        30002, *graph, "--disaggregation-bootstrap-port", "31001",
        "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "mooncake",
        "--enable-metrics", "--mem-fraction-static", "0.8", "--tp-size", "4")
    dp = (["--attn-dp-size", "8", *graph] if new
          else [*graph])
    tail = ([] if new else ["--dp-size", "8", "--enable-dp-attention"])
    assert list(d0.argv) == server(
        30003, *dp, "--disaggregation-mode", "decode",
        "--disaggregation-transfer-backend", "mooncake", *tail, "--enable-metrics",
        "--ep-size", "8", "--mem-fraction-static", "0.8", "--tp-size", "8")
    assert list(router.argv) == [
        *ROUTER, "--pd-disaggregation", "--prefill", "http://127.0.0.1:30001", "31000",
        "--prefill", "http://127.0.0.1:30002", "31001", "--decode", "http://127.0.0.1:30003",
        "--host", "127.0.0.1", "--port", "30000", "--prometheus-host", "127.0.0.1",
        "--prometheus-port", "31002"]
    assert [p.devices for p in plan.processes] == [(0, 1, 2, 3), (4, 5, 6, 7),
                                                   tuple(range(8, 16)), ()]
    assert [p.env for p in plan.processes] == [
        {"CUDA_VISIBLE_DEVICES": "0,1,2,3", **PCI}, {"CUDA_VISIBLE_DEVICES": "4,5,6,7", **PCI},
        {"CUDA_VISIBLE_DEVICES": "8,9,10,11,12,13,14,15", **PCI}, {}]
    assert [p.bootstrap_port for p in plan.processes] == [31000, 31001, None, None]
    assert [p.metrics_port for p in plan.processes] == [None, None, None, 31002]
    assert [p.health_url for p in plan.processes] == [
        f"http://127.0.0.1:{port}/health" for port in (30001, 30002, 30003, 30000)]
    assert plan.entry_url == "http://127.0.0.1:30000" and plan.devices_used == 16
    assert plan.sglang_version == version


def test_colocated_plan_one_server_per_dp_group_behind_the_router():
    point = make_point("colocated", [], count=4, parallelism={"tp": 2, "dp": 2})
    plan = plan_point(point, make_profile({"chunked_prefill_size": 4096}), None)
    assert [p.name for p in plan.processes] == ["colocated-0", "colocated-1", "router"]
    c0, c1, router = plan.processes
    assert list(c0.argv) == server(30001, "--chunked-prefill-size", "4096", "--enable-metrics",
                                   "--tp-size", "2")
    assert c1.env == {"CUDA_VISIBLE_DEVICES": "2,3", **PCI} and c1.port == 30002
    assert c0.health_url == "http://127.0.0.1:30001/health_generate"
    assert list(router.argv) == [*ROUTER, "--worker-urls", "http://127.0.0.1:30001",
                                 "http://127.0.0.1:30002", "--host", "127.0.0.1",
                                 "--port", "30000", "--prometheus-host", "127.0.0.1",
                                 "--prometheus-port", "31000"]
    assert "--disaggregation-mode" not in " ".join(c0.argv) and plan.transfer_backend is None


def test_colocated_single_server_is_its_own_entry():
    plan = plan_point(make_point("colocated", [], count=1), make_profile({}), None)
    assert [p.name for p in plan.processes] == ["colocated-0"]
    assert plan.entry_url == plan.processes[0].url == "http://127.0.0.1:30001"


def test_epd_plan_flag_by_flag():
    roles = [{"role": "decode", "count": 1}, {"role": "encode", "count": 2},
             {"role": "prefill", "count": 1, "parallelism": {"tp": 2}}]
    point = make_point("epd", roles, count=5)
    plan = plan_point(point, make_profile({"encoder_transfer_backend": "mooncake"}), None)
    assert [p.name for p in plan.processes] == ["encode-0", "encode-1", "prefill-0",
                                                "decode-0", "router"]
    e0, e1, p0, d0, router = plan.processes
    assert list(e0.argv) == server(30001, "--enable-metrics", "--encoder-only",
                                   "--encoder-transfer-backend", "mooncake", "--tp-size", "1")
    assert e1.port == 30002 and e1.env == {"CUDA_VISIBLE_DEVICES": "1", **PCI}
    assert list(p0.argv) == server(
        30003, "--disaggregation-bootstrap-port", "31000", "--disaggregation-mode", "prefill",
        "--disaggregation-transfer-backend", "mooncake", "--enable-metrics",
        "--encoder-bootstrap-port", "31001",
        "--encoder-transfer-backend", "mooncake", "--encoder-urls", "http://127.0.0.1:30001",
        "http://127.0.0.1:30002", "--language-only", "--tp-size", "2")
    assert p0.devices == (2, 3)
    assert list(d0.argv) == server(30004, "--disaggregation-mode", "decode",
                                   "--disaggregation-transfer-backend", "mooncake",
                                   "--enable-metrics", "--tp-size", "1")
    assert list(router.argv) == [*ROUTER, "--pd-disaggregation", "--prefill",
                                 "http://127.0.0.1:30003", "31000", "--decode",
                                 "http://127.0.0.1:30004", "--host", "127.0.0.1",
                                 "--port", "30000", "--prometheus-host", "127.0.0.1",
                                 "--prometheus-port", "31002"]


def test_epd_refused_before_0_5_7():
    point = make_point("epd", [{"role": "encode"}, {"role": "prefill"}, {"role": "decode"}])
    with pytest.raises(HarnessError, match=r"^sglang 0\.5\.6 has no --encoder-only "
                                           r"\(0\.5\.7 and later\)$"):
        plan_point(point, make_profile({}, "0.5.6"), None)


def test_devices_come_from_the_given_accelerators_and_never_overlap():
    plan = plan_point(make_point("pd", PD_ROLES), make_profile(PD_CONFIG),
                      [15, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0, 1, 2],
                      device_source="registry host-a")
    assert [p.devices for p in plan.processes[:3]] == [
        (15, 3, 4, 5), (6, 7, 8, 9), (10, 11, 12, 13, 14, 0, 1, 2)]
    flat = [d for p in plan.processes for d in p.devices]
    assert len(flat) == len(set(flat)) == 16 and plan.device_source == "registry host-a"
    with pytest.raises(HarnessError, match=r"needs 16 devices \(prefill 8, decode 8\) but 12"):
        plan_point(make_point("pd", PD_ROLES), make_profile(PD_CONFIG), list(range(12)))


def test_several_hosts_a_server_spans_hosts_only_when_none_holds_it():
    plan = plan_point(make_point("pd", PD_ROLES), make_profile(PD_CONFIG),
                      {"node-a": range(8), "node-b": range(8)})
    assert [(p.host, p.devices) for p in plan.processes[:3]] == [
        ("node-a", (0, 1, 2, 3)), ("node-a", (4, 5, 6, 7)), ("node-b", tuple(range(8)))]
    assert plan.processes[2].url == "http://node-b:30000"  # each host counts its own ports
    with pytest.raises(HarnessError, match="no host has 8 free devices left"):
        plan_point(make_point("pd", PD_ROLES), make_profile(PD_CONFIG),
                   {"node-a": range(8), "node-b": range(6), "node-c": range(6)})
    # larger than every host: whole hosts only (tests/harness/engines/test_multinode_plan.py)
    with pytest.raises(HarnessError, match="more than a host's 6; across hosts tp x pp must "
                                           "be nnodes x 6 devices per host"):
        plan_point(make_point("pd", PD_ROLES), make_profile(PD_CONFIG),
                   {"node-a": range(6), "node-b": range(6), "node-c": range(6)})


def test_64_gpu_point_plans():
    roles = [{"role": "prefill", "count": 4, "parallelism": {"tp": 8}},
             {"role": "decode", "count": 2, "parallelism": {"tp": 16, "dp": 16, "ep": 16}}]
    plan = plan_point(make_point("pd", roles, count=64), make_profile(PD_CONFIG), None)
    assert plan.devices_used == 64 and len(plan.processes) == 7
    assert plan.processes[-1].argv.count("--prefill") == 4


@pytest.mark.parametrize("config,match", [
    ({"tp_size": 2}, "profile config tp_size 2 contradicts the point's prefill tp 4"),
    ({"disaggregation_mode": "prefill"}, "disaggregation_mode is set by the point's topology"),
    ({"role_config": {"router2": {}}}, "unknown role.s. router2"),
    ({"role_config": {"decode": {"enable_dp_attention": True, "dp_size": 4}}},
     "dp_size 4 contradicts the point's decode dp 8"),
])
def test_refusals(config, match):
    with pytest.raises(HarnessError, match=match):
        plan_point(make_point("pd", PD_ROLES), make_profile(config), None)


def test_dp_attention_needs_dp_to_divide_tp():
    roles = [{"role": "prefill"}, {"role": "decode", "parallelism": {"tp": 4, "dp": 3}}]
    cfg = {"role_config": {"decode": {"enable_dp_attention": True}}}
    with pytest.raises(HarnessError, match="dp 3 to divide tp 4"):
        plan_point(make_point("pd", roles), make_profile(cfg), None)


def test_cpu_points_assign_no_devices():
    plan = plan_point(make_point("pd", PD_ROLES, count=1, vendor="cpu"),
                      make_profile(PD_CONFIG), None)
    assert all(p.devices == () and "CUDA_VISIBLE_DEVICES" not in p.env
               for p in plan.processes)


def test_planning_is_pure(monkeypatch):
    """No socket, no file, no change to its inputs; the same inputs give the same plan."""
    point, profile = make_point("pd", PD_ROLES), make_profile(PD_CONFIG)
    before = (point.model_dump(), profile.model_dump())
    first = plan_point(point, profile, None)

    def refuse(*_a, **_k):
        raise AssertionError("planning touched the world")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(builtins, "open", refuse)
    second = plan_point(point, profile, None)
    monkeypatch.undo()
    assert first == second and first.digest() == second.digest()
    assert (point.model_dump(), profile.model_dump()) == before


# --- the accelerator check ------------------------------------------------------------------


def inventory(nvml):
    probe = Probe(nvml=nvml)
    try:
        return probe.inventory()
    finally:
        probe.close()


def acc(**kw) -> Accelerator:
    return Accelerator.model_validate({"vendor": "nvidia", "model": "H200", "count": 8,
                                       "memory_gb": 141, **kw})


def test_accelerator_check_passes_and_names_the_devices():
    assert check_accelerator(acc(count=4), inventory(FakeNvml(8))) == [0, 1, 2, 3]
    assert check_accelerator(acc(vendor="cpu", model="x86_64"), None) == []


@pytest.mark.parametrize("kw,match", [
    ({"model": "H100"}, r"model H100 \(point: nvidia H100 x8 141 GB\) but this host has "
                        r"nvidia NVIDIA H200 x8 140 GB"),
    ({"count": 16}, r"count 16 \(point: nvidia H200 x16 141 GB\) but this host has 8"),
    ({"memory_gb": 80}, r"memory 80 GB per device \(point: nvidia H200 x8 80 GB\)"),
    ({"vendor": "amd"}, r"vendor amd \(point: amd H200 x8 141 GB\) but this host has nvidia"),
])
def test_accelerator_mismatch_names_both_values(kw, match):
    with pytest.raises(HarnessError, match=match):
        check_accelerator(acc(**kw), inventory(FakeNvml(8)))


def test_accelerator_check_without_gpus_says_why():
    with pytest.raises(HarnessError, match=r"needs nvidia H200 x8 141 GB; this host has no "
                                           r"GPU \(NVML unavailable: driver not loaded\)"):
        check_accelerator(acc(), inventory(FakeNvml(8, fail_init="driver not loaded")))


def test_model_names_match_whole_words():
    assert model_matches("H200", "NVIDIA H200") and model_matches("h200", "NVIDIA H200 NVL")
    assert not model_matches("H20", "NVIDIA H200") and not model_matches("A100", "NVIDIA H200")


# --- forge engine up --plan -----------------------------------------------------------------


def write_point(tmp_path: Path, point: dict, config: dict) -> Path:
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump({
        "service": "s", "rev": 1, "engine": "sglang", "config": config,
        "framework": {"kind": "sglang", "version": "0.5.23"}}))
    path = tmp_path / "point.yaml"
    path.write_text(yaml.safe_dump({**point, "runtime_profile": {
        "service": "s", "rev": 1, "file": "profile.yaml"}}))
    return path


def test_cli_plan_prints_and_starts_nothing(tmp_path):
    from click.testing import CliRunner
    from infer_forge.cli import main

    point = make_point("pd", PD_ROLES).model_dump(mode="json", exclude={"runtime_profile"})
    path = write_point(tmp_path, point, PD_CONFIG)
    r = CliRunner().invoke(main, ["engine", "up", "--point", str(path), "--plan", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)["plan"]
    assert [p["name"] for p in out["processes"]] == ["prefill-0", "prefill-1", "decode-0",
                                                     "router"]
    assert out["digest"].startswith("sha256:") and "not deployable here" in out["device_source"]
    r = CliRunner().invoke(main, ["engine", "up", "--point", str(path), "--plan",
                                  "--base-port", "40000"])
    assert r.exit_code == 0, r.output
    assert "[decode-0] http://127.0.0.1:40003" in r.output
    assert "CUDA_VISIBLE_DEVICES=8,9,10,11,12,13,14,15 " in r.output
    assert "--prefill http://127.0.0.1:40001 41000" in r.output
    r = CliRunner().invoke(main, ["engine", "up", "--plan"])
    assert r.exit_code != 0 and "--plan and --base-port need --point" in r.output


@pytest.mark.parametrize("name", ["qwen3-235b-pd-h200", "qwen3-vl-epd-h200"])
def test_example_points_plan(name):
    from infer_forge.harness.engines.host_plan import plan_here
    from infer_forge.harness.engines.point_up import point_and_profile

    point, profile = point_and_profile(REPO / "examples" / "points" / f"{name}.yaml")
    plan = plan_here(point, profile, ws=None, plan_only=True, nvml=FakeNvml(8))
    assert plan.devices_used == point.accelerator.count
    assert plan.device_source.endswith("(NVML)") and plan.processes[-1].role == "router"


def test_host_accelerators_fall_back_to_the_node_registry(workspace):
    """Without NVML now, the registry's last observation of this host is what is checked."""
    from infer_forge.harness.engines.accelerators import host_accelerators
    from infer_forge.harness.nodes.identity import local_host
    from infer_forge.harness.nodes.registry import register_host

    none_now = FakeNvml(8, fail_init="driver not loaded")
    inv, source = host_accelerators(workspace, nvml=none_now)
    assert inv is not None and inv.gpus == () and source == f"host {local_host()}"
    register_host(workspace, local_host(), inventory(FakeNvml(8)))
    inv, source = host_accelerators(workspace, nvml=none_now)
    assert inv is not None and len(inv.gpus) == 8 and "(Node Registry," in source
    assert check_accelerator(acc(count=8), inv, source) == list(range(8))
    live, source = host_accelerators(workspace, nvml=FakeNvml(2))
    assert live is not None and len(live.gpus) == 2 and source.endswith("(NVML)")


def test_printed_plans_never_show_a_secret():
    cfg = {"env": {"HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123", "NCCL_DEBUG": "INFO"}}
    plan = plan_point(make_point("colocated", [], count=1), make_profile(cfg), None)
    line = plan.processes[0].command_line()
    assert "HF_TOKEN=[REDACTED]" in line and "NCCL_DEBUG=INFO" in line
    assert "hf_abcdef" not in "\n".join(plan.lines())
    assert plan.processes[0].env["HF_TOKEN"].startswith("hf_")  # the server still gets it
    assert plan.to_json()["processes"][0]["env"]["HF_TOKEN"] == "[REDACTED]"
    assert "hf_abcdef" not in json.dumps(plan.to_json())
