"""`forge ab` end to end: two commits of an SGLang-shaped repository (tests/helpers/
sglang_repo.py: SGLang's layout and setuptools-scm versioning) as a MonoRepo member, each
built into its own environment layered on a base environment with a released sglang
installed, deployed at one point, checked to be the build it claims, measured and judged.
Real git, real pip, real servers on 127.0.0.1, the real CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.workspace import open_workspace
from infer_forge.repos import commands as rc
from infer_forge.repos.git import git, out

from tests.conftest import run_forge
from tests.helpers.gitrepos import write_manifest
from tests.helpers.sglang_repo import (
    DEPLOY_INSTALL,
    SGLangRepo,
    ab_spec,
    installed_base,
    make_sglang_repo,
    python_of,
)

INSTALL = DEPLOY_INSTALL  # as docs/ab.md has it


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> tuple[SGLangRepo, Path, str]:
    """The repository (plus a `claims-release` branch whose server reports the base's
    version, not its own), the base environment's Python, and `lying`'s commit."""
    tmp = tmp_path_factory.mktemp("ab-stack")
    repo = make_sglang_repo(tmp / "sglang")
    git(["checkout", "-q", "-b", "claims-release", repo.main], repo.path)
    p = repo.path / "python/sglang/launch_server.py"
    p.write_text(p.read_text().replace("FAKE_SGLANG_VERSION=__version__",
                                       'FAKE_SGLANG_VERSION="0.5.23"'))
    assert 'FAKE_SGLANG_VERSION="0.5.23"' in p.read_text()  # the fixture's text changed
    git(["commit", "-qam", "launch_server: claim the release"], repo.path,
        env={"GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@x", "GIT_COMMITTER_NAME": "x",
             "GIT_COMMITTER_EMAIL": "x@x"})
    lying = out(["rev-parse", "HEAD"], repo.path)
    git(["checkout", "-q", "main"], repo.path)
    base = python_of(installed_base(tmp / "base"))
    return repo, base, lying


@pytest.fixture
def ab_home(stack, tmp_path, forge_home, tiny_model):
    repo, base, _ = stack
    run_forge("init", home=forge_home)
    ws = open_workspace(forge_home)
    rc.init(ws, write_manifest(tmp_path / "stack.yaml", [
        {"name": "sglang", "url": str(repo.path), "branch": "main",
         "deploy": {"install": INSTALL, "module": "sglang"}}]))
    ws.close()
    models = forge_home / "models"
    models.mkdir(exist_ok=True)
    shutil.copytree(tiny_model, models / tiny_model.name)
    point = ab_spec(tmp_path / "spec", base, slo={"ttft_ms": {"p50": 5000}})
    return forge_home, point


def _ab(home: Path, point: Path, *args: str):
    r = run_forge("ab", "--point", str(point), "--json", *args, home=home, timeout=600)
    return r, (json.loads(r.stdout) if r.stdout.strip().startswith("{") else None)


def test_ab_builds_deploys_verifies_and_accepts_the_faster_commit(stack, ab_home):
    repo, _, _ = stack
    home, point = ab_home
    r, res = _ab(home, point, "--base", "main", "--candidate", "fast")
    assert r.returncode == 0, r.stderr[-3000:]
    assert res["verdict"] == "accepted", res
    # Each side ran its own build, and its server reported that build's version: the base
    # its release tag, the candidate setuptools-scm's dev version naming its commit.
    assert res["base"]["commit"] == repo.main and res["candidate"]["commit"] == repo.fast
    assert res["base"]["build"]["server_version"] == repo.version_of("main") == "0.5.24"
    cand = res["candidate"]["build"]
    assert cand["server_version"] == repo.version_of("fast")
    assert cand["server_version"].endswith("+g" + repo.sha7(repo.fast))
    assert cand["commit_id"] == "g" + repo.sha7(repo.fast)
    gates = {g["name"]: g for g in res["gates"]}
    assert gates["faster"]["verdict"] == "pass" and gates["faster"]["ci"][0] > 1.0
    assert gates["correctness"]["verdict"] == "pass"
    assert {"path": "code.sglang", "baseline": repo.main, "candidate": repo.fast} in \
        res["differs"]
    # A normal task in the ledger: builds as tool calls, measurements naming their build.
    ws = open_workspace(home)
    evs = [s.event for s in ws.ledger.stream(task_stream(res["task_id"]))]
    builds = [e for e in evs if isinstance(e, E.ToolInvoked) and e.tool == "deploy-build"]
    assert len(builds) == 2 and all(e.exit_code == 0 for e in builds)
    ms = [e for e in evs if isinstance(e, E.MeasurementRecorded)]
    assert {m.meta["builds"]["sglang"]["commit"] for m in ms} == {repo.main, repo.fast}
    ws.close()
    # Again: a new task, the same builds from the cache.
    r2, res2 = _ab(home, point, "--base", "main", "--candidate", "fast")
    assert r2.returncode == 0, r2.stderr[-2000:]
    assert res2["task_id"] == res["task_id"] + "-2"
    assert res2["base"]["build"]["cached"] and res2["candidate"]["build"]["cached"]
    shown = run_forge("task", "show", res["task_id"], home=home)
    assert "code.sglang" in shown.stdout and "accepted" in shown.stdout
    # In the index like any task: its gates by SQL.
    q = run_forge("sql", f"SELECT block_id, gate, verdict FROM gate_verdicts WHERE task_id = "
                  f"'{res['task_id']}' AND gate = 'faster'", "--json", home=home)
    assert q.returncode == 0, q.stderr
    assert [(r["block_id"], r["verdict"]) for r in json.loads(q.stdout)] == [("b2", "pass")]


def test_ab_refuses_a_build_that_fell_back_and_a_server_that_is_not_the_build(stack, ab_home):
    repo, _, lying = stack
    home, point = ab_home
    r, res = _ab(home, point, "--base", "main", "--candidate", "broken-install")
    assert r.returncode == 1, r.stderr[-2000:]
    assert res["verdict"] == "not measured"
    assert "installed no sglang" in res["reason"] and "0.5.23" in res["reason"]
    assert "fell back" in res["reason"]
    # A build whose server reports the installed release instead of itself: not measured.
    r, res = _ab(home, point, "--base", "main", "--candidate", lying)
    assert r.returncode == 1, r.stderr[-2000:]
    assert res["verdict"] == "not measured"
    assert "0.5.23" in res["reason"] and repo.sha7(lying) in res["reason"], res["reason"]
    # Bad input: one line naming the flag and the ref.
    bad = run_forge("ab", "--point", str(point), "--base", "main", "--candidate", "nope",
                    home=home)
    assert bad.returncode != 0 and "--candidate 'nope'" in bad.stderr


def test_an_agent_edits_the_member_and_its_commit_is_built_deployed_and_accepted(
        stack, ab_home, tmp_path, monkeypatch):
    """The agent executor's `code.sglang` candidate: it writes the decode loop in the task's
    worktree and proposes the worktree's state; the loop commits it, builds that commit and
    measures it against the base's build."""
    from infer_forge.harness.loop.define import define_task
    from infer_forge.harness.loop.run import run_task
    from infer_forge.harness.testing.scripted_chat import ScriptedChat

    from tests.harness.loop.test_agent_executor import KEY, KEY_ENV, call, models_toml, propose

    repo, _, _ = stack
    home, point = ab_home
    monkeypatch.setenv(KEY_ENV, KEY)
    task = tmp_path / "spec" / "agent-ab.yaml"
    task.write_text(yaml.safe_dump({
        "id": "agent-ab", "type": "engine-integration",
        "goal": "Make SGLang's decode step faster at this point without changing outputs",
        "point": "point.yaml",
        "code": {"members": ["sglang"], "base": {"sglang": "main"}},
        "contract": {"gates": [
            {"name": "faster", "metric": "output_throughput", "vs_baseline": "ratio",
             "at_least": 1.0},
            {"name": "correctness", "metric": "token_match", "at_least": 0.99},
            {"name": "stability", "repeats": 3, "max_failed_requests": 0}],
            "more_runs": 3},  # a trending side (a busy machine) gets extra runs
        "exit": {"when": "all_gates_pass", "max_blocks": 3},
        "executor": {"kind": "agent"}}))
    worktree = home / "worktrees" / "agent-ab" / "sglang"
    scheduler = worktree / "python/sglang/srt/managers/scheduler.py"
    edit = {"task_id": "agent-ab", "path": str(scheduler),
            "content": '"""The decode loop."""\n\nDECODE_DELAY_MS = 1.0\n'}
    # A third decision (b2 not accepted) stops rather than finding the script spent.
    with ScriptedChat([call("write_file", edit),
                       propose({"code.sglang": "worktree"}, "a faster decode step"),
                       call("stop", {"reason": "b2 was not accepted"})]) as chat:
        with open(home / "forge.toml", "a") as f:
            f.write("\n[wiki]\nembeddings = false\n\n" + models_toml({"small": chat.url}))
        ws = open_workspace(home)
        define_task(ws, task)
        r = run_task(ws, "agent-ab")
    b1, b2 = r.memory.execution_record[:2]
    tool = json.loads(chat.requests[1]["messages"][-1]["content"])
    assert r.exit_state == "delivered", (r.exit_reason, tool, b2.decision_reason, [
        (m["success"], m.get("error"), m["metrics"].get("failed")) for m in b2.measurements])
    assert b1.decision is None and b2.decision == "accepted"
    sha = b2.candidate["code.sglang"]
    member = rc.open_monorepo(ws).member_dir("sglang")
    assert out(["show", f"{sha}:python/sglang/srt/managers/scheduler.py"], member) \
        .endswith("DECODE_DELAY_MS = 1.0")
    base_build = b1.measurements[0]["meta"]["builds"]["sglang"]
    cand_build = b2.measurements[0]["meta"]["builds"]["sglang"]
    assert base_build["commit"] == repo.main and base_build["server_version"] == "0.5.24"
    assert cand_build["commit"] == sha
    assert cand_build["server_version"] == f"0.5.25.dev1+g{sha[:7]}"
    ws.close()
