"""The handoff between tasks made real: `context.prior_tasks` must name defined tasks and reach
the agent (their exits, handoffs and best results); `forge task new FILE --from TASK` starts
the successor from the prior task's handoff (`context.start_from`); `context.repos` names
MonoRepo members at a ref. Real ledger, real CLI, the agent against `ScriptedChat` (the LLM
boundary only)."""

from __future__ import annotations

import json

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import (
    exit_task,
    handoff_block,
    record_measurement,
    start_block,
    verify_block,
)
from infer_forge.harness.loop.run import run_task
from infer_forge.harness.testing.scripted_chat import ScriptedChat
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.workspace import open_workspace
from infer_forge.projections.memory import task_memory, task_summary

from tests.conftest import run_forge

from .test_agent_executor import CB_EAGER, call, propose, setup
from .test_loop import make_task_dir

METRICS = {"output_throughput": 100.0, "median_ttft_ms": 90.0, "token_match": 1.0}
NEXT = "try continuous batching with eager attention"


def _prior(ws, root, task_id: str = "p1") -> None:
    """A manual task measured once, handed off and exited with a follow-up handoff."""
    define_task(ws, make_task_dir(root / task_id, task_id, executor="{kind: manual}"))
    start_block(ws, task_id, "baseline")
    for _ in range(3):
        record_measurement(ws, task_id, METRICS)
    verify_block(ws, task_id)
    handoff_block(ws, task_id, state_reached="baseline measured: 100 tok/s",
                  findings=["sdpa is the default"], next_sub_goal=NEXT)
    exit_task(ws, task_id, "follow-up-handoff", "out of time",
              handoff="batching was never tried; start there")


def _with_context(path, context: str):
    path.write_text(path.read_text() + f"context: {context}\n")
    return path


def test_unknown_or_own_prior_task_is_refused_naming_field_and_value(workspace, tmp_path):
    path = _with_context(make_task_dir(tmp_path / "a", "a1"), "{prior_tasks: [does-not-exist]}")
    with pytest.raises(HarnessError, match=r"context\.prior_tasks\[0\]: 'does-not-exist' is not "
                       r"a defined task"):
        define_task(workspace, path)
    path = _with_context(make_task_dir(tmp_path / "b", "b1"), "{prior_tasks: [b1]}")
    with pytest.raises(HarnessError, match=r"context\.prior_tasks\[0\]: 'b1' is this task"):
        define_task(workspace, path)
    path = _with_context(make_task_dir(tmp_path / "c", "c1"),
                         "{start_from: {task_id: x1}}")
    with pytest.raises(HarnessError, match=r"context\.start_from\.task_id: 'x1' is not in "
                       r"context\.prior_tasks"):
        define_task(workspace, path)
    for t in ("a1", "b1", "c1"):
        assert workspace.ledger.version(task_stream(t)) == 0


def test_repos_without_a_monorepo_or_malformed_are_refused(workspace, tmp_path):
    path = _with_context(make_task_dir(tmp_path / "r", "r1"), "{repos: [sglang@main]}")
    with pytest.raises(HarnessError, match=r"context\.repos: the workspace has no MonoRepo"):
        define_task(workspace, path)
    assert workspace.ledger.version(task_stream("r1")) == 0


def test_repos_are_kept_as_the_commits_they_name(workspace, tmp_path):
    import subprocess

    from infer_forge.repos import commands as rc

    from tests.helpers.gitrepos import make_remote, write_manifest

    remote = make_remote(tmp_path, "kernels", {"value.txt": "0\n"},
                         branches={"two": {"value.txt": "2\n"}})
    rc.init(workspace, write_manifest(tmp_path / "m.yaml", [
        {"name": "kernels", "url": str(remote)}]))
    two = subprocess.run(["git", "-C", str(rc.open_monorepo(workspace).member_dir("kernels")),
                          "rev-parse", "origin/two"], check=True, capture_output=True,
                         text=True).stdout.strip()
    define_task(workspace, _with_context(make_task_dir(tmp_path / "k", "k1"),
                                         "{repos: [kernels@two]}"))
    assert task_memory(workspace.ledger, "k1").definition["context"]["repos"] == \
        [f"kernels@{two}"]
    for entry, says in (
            ("kernels@nope", r"context\.repos\[0\]: 'kernels@nope' is not a commit, branch "
             "or tag of member kernels"),
            ("other@main", r"context\.repos\[0\]: 'other@main': "),
            ("kernels", r"context\.repos\[0\]: 'kernels': give MEMBER@REF")):
        path = _with_context(make_task_dir(tmp_path / "x", "x1"), f"{{repos: ['{entry}']}}")
        with pytest.raises(HarnessError, match=says):
            define_task(workspace, path)
    assert workspace.ledger.version(task_stream("x1")) == 0


def test_cli_refuses_an_unknown_prior_task_in_one_line(forge_home, tmp_path):
    assert run_forge("init").returncode == 0
    path = _with_context(make_task_dir(tmp_path / "s", "s1"), "{prior_tasks: [nope]}")
    p = run_forge("task", "new", str(path))
    assert p.returncode != 0 and "context.prior_tasks[0]: 'nope' is not a defined task" in \
        p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_task_new_from_starts_the_successor_from_the_handoff(forge_home, tmp_path):
    assert run_forge("init").returncode == 0
    with open_workspace(forge_home) as ws:
        _prior(ws, tmp_path)
        define_task(ws, make_task_dir(tmp_path / "run", "running", executor="{kind: manual}"))
        start_block(ws, "running", "baseline")
    succ = make_task_dir(tmp_path / "n", "n1", executor="{kind: manual}")
    for bad, says in (("running", "task 'running' has not exited (status running)"),
                      ("ghost", "--from: 'ghost' is not a defined task")):
        p = run_forge("task", "new", str(succ), "--from", bad)
        assert p.returncode != 0 and says in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
    p = run_forge("task", "new", str(succ), "--from", "p1", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["created"] is True
    with open_workspace(forge_home) as ws:
        mem = task_memory(ws.ledger, "n1")
        ctx = mem.definition["context"]
        assert ctx["prior_tasks"] == ["p1"]
        assert ctx["start_from"] == {
            "task_id": "p1", "exit_state": "follow-up-handoff", "exit_reason": "out of time",
            "handoff": "batching was never tried; start there",
            "state_reached": "baseline measured: 100 tok/s",
            "findings": ["sdpa is the default"], "next_sub_goal": NEXT}
        # The successor's first block is the one its predecessor proposed.
        assert mem.next_block == {"index": 1, "sub_goal": NEXT}
        show = task_summary(ws.ledger, "n1")
        (prior,) = show["prior_tasks"]
        assert prior["task_id"] == "p1" and prior["exit_state"] == "follow-up-handoff"
        assert prior["exit_handoff"] == "batching was never tried; start there"
        assert prior["last_handoff"]["next_sub_goal"] == NEXT
        assert prior["best_so_far"]["median"] == 100.0
    p = run_forge("task", "show", "n1")
    assert p.returncode == 0, p.stderr
    assert f"follows p1 (follow-up-handoff): next {NEXT}" in p.stdout
    assert "prior task p1: exited (follow-up-handoff), best output_throughput 100.0; " \
        "handoff: batching was never tried; start there" in p.stdout
    # The same command again is the same definition (idempotent).
    p = run_forge("task", "new", str(succ), "--from", "p1")
    assert p.returncode == 0 and "already defined" in p.stdout


def test_a_reopened_prior_task_has_no_exit_handoff(workspace, tmp_path):
    from infer_forge.harness.loop.manual import reopen_task

    _prior(workspace, tmp_path)
    assert task_memory(workspace.ledger, "p1").task.exit_handoff == \
        "batching was never tried; start there"
    reopen_task(workspace, "p1", "more time")
    assert task_memory(workspace.ledger, "p1").task.exit_handoff is None


def test_the_agent_reads_its_prior_tasks(forge_home, tmp_path):
    from infer_forge.ledger.workspace import init_workspace

    ws, _ = init_workspace(forge_home)
    _prior(ws, tmp_path)
    ws.close()
    with ScriptedChat([call("task_show", {"task_id": "t1"}), propose(CB_EAGER, NEXT)]) as chat:
        ws, _ = setup(forge_home, tmp_path, {"small": chat.url},
                      extra_yaml="context: {prior_tasks: [p1]}\n")
        r = run_task(ws, "t1")
    assert r.exit_state == "delivered"
    # task_show (the agent's tool, as the MCP's) carries the prior tasks' briefs.
    shown = json.loads(chat.requests[1]["messages"][-1]["content"])
    assert [p["task_id"] for p in shown["prior_tasks"]] == ["p1"]
    assert shown["prior_tasks"][0]["exit_handoff"] == "batching was never tried; start there"
    system = chat.requests[0]["messages"][0]["content"]
    head, _, prior = system.partition("## Prior tasks")
    assert prior, "no prior tasks section in the agent's prompt"
    seen = json.loads(prior.split("\n", 2)[1])
    assert seen[0]["task_id"] == "p1" and seen[0]["exit_state"] == "follow-up-handoff"
    assert seen[0]["exit_handoff"] == "batching was never tried; start there"
    assert seen[0]["last_handoff"]["next_sub_goal"] == NEXT
    assert seen[0]["best_so_far"]["median"] == 100.0
    assert '"prior_tasks": ["p1"]' in head  # the task view names them too
    ws.close()


def test_model_calls_are_in_the_index_and_sql_sums_cost_per_task_and_tier(forge_home,
                                                                           tmp_path):
    """Real ModelCalled events (the agent executor against ScriptedChat, priced by
    forge.toml) become `model_calls` rows; `forge sql` sums them per task and tier, and a
    rebuild gives the same index as the incremental catch-up."""
    from infer_forge.ledger import events as E
    from infer_forge.projections.index import open_index, rebuild
    from infer_forge.projections.index.schema import fingerprint

    with ScriptedChat([propose(CB_EAGER, NEXT)]) as chat:
        ws, _ = setup(forge_home, tmp_path, {"small": chat.url})
        assert run_task(ws, "t1").exit_state == "delivered"
    calls = [r.event for r in ws.ledger.stream(task_stream("t1"))
             if isinstance(r.event, E.ModelCalled)]
    assert calls and all(c.cost_usd > 0 for c in calls)
    ws.close()
    p = run_forge("sql", "SELECT task_id, tier, model, purpose, count(*) AS calls, "
                  "sum(tokens_in + tokens_out) AS tokens, sum(cost_usd) AS cost "
                  "FROM model_calls GROUP BY ALL", "--json")
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(p.stdout)
    assert row["task_id"] == "t1" and row["tier"] == "small" and row["calls"] == len(calls)
    assert (row["model"], row["purpose"]) == ("small-model", "executor")
    assert row["tokens"] == sum(c.tokens_in + c.tokens_out for c in calls)
    assert row["cost"] == pytest.approx(sum(c.cost_usd for c in calls))
    with open_workspace(forge_home) as ws:
        with open_index(ws) as q:
            got = q.con.execute("SELECT event_id, block_id, success FROM model_calls "
                                "ORDER BY position").fetchall()
            assert got == [(str(c.event_id), c.block_id, True) for c in calls]
            incremental = fingerprint(q.con)
        rebuild(ws)
        with open_index(ws) as q:
            assert fingerprint(q.con) == incremental
