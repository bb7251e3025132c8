"""Pinned images (harness/engines/image.py): a profile's servers run in its image by digest, a
tag alone is refused, and the digest, the server's version and its resolved arguments are
checked against the profile at start. Docker cannot run here: the command lines are tested as
pure functions, and the checks end to end through a stand-in `docker`/`podman` on PATH
(tests/helpers/fake_docker.py: the real CLIs' output shapes; `run` execs the stand-in SGLang
server, as the image would run SGLang)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from infer_forge.harness.engines import engine_for
from infer_forge.harness.engines.base import engine_config_of
from infer_forge.harness.engines.image import (
    ContainerRuntime,
    ImageUse,
    argv_options,
    check_server,
    clear_stale_container,
    container_argv,
    detect_runtime,
    image_ref,
    image_use,
    owner_tag,
)
from infer_forge.harness.engines.plan import wrap_plan
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.proc import group_alive, start_time
from infer_forge.ledger.specs import RuntimeProfile

from tests.conftest import REPO, TESTS
from tests.helpers import fake_docker

DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
NAME = "lmsysorg/sglang:v0.5.23-cu129"
REF = f"{NAME}@{DIGEST}"
FAKE = [sys.executable, str(TESTS / "data" / "sglang" / "fake_server.py")]


def profile(**kw) -> RuntimeProfile:
    data = {"service": "qwen-h200", "rev": 3, "engine": "sglang",
            "config": {"chunked_prefill_size": 4096, "tp_size": 1},
            "image": {"name": NAME, "digest": DIGEST},
            "framework": {"kind": "sglang", "version": "0.5.23"}, **kw}
    return RuntimeProfile.model_validate(data)


def use(kind="docker") -> ImageUse:
    return ImageUse(ContainerRuntime(kind, f"/usr/bin/{kind}"), REF, DIGEST, "qwen-h200 rev 3")


# --- pure: references, runtimes, command lines, checks -----------------------------------


def test_a_tag_without_digest_is_refused_naming_profile_image_and_field():
    p = profile(image={"name": NAME})
    with pytest.raises(HarnessError) as e:
        image_ref(p)
    msg = str(e.value)
    assert msg.startswith(f"runtime profile qwen-h200 rev 3: image {NAME} has no digest "
                          "(image.digest:") and "\n" not in msg
    with pytest.raises(HarnessError, match="has no digest"):  # before anything launches
        engine_config_of(p)
    assert image_ref(profile()) == REF
    assert image_ref(profile(image={"name": f"lmsysorg/sglang@{DIGEST}"})) == \
        f"lmsysorg/sglang@{DIGEST}"
    with pytest.raises(HarnessError, match="is not image.digest"):
        image_ref(profile(image={"name": f"lmsysorg/sglang@{OTHER}", "digest": DIGEST}))
    name, cfg = engine_config_of(profile())
    assert cfg["image"] == REF and cfg["image_fallback"] == "refuse"
    assert cfg["version"] == "0.5.23"


def test_runtime_detection_and_fallback():
    only = {"podman": "/bin/podman"}
    assert detect_runtime(lambda n: {"docker": "/bin/docker", **only}.get(n)) == \
        ContainerRuntime("docker", "/bin/docker")
    assert detect_runtime(only.get) == ContainerRuntime("podman", "/bin/podman")
    assert detect_runtime(lambda n: None) is None
    with pytest.raises(HarnessError) as e:
        image_use(profile(), which=lambda n: None)
    assert str(e.value) == (f"runtime profile qwen-h200 rev 3: image {REF} needs docker or "
                            "podman and neither is on PATH (install one, or set the profile's "
                            "image_fallback: local to run the local install)")
    said: list[str] = []
    assert image_use(profile(image_fallback="local"), which=lambda n: None,
                     say=said.append) is None
    assert "running the local install instead of image" in said[0]
    assert image_use(profile(image=None), which=lambda n: None) is None
    u = image_use(profile(), which=only.get)
    assert u is not None and u.runtime.kind == "podman" and u.digest == DIGEST


def test_container_command_lines(tmp_path):
    inner = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(tmp_path),
             "--port", "30001", "--tp-size", "2"]
    d = container_argv(use(), inner, name="forge-prefill-0-30001", devices=[4, 5],
                       env_names=["CUDA_VISIBLE_DEVICES", "NCCL_DEBUG"], mounts=[tmp_path])
    assert d == ["/usr/bin/docker", "run", "--rm", "--name", "forge-prefill-0-30001",
                 "--label", "org.infer-forge.managed=1", "--network", "host", "--ipc", "host",
                 "--gpus", '"device=4,5"', "-v", f"{tmp_path}:{tmp_path}:ro",
                 "-e", "NCCL_DEBUG", REF, "python3", "-m", "sglang.launch_server",
                 "--model-path", str(tmp_path), "--port", "30001", "--tp-size", "2"]
    p = container_argv(use("podman"), inner, name="c", devices=[0, 1])
    assert p[p.index("--ipc") + 2:p.index(REF)] == [
        "--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=1"]
    assert container_argv(use(), inner, name="c")[11:13] == ["--gpus", "all"]
    assert "--device" in container_argv(use("podman"), inner, name="c") and \
        "nvidia.com/gpu=all" in container_argv(use("podman"), inner, name="c")
    # a launcher the config names is used as it is, inside the image
    assert container_argv(use(), ["/opt/bin/serve", "-x"], name="c")[-2:] == \
        ["/opt/bin/serve", "-x"]
    assert "--gpus" not in container_argv(use(), inner, name="c", vendor="cpu")


def test_wrap_plan_runs_every_process_in_the_image(tmp_path):
    plan_mod = pytest.importorskip("infer_forge.harness.engines.plan")
    from infer_forge.ledger.specs import DeploymentPoint

    point = DeploymentPoint.model_validate({
        "model": {"name": "m", "source": str(tmp_path)},
        "scenario": {"traffic": {"concurrency": 4}},
        "topology": {"architecture": "pd", "roles": [
            {"role": "prefill", "count": 2, "parallelism": {"tp": 2}},
            {"role": "decode", "count": 1, "parallelism": {"tp": 4}}]},
        "runtime_profile": {"service": "qwen-h200", "rev": 3},
        "accelerator": {"vendor": "nvidia", "model": "H200", "count": 8}})
    plan = plan_mod.plan_point(point, profile(config={}), None, model=str(tmp_path))
    wrapped = wrap_plan(plan, use())
    assert [p.name for p in wrapped.processes] == [p.name for p in plan.processes]
    for before, after in zip(plan.processes, wrapped.processes, strict=True):
        argv = list(after.argv)
        assert argv[:2] == ["/usr/bin/docker", "run"] and REF in argv
        assert argv[argv.index("--name") + 1] == f"forge-{before.name}-{before.port}"
        assert "CUDA_VISIBLE_DEVICES" not in after.env
        inner = argv[argv.index(REF) + 1:]
        assert inner[0] == "python3" and inner[1:] == list(before.argv[1:])
        if before.role == "router":
            assert "--gpus" not in argv and "-v" in argv
        else:
            devs = ",".join(map(str, before.devices))
            assert argv[argv.index("--gpus") + 1] == f'"device={devs}"'
            assert argv[argv.index("-v") + 1] == f"{tmp_path}:{tmp_path}:ro"
    assert wrapped.entry_url == plan.entry_url


def test_check_server_names_both_values():
    info = {"version": "0.5.23", "chunked_prefill_size": 8192, "tp_size": 2,
            "attention_backend": "fa3", "enable_metrics": True, "json_model_override_args":
            "{}", "cuda_graph_bs": [1, 2, 4]}
    ok = {"chunked_prefill_size": "8192", "tp_size": 2, "attention_backend": "auto",
          "enable_metrics": True, "cuda_graph_bs": ["1", "2", "4"], "port": 1,
          "json_model_override_args": {}, "enable_foo": False, "new_flag": 3}
    assert check_server(info, version="0.5.23", requested=ok, where="w") == ["new_flag"]
    with pytest.raises(HarnessError) as e:
        check_server(info, version="0.5.22", requested=ok, where="prefill-0 at http://h:1",
                     pinned_by="runtime profile qwen-h200 rev 3 (framework.version)")
    assert str(e.value) == ("prefill-0 at http://h:1: runtime profile qwen-h200 rev 3 "
                            "(framework.version) pins sglang 0.5.22, the server reports 0.5.23 "
                            "(/server_info version)")
    with pytest.raises(HarnessError) as e:
        check_server(info, version="0.5.23", requested={"chunked_prefill_size": 4096,
                                                        "tp_size": 2}, where="w")
    assert "chunked_prefill_size 4096 requested, 8192 resolved" in str(e.value)
    # check_args: false in the engine config checks the version only
    assert check_server(info, version="0.5.23", requested={"chunked_prefill_size": 4096},
                        where="w", args=False) == []
    with pytest.raises(HarnessError, match="pins sglang 0.5.4"):
        check_server(info, version="0.5.4", requested={}, where="w", args=False)
    assert argv_options(["python3", "-m", "x", "--tp-size", "4", "--enable-metrics",
                         "--cuda-graph-bs", "1", "2", "--chunked-prefill-size", "-1"]) == {
        "tp_size": "4", "enable_metrics": True, "cuda_graph_bs": ["1", "2"],
        "chunked_prefill_size": "-1"}


# --- end to end through a stand-in docker ---------------------------------------------------


@pytest.fixture
def docker(tmp_path, monkeypatch):
    """A stand-in `docker` first on PATH serving REF; returns its state directory."""
    return fake_docker.on_path(tmp_path, monkeypatch, {REF: [DIGEST]})


def calls(state: Path) -> list[list[str]]:
    return [json.loads(x) for x in (state / "calls.jsonl").read_text().splitlines()]


def held(state: Path, name: str, owner: str | None) -> None:
    """The runtime holds container `name`, as a forge process `owner` started it."""
    labels = {"org.infer-forge.managed": "1"} | ({"org.infer-forge.owner": owner} if owner
                                                 else {})
    (state / "containers.json").write_text(json.dumps({name: {"labels": labels}}))


def fake_use(state: Path) -> ImageUse:
    """The profile's image through the stand-in docker of the `docker` fixture."""
    return ImageUse(ContainerRuntime("docker", str(state.parent / "bin" / "docker")), REF,
                    DIGEST, "qwen-h200 rev 3")


def test_a_container_a_killed_forge_left_is_removed_before_the_start(docker):
    gone = subprocess.Popen(["sleep", "30"])
    owner = f"{socket.gethostname()}:{gone.pid}:{start_time(gone.pid)}"
    gone.kill()
    gone.wait()
    held(docker, "forge-sglang-30001", owner)
    said: list[str] = []
    clear_stale_container(fake_use(docker), "forge-sglang-30001", say=said.append)
    assert [c[:2] for c in calls(docker)] == [["container", "inspect"], ["rm", "-f"]]
    assert json.loads((docker / "containers.json").read_text()) == {}
    assert said == [f"removed container forge-sglang-30001: forge process {gone.pid}, which "
                    "started it, is gone"]


def test_a_container_of_a_running_forge_or_not_forges_is_left(docker):
    runtime = fake_use(docker)
    held(docker, "forge-sglang-30001", owner_tag())  # this process: alive
    with pytest.raises(HarnessError) as e:
        clear_stale_container(runtime, "forge-sglang-30001")
    assert str(e.value).startswith("container forge-sglang-30001 is running for forge "
                                   f"process {owner_tag().split(':')[1]} on this host")
    for owner in (None, "other-host:1:1"):  # not labelled by forge, or another host's
        held(docker, "forge-sglang-30001", owner)
        clear_stale_container(runtime, "forge-sglang-30001")
    clear_stale_container(runtime, "forge-sglang-30002")  # none of that name
    assert ["rm", "-f"] not in [c[:2] for c in calls(docker)]
    assert "forge-sglang-30001" in json.loads((docker / "containers.json").read_text())


def launch(p: RuntimeProfile, workspace, **cfg):
    name, config = engine_config_of(p)
    return engine_for(name).launch({**config, **cfg}, model="Qwen/Qwen3-8B", ws=workspace)


@pytest.mark.slow
def test_server_runs_in_the_image_by_digest_and_is_checked(docker, workspace):
    with launch(profile(), workspace, env={"FAKE_SGLANG_MODE": "ok"}) as running:
        info = running.describe()
        assert info["image"] == {"ref": REF, "digest": DIGEST, "runtime": "docker",
                                 "container": info["image"]["container"]}
        cmd = info["launch_command"]
        assert cmd[1:3] == ["run", "--rm"] and cmd[cmd.index(REF) + 1:][:3] == [
            "python3", "-m", "sglang.launch_server"]
        assert ["-e", "FAKE_SGLANG_MODE"] == cmd[cmd.index("-e"):cmd.index("-e") + 2]
        assert info["version"] == "0.5.23" and info["resolved_args"]["chunked_prefill_size"] \
            == 4096
        pid = running.pid
    assert not group_alive(pid)
    seen = [c[:2] for c in calls(docker)]
    # inspect (missing), pull by digest, inspect again, run, and the container removed after
    assert seen == [["image", "inspect"], ["pull", REF], ["image", "inspect"],
                    ["container", "inspect"], ["run", "--rm"], ["rm", "-f"]]
    run_argv = next(c for c in calls(docker) if c[0] == "run")
    assert f"org.infer-forge.owner={owner_tag()}" in run_argv  # whose container it is
    assert calls(docker)[-1] == ["rm", "-f", info["image"]["container"]]


@pytest.mark.slow
def test_digest_resolve_pins_the_tag_at_first_use_and_keeps_it(docker, workspace):
    """`image: {name: repo:tag, digest: resolve}`: the first launch pulls the tag, records the
    digest it got (ImageResolved) and runs by that digest; a later launch uses the recorded
    digest, not the tag, even after the tag has moved in the registry."""
    (docker / "registry.json").write_text(json.dumps({NAME: [DIGEST], REF: [DIGEST]}))
    p = profile(image={"name": NAME, "digest": "resolve"})
    with launch(p, workspace, env={"FAKE_SGLANG_MODE": "ok"}) as running:
        info = running.describe()
        assert (info["image"]["ref"], info["image"]["digest"]) == (REF, DIGEST)
        cmd = info["launch_command"]
        assert REF in cmd and f"{NAME}@resolve" not in cmd
    (rec,) = [r.event for r in workspace.ledger.stream("workspace")
              if r.type == "ImageResolved"]
    assert (rec.name, rec.digest, rec.runtime) == (NAME, DIGEST, "docker")
    assert [c for c in calls(docker) if c[:1] == ["pull"]] == [["pull", NAME]]
    # The tag moves; the recorded digest is what runs.
    (docker / "registry.json").write_text(json.dumps({NAME: [OTHER], REF: [DIGEST]}))
    before = len(calls(docker))
    with launch(p, workspace) as running:
        assert running.describe()["image"]["digest"] == DIGEST
    assert not [c for c in calls(docker)[before:] if c[:1] == ["pull"]]
    assert len([r for r in workspace.ledger.stream("workspace")
                if r.type == "ImageResolved"]) == 1


def test_digest_resolve_needs_a_workspace_and_is_the_only_word(docker):
    with pytest.raises(HarnessError, match=rf"^image {re.escape(NAME)} \(digest: resolve\) "
                                           "needs a workspace"):
        launch(profile(image={"name": NAME, "digest": "resolve"}), None)
    with pytest.raises(ValueError, match="or `resolve` \\(pinned at first use\\)"):
        profile(image={"name": NAME, "digest": "latest"})


@pytest.mark.slow
def test_a_digest_mismatch_refuses_the_deploy_naming_both(docker, workspace):
    (docker / "registry.json").write_text(json.dumps({REF: [OTHER]}))
    with pytest.raises(HarnessError) as e:
        launch(profile(), workspace)
    assert str(e.value) == (f"image.digest pins {DIGEST}, docker reports {OTHER} for {REF}")
    assert ["run", "--rm"] not in [c[:2] for c in calls(docker)]  # nothing started


@pytest.mark.slow
def test_a_version_mismatch_refuses_the_deploy_naming_both(docker, workspace):
    p = profile(framework={"kind": "sglang", "version": "0.5.22"})
    with pytest.raises(HarnessError) as e:
        launch(p, workspace)
    msg = str(e.value)
    assert "pins sglang 0.5.22, the server reports 0.5.23 (/server_info version)" in msg
    stopped = [r.event for r in workspace.ledger.stream("engines")
               if r.type == "EngineStopped"]
    assert stopped and stopped[-1].reason == "error"
    assert calls(docker)[-1][:2] == ["rm", "-f"]  # the container is gone too
    launched = [r.event for r in workspace.ledger.stream("engines")
                if r.type == "EngineLaunched"][-1]
    assert not group_alive(launched.pid)


@pytest.mark.slow
def test_podman_and_the_local_fallback(tmp_path, monkeypatch, workspace):
    state = tmp_path / "podman-state"
    state.mkdir()
    (state / "images.json").write_text(json.dumps({REF: [DIGEST]}))  # present: no pull
    fake_docker.install(tmp_path / "bin", state, kind="podman")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    with launch(profile(), workspace) as running:
        cmd = running.describe()["launch_command"]
        assert cmd[0].endswith("/podman") and "nvidia.com/gpu=all" in cmd
    assert [c[:2] for c in calls(state)] == [["image", "inspect"], ["container", "inspect"],
                                             ["run", "--rm"], ["rm", "-f"]]
    # No container runtime at all: refused, unless the profile allows the local install.
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(HarnessError, match="needs docker or podman and neither is on PATH"):
        launch(profile(), workspace)
    with launch(profile(image_fallback="local"), workspace, launcher=FAKE) as running:
        assert running.describe()["launch_command"][:2] == FAKE


# --- whole points: a candidate switching colocated -> PD, in the image ----------------------

FAKE_ROUTER = [sys.executable, str(REPO / "harness" / "testing"
                                   / "fake_router.py")]


def stand_in_point():
    from infer_forge.ledger.specs import DeploymentPoint

    return DeploymentPoint.model_validate({
        "name": "stand-in", "model": {"name": "m", "source": "Qwen/Qwen3-8B"},
        "scenario": {"traffic": {"concurrency": 2}},
        "runtime_profile": {"service": "qwen-h200", "rev": 3},
        "accelerator": {"vendor": "cpu", "model": "x86_64", "count": 1}})


@pytest.mark.slow
def test_colocated_then_pd_candidate_deployed_whole(workspace):
    from infer_forge.harness.engines.base import request_json
    from infer_forge.harness.engines.whole import deploy_whole, deployment_meta
    from infer_forge.ledger.candidates import differences
    from infer_forge.ledger.specs import apply_candidate

    base = stand_in_point()
    prof = profile(image=None, config={"launcher": FAKE, "router_launcher": FAKE_ROUTER,
                                       "startup_timeout_s": 60})
    with deploy_whole(workspace, base, prof, model="Qwen/Qwen3-8B") as eng:
        desc = eng.describe()
        assert deployment_meta(base, desc)["processes"] == ["sglang"]
        assert desc["launch_command"][:2] == FAKE
    cand = {"topology.architecture": "pd", "decode.count": 1}
    pd, pd_prof = apply_candidate(base, prof, cand)
    assert pd is not None and pd_prof is not None
    with deploy_whole(workspace, pd, pd_prof, model="Qwen/Qwen3-8B") as eng:
        desc = eng.describe()
        meta = deployment_meta(pd, desc)
        assert meta["architecture"] == "pd"
        assert meta["processes"] == ["prefill-0", "decode-0", "router"]
        assert eng.base_url == desc["plan"]["entry_url"]
        out = request_json("POST", eng.base_url + "/v1/completions",
                           {"model": "m", "prompt": "a b c", "max_tokens": 2})
        assert out["disaggregation_mode"] == "decode"
        pids = [p["pid"] for p in desc["processes"]]
    assert not any(group_alive(p) for p in pids)
    assert [d["path"] for d in differences(base, prof, cand)][:1] == ["topology.architecture"]


@pytest.mark.slow
def test_pd_in_the_image_and_a_role_reporting_another_version(docker, workspace):
    from infer_forge.harness.engines.whole import deploy_whole
    from infer_forge.ledger.specs import apply_candidate

    pd, _ = apply_candidate(stand_in_point(), None, {"topology.architecture": "pd"})
    assert pd is not None
    with deploy_whole(workspace, pd, profile(config={"startup_timeout_s": 60}),
                      model="Qwen/Qwen3-8B") as eng:
        desc = eng.describe()
        assert desc["image"] == {"ref": REF, "digest": DIGEST, "runtime": "docker"}
        runs = [c for c in calls(docker) if c[:1] == ["run"]]
        names = [c[c.index("--name") + 1].rsplit("-", 1)[0] for c in runs]
        # the servers start together (which client logs first is a race), the router after
        assert sorted(names[:2]) == ["forge-decode-0", "forge-prefill-0"] and \
            names[2:] == ["forge-router"]
        assert all(c[c.index(REF) + 1] == "python3" for c in runs)
        # each container names its owner as it starts; the recorded plan does not (its
        # digest names what runs, the same on every deploy)
        assert all(f"org.infer-forge.owner={owner_tag()}" in c for c in runs)
        planned = [r.event for r in workspace.ledger.stream("engines")
                   if r.type == "LaunchPlanned"][-1]
        assert "org.infer-forge.owner" not in json.dumps(planned.plan)
    removed = [c[2] for c in calls(docker) if c[:2] == ["rm", "-f"]]
    assert [r.rsplit("-", 1)[0] for r in removed] == ["forge-router", "forge-decode-0",
                                                      "forge-prefill-0"]
    # The profile pins 0.5.22; the image's servers say 0.5.23: the first role found ready
    # refuses it (prefill and decode start together: either may be first) and nothing is
    # left running.
    bad = profile(config={"startup_timeout_s": 60},
                  framework={"kind": "sglang", "version": "0.5.22"})
    with pytest.raises(HarnessError) as e:
        deploy_whole(workspace, pd, bad, model="Qwen/Qwen3-8B")
    assert re.match(r"(prefill-0 \(prefill server\)|decode-0 \(decode server\)) at "
                    r"http://127\.0\.0\.1:\d+: ", str(e.value)), str(e.value)
    assert ("runtime profile qwen-h200 rev 3 (framework.version) pins sglang 0.5.22, the "
            "server reports 0.5.23 (/server_info version)") in str(e.value)
    launched = [r.event for r in workspace.ledger.stream("engines") if r.type == "EngineLaunched"]
    assert not any(group_alive(ev.pid) for ev in launched if ev.pid)


def test_cli_refuses_a_tag_without_digest(tmp_path):
    import yaml

    from tests.conftest import run_forge

    home = tmp_path / "home"
    assert run_forge("init", home=home).returncode == 0
    prof = tmp_path / "profile.yaml"
    prof.write_text(yaml.safe_dump({"service": "s", "rev": 1, "engine": "sglang",
                                    "config": {"launcher": FAKE},
                                    "image": {"name": NAME},
                                    "framework": {"kind": "sglang", "version": "0.5.23"}}))
    r = run_forge("engine", "up", str(prof), "--model", "Qwen/Qwen3-8B", "--once", home=home)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"runtime profile s rev 1: image {NAME} has no digest " \
        "(image.digest:" in lines[0], r.stderr
    bad = prof.read_text().replace("image_fallback", "x") + "image_fallback: maybe\n"
    prof.write_text(bad)
    r = run_forge("engine", "up", str(prof), "--model", "Qwen/Qwen3-8B", "--once", home=home)
    assert r.returncode == 1 and "image_fallback" in r.stderr, r.stderr


def _point_files(d: Path, **prof) -> Path:
    import yaml

    d.mkdir(parents=True, exist_ok=True)
    (d / "profile.yaml").write_text(yaml.safe_dump({
        "service": "qwen-h200", "rev": 3, "engine": "sglang",
        "config": {"startup_timeout_s": 60}, "image": {"name": NAME, "digest": DIGEST},
        "framework": {"kind": "sglang", "version": "0.5.23"}, **prof}))
    spec = stand_in_point().model_dump(mode="json")
    spec["topology"] = {"architecture": "pd", "roles": [{"role": "prefill"},
                                                        {"role": "decode"}]}
    spec["runtime_profile"]["file"] = "profile.yaml"
    (d / "point.yaml").write_text(yaml.safe_dump(spec))
    return d / "point.yaml"


@pytest.mark.slow
def test_engine_up_point_runs_in_the_image(docker, tmp_path, workspace):
    from infer_forge.harness.engines.point_up import point_up

    point = _point_files(tmp_path / "spec")
    shown = point_up(workspace, point, plan_only=True)["plan"]
    assert all(p["argv"][:2] == [str(tmp_path / "bin" / "docker"), "run"]
               for p in shown["processes"])
    assert not (docker / "calls.jsonl").exists()  # --plan pulls nothing
    said: list[str] = []
    out = point_up(workspace, point, once=True, echo=said.append)
    assert out["deployment"]["image"]["ref"] == REF
    planned = [r.event for r in workspace.ledger.stream("engines")
               if r.type == "LaunchPlanned"][-1]
    # what was recorded before anything started is what ran: the wrapped command lines
    assert all(REF in p["argv"] for p in planned.plan["processes"])
    assert [c[:2] for c in calls(docker)][:3] == [["image", "inspect"], ["pull", REF],
                                                  ["image", "inspect"]]
    assert sum(c[:2] == ["rm", "-f"] for c in calls(docker)) == 3


def test_engine_up_plan_without_a_runtime_shows_what_would_run(tmp_path, monkeypatch):
    from infer_forge.harness.engines.point_up import point_up

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    point = _point_files(tmp_path / "spec")
    shown = point_up(None, point, plan_only=True)["plan"]
    assert [p["argv"][:2] for p in shown["processes"]] == [["docker", "run"]] * 3
    with pytest.raises(HarnessError, match="needs docker or podman and neither is on PATH"):
        point_up(None, point, once=True)
    local = _point_files(tmp_path / "local", image_fallback="local")
    shown = point_up(None, local, plan_only=True)["plan"]
    assert shown["processes"][0]["argv"][1:3] == ["-m", "sglang.launch_server"]


def test_a_runtime_that_cannot_answer_is_not_a_missing_image(tmp_path, monkeypatch):
    """Recorded from docker 28.2.2 on a host without its daemon: inspect exits 1 with
    `Cannot connect to the Docker daemon …` on stderr; that is said as it is, no pull tried."""
    import subprocess

    from infer_forge.harness.engines.image import ensure_image

    seen: list[list[str]] = []

    def run(cmd, **_kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "Cannot connect to the Docker daemon at "
                                           "unix:///var/run/docker.sock. Is the docker daemon "
                                           "running?\n")

    with pytest.raises(HarnessError) as e:
        ensure_image(use(), run=run)
    assert str(e.value).startswith(f"docker image inspect {REF} exited 1: Cannot connect to "
                                   "the Docker daemon")
    assert len(seen) == 1
