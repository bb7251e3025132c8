"""Weights without copies: `forge weights pull org/model[@revision]` references a snapshot of
the shared Hugging Face cache, and `path:/abs/dir` a directory, where they lie.

The cache is written by the real `huggingface_hub` (`snapshot_download`) from a hub on
127.0.0.1 that answers the hub's routes (tests/helpers/fake_hub.py: no hub is reachable
here), and read back by the real `scan_cache_dir` / `try_to_load_from_cache`: forge's record
must name the snapshot the library wrote, its commit and its blobs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.models.weight_refs import hub_cache_dir
from infer_forge.harness.models.weights import model_path

from tests.conftest import run_forge
from tests.helpers.fake_hub import FakeHub, Repo, git_blob_sha1

C1, C2 = "1" * 40, "2" * 40
WEIGHTS = bytes(range(256)) * 64  # an LFS file
FILES = {"config.json": (b'{"model_type": "llama"}\n', False),
         "model.safetensors": (WEIGHTS, True),
         "tokenizer/tokenizer.json": (b'{"version": "1.0"}\n', False)}
FILES2 = {**FILES, "config.json": (b'{"model_type": "llama", "v": 2}\n', False)}


@pytest.fixture(scope="module")
def hub():
    with FakeHub({"acme/tiny": Repo({C1: FILES, C2: FILES2}, {"main": C1, "v2": C2})}) as h:
        yield h


@pytest.fixture
def env(tmp_path, hub):
    home = tmp_path / "home"
    assert run_forge("init", home=home).returncode == 0
    return {"home": home, "cache": tmp_path / "hf-cache",
            "env": {"HF_HUB_CACHE": str(tmp_path / "hf-cache"), "HF_ENDPOINT": hub.url,
                    "HF_HUB_OFFLINE": "0"}}


def pull(env, *args, offline=False, **extra):
    e = {**env["env"], **extra, **({"HF_HUB_OFFLINE": "1"} if offline else {})}
    return run_forge("weights", "pull", *args, "--json", home=env["home"], env=e)


def ok(r) -> dict:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def tree(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.lstat().st_size for p in root.rglob("*")}


def test_a_hub_model_is_referenced_in_the_cache_main_resolved_to_its_commit(env, hub):
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    first = ok(pull(env, "acme/tiny"))  # not cached yet: the real client fills the cache
    assert first["network"] is True and first["reused"] is False
    snap = env["cache"] / "models--acme--tiny" / "snapshots" / C1
    assert (first["revision"], first["commit"], first["path"]) == ("main", C1, str(snap))

    # What the real library wrote and reads back is what forge recorded.
    (repo,) = scan_cache_dir(env["cache"]).repos
    (rev,) = repo.revisions
    assert (repo.repo_id, rev.commit_hash, set(rev.refs)) == ("acme/tiny", C1, {"main"})
    rec = json.loads((env["home"] / "models" / "acme--tiny@main.ref.json").read_text())
    assert {f.file_path.relative_to(snap).as_posix(): f.blob_path.name for f in rev.files} == \
        {rel: f["hash"] for rel, f in rec["files"].items()}
    assert rec["files"]["model.safetensors"] == {
        "kind": "sha256", "hash": hashlib.sha256(WEIGHTS).hexdigest(), "size": len(WEIGHTS)}
    assert rec["files"]["config.json"] == {"kind": "git-blob-sha1", "size": 24,
                                           "hash": git_blob_sha1(FILES["config.json"][0])}
    assert try_to_load_from_cache("acme/tiny", "config.json", cache_dir=env["cache"]) == \
        str(snap / "config.json")

    # No copy: FORGE_HOME/models holds the small record only; the path is the cache's.
    assert tree(env["home"] / "models").keys() == {"acme--tiny@main.ref.json"}
    blob = next(f.blob_path for f in rev.files if f.file_name == "model.safetensors")
    assert (snap / "model.safetensors").stat().st_ino == blob.stat().st_ino
    assert model_path(env["home"], "acme/tiny") == snap
    assert model_path(env["home"], f"acme/tiny@{C1}") == snap  # by the commit it resolved to
    # In a container the snapshot's links must resolve: its repo folder is what is mounted.
    from infer_forge.harness.engines.image import model_mounts

    (mount,) = model_mounts(snap)
    assert all(os.path.realpath(snap / rel).startswith(mount + "/") for rel in rec["files"])

    listed = json.loads(run_forge("weights", "list", "--json", home=env["home"]).stdout)
    assert [(m["name"], m["source"], m["commit"], m["path"]) for m in listed] == [
        ("acme/tiny", "hub", C1, str(snap))]

    # Again, offline: the cache answers, the hub is not asked, nothing changes.
    asked, before = len(hub.requests), tree(env["cache"])
    again = ok(pull(env, "hf:acme/tiny@main", offline=True))
    assert (again["network"], again["reused"], again["digest"]) == (False, True, first["digest"])
    assert len(hub.requests) == asked and tree(env["cache"]) == before

    from infer_forge.ledger.workspace import open_workspace

    ws = open_workspace(env["home"])
    try:
        pulled = [r.event for r in ws.ledger.stream("workspace") if r.type == "ModelPulled"]
    finally:
        ws.close()
    assert len(pulled) == 1 and pulled[0].name == "acme/tiny" and pulled[0].path == str(snap)
    assert {k: pulled[0].recipe[k] for k in ("repo_id", "revision", "commit", "digest_kind")} \
        == {"repo_id": "acme/tiny", "revision": "main", "commit": C1, "digest_kind": "hub"}
    assert pulled[0].recipe["files"] == rec["files"]


def test_a_moved_branch_is_followed_with_refresh_and_a_tag_is_its_own_reference(env, hub):
    ok(pull(env, "acme/tiny"))
    hub.repos["acme/tiny"].refs["main"] = C2
    try:
        assert ok(pull(env, "acme/tiny"))["commit"] == C1  # the cache's refs/main
        moved = ok(pull(env, "acme/tiny", "--refresh"))
        assert (moved["commit"], moved["network"]) == (C2, True)
        assert (env["cache"] / "models--acme--tiny" / "refs" / "main").read_text() == C2
        assert model_path(env["home"], "acme/tiny") == Path(moved["path"])
        with pytest.raises(HarnessError, match=f"run `forge weights pull acme/tiny@{C1}`"):
            model_path(env["home"], f"acme/tiny@{C1}")  # no reference names it any more
    finally:
        hub.repos["acme/tiny"].refs["main"] = C1
    # C2's snapshot is cached, but no refs/v2 says so: offline, the library cannot tell.
    assert "revision v2 is not in the Hugging Face cache" in pull(env, "acme/tiny@v2",
                                                                  offline=True).stderr
    tag = ok(pull(env, "acme/tiny@v2"))
    assert (tag["revision"], tag["commit"], tag["network"]) == ("v2", C2, True)
    assert ok(pull(env, "acme/tiny@v2", offline=True))["commit"] == C2
    assert model_path(env["home"], "acme/tiny", revision="v2").name == C2


def test_allow_patterns_limit_what_is_fetched_and_referenced(env, hub):
    asked = len(hub.requests)
    only = ok(pull(env, "acme/tiny", "--allow-patterns", "*.json"))
    fetched = [r for r in hub.requests[asked:] if r.startswith("GET /acme/tiny/resolve/")]
    assert sorted(r.rsplit("/", 1)[1] for r in fetched) == ["config.json", "tokenizer.json"]
    rec = json.loads((env["home"] / "models" / "acme--tiny@main.ref.json").read_text())
    assert sorted(rec["files"]) == ["config.json", "tokenizer/tokenizer.json"]
    assert rec["allow_patterns"] == ["*.json"] and only["files"] == 2
    # A pattern the cached snapshot cannot answer offline is an error, not a silent subset.
    r = pull(env, "acme/tiny", "--allow-patterns", "*.safetensors", offline=True)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "acme/tiny" in r.stderr and "the cached snapshot of main lacks files" in r.stderr


def test_a_missing_snapshot_offline_is_one_line_naming_repo_and_revision(env, hub):
    r = pull(env, "acme/tiny@v9", offline=True)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("Error: cannot download acme/tiny: no network access")
    assert "revision v9 is not in the Hugging Face cache" in r.stderr
    r = pull(env, "acme/tiny@v9")  # the hub is there: the revision is not
    assert r.returncode == 1 and "cannot download acme/tiny@v9: not found on the hub" in r.stderr
    assert not (env["home"] / "models").exists() or not list((env["home"] / "models").iterdir())


def test_verify_reads_the_blobs_only_when_asked(env):
    rec = ok(pull(env, "acme/tiny", "--verify"))
    assert rec["reused"] is False
    blob = Path(os.path.realpath(Path(rec["path"]) / "model.safetensors"))
    blob.chmod(0o644)
    blob.write_bytes(b"\1" * len(WEIGHTS))  # same size, other bytes: only reading tells
    assert ok(pull(env, "acme/tiny", offline=True))["digest"] == rec["digest"]
    r = pull(env, "acme/tiny", "--verify", offline=True)
    assert r.returncode == 1 and "model.safetensors: blob" in r.stderr
    assert "holds other content" in r.stderr
    # A cache of copies (where links cannot be made): no blob name to trust, the file is hashed.
    cfg = Path(rec["path"]) / "config.json"
    content = cfg.read_bytes()
    cfg.unlink()
    cfg.write_bytes(content)
    ok(pull(env, "acme/tiny", offline=True))
    got = json.loads((env["home"] / "models" / "acme--tiny@main.ref.json").read_text())
    assert got["files"]["config.json"] == {"kind": "sha256", "computed": True,
                                           "hash": hashlib.sha256(content).hexdigest(),
                                           "size": len(content)}


def test_a_directory_is_referenced_in_place_with_a_lazy_digest(env, tmp_path):
    d = tmp_path / "my-model"
    (d / "sub").mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "sub" / "w.bin").write_bytes(b"w" * 100)
    first = ok(pull(env, f"path:{d}"))
    assert (first["path"], first["digest_kind"], first["files"]) == (str(d), "listing", 2)
    assert ok(pull(env, str(d)))["reused"] is True  # an absolute path is the same reference
    os.utime(d / "sub" / "w.bin", ns=(1, 1))  # the listing sees (size, mtime_ns) only
    assert ok(pull(env, f"path:{d}"))["digest"] != first["digest"]
    full = ok(pull(env, f"path:{d}", "--verify"))
    rec = json.loads(next((env["home"] / "models").glob("path-*.ref.json")).read_text())
    assert full["digest_kind"] == "sha256" and rec["files"]["sub/w.bin"]["hash"] == \
        hashlib.sha256(b"w" * 100).hexdigest()
    assert [p.name for p in (env["home"] / "models").iterdir()] == [
        f"path-{hashlib.sha256(str(d).encode()).hexdigest()[:16]}.ref.json"]  # no copy
    assert model_path(env["home"], f"path:{d}") == d
    r = pull(env, "path:rel/dir")
    assert r.returncode == 1 and "give an absolute path" in r.stderr


def test_the_cache_is_found_the_way_huggingface_hub_finds_it(monkeypatch, tmp_path):
    for k in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub_cache_dir() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub_cache_dir() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "shared"))
    assert hub_cache_dir() == tmp_path / "shared"


def test_a_hub_model_not_pulled_says_how(tmp_path):
    with pytest.raises(HarnessError, match=r"run `forge weights pull acme/tiny@v2`"):
        model_path(tmp_path, "acme/tiny@v2")


def test_a_points_hub_source_is_resolved_in_the_cache_and_served_from_there(
        workspace, tmp_path, tiny_model, monkeypatch):
    """The engine evaluator on a point whose `model.source` is a hub id at a revision: the
    snapshot is fetched into the shared cache once (tiny-llama's files served by the hub on
    127.0.0.1), recorded, and the server (the SGLang stand-in, tests/data/sglang/
    fake_server.py) is launched on the snapshot's path."""
    import sys

    import yaml
    from infer_forge.harness.loop.engine_evaluator import EngineEvaluator
    from infer_forge.harness.loop.evaluator_protocol import EvalContext
    from infer_forge.ledger.specs import load_point, load_profile, load_task

    from tests.conftest import REPO

    files = {p.name: (p.read_bytes(), p.suffix == ".safetensors")
             for p in tiny_model.iterdir() if p.name != "forge-manifest.json"}
    with FakeHub({"forge/tiny-llama": Repo({C2: files}, {"v1": C2})}) as hub:
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        d = tmp_path / "spec"
        d.mkdir()
        fake = [sys.executable, str(REPO / "tests" / "data" / "sglang" / "fake_server.py")]
        (d / "profile.yaml").write_text(yaml.safe_dump({
            "service": "stand-in", "rev": 1, "engine": "sglang",
            "config": {"launcher": fake, "startup_timeout_s": 60},
            "framework": {"kind": "sglang", "version": "0.5.23"}}))
        (d / "point.yaml").write_text(yaml.safe_dump({
            "name": "hub", "model": {"name": "tiny", "source": "forge/tiny-llama",
                                     "revision": "v1"},
            "scenario": {"traffic": {"input_len": 16, "output_len": 8, "concurrency": 1,
                                     "num_prompts": 1}},
            "runtime_profile": {"service": "stand-in", "rev": 1, "file": "profile.yaml"},
            "accelerator": {"vendor": "cpu", "model": "x86_64", "count": 1}}))
        (d / "task.yaml").write_text(yaml.safe_dump({
            "id": "hub", "type": "deployment-tuning", "goal": "g", "point": "point.yaml",
            "contract": {"gates": [{"name": "t", "metric": "output_throughput",
                                    "at_least": 0.0}]},
            "exit": {"when": "all_gates_pass", "max_blocks": 1},
            "executor": {"kind": "sweep", "strategy": "grid"}}))
        ctx = EvalContext(workspace=workspace, task_id="hub", block_id="b1",
                          point=load_point(d / "point.yaml"),
                          profile=load_profile(d / "profile.yaml"))
        (run,) = EngineEvaluator(workspace, load_task(d / "task.yaml"), base_dir=d).evaluate(
            {}, repeats=1, ctx=ctx)
    assert run.success, run.error
    snap = tmp_path / "hf-cache" / "models--forge--tiny-llama" / "snapshots" / C2
    cmd = run.meta["launch_command"]
    assert cmd[cmd.index("--model-path") + 1] == str(snap)
    assert run.meta["deployment"]["weights"] == "real"
    (pulled,) = [r.event for r in workspace.ledger.stream("workspace") if r.type == "ModelPulled"]
    assert (pulled.name, pulled.recipe["revision"], pulled.recipe["commit"]) == (
        "forge/tiny-llama", "v1", C2)
    assert not (workspace.home / "models" / "tiny-llama").exists()  # nothing copied


def test_loading_the_embedding_model_leaves_the_process_online(monkeypatch):
    """The journal's MiniLM loads offline by argument; it used to set HF_HUB_OFFLINE in
    os.environ, which turned every later hub reference in the process offline."""
    import os

    from infer_forge.projections.embed import load_model

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert load_model() is not None
    assert "HF_HUB_OFFLINE" not in os.environ and "TRANSFORMERS_OFFLINE" not in os.environ
