"""`forge perf capture` against an SGLang server forge runs in a pinned image: the trace root
is mounted read-write into the container, so every rank's trace comes back. Docker cannot run
here: the stand-in `docker` (tests/helpers/fake_docker.py) runs the stand-in server with the
container's view of the host (its volumes; any other path is the container's own)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from infer_forge.harness.engines import engine_for
from infer_forge.harness.engines.base import engine_config_of
from infer_forge.harness.engines.trace_dir import trace_root
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.perf.capture import Load, capture_profile
from infer_forge.ledger.specs import RuntimeProfile

from tests.conftest import need
from tests.helpers import fake_docker

DIGEST = "sha256:" + "ab" * 32
REF = f"lmsysorg/sglang:v0.5.23-cu129@{DIGEST}"


@pytest.fixture(scope="module")
def torch_trace(tmp_path_factory) -> Path:
    """A real torch.profiler trace (CPU) with one SGLang-named decode step span."""
    import importlib.util

    need(importlib.util.find_spec("torch") is not None, "torch (the real profiler) is not "
         "installed")
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    lin = torch.nn.Linear(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with record_function("step[DECODE bs=4]"):
                torch.relu(lin(torch.randn(4, 32)))
    path = tmp_path_factory.mktemp("trace") / "decode.json"
    prof.export_chrome_trace(str(path))
    return path


@pytest.fixture
def docker(tmp_path, monkeypatch):
    """A stand-in `docker` first on PATH serving REF; returns its state directory."""
    return fake_docker.on_path(tmp_path, monkeypatch, {REF: [DIGEST]})


def launch(ws, trace: Path):
    p = RuntimeProfile.model_validate({
        "service": "qwen-h200", "rev": 3, "engine": "sglang", "config": {"tp_size": 2},
        "image": {"name": "lmsysorg/sglang:v0.5.23-cu129", "digest": DIGEST},
        "framework": {"kind": "sglang", "version": "0.5.23"}})
    name, config = engine_config_of(p)
    return engine_for(name).launch({**config, "env": {"FAKE_SGLANG_TRACE": str(trace)}},
                                   model="Qwen/Qwen3-8B", ws=ws)


def capture(ws, url: str, tokenizer: Path, **kw):
    return capture_profile(ws, url=url, engine="sglang", model="Qwen/Qwen3-8B",
                           tokenizer_dir=str(tokenizer), duration_s=0.001,
                           load=Load(requests=2, input_len=8, output_len=4), **kw)


def test_every_ranks_trace_comes_back_from_the_container(docker, workspace, torch_trace,
                                                         tiny_tokenizer_dir):
    root = trace_root(workspace.home)
    with launch(workspace, torch_trace) as running:
        cmd = running.describe()["launch_command"]
        assert ["-v", f"{root}:{root}:rw"] == cmd[cmd.index(f"{root}:{root}:rw") - 1:][:2]
        out = capture(workspace, running.base_url, tiny_tokenizer_dir)
    names = sorted(out["traces"])
    assert len(names) == 2 and [n.rsplit("-", 1)[-1] for n in names] == [
        "0.trace.json.gz", "1.trace.json.gz"]
    for digest in out["traces"].values():  # stored (through the redactor), byte-equal
        assert gzip.decompress(workspace.artifacts.get(digest)) == torch_trace.read_bytes()
    [decode] = [p for p in out["phases"] if p["name"] == "decode"]
    assert decode["steps"] == 3 and decode["tokens"] == 12
    relu = next(o for o in decode["top"] if o["name"] == "aten::relu")
    assert relu["count"] == 2 * 3  # both ranks
    assert list(root.iterdir()) == []  # the capture's directory is gone once stored
    assert not (docker / "container-fs").exists()  # nothing written inside the container


def test_without_the_mount_the_traces_stay_in_the_container(docker, workspace, torch_trace,
                                                            tiny_tokenizer_dir):
    """A server started without forge's workspace gets no trace mount (as before this
    change): the files land in the container's own filesystem and the capture says so."""
    with launch(None, torch_trace) as running:
        cmd = running.describe()["launch_command"]
        assert not any(a.endswith(":rw") for a in cmd)
        with pytest.raises(HarnessError, match="no complete \\*.trace.json.gz"):
            capture(workspace, running.base_url, tiny_tokenizer_dir, collect_timeout_s=0.5)
    inside = sorted(p.name for p in (docker / "container-fs").rglob("*.trace.json.gz"))
    assert len(inside) == 2 and all("-TP-" in n for n in inside)
    assert workspace.ledger.stream("profiles") == []


def test_each_role_of_a_pd_point_in_the_image_captured_apart(docker, workspace, torch_trace,
                                                             tiny_tokenizer_dir):
    """A PD point deployed whole in the image: its servers get the trace mount as they start
    (the router, which writes no trace, does not); each role's server is captured while the
    load goes through the router (`load_url`)."""
    from infer_forge.harness.engines.whole import deploy_whole
    from infer_forge.ledger.specs import apply_candidate

    from tests.harness.engines.test_images import profile, stand_in_point

    root = trace_root(workspace.home)
    pd, _ = apply_candidate(stand_in_point(), None, {"topology.architecture": "pd"})
    assert pd is not None
    prof = profile(config={"startup_timeout_s": 60, "env": {"FAKE_SGLANG_TRACE":
                                                            str(torch_trace)}})
    with deploy_whole(workspace, pd, prof, model="Qwen/Qwen3-8B") as eng:
        desc = eng.describe()
        runs = {c[c.index("--name") + 1].rsplit("-", 1)[0]: c
                for c in (json.loads(x) for x in (docker / "calls.jsonl").read_text()
                          .splitlines()) if c[:1] == ["run"]}
        assert f"{root}:{root}:rw" in runs["forge-prefill-0"]
        assert f"{root}:{root}:rw" in runs["forge-decode-0"]
        assert not any(a.endswith(":rw") for a in runs["forge-router"])
        planned = [r.event for r in workspace.ledger.stream("engines")
                   if r.type == "LaunchPlanned"][-1]
        assert str(root) not in json.dumps(planned.plan)  # the plan names what runs
        urls = {p["role"]: p["url"] for p in desc["processes"]}
        got = {role: capture(workspace, urls[role], tiny_tokenizer_dir,
                             load_url=desc["entry_url"]) for role in ("prefill", "decode")}
    for role, out in got.items():
        assert out["url"] == urls[role] and out["load"]["url"] == desc["entry_url"]
        assert len(out["traces"]) == 1 and out["bench"]["completed"] >= 2
        assert [p["name"] for p in out["phases"]] == ["decode"]
    assert len(workspace.ledger.stream("profiles")) == 2
