"""The human gate (harness/guard/approvals.py): approvals bound to one exact action, used
once, expiring on the module's clock (set here, never slept on), decided by people only.

Each refused attempt is refused AND recorded: a reused approval (for the same action again,
or offered for another one), an expired one, an agent granting (through the real MCP client:
no tool grants; and calling `decide` directly). End to end: a task whose contract says
`human: required` waits after its verification, `forge approve` + `forge task resume`
accept it (the approval used once), `forge deny` turns the acceptance into a rejection; a
protected push leaves a pending approval that `forge approve` grants, and the push then goes
through, once.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.guard import approvals as A
from infer_forge.harness.guard.human_channel import os_user
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.run import run_task
from infer_forge.ledger import events as E
from infer_forge.ledger.errors import ConflictError
from infer_forge.ledger.specs import Contract, canonical
from infer_forge.ledger.streams import APPROVALS_STREAM, REPOS_STREAM, task_stream
from infer_forge.projections.memory import task_memory

from tests.conftest import run_forge

from ...repos.test_repos_push_guard import _bare, _commit, _main, _member, _remote_ref, mono  # noqa: F401
from ..loop.test_loop import make_task_dir
from ..mcp.test_mcp import call, events, stdio_client

ANA = E.Actor.human("ana")
BOT = E.Actor.agent("coder", "some-model-1")
URL = "http://prod.example:30000"
FLUSH = ("production-call", URL, {"method": "POST", "path": "/flush_cache"})
RELOAD = ("production-call", URL, {"method": "POST", "path": "/update_weights_from_disk"})


class Clock:
    """The gate's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(A, "clock", c)
    return c


def approvals_log(ws, kind: type[E.Event] | None = None) -> list:
    evs = [r.event for r in ws.ledger.stream(APPROVALS_STREAM)]
    return [e for e in evs if kind is None or isinstance(e, kind)]


def granted(ws, action=FLUSH, **kw) -> str:
    aid = A.request(ws, *action, summary="flush the prefix cache", actor=BOT, **kw)
    A.decide(ws, aid, True, "maintenance window", ANA)
    return aid


# --- bound to one action, used once ----------------------------------------------------


def test_a_grant_is_used_once_and_not_reused_for_another_action(workspace, clock):
    aid = granted(workspace)
    assert A.require(workspace, *FLUSH, actor=BOT) == aid
    [used] = approvals_log(workspace, E.ApprovalUsed)
    assert (used.approval_id, used.action_digest) == (aid, A.action_digest(*FLUSH))
    assert used.actor == BOT

    # The same action again: the approval is spent; that is refused and recorded, and a new
    # request waits for a person.
    with pytest.raises(A.ApprovalWaiting, match="forge approve appr-") as again:
        A.require(workspace, *FLUSH, actor=BOT)
    assert again.value.approval_id != aid
    [stale] = approvals_log(workspace, E.ApprovalRefused)
    assert stale.approval_id == aid and "already used" in stale.reason
    assert [a.approval_id for a in A.pending(workspace)] == [again.value.approval_id]

    # The approval offered for another action: refused, recorded, nothing used.
    with pytest.raises(HarnessError, match=f"approval {aid} was asked for production-call"):
        A.require(workspace, *RELOAD, actor=BOT, approval_id=aid)
    other = approvals_log(workspace, E.ApprovalRefused)[-1]
    assert (other.approval_id, other.action_digest) == (aid, A.action_digest(*RELOAD))
    assert len(approvals_log(workspace, E.ApprovalUsed)) == 1


def test_arguments_are_part_of_the_action(workspace, clock):
    granted(workspace)
    with pytest.raises(A.ApprovalWaiting):  # same kind and target, other arguments
        A.require(workspace, "production-call", URL,
                  {"method": "POST", "path": "/flush_cache", "all": True}, actor=BOT)
    assert approvals_log(workspace, E.ApprovalUsed) == []


def test_asking_again_while_pending_returns_the_same_request(workspace, clock):
    one = A.request(workspace, *FLUSH, summary="x", actor=BOT)
    two = A.request(workspace, *FLUSH, summary="y", actor=ANA)
    with pytest.raises(A.ApprovalWaiting) as w:
        A.require(workspace, *FLUSH, actor=BOT)
    assert one == two == w.value.approval_id
    assert len(approvals_log(workspace, E.ApprovalRequested)) == 1


def test_two_racers_cannot_both_use_one_approval(workspace, clock):
    aid = granted(workspace)
    seen = A.check(workspace, *FLUSH, actor=BOT)  # racer 1 read: granted, its use prepared
    assert seen.state == "granted" and seen.use is not None
    assert A.require(workspace, *FLUSH, actor=ANA) == aid  # racer 2 uses it first
    with pytest.raises(ConflictError):  # racer 1's use expects the version it read
        workspace.ledger.save(seen.use)
    assert [u.actor for u in approvals_log(workspace, E.ApprovalUsed)] == [ANA]


# --- expiry ------------------------------------------------------------------------------


def test_an_expired_approval_is_refused_and_recorded(workspace, clock):
    aid = granted(workspace, ttl_s=60)
    clock.now += timedelta(seconds=61)
    with pytest.raises(A.ApprovalWaiting) as w:
        A.require(workspace, *FLUSH, actor=BOT)
    assert w.value.approval_id != aid
    [refused] = approvals_log(workspace, E.ApprovalRefused)
    assert refused.approval_id == aid and "expired at 2030-01-01T00:01:00" in refused.reason
    assert approvals_log(workspace, E.ApprovalUsed) == []
    rows = {r["approval_id"]: r for r in A.listing(workspace, everything=True)}
    assert rows[aid]["state"] == "expired"


def test_an_expired_request_cannot_be_granted(workspace, clock):
    aid = A.request(workspace, *FLUSH, summary="x", actor=BOT, ttl_s=30)
    clock.now += timedelta(seconds=30)
    with pytest.raises(HarnessError, match=f"cannot grant approval {aid} expired"):
        A.decide(workspace, aid, True, "late", ANA)
    assert approvals_log(workspace, E.ApprovalGranted) == []
    assert A.pending(workspace) == []


def test_within_its_time_a_grant_is_used(workspace, clock):
    aid = granted(workspace, ttl_s=60)
    clock.now += timedelta(seconds=59)
    assert A.require(workspace, *FLUSH, actor=BOT) == aid


# --- people decide, agents ask -----------------------------------------------------------


def test_an_agent_granting_directly_is_refused_and_recorded(workspace, clock):
    aid = A.request(workspace, *FLUSH, summary="x", actor=BOT)
    for grant in (True, False):
        with pytest.raises(HarnessError, match="only a person decides"):
            A.decide(workspace, aid, grant, "looks fine to me", BOT)
    refusals = approvals_log(workspace, E.ApprovalRefused)
    assert [r.actor for r in refusals] == [BOT, BOT]
    assert all(r.approval_id == aid for r in refusals)
    assert [a.approval_id for a in A.pending(workspace)] == [aid]
    with pytest.raises(HarnessError, match="only a person"):  # a tool is no person either
        A.decide(workspace, aid, True, "auto", E.Actor.tool("ci"))


def test_an_agent_over_mcp_can_ask_but_has_no_way_to_grant(forge_home):
    assert run_forge("init").returncode == 0

    async def session() -> tuple[set[str], dict, str]:
        async with stdio_client(forge_home) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            asked = await call(c, "request_approval", {
                "kind": "production-call", "target": URL,
                "arguments": {"method": "POST", "path": "/flush_cache"},
                "summary": "the cache is stale"})
            why = await call(c, "grant_approval", {"approval_id": asked["approval_id"]},
                             ok=False)
            return names, asked, why

    names, asked, why = asyncio.run(session())
    assert "request_approval" in names
    assert not {n for n in names if any(w in n for w in ("grant", "approve", "deny",
                                                          "decide"))}
    assert asked["state"] == "pending" and "forge approve" in asked["next"]
    assert "unknown tool 'grant_approval'" in why
    [req] = [e for e in events(forge_home, APPROVALS_STREAM)
             if isinstance(e, E.ApprovalRequested)]
    assert req.actor.kind == "agent" and req.approval_id == asked["approval_id"]
    assert not [e for e in events(forge_home, APPROVALS_STREAM)
                if isinstance(e, E.ApprovalGranted)]
    failed = [e for e in events(forge_home, "agents") if isinstance(e, E.AgentStepFailed)]
    assert [f.tool for f in failed] == ["grant_approval"]  # the attempt is recorded
    # A person decides it from the CLI.
    r = run_forge("approve", asked["approval_id"], "--reason", "ok", "--by", "ana", "--json")
    assert r.returncode == 0, r.stderr
    # The OS user and the channel are who granted; --by is only what they said.
    assert json.loads(r.stdout)["decided_by"] == {
        "kind": "human", "name": f"{os_user()} via key, says ana", "model": None}


# --- deny, wait, the CLI -----------------------------------------------------------------


def test_deny_and_the_cli(workspace):
    aid = A.request(workspace, *FLUSH, summary="flush it", actor=BOT)
    shown = run_forge("approvals")
    assert shown.returncode == 0 and aid in shown.stdout and "pending" in shown.stdout
    r = run_forge("deny", aid, "--reason", "not during the freeze", "--by", "bo", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["state"] == "denied"
    assert run_forge("approvals").stdout.strip() == "nothing waits for approval"
    rows = json.loads(run_forge("approvals", "--all", "--json").stdout)
    assert [(x["approval_id"], x["state"], x["reason"]) for x in rows] == [
        (aid, "denied", "not during the freeze")]
    again = run_forge("approve", aid, "--reason", "changed my mind")
    assert again.returncode != 0
    assert f"already denied by human {os_user()} via cli, says bo" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    ghost = run_forge("approve", "appr-000000000000", "--reason", "x")
    assert ghost.returncode != 0 and "no approval 'appr-000000000000'" in ghost.stderr
    assert approvals_log(workspace, E.ApprovalGranted) == []


def test_a_waiting_caller_sees_the_decision(workspace):
    aid = A.request(workspace, *FLUSH, summary="x", actor=BOT)
    got: dict = {}

    def wait() -> None:
        try:
            got["id"] = A.require(workspace, *FLUSH, actor=BOT, wait=True, timeout_s=60,
                                  poll_s=0.05)
        except HarnessError as e:
            got["error"] = e

    t = threading.Thread(target=wait)
    t.start()
    r = run_forge("approve", aid, "--reason", "go", "--by", "ana")
    t.join(90)
    assert r.returncode == 0, r.stderr
    assert got == {"id": aid}
    assert len(approvals_log(workspace, E.ApprovalUsed)) == 1

    other = A.request(workspace, *RELOAD, summary="x", actor=BOT)
    result: dict = {}

    def wait_denied() -> None:
        try:
            A.require(workspace, *RELOAD, actor=BOT, wait=True, timeout_s=60, poll_s=0.05)
        except A.ApprovalDeniedError as e:
            result["denied"] = str(e)

    t = threading.Thread(target=wait_denied)
    t.start()
    assert run_forge("deny", other, "--reason", "no", "--by", "ana").returncode == 0
    t.join(90)
    assert f"approval {other}" in result["denied"]
    assert f"denied by human {os_user()} via cli, says ana: no" in result["denied"]


def test_waiting_gives_up_at_its_deadline(workspace):
    with pytest.raises(A.ApprovalWaiting, match="gave up after 0.2s: waiting for approval"):
        A.require(workspace, *FLUSH, actor=BOT, wait=True, timeout_s=0.2, poll_s=0.05)
    assert len(A.pending(workspace)) == 1


# --- acceptance under human: required ------------------------------------------------------


def human_task(root: Path) -> Path:
    path = make_task_dir(root)
    path.write_text(path.read_text().replace("contract:\n", "contract:\n  human: required\n"))
    return path


def test_a_contract_without_human_hashes_as_before():
    gates = [{"name": "g", "metric": "m", "at_least": 1}]
    assert "human" not in canonical(Contract(gates=gates))
    assert canonical(Contract(gates=gates, human="required"))["human"] == "required"


def test_human_required_acceptance_waits_for_approval_then_resumes(workspace, tmp_path):
    define_task(workspace, human_task(tmp_path / "specs"))
    r = run_task(workspace, "t1")
    assert r.status == "waiting" and "forge approve appr-" in str(r.exit_reason)
    mem = task_memory(workspace.ledger, "t1")
    b4 = mem.execution_record[-1]
    assert b4.block_id == "b4" and b4.verification["verdict"] == "pass"  # verified, recorded
    assert b4.decision is None and mem.status != "exited"
    [req] = A.pending(workspace)
    assert (req.kind, req.target) == ("accept", "t1:b4")
    assert req.arguments["candidate"] == {"engine.continuous_batching": True,
                                          "engine.attn_implementation": "eager"}
    assert req.approval_id in str(r.exit_reason)

    # Resuming without a decision: still waiting, on the same request, nothing new recorded.
    v = workspace.ledger.version(task_stream("t1"))
    assert run_task(workspace, "t1").status == "waiting"
    assert workspace.ledger.version(task_stream("t1")) == v
    assert len(approvals_log(workspace, E.ApprovalRequested)) == 1

    ok = run_forge("approve", req.approval_id, "--reason", "numbers checked", "--by", "ana")
    assert ok.returncode == 0, ok.stderr
    res = run_forge("task", "resume", "t1", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["exit_state"] == "delivered"
    mem = task_memory(workspace.ledger, "t1")
    assert [b.decision for b in mem.execution_record][-1] == "accepted"
    acc = [x.event for x in workspace.ledger.stream(task_stream("t1"))
           if isinstance(x.event, E.DeliverableAccepted)]
    assert len(acc) == 1 and req.approval_id in acc[0].evidence
    [used] = approvals_log(workspace, E.ApprovalUsed)
    assert used.approval_id == req.approval_id
    assert run_task(workspace, "t1").exit_state == "delivered"  # once
    assert len(approvals_log(workspace, E.ApprovalUsed)) == 1


def test_a_denied_acceptance_is_a_rejection(workspace, tmp_path):
    define_task(workspace, human_task(tmp_path / "specs"))
    assert run_task(workspace, "t1").status == "waiting"
    [req] = A.pending(workspace)
    A.decide(workspace, req.approval_id, False, "not this week", ANA)
    r = run_task(workspace, "t1")
    assert r.status == "exited" and r.exit_state == "follow-up-handoff"  # nothing left
    mem = task_memory(workspace.ledger, "t1")
    assert mem.accepted == []
    last = mem.rejected[-1]
    assert f"acceptance denied by ana ({req.approval_id}): not this week" == last["reason"]
    assert approvals_log(workspace, E.ApprovalUsed) == []


# --- a protected push ----------------------------------------------------------------------


def test_a_refused_push_waits_for_forge_approve_and_then_goes_through_once(
        tmp_path, workspace, mono):  # noqa: F811
    bare, member = _bare(tmp_path), _member(mono)
    before = _main(bare)
    new = _commit(member, "gate.txt")
    refused = run_forge("repos", "push", "alpha", "origin", "HEAD:main")
    assert refused.returncode != 0
    [line] = refused.stderr.strip().splitlines()
    assert _remote_ref(bare, "refs/heads/main") == before
    rows = json.loads(run_forge("approvals", "--json").stdout)
    [p] = rows
    assert (p["kind"], p["target"], p["arguments"]) == (
        "push", "alpha:origin:refs/heads/main", {"range": f"{before}..{new}"})
    assert f"forge approve {p['approval_id']}" in line
    # A plain git push of the same range (the hook) waits on the same request.
    assert subprocess.run(["git", "push", "-q", "origin", "HEAD:main"], cwd=member,
                          capture_output=True).returncode != 0
    assert len(approvals_log(workspace, E.ApprovalRequested)) == 1

    ok = run_forge("approve", p["approval_id"], "--reason", "hotfix", "--by", "ana")
    assert ok.returncode == 0, ok.stderr
    pushed = run_forge("repos", "push", "alpha", "origin", "HEAD:main", "--json")
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(pushed.stdout)["approval_id"] == p["approval_id"]
    assert _remote_ref(bare, "refs/heads/main") == new
    [used] = approvals_log(workspace, E.ApprovalUsed)
    assert used.approval_id == p["approval_id"]
    allowed = [r.event for r in workspace.ledger.stream(REPOS_STREAM)
               if isinstance(r.event, E.PushAllowed)]
    assert [a.approval_id for a in allowed] == [p["approval_id"]]

    # Once: the remote rewound, the same push is refused again, with a new request.
    subprocess.run(["git", "update-ref", "refs/heads/main", before], cwd=bare, check=True)
    again = run_forge("repos", "push", "alpha", "origin", "HEAD:main")
    assert again.returncode != 0
    assert _remote_ref(bare, "refs/heads/main") == before
    [p2] = json.loads(run_forge("approvals", "--json").stdout)
    assert p2["approval_id"] != p["approval_id"]
    assert len(approvals_log(workspace, E.ApprovalUsed)) == 1
    # `forge repos approve` of that push grants that very request.
    r = run_forge("repos", "approve", "alpha", "--ref", "main", "--range", f"{before}..{new}",
                  "--reason", "again", "--by", "bo", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["approval_id"] == p2["approval_id"]
    assert A.pending(workspace) == []
