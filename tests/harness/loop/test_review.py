"""Cross-model adversarial review as a contract gate (`contract.review: {tier}`).

The reviewer is the real `openai` client against ScriptedChat (a local OpenAI-protocol
server: the only fake, at the LLM boundary); [models.large] is family qwen (the reviewer),
[models.small] and [models.medium] family llama (the executors). The evaluator is a real
subprocess whose throughput is 100 x `engine.speedup`; the ledger is real.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import (
    handoff_block,
    record_measurement,
    start_block,
    verify_block,
)
from infer_forge.harness.loop.run import run_task
from infer_forge.harness.testing.scripted_chat import ScriptedChat
from infer_forge.ledger import events as E
from infer_forge.ledger.clock import digest
from infer_forge.ledger.specs import canonical, load_task
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.workspace import init_workspace, open_workspace
from infer_forge.projections.memory import task_memory

from tests.conftest import REPO, run_forge

EVAL = r'''
import json, os, sys
cand = json.load(sys.stdin)
r = int(os.environ.get("FORGE_REPEAT", "0"))
jitter = (1.0, 1.01, 0.99)[r % 3]
print(json.dumps({"output_throughput": 100.0 * cand.get("engine.speedup", 1.0) * jitter,
                  "token_match": 1.0}))
'''

TASK = """\
id: {task_id}
type: deployment-tuning
goal: Raise output throughput
point: ../points/tiny-cpu.yaml
scope:
  engine.speedup: [1.2, 1.3]
contract:
  gates:
    - {{name: throughput, metric: output_throughput, vs_baseline: ratio, at_least: 1.05}}
    - {{name: correctness, metric: token_match, at_least: 0.99}}
{review}exit: {{max_blocks: 6, no_progress_blocks: 3}}
executor: {executor}
{routing}evaluator: {{kind: command, argv: [{python}, evalscript.py]}}
"""

APPROVE = {"content": json.dumps({"verdict": "approve", "reasons": []})}


def objection(text: str, evidence: list[str]) -> dict:
    return {"content": json.dumps({"verdict": "object",
                                   "reasons": [{"text": text, "evidence": evidence}]})}


def task_file(root: Path, task_id: str = "rv", *, review: str | None = "{tier: large}",
              executor: str = "{kind: sweep}", routing: str | None = None) -> Path:
    for sub in ("points", "profiles", "tasks"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "examples/points/tiny-cpu.yaml", root / "points/tiny-cpu.yaml")
    shutil.copy(REPO / "examples/profiles/tiny-cpu.yaml", root / "profiles/tiny-cpu.yaml")
    (root / "tasks/evalscript.py").write_text(EVAL)
    path = root / "tasks" / f"{task_id}.yaml"
    path.write_text(TASK.format(
        task_id=task_id, executor=executor, python=json.dumps(sys.executable),
        review=f"  review: {review}\n" if review else "",
        routing=f"routing: {routing}\n" if routing else ""))
    return path


class Models:
    """The workspace and its model tiers' endpoints."""

    def __init__(self, ws, reviewer: ScriptedChat, executor: ScriptedChat):
        self.ws, self.reviewer, self.executor = ws, reviewer, executor


@pytest.fixture
def models(forge_home) -> Iterator[Models]:
    ws, _ = init_workspace(forge_home)
    ws.close()
    with ScriptedChat(model="qwen-reviewer") as rev, ScriptedChat(model="llama-exec") as ex:
        with open(forge_home / "forge.toml", "a") as f:
            f.write(f"""
[wiki]
embeddings = false

[models.large]
url = "{rev.url}"
model = "qwen-reviewer"
family = "qwen"
timeout_s = 30

[models.small]
url = "{ex.url}"
model = "llama-exec"
family = "llama"

[models.medium]
url = "{ex.url}"
model = "llama-other"
family = "Llama"
""")
        ws = open_workspace(forge_home)
        try:
            yield Models(ws, rev, ex)
        finally:
            ws.close()


def events_of(ws, task_id: str, cls: type) -> list:
    return [r.event for r in ws.ledger.stream(task_stream(task_id)) if isinstance(r.event, cls)]


def user_prompt(request: dict) -> str:
    return next(m["content"] for m in request["messages"] if m["role"] == "user")


# --- the automatic loop ------------------------------------------------------------------


def test_reviewer_approves_the_passing_candidate_and_it_is_delivered(models, tmp_path):
    ws = models.ws
    models.reviewer.add(APPROVE)
    define_task(ws, task_file(tmp_path))
    res = run_task(ws, "rv")
    assert res.exit_state == "delivered", res.exit_reason
    mem = task_memory(ws.ledger, "rv")
    # (a rare extra block under load: the message says which, the next time it happens)
    assert len(mem.execution_record) == 2, [
        (b.decision, b.candidate, b.decision_reason, (b.verification or {}).get("gates"))
        for b in mem.execution_record]
    b1, b2 = mem.execution_record
    assert b2.decision == "accepted" and b2.candidate == {"engine.speedup": 1.2}
    # One call, on the reviewer's tier (the baseline is not reviewed).
    assert len(models.reviewer.requests) == 1 and not models.executor.requests
    assert models.reviewer.requests[0]["model"] == "qwen-reviewer"
    gates = b2.verification["gates"]
    assert gates[-1]["name"] == "review" and gates[-1]["kind"] == "review"
    assert gates[-1]["verdict"] == "pass" and "approves" in gates[-1]["reason"]
    called = events_of(ws, "rv", E.ModelCalled)
    (rec,) = events_of(ws, "rv", E.ReviewRecorded)
    (ver,) = [v for v in events_of(ws, "rv", E.VerificationRecorded) if v.block_id == "b2"]
    assert [c.purpose for c in called] == ["reviewer"] and called[0].tier == "large"
    assert (rec.tier, rec.model, rec.family, rec.verdict) == ("large", "qwen-reviewer", "qwen",
                                                            "approve")
    assert rec.response_digest == called[0].response_digest and rec.response_digest
    assert rec.causation_id == called[0].event_id
    assert rec.actor.model == "qwen-reviewer"
    # Saved together: the call, the verdict and the verification are one command.
    assert called[0].command_id == rec.command_id == ver.command_id
    assert str(rec.event_id) in ver.evidence

    # The reviewer saw the deliverable: candidate, measurements (both medians), gate numbers.
    prompt = user_prompt(models.reviewer.requests[0])
    assert '{"engine.speedup": 1.2}' in prompt
    assert "output_throughput: median 120 (n=3)" in prompt
    assert "output_throughput: median 100 (n=3)" in prompt  # the baseline's
    assert "throughput (relative on output_throughput): PASS" in prompt
    assert "ratio 1.2" in prompt and "at_least 1.05" in prompt
    assert "correctness (absolute on token_match): PASS" in prompt
    for m in b2.measurements + b1.measurements:
        assert m["event_id"] in prompt
    assert "# Last handoff" in prompt and "baseline measured" in prompt


def test_an_objection_fails_the_verification_and_the_next_candidate_is_delivered(
        models, tmp_path):
    ws = models.ws
    models.reviewer.add(objection("the gain is <script>alert(1)</script> noise [[x|y]]",
                                  ["output_throughput", "not-an-id"]), APPROVE)
    define_task(ws, task_file(tmp_path))
    res = run_task(ws, "rv")
    assert res.exit_state == "delivered", res.exit_reason
    mem = task_memory(ws.ledger, "rv")
    _, b2, b3 = mem.execution_record
    # The gates pass; the objection alone fails b2.
    assert b2.verification["verdict"] == "fail"
    assert all(g["verdict"] == "pass" for g in b2.verification["gates"][:-1])
    assert b2.verification["gates"][-1]["verdict"] == "fail"
    (rej,) = events_of(ws, "rv", E.DirectionRejected)
    assert rej.candidate == {"engine.speedup": 1.2}
    assert "review fail" in rej.reason and "objects" in rej.reason
    assert "the gain is <script>alert(1)</script> noise" in rej.reason
    assert "(evidence: output_throughput)" in rej.reason
    assert b3.decision == "accepted" and b3.candidate == {"engine.speedup": 1.3}
    recs = events_of(ws, "rv", E.ReviewRecorded)
    assert [r.verdict for r in recs] == ["object", "approve"]
    assert recs[0].evidence == ["output_throughput"]  # what it cited that exists
    assert recs[0].reasons == ["the gain is <script>alert(1)</script> noise [[x|y]] "
                               "(evidence: output_throughput)"]

    # The wiki's task page shows each review; the reviewer's text is inert.
    from infer_forge.wiki import build as B

    B.build(ws, embeddings=False)
    md = (ws.home / "wiki" / "tasks" / "rv.md").read_text()
    html = (ws.home / "site" / "tasks" / "rv.html").read_text()
    assert "## Reviews" in md
    assert "qwen-reviewer" in md and "object" in md and "approve" in md
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "[[x|y]]" not in md.split("\n---\n", 1)[1]  # no wiki link formed
    assert "output_throughput" in html


# --- invalid reviews: the manual path (`forge block verify`) --------------------------------


def _measured_candidate(ws, tmp_path, task_id: str = "rm", match: float = 1.0,
                        **kw: str) -> None:
    """A manual task: the baseline measured and handed off, then b2 (speedup 1.2) measured
    (its gates pass) and open."""
    define_task(ws, task_file(tmp_path, task_id, executor="{kind: manual}", **kw))
    start_block(ws, task_id, "baseline")
    for x in (100.0, 101.0, 99.0):
        record_measurement(ws, task_id, {"output_throughput": x, "token_match": 1.0})
    verify_block(ws, task_id)
    handoff_block(ws, task_id, state_reached="baseline measured")
    start_block(ws, task_id, "try a speedup", {"engine.speedup": 1.2})
    for x in (120.0, 121.0, 119.0):
        record_measurement(ws, task_id, {"output_throughput": x, "token_match": match})


@pytest.mark.parametrize(("reply", "why"), [
    ({"content": "Looks good to me, ship it."}, "not one JSON object"),
    ({"content": 'Sure! {"verdict": "approve"}'}, "not one JSON object"),
    ({"content": json.dumps({"verdict": "object", "reasons": []})}, "objection without reasons"),
    (objection("it is slow", ["vibes"]), "cites no evidence of the deliverable (cited: vibes)"),
    ({"content": json.dumps({"verdict": "maybe"})}, "not the verdict object: verdict"),
    ({"status": 503, "body": '{"error": {"message": "overloaded"}}'}, "HTTP 503"),
    ({"raw": "not a completion"}, "bad response"),
])
def test_an_invalid_review_is_inconclusive_and_recorded_with_its_reason(models, tmp_path,
                                                                        reply, why):
    ws = models.ws
    _measured_candidate(ws, tmp_path)
    models.reviewer.add(reply)
    out = verify_block(ws, "rm")
    assert out["verdict"] == "inconclusive"
    review = out["gates"][-1]
    assert review["name"] == "review" and review["verdict"] == "inconclusive"
    assert why in review["reason"] and "does not pass" in review["reason"]
    (rec,) = events_of(ws, "rm", E.ReviewRecorded)
    assert rec.verdict == "invalid" and len(rec.reasons) == 1 and why in rec.reasons[0]
    assert "\n" not in rec.reasons[0]
    (called,) = events_of(ws, "rm", E.ModelCalled)
    assert called.purpose == "reviewer" and called.block_id == "b2"


def test_a_reviewer_timeout_and_a_down_endpoint_are_invalid(models, tmp_path):
    ws = models.ws
    _measured_candidate(ws, tmp_path, "rt", review="{tier: large, timeout_s: 0.5}")
    models.reviewer.add({"delay_s": 3, **APPROVE})
    out = verify_block(ws, "rt")
    assert out["verdict"] == "inconclusive"
    assert "timed out after 0.5s" in out["gates"][-1]["reason"]
    models.reviewer.stop()  # the endpoint goes down
    out = verify_block(ws, "rt")
    assert out["verdict"] == "inconclusive" and "is down" in out["gates"][-1]["reason"]
    assert [r.verdict for r in events_of(ws, "rt", E.ReviewRecorded)] == ["invalid"] * 2
    assert [c.success for c in events_of(ws, "rt", E.ModelCalled)] == [False, False]


def test_forge_block_verify_runs_the_review(models, tmp_path):
    ws = models.ws
    _measured_candidate(ws, tmp_path)
    models.reviewer.add(objection("ratio rests on 3 runs", ["throughput"]))
    r = run_forge("block", "verify", "rm", "--json", home=ws.home)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["verdict"] == "fail"
    assert out["gates"][-1]["reason"].endswith("ratio rests on 3 runs (evidence: throughput)")
    (rec,) = events_of(ws, "rm", E.ReviewRecorded)
    assert rec.verdict == "object" and rec.evidence == ["throughput"]


def test_gates_that_fail_are_not_reviewed(models, tmp_path):
    ws = models.ws
    _measured_candidate(ws, tmp_path, match=0.5)  # the correctness gate fails
    out = verify_block(ws, "rm")
    assert out["verdict"] == "fail" and [g["name"] for g in out["gates"]] == [
        "throughput", "correctness"]
    assert not models.reviewer.requests and not events_of(ws, "rm", E.ReviewRecorded)


# --- definition: the reviewer must be of another family ---------------------------------


def _ledger_size(home: Path) -> int:
    import sqlite3

    conn = sqlite3.connect(home / "ledger.sqlite")
    try:
        return conn.execute("SELECT count(*) FROM stored_events").fetchone()[0]
    finally:
        conn.close()


@pytest.mark.parametrize(("review", "executor", "routing", "names"), [
    # A command policy on the small tier; the reviewer on medium: both llama.
    ("{tier: medium}", "COMMAND", "{model_tier: small}",
     ["medium", "llama-other", "small", "llama-exec", "'Llama'"]),
    # An agent executor on the small tier.
    ("{tier: medium}", "{kind: agent, tier: small}", None,
     ["medium", "llama-other", "small", "llama-exec"]),
    # The same tier reviewing itself.
    ("{tier: small}", "COMMAND", "{model_tier: small}", ["small", "llama-exec"]),
    # Escalation moves the executor to large: the reviewer's own tier.
    ("{tier: large}", "COMMAND", "{model_tier: small, escalate_after: 2}",
     ["large", "qwen-reviewer", "'qwen'"]),
])
def test_a_same_family_reviewer_is_refused_at_definition(models, tmp_path, review, executor,
                                                         routing, names):
    home = models.ws.home
    policy = tmp_path / "policy.py"
    policy.write_text("print('{\"action\": \"stop\", \"reason\": \"x\"}')\n")
    ex = f"{{kind: command, argv: [{json.dumps(sys.executable)}, {json.dumps(str(policy))}]}}"
    path = task_file(tmp_path, "same", review=review,
                     executor=ex if executor == "COMMAND" else executor, routing=routing)
    before = _ledger_size(home)
    r = run_forge("task", "new", str(path), home=home)
    assert r.returncode != 0
    line = r.stderr.strip()
    assert "\n" not in line and "another model family" in line, line
    for n in names:
        assert n in line, (n, line)
    assert _ledger_size(home) == before  # nothing recorded
    assert not models.ws.ledger.stream(task_stream("same"))


def test_an_unconfigured_review_tier_is_refused_and_another_family_is_defined(models,
                                                                              tmp_path):
    ws = models.ws
    before = _ledger_size(ws.home)
    with pytest.raises(HarnessError, match=r"contract.review.tier: no model for tier 'xl'"):
        define_task(ws, task_file(tmp_path, "nx", review="{tier: xl}"))
    assert _ledger_size(ws.home) == before
    policy = tmp_path / "policy.py"
    policy.write_text("print('{\"action\": \"stop\", \"reason\": \"x\"}')\n")
    ex = f"{{kind: command, argv: [{json.dumps(sys.executable)}, {json.dumps(str(policy))}]}}"
    info = define_task(ws, task_file(tmp_path, "ok", executor=ex, routing="{model_tier: small}"))
    assert info["created"]


def test_a_contract_without_review_hashes_as_before(tmp_path):
    """`review` is left out of the stored contract when absent: the definition and contract
    hashes of existing tasks do not change."""
    plain = load_task(task_file(tmp_path / "a", "p", review=None))
    reviewed = load_task(task_file(tmp_path / "b", "p"))
    assert "review" not in canonical(plain)["contract"]
    assert "review" not in plain.contract.model_dump(mode="json")
    assert canonical(reviewed)["contract"]["review"] == {"tier": "large", "timeout_s": 300.0}
    stripped = {k: v for k, v in canonical(reviewed)["contract"].items() if k != "review"}
    assert digest(plain.contract.model_dump(mode="json")) == digest(stripped)


# --- a code candidate: the reviewer reads the diff ------------------------------------------

PATCH = """diff --git a/value.txt b/value.txt
--- a/value.txt
+++ b/value.txt
@@ -1 +1 @@
-0
+1
"""


def test_the_reviewer_reads_a_code_candidates_diff(models, tmp_path):
    from infer_forge.repos import commands as rc

    from tests.helpers.gitrepos import make_remote, write_manifest

    ws = models.ws
    remote = make_remote(tmp_path, "kernels", {"value.txt": "0\n"})
    rc.init(ws, write_manifest(tmp_path / "m.yaml", [{"name": "kernels", "url": str(remote)}]))
    d = tmp_path / "spec"
    shutil.copytree(REPO / "examples/points", d / "points")
    shutil.copytree(REPO / "examples/profiles", d / "profiles")
    (d / "p1.patch").write_text(PATCH)
    (d / "exec.py").write_text(
        "import json, sys\nm = json.load(sys.stdin)['memory']\n"
        "n = sum(1 for b in m['execution_record'] if b.get('candidate'))\n"
        "print(json.dumps({'action': 'try', 'candidate': {'code.kernels': 'patch:p1.patch'}}"
        " if n == 0 else {'action': 'stop', 'reason': 'done'}))\n")
    (d / "eval.py").write_text(
        "import json, os, pathlib\n"
        "t = pathlib.Path(os.environ['FORGE_WORKTREE_KERNELS'])\n"
        "print(json.dumps({'value': int((t / 'value.txt').read_text())}))\n")
    py = json.dumps(sys.executable)
    (d / "t.yaml").write_text(f"""id: code-rv
type: kernel
goal: bring the value to 1
point: points/tiny-cpu.yaml
code: {{members: [kernels], build: false}}
contract:
  gates: [{{name: value, metric: value, at_least: 1, repeats: 1}}]
  review: {{tier: large}}
exit: {{when: all_gates_pass, max_blocks: 4, no_progress_blocks: 3}}
executor: {{kind: command, argv: [{py}, exec.py]}}
evaluator: {{kind: command, argv: [{py}, eval.py]}}
""")
    models.reviewer.add(APPROVE)
    define_task(ws, d / "t.yaml")
    res = run_task(ws, "code-rv")
    assert res.exit_state == "delivered", res.exit_reason
    (req,) = models.reviewer.requests
    prompt = user_prompt(req)
    sha = task_memory(ws.ledger, "code-rv").execution_record[1].candidate["code.kernels"]
    assert "# Diff of code.kernels (diff:kernels)" in prompt and sha in prompt
    assert "-0\n+1" in prompt and "value.txt" in prompt
    assert "diff:kernels" in prompt.split("# Evidence you may cite")[1]
