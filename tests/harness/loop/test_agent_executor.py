"""The agent executor (`executor: {kind: agent}`) driven for real: the loop, the ledger, the
command evaluator and the official `openai` client against local OpenAI-protocol servers
(`ScriptedChat`: the only fake, at the LLM boundary) configured as `[models.<tier>]` in the
test's forge.toml; once against the project's tiny model served by `transformers serve`.

The evaluator is tests/harness/loop/test_loop.py's: continuous batching with eager attention passes
every gate (delivered); continuous batching with sdpa breaks the TTFT SLO (rejected, no progress).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.loop.agent_executor import AgentExecutor
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.run import run_task
from infer_forge.harness.testing.scripted_chat import ScriptedChat
from infer_forge.ledger import events as E
from infer_forge.ledger.specs import load_task
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.workspace import init_workspace, open_workspace

from tests.conftest import FORGE, REPO, run_forge

from .test_loop import make_task_dir

CB_EAGER = {"engine.continuous_batching": True, "engine.attn_implementation": "eager"}
CB_SDPA = {"engine.continuous_batching": True, "engine.attn_implementation": "sdpa"}
EAGER = {"engine.attn_implementation": "eager"}
KEY_ENV = "FORGE_TEST_AGENT_KEY"
KEY = "sk-forgetest-" + "9f3ac1d27be04b65a8d1e0c4f7a2b3c9"


def propose(cand: dict, sub_goal: str = "try it") -> dict:
    return {"tool_calls": [{"name": "propose", "arguments": {"candidate": cand,
                                                             "sub_goal": sub_goal}}]}


def call(name: str, arguments: dict | str | None = None) -> dict:
    return {"tool_calls": [{"name": name, "arguments": {} if arguments is None else arguments}]}


def models_toml(tiers: dict[str, str], *, timeout_s: float = 30.0, key: bool = True) -> str:
    out = []
    for tier, url in tiers.items():
        out.append(f'[models.{tier}]\nurl = "{url}"\nmodel = "{tier}-model"\n'
                   f'family = "{tier}-family"\nprice_in_per_mtok = 1.0\n'
                   f'price_out_per_mtok = 4.0\ntimeout_s = {timeout_s}\n'
                   + (f'api_key_env = "{KEY_ENV}"\n' if key else ""))
    return "\n".join(out)


def setup(home: Path, tmp: Path, tiers: dict[str, str], *, executor: str = "{kind: agent}",
          extra_yaml: str = "", exit_extra: str = "", timeout_s: float = 30.0, **kw):
    """A workspace whose forge.toml names the tiers, and a defined agent task t1."""
    ws, _ = init_workspace(home)
    ws.close()
    with open(home / "forge.toml", "a") as f:  # skills by task type (no MiniLM load)
        f.write("\n[wiki]\nembeddings = false\n\n" + models_toml(tiers, timeout_s=timeout_s))
    ws = open_workspace(home)
    path = make_task_dir(tmp / "specs", executor=executor, **kw)
    text = path.read_text()
    if exit_extra:
        text = text.replace("when: all_gates_pass}", f"when: all_gates_pass, {exit_extra}}}")
    path.write_text(text + extra_yaml)
    define_task(ws, path)
    return ws, path


def events(ws, task_id: str = "t1") -> list[E.Event]:
    return [r.event for r in ws.ledger.stream(task_stream(task_id))]


def of_block(evs: list[E.Event], block_id: str | None, cls: type) -> list:
    return [e for e in evs if isinstance(e, cls) and e.block_id == block_id]


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)


def test_agent_reads_memory_proposes_and_delivers(forge_home, tmp_path):
    with ScriptedChat([call("task_memory"), propose(CB_EAGER, "batching with eager")]) as chat:
        ws, _ = setup(forge_home, tmp_path, {"small": chat.url})
        r = run_task(ws, "t1")
    assert (r.exit_state, r.blocks) == ("delivered", 2)
    b2 = r.memory.execution_record[1]
    assert b2.candidate == CB_EAGER and b2.sub_goal == "batching with eager"
    assert b2.routing == {"executor": "agent", "model_tier": "small", "agent_topology": "single",
                          "model": "small-model", "family": "small-family"}
    # The baseline block decides nothing; b2's decision: two calls, both offered the tools.
    assert len(chat.requests) == 2
    offered = {t["function"]["name"] for t in chat.requests[0]["tools"]}
    assert {"task_memory", "task_show", "write_file", "run_command", "propose",
            "stop"} <= offered
    assert not offered & {"block_start", "block_verify", "block_handoff", "measure"}
    system = chat.requests[0]["messages"][0]["content"]
    assert "Raise output throughput" in system and "engine.continuous_batching" in system
    # The second call carries the memory tool's answer (Task Memory in brief).
    tool_msg = chat.requests[1]["messages"][-1]
    assert tool_msg["role"] == "tool" and '"best_so_far"' in tool_msg["content"]
    assert '"execution_record"' not in tool_msg["content"]
    assert chat.requests[1]["messages"][-2]["tool_calls"][0]["function"]["name"] == "task_memory"
    evs = events(ws)
    started = of_block(evs, "b2", E.LoopBlockStarted)[0]
    assert started.actor == E.Actor.agent("forge-agent", "small-model")
    calls = of_block(evs, "b2", E.ModelCalled)
    assert [(c.tier, c.model, c.family, c.purpose, c.success) for c in calls] == \
        [("small", "small-model", "small-family", "executor", True)] * 2
    for c in calls:
        assert c.tokens_in > 100 and c.tokens_out > 0 and c.latency_s > 0
        assert c.cost_usd == pytest.approx((c.tokens_in * 1.0 + c.tokens_out * 4.0) / 1e6)
        prompt = json.loads(ws.artifacts.get(c.prompt_digest))
        assert prompt["model"] == "small-model" and prompt["messages"][0]["role"] == "system"
        assert json.loads(ws.artifacts.get(c.response_digest))["choices"][0]["message"]
    assert [t.tool for t in of_block(evs, "b2", E.ToolInvoked)][0] == "agent:task_memory"
    # The saved block: started, then what deciding recorded, then the loop's steps.
    b2_types = [e.TYPE for e in evs if e.block_id == "b2"]
    assert b2_types[:5] == ["LoopBlockStarted", "SkillsProvided", "ModelCalled", "ToolInvoked",
                            "ModelCalled"]
    # The skills chosen for the block (by task type here) are in its prompt and recorded.
    given = of_block(evs, "b2", E.SkillsProvided)[0]
    assert given.skills and given.query == "Raise output throughput without breaking the " \
        "TTFT SLO or the outputs"
    assert all(f'<skill name="{n}"' in system for n in given.skills)
    # Task Memory counts the task's model usage (what the budgets read).
    assert r.memory.model_calls == 2
    assert r.memory.model_tokens_in == sum(c.tokens_in for c in calls)
    assert r.memory.model_cost_usd == pytest.approx(sum(c.cost_usd for c in calls))
    # The key travels as the Authorization header, and nowhere into the ledger or artifacts.
    assert all(h.get("authorization") == f"Bearer {KEY}" for h in chat.headers)
    ws.close()
    assert KEY not in (forge_home / "ledger.sqlite").read_bytes().decode("utf-8", "replace")
    for f in (forge_home / "artifacts").rglob("*"):
        if f.is_file():
            assert KEY.encode() not in f.read_bytes(), f


def test_escalation_moves_the_calls_to_the_large_tier_and_the_reviewer_objects(forge_home,
                                                                               tmp_path):
    with ScriptedChat([propose(CB_SDPA, "batching alone"),       # b2 on small: no progress
                       call("verdict", {"verdict": "object",      # b3: small reviews large
                                        "reasons": ["eager alone gains 2% at most"]})],
                      ) as small, \
            ScriptedChat([propose(EAGER, "eager alone"),        # b3 on large, objected
                          propose(CB_EAGER, "batching with eager")]) as large:
        ws, _ = setup(forge_home, tmp_path, {"small": small.url, "large": large.url},
                      extra_yaml="routing: {escalate_after: 1}\n")
        r = run_task(ws, "t1")
    assert r.exit_state == "delivered" and r.blocks == 3
    b2, b3 = r.memory.execution_record[1:]
    assert b2.routing["model_tier"] == "small" and b2.decision == "rejected"
    assert b3.routing == {"executor": "agent", "model_tier": "large", "model": "large-model",
                          "family": "large-family", "agent_topology": "executor-reviewer",
                          "escalated_after": 1, "escalated_from": "small",
                          "reviewer_tier": "small", "reviewer_model": "small-model",
                          "reviewer_family": "small-family"}
    assert b3.candidate == CB_EAGER
    assert len(small.requests) == 2 and len(large.requests) == 2
    assert [t["function"]["name"] for t in small.requests[1]["tools"]] == ["verdict"]
    # The objection comes after the turn's tool result (the protocol's order).
    assert [m["role"] for m in large.requests[1]["messages"]] == ["system", "user", "assistant",
                                                                  "tool", "user"]
    assert "objected to engine.attn_implementation=\\\"eager\\\": eager alone gains 2% at most" \
        in json.dumps(large.requests[1]["messages"])
    calls = of_block(events(ws), "b3", E.ModelCalled)
    assert [(c.tier, c.purpose) for c in calls] == [("large", "executor"), ("small", "reviewer"),
                                                   ("large", "executor")]
    assert of_block(events(ws), "b3", E.LoopBlockStarted)[0].actor.model == "large-model"
    # Each decided block records its own skills choice (a fact of its own, its own id).
    evs = events(ws)
    assert [e.block_id for e in evs if isinstance(e, E.SkillsProvided)] == ["b2", "b3"]
    assert len({e.event_id for e in evs}) == len(evs)
    ws.close()


def test_a_reviewer_without_a_verdict_is_a_failed_step_and_the_proposal_stands(forge_home,
                                                                               tmp_path):
    with ScriptedChat([propose(CB_EAGER, "batching with eager")]) as small, \
            ScriptedChat([{"content": "Looks fine to me."}]) as large:
        ws, _ = setup(forge_home, tmp_path, {"small": small.url, "large": large.url},
                      extra_yaml="routing: {agent_topology: executor-reviewer}\n")
        r = run_task(ws, "t1")
    assert r.exit_state == "delivered" and r.memory.execution_record[1].candidate == CB_EAGER
    evs = events(ws)
    assert [(c.tier, c.purpose) for c in of_block(evs, "b2", E.ModelCalled)] == [
        ("small", "executor"), ("large", "reviewer")]
    [failed] = of_block(evs, "b2", E.AgentStepFailed)
    assert failed.tool == "verdict" and failed.reason.startswith("reviewer: no verdict")
    assert failed.actor.model == "large-model"
    ws.close()


def test_planner_executor_plans_on_the_large_tier(forge_home, tmp_path):
    with ScriptedChat([call("task_show"), propose(CB_EAGER, "the plan's candidate")]) as small, \
            ScriptedChat([{"content": "Plan: enable continuous batching with eager "
                           "attention; sdpa breaks TTFT."}]) as large:
        ws, _ = setup(forge_home, tmp_path, {"small": small.url, "large": large.url},
                      extra_yaml="routing: {agent_topology: planner-executor}\n")
        r = run_task(ws, "t1")
    assert r.exit_state == "delivered"
    b2 = r.memory.execution_record[1]
    assert (b2.routing["agent_topology"], b2.routing["planner_tier"],
            b2.routing["planner_model"]) == ("planner-executor", "large", "large-model")
    assert len(large.requests) == 1 and "tools" not in large.requests[0]
    assert "Plan: enable continuous batching" in json.dumps(small.requests[0]["messages"])
    calls = of_block(events(ws), "b2", E.ModelCalled)
    assert [(c.tier, c.purpose) for c in calls] == [("large", "planner"), ("small", "sub-agent"),
                                                   ("small", "sub-agent")]
    ws.close()


def test_bad_output_is_recorded_and_the_loop_goes_on(forge_home, tmp_path):
    script = [
        call("propose", '{"candidate": {"engine.continuous_batching": tru'),   # malformed
        call("launch_rockets", {"count": 3}),                                   # unknown tool
        propose({"engine.tp_size": 8}),                                         # out of scope
        propose({}),                                                            # already tried
        {"content": "I'm sorry, I can't help with that."},                      # refusal, prose
        {"status": 503, "body": "overloaded"},                                  # HTTP error
        {"delay_s": 1.5, "content": "too late"},                                # timeout
        {"raw": "<html>not a chat completion</html>"},                          # bad body
        {"tool_calls": []},                                                     # empty answer
        propose(CB_EAGER, "finally"),
    ]
    with ScriptedChat(script) as chat:
        ws, _ = setup(forge_home, tmp_path, {"small": chat.url}, timeout_s=0.5)
        r = run_task(ws, "t1")
    assert r.exit_state == "delivered" and r.memory.execution_record[1].candidate == CB_EAGER
    evs = events(ws)
    failed = of_block(evs, "b2", E.AgentStepFailed)
    reasons = [f.reason for f in failed]
    expect = ["propose: arguments are not valid JSON", "unknown tool 'launch_rockets'",
              "propose: out of scope: engine.tp_size is not in the task's scope",
              "propose: baseline was already tried",
              "no tool call: the model answered prose: \"I'm sorry, I can't help",
              "model call failed: HTTP 503", "model call failed: timed out after 0.5s",
              "model call failed: bad response", "no tool call: an empty answer"]
    assert len(reasons) == len(expect), reasons
    for got, want in zip(reasons, expect, strict=True):
        assert got.startswith(want), (got, want)
        assert "\n" not in got and len(got) <= 300
    assert [f.tool for f in failed][:4] == ["propose", "launch_rockets", "propose", "propose"]
    assert failed[0].arguments == {"raw": '{"candidate": {"engine.continuous_batching": tru'}
    assert all(f.actor.kind == "agent" for f in failed)
    calls = of_block(evs, "b2", E.ModelCalled)
    assert [c.success for c in calls] == [True] * 5 + [False] * 3 + [True] * 2
    assert calls[6].error.startswith("timed out") and calls[6].response_digest is None
    # The model was told each time: the next request carries the failure it caused.
    told = json.dumps(chat.requests[3]["messages"])
    assert "is not in the task's scope" in told
    assert "Answer with a tool call" in json.dumps(chat.requests[5]["messages"])
    ws.close()


def test_no_decision_within_max_steps_exits_failed_blocked(forge_home, tmp_path):
    with ScriptedChat([{"content": "hmm"}, call("stop", "{not json")]) as chat:
        ws, _ = setup(forge_home, tmp_path, {"small": chat.url},
                      executor="{kind: agent, max_steps: 2}")
        r = run_task(ws, "t1")
    assert r.exit_state == "failed-blocked" and r.blocks == 1
    assert r.exit_reason.startswith("agent executor: no decision in 2 steps (last: stop: "
                                    "arguments are not valid JSON")
    evs = events(ws)
    # What deciding recorded is saved task-level, with the exit, in one save.
    assert [e.TYPE for e in evs[-5:]] == ["ModelCalled", "AgentStepFailed", "ModelCalled",
                                          "AgentStepFailed", "TaskExited"]
    assert all(e.block_id is None for e in evs[-5:])
    assert r.memory.model_calls == 2
    ws.close()


def test_endpoint_down_exits_failed_blocked(forge_home, tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ws, _ = setup(forge_home, tmp_path, {"small": f"http://127.0.0.1:{port}/v1"})
    r = run_task(ws, "t1")
    assert r.exit_state == "failed-blocked"
    assert "the model endpoint of tier small is down" in r.exit_reason
    evs = events(ws)
    mc = [e for e in evs if isinstance(e, E.ModelCalled)]
    assert len(mc) == 1 and not mc[0].success and "is down" in mc[0].error
    assert [e.TYPE for e in evs[-3:]] == ["ModelCalled", "AgentStepFailed", "TaskExited"]
    ws.close()


def test_agent_stop_hands_off(forge_home, tmp_path):
    with ScriptedChat([call("stop", {"reason": "nothing promising",
                                     "handoff": "try a bigger batch next time"})]) as chat:
        ws, _ = setup(forge_home, tmp_path, {"small": chat.url})
        r = run_task(ws, "t1")
    assert r.exit_state == "follow-up-handoff"
    assert r.exit_reason == "agent stopped: nothing promising"
    assert events(ws)[-1].handoff == "try a bigger batch next time"
    ws.close()


def test_token_budget_spent_mid_decision_exits_failed_budget(forge_home, tmp_path):
    with ScriptedChat([call("task_memory"), propose(CB_EAGER)]) as chat:
        ws, _ = setup(forge_home, tmp_path, {"small": chat.url}, exit_extra="max_tokens: 50")
        r = run_task(ws, "t1")
    assert r.exit_state == "failed-budget" and len(chat.requests) == 1
    assert r.exit_reason.startswith("token budget spent:") and "of 50 tokens" in r.exit_reason
    assert r.memory.model_tokens_in + r.memory.model_tokens_out > 50
    ws.close()


def test_cost_budget_spent_between_blocks_exits_failed_budget(forge_home, tmp_path):
    # One call (~600 prompt tokens at $1/Mtok) spends a $0.0001 budget; b2 still runs.
    with ScriptedChat([propose(CB_SDPA)]) as chat:
        ws, _ = setup(forge_home, tmp_path, {"small": chat.url},
                      exit_extra="max_cost_usd: 0.0001")
        r = run_task(ws, "t1")
    assert r.exit_state == "failed-budget" and r.blocks == 2 and len(chat.requests) == 1
    assert r.exit_reason.startswith("cost budget spent: $0.0")
    assert r.memory.model_cost_usd >= 0.0001
    ws.close()


def test_missing_tier_is_refused_before_anything_is_recorded(forge_home, tmp_path):
    with ScriptedChat([]) as chat:
        ws, _ = setup(forge_home, tmp_path, {"small": chat.url},
                      executor="{kind: agent, tier: medium}")
        n = len(events(ws))
        with pytest.raises(HarnessError, match=r"no model for tier 'medium': add "
                           r"\[models.medium\]"):
            run_task(ws, "t1")
        assert len(events(ws)) == n
    ws.close()


def test_spec_fields_and_hashes():
    task = load_task(REPO / "examples/tasks/tune-tiny-cpu.yaml")
    ex = task.executor.model_copy(update={"kind": "agent", "tier": "large", "max_steps": 4})
    assert ex.model_dump()["tier"] == "large" and ex.model_dump()["max_steps"] == 4
    # Defaults stay out of the stored shape: definitions hash as before these fields.
    stored = task.executor.model_dump()
    assert "tier" not in stored and "max_steps" not in stored
    assert "max_tokens" not in task.exit.model_dump()


def test_escalation_ladder_and_routing_rules():
    from infer_forge.harness.loop.routing import ladder, route
    from infer_forge.ledger.config import ModelSettings

    def m(name: str, price: float = 0.0) -> ModelSettings:
        return ModelSettings(url="http://x/v1", model=name, family="f",
                             price_in_per_mtok=price)

    models = {"xl": m("xl", 10.0), "large": m("l"), "cheap": m("c", 1.0), "small": m("s"),
              "medium": m("m")}
    # Known names in their order, then the others by price.
    assert ladder(models) == ["small", "medium", "large", "cheap", "xl"]
    assert ladder(None) == ["small", "large"]
    task = load_task(REPO / "examples/tasks/tune-tiny-cpu.yaml")
    agent = task.model_copy(update={
        "executor": task.executor.model_copy(update={"kind": "agent"}),
        "routing": task.routing.model_copy(update={"escalate_after": 2})})
    r = route(agent, 1, None, models)
    assert (r["model_tier"], r["model"], "escalated_after" in r) == ("small", "s", False)
    r = route(agent, 2, None, models)  # one step per K no-progress blocks
    assert (r["model_tier"], r["escalated_from"], r["agent_topology"],
            r["reviewer_tier"]) == ("medium", "small", "executor-reviewer", "large")
    assert route(agent, 4, None, models)["model_tier"] == "large"
    assert route(agent, 40, None, models)["model_tier"] == "xl"  # the top, no further
    top = agent.model_copy(update={"executor": agent.executor.model_copy(
        update={"tier": "xl"})})
    r = route(top, 9, None, models)  # at the top: no escalation; the reviewer is below
    assert "escalated_after" not in r and r["model_tier"] == "xl"
    assert route(agent.model_copy(update={"routing": agent.routing.model_copy(update={
        "agent_topology": "planner-executor", "escalate_after": None})}), 0, None,
        models)["planner_tier"] == "medium"


# --- a killed agent loop resumes from the ledger -------------------------------------------


def _forge_run(home: Path) -> subprocess.Popen:
    env = {**os.environ, "FORGE_HOME": str(home), "PYTHONUNBUFFERED": "1", KEY_ENV: KEY}
    return subprocess.Popen([*FORGE, "task", "run", "t1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
                            start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def test_kill_9_mid_decision_then_resume(forge_home, tmp_path):
    """`forge task run` killed while its model call is in flight (the server holds it):
    nothing of the decision was saved; resume asks again and delivers, nothing twice."""
    entered, release = threading.Event(), threading.Event()

    def held(_req: dict) -> dict:
        entered.set()
        release.wait(60)
        return {"content": "the client is gone"}

    with ScriptedChat([call("task_memory"), held,
                       call("task_memory"), propose(CB_EAGER, "after the crash")]) as chat:
        ws, _ = setup(forge_home, tmp_path, {"small": chat.url})
        proc = _forge_run(forge_home)
        try:
            assert entered.wait(120), "the loop never reached its second model call"
            _kill(proc)
        finally:
            release.set()
        before = [e.TYPE for e in events(ws)]
        assert before[-1] == "LoopBlockHandedOff" and "ModelCalled" not in before  # b1 only
        p = run_forge("task", "resume", "t1", home=forge_home, env={KEY_ENV: KEY})
        assert p.returncode == 0, p.stderr
        assert "delivered" in p.stdout
        assert len(chat.requests) == 4
    evs = events(ws)
    assert len({e.event_id for e in evs}) == len(evs)
    assert [e.TYPE for e in evs].count("LoopBlockStarted") == 2
    assert [(e.block_id, e.TYPE) for e in evs if isinstance(e, E.ModelCalled | E.ToolInvoked)
            and e.block_id == "b2"][:3] == [("b2", "ModelCalled"), ("b2", "ToolInvoked"),
                                            ("b2", "ModelCalled")]
    assert len([e for e in evs if isinstance(e, E.ModelCalled)]) == 2
    ws.close()


def test_kill_9_mid_measurement_does_not_ask_again(forge_home, tmp_path):
    """Killed after the decision was saved (inside b2's measurement): resume measures b2
    without calling the model again."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with ScriptedChat([propose(CB_EAGER, "batching with eager")]) as chat:
        ws, _ = setup(forge_home, tmp_path, {"small": chat.url})
        env = {**os.environ, "FORGE_HOME": str(forge_home), "PYTHONUNBUFFERED": "1",
               KEY_ENV: KEY, "EVAL_BLOCK_FIFO": str(fifo)}
        proc = subprocess.Popen([*FORGE, "task", "run", "t1"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, cwd=str(REPO),
                                start_new_session=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("begin b2:measure"):
                break
        _kill(proc)
        p = run_forge("task", "resume", "t1", home=forge_home, env={KEY_ENV: KEY})
        assert p.returncode == 0 and "delivered" in p.stdout, p.stderr
        assert len(chat.requests) == 1
    evs = events(ws)
    assert len([e for e in evs if isinstance(e, E.ModelCalled)]) == 1
    assert len([e for e in evs if isinstance(e, E.MeasurementRecorded)
                and e.block_id == "b2"]) == 3
    ws.close()


# --- the project's tiny model as a real endpoint -------------------------------------------


def test_tiny_model_endpoint_nonsense_is_recorded_and_exits_typed(forge_home, tmp_path,
                                                                 hf_server):
    ws, _ = init_workspace(forge_home)
    ws.close()
    with open(forge_home / "forge.toml", "a") as f:
        f.write(f'\n[wiki]\nembeddings = false\n\n[models.small]\nurl = "{hf_server.base_url}/v1"\n'
                f'model = "{hf_server.model}"\nfamily = "llama"\nmax_tokens = 12\n'
                "timeout_s = 120.0\n")
    ws = open_workspace(forge_home)
    path = make_task_dir(tmp_path / "specs", executor="{kind: agent, max_steps: 2}")
    define_task(ws, path)
    r = run_task(ws, "t1")
    assert r.exit_state == "failed-blocked"
    assert r.exit_reason.startswith("agent executor: no decision in 2 steps")
    evs = events(ws)
    calls = [e for e in evs if isinstance(e, E.ModelCalled)]
    failed = [e for e in evs if isinstance(e, E.AgentStepFailed)]
    # The endpoint answered (calls succeed); what it said is no tool call: failed steps.
    assert len(calls) == 2 and len(failed) == 2
    assert all(c.success and c.model == hf_server.model and c.tier == "small"
               and c.tokens_in > 0 and c.tokens_out > 0 for c in calls)
    for f in failed:
        assert f.reason.startswith("no tool call: ") and "\n" not in f.reason
        assert len(f.reason) <= 300
    for c in calls:  # the real answer, kept as the response artifact
        answer = json.loads(ws.artifacts.get(c.response_digest))["choices"][0]["message"]
        assert not answer.get("tool_calls")
    ws.close()


def test_agent_executor_builds_from_the_task(forge_home, tmp_path):
    with ScriptedChat([]) as chat:
        ws, path = setup(forge_home, tmp_path, {"small": chat.url})
        from infer_forge.harness.loop.executors import make_executor

        ex = make_executor(load_task(path), ws=ws)
        assert isinstance(ex, AgentExecutor) and ex.kind == "agent"
    ws.close()
