"""The traceable path: `forge trace ID` from an accepted deliverable of a real loop task back
to its block, routing, tool calls (argv), measurements, gates and handoff, and forward to the
graph edges a graph task fed; from a measurement or a tool call to the same block; the same
chain on the decision's wiki page; unknown or too-short ids as one line."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from infer_forge.harness.graph.run import run_graph
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.run import run_task
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import task_stream
from infer_forge.projections.memory import task_memory
from infer_forge.projections.trace import trace

from tests.conftest import run_forge

from ..harness.graph.test_graph_run import define_loop_graph
from ..harness.loop.test_loop import make_task_dir


@pytest.fixture
def delivered(workspace, tmp_path):
    """A real loop task (command evaluator, sweep executor) run to delivery."""
    define_task(workspace, make_task_dir(tmp_path / "specs"))
    assert run_task(workspace, "t1").exit_state == "delivered"
    return workspace


def test_trace_of_an_accepted_deliverable_reaches_its_tool_calls_and_numbers(delivered,
                                                                              forge_home):
    ws = delivered
    mem = task_memory(ws.ledger, "t1")
    (acc,) = mem.accepted
    b4 = mem.block("b4")
    r = run_forge("trace", acc["event_id"][:8], "--json", home=forge_home)
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    assert (c["focus"], c["kind"]) == (acc["event_id"], "deliverable")
    assert c["task"]["task_id"] == "t1" and c["task"]["exit_state"] == "delivered"
    assert c["task"]["definition_hash"] == mem.definition_hash
    assert c["block"]["block_id"] == "b4" and c["block"]["candidate"] == acc["candidate"]
    assert c["routing"] == {"executor": "sweep", "model_tier": "none", "agent_topology": "single"}
    # Tool calls: the evaluator's three runs, with the argv the task gave it.
    assert [t["event_id"] for t in c["tool_calls"]] == [t["event_id"] for t in b4.tool_calls]
    for t in c["tool_calls"]:
        assert t["argv"] == [sys.executable, "evalscript.py"] and t["exit_code"] == 0
        assert t["stdout"].startswith("sha256:")
    # Measurements with their numbers; the gates with theirs.
    assert [m["event_id"] for m in c["measurements"]] == [m["event_id"] for m in b4.measurements]
    assert all(m["metrics"]["output_throughput"] > 130 for m in c["measurements"])
    ver = c["verification"]
    assert ver["event_id"] == acc["verification_event_id"] and ver["verdict"] == "pass"
    gates = {g["name"]: g for g in ver["gates"]}
    assert set(gates) == {"throughput", "ttft-slo", "correctness", "stability"}
    assert gates["throughput"]["baseline_median"] == 100.0
    assert gates["throughput"]["ratio"] > 1.05 and gates["throughput"]["threshold"] == 1.05
    assert [s["name"] for s in ver["steps"]] == ["baseline", "measure", "gates", "decide"]
    assert c["decision"]["kind"] == "accepted" and c["decision"]["event_id"] == acc["event_id"]
    assert c["handoff"]["outcome"] == "delivered"
    assert c["graph_edges"] == []
    # Artifact links: each digest with its file under FORGE_HOME/artifacts, present.
    digests = {a["digest"]: a for a in c["artifacts"]}
    for t in c["tool_calls"]:
        a = digests[t["stdout"]]
        assert a["exists"] and Path(a["path"]).is_file()
        assert Path(a["path"]).is_relative_to(forge_home / "artifacts")
        assert a["relative"].startswith("artifacts/sha256/")
        assert "warming up" in Path(a["path"]).read_text()

    human = run_forge("trace", acc["event_id"], home=forge_home)
    assert human.returncode == 0, human.stderr
    out = human.stdout
    for needle in (f"trace {acc['event_id']} (deliverable)", "block b4 (#4)",
                   "routing: agent_topology single, executor sweep, model_tier none",
                   f"{sys.executable} evalscript.py  exit 0", "measurements: 3",
                   "gate throughput pass: output_throughput median", "baseline 100",
                   "decision ", ": accepted", "handoff ", "graph edges fed: 0",
                   str(forge_home / "artifacts" / "sha256")):
        assert needle in out, needle


def test_a_measurement_and_a_tool_call_trace_to_the_same_block(delivered):
    ws = delivered
    mem = task_memory(ws.ledger, "t1")
    b2 = mem.block("b2")
    by_meas = trace(ws, b2.measurements[1]["event_id"])
    by_tool = trace(ws, b2.tool_calls[0]["event_id"])
    assert by_meas["kind"] == "measurement" and by_tool["kind"] == "tool-call"
    for c in (by_meas, by_tool):
        assert c["block"]["block_id"] == "b2"
        assert c["decision"]["kind"] == "rejected" and "throughput fail" in c["decision"]["reason"]
        assert c["verification"]["verdict"] == "fail"
        assert c["handoff"] is not None
    assert by_meas["tool_calls"] == by_tool["tool_calls"]


def test_a_graph_task_lists_the_edges_it_fed(tmp_path, workspace, forge_home):
    define_loop_graph(tmp_path, workspace)
    assert run_graph(workspace, "lg", jobs=1).outcome == "completed"
    handoff = next(r.event for r in workspace.ledger.stream("graph:lg")
                   if isinstance(r.event, E.HandoffDelivered))
    # The loop task inside the node, and the node's own task: both fed the edge tune -> check.
    for tid in ("lg.tune.a1", "lg.tune"):
        acc = next(r.event for r in workspace.ledger.stream(task_stream(tid))
                   if isinstance(r.event, E.DeliverableAccepted))
        r = run_forge("trace", str(acc.event_id), "--json", home=forge_home)
        assert r.returncode == 0, r.stderr
        c = json.loads(r.stdout)
        (edge,) = c["graph_edges"]
        assert (edge["graph"], edge["src"], edge["dst"]) == ("lg", "tune", "check"), tid
        assert edge["event_id"] == str(handoff.event_id)
        assert edge["verification_event_id"] == str(handoff.verification_event_id)
        assert "lg.tune.a1" in edge["tasks"]
        human = run_forge("trace", str(acc.event_id), home=forge_home).stdout
        assert "graph edges fed: 1" in human and "graph lg: tune -> check" in human
    # The downstream node fed nothing.
    acc = next(r.event for r in workspace.ledger.stream(task_stream("lg.check"))
               if isinstance(r.event, E.DeliverableAccepted))
    assert trace(workspace, str(acc.event_id))["graph_edges"] == []


def test_the_decision_page_carries_the_chain_as_plain_text(delivered, forge_home):
    ws = delivered
    acc = task_memory(ws.ledger, "t1").accepted[0]
    assert run_forge("wiki", "build", "--no-embeddings", home=forge_home).returncode == 0
    (page,) = (forge_home / "wiki" / "decisions").glob(f"t1-accepted-{acc['event_id']}.md")
    md = page.read_text()
    assert "## Traceable path" in md
    assert f"`{sys.executable} evalscript.py`" in md  # argv as code, never a link
    assert "**Verification** pass" in md and "throughput pass: output_throughput" in md
    assert "`artifacts/sha256/" in md
    site = (forge_home / "site" / "decisions" / f"t1-accepted-{acc['event_id']}.html")
    html = site.read_text()
    assert "Traceable path" in html and "evalscript.py" in html
    # The only links the section forms are forge's own: the task page, and the pages of the
    # tool outputs it previews (artifacts/<digest prefix>).
    section = html[html.index("Traceable path"):]
    section = section[:section.find("Related")] if "Related" in section else section
    assert 'href="../tasks/t1.html"' in section
    assert section.count("<a ") == (section.count('href="../tasks/t1.html"')
                                    + len(re.findall(r'href="\.\./artifacts/[0-9a-f]{16}\.html"',
                                                     section)))


@pytest.mark.parametrize(("ident", "says"), [
    ("00000000-0000-4000-8000-000000000000", "no deliverable, decision, measurement"),
    ("abc", "is not an event id or a prefix of one (at least 8"),
    ("'; drop table", "is not an event id"),
])
def test_an_unknown_id_is_one_line(delivered, forge_home, ident, says):
    r = run_forge("trace", ident, home=forge_home)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and says in r.stderr, r.stderr


def test_an_event_without_a_path_is_refused(delivered, forge_home):
    """A task's definition is no deliverable, decision, measurement or tool call."""
    ws = delivered
    defined = ws.ledger.stream(task_stream("t1"))[0].event
    r = run_forge("trace", str(defined.event_id), home=forge_home)
    assert r.returncode == 1 and "no deliverable, decision" in r.stderr
