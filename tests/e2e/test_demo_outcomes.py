"""`forge demo` when its task does not deliver, through the real CLI (issue 31 item 5): one
line naming why with the numbers and the command that continues it, exit 1; `forge demo`
again reopens and continues (one out of budget says to start afresh); a delivered demo
re-reports; and the README's tour after the demo either works or says in one line what is
missing, exit non-zero.

The engine is the one part replaced: the demo's own task, ledger, gates and CLI run as a
user's would, with the scripted evaluator of test_demo.py (an unstable baseline, then a
stable one) in place of `transformers serve` (the slow test_demo.py runs the real engine).
"""

from __future__ import annotations

import json
import re

import pytest
from infer_forge.harness import demo as demo_mod
from infer_forge.harness.demo import not_delivered
from infer_forge.harness.forge_command import forge_command

from tests.conftest import REPO, run_forge
from tests.e2e.test_demo import ScriptedEvaluator

TASK = "demo-tune-tiny-cpu"
UNSTABLE = (100.0, 150.0, 60.0)


def _one_line_error(r) -> str:
    """The single `Error: …` line a failing command printed on stderr, and nothing else
    there (transformers' weight-loading progress bar was, before the embedder ran in numpy)."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert len(lines) == 1, r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def failed_demo(tmp_path_factory):
    """A workspace whose demo exited failed-unverifiable, and that `forge demo`'s result."""
    home = tmp_path_factory.mktemp("demo-failed") / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(demo_mod, "EngineEvaluator",
                   lambda ws, task: ScriptedEvaluator(UNSTABLE))
        r = run_forge("demo", home=home, timeout=300)
    return home, r


def _memory(home) -> dict:
    m = run_forge("task", "memory", TASK, "--json", home=home)
    assert m.returncode == 0, m.stderr
    return json.loads(m.stdout)


def test_a_demo_that_does_not_deliver_exits_1_with_why_and_how_to_continue(failed_demo):
    home, r = failed_demo
    memory = _memory(home)
    assert memory["exit_state"] == "failed-unverifiable"
    line = _one_line_error(r)
    assert r.returncode == 1
    # Why, with the numbers the gate judged …
    cv = next(g for g in memory["execution_record"][0]["verification"]["gates"]
              if g["name"] == "stability")["cv"]
    said = re.search(r"output_throughput CV (\d+\.\d{4}) > max 0\.15", line)
    assert said and abs(float(said.group(1)) - cv) < 1e-3, line
    assert line.startswith("Error: the demo did not deliver (failed-unverifiable): "
                           "the baseline is not stable: ")
    # … and the commands that continue it, for this home, as this shell runs forge (the
    # demo ran in the repository: run_forge's working directory).
    forge = f"{forge_command(cwd=str(REPO))} --home {home}"
    assert f"`{forge} demo` again" in line
    assert f"task reopen {TASK} --reason R && {forge} task run {TASK}" in line
    # The table and the explore block were still printed.
    assert "exit: failed-unverifiable" in r.stdout and "explore:" in r.stdout


TOUR_OK = [
    ("log", "--type", "TaskExited"),
    ("replay", TASK),
    ("check",),
    ("task", "memory", TASK),
    ("sql", "SELECT block_id, metric, max(value) FROM measurements GROUP BY ALL"),
    ("filter", "--model", "tiny-llama", "--metric", "output_throughput", "--engine", "hf"),
    ("retrieve", "why was bfloat16 rejected"),
    ("wiki", "ask", "why was bfloat16 rejected?"),
    ("wiki", "lint"),
    ("concurrency", "--by", "engineer", "--period", "month"),
]


def test_the_tour_after_a_demo_that_did_not_deliver(failed_demo, tmp_path):
    home, _ = failed_demo
    for args in TOUR_OK:
        r = run_forge(*args, home=home)
        assert r.returncode == 0, (args, r.stdout[-800:], r.stderr[-800:])
    r = run_forge("events", "export", "-o", str(tmp_path / "all.jsonl"), home=home)
    assert r.returncode == 0 and (tmp_path / "all.jsonl").stat().st_size > 0, r.stderr
    # A position the short ledger has not reached: said, with the ledger's end.
    until = _one_line_error(run_forge("replay", TASK, "--until", "40", home=home))
    end = re.fullmatch(r"Error: position 40 is past the end of the ledger, which ends at "
                       r"position (\d+)", until)
    check = json.loads(run_forge("check", "--json", home=home).stdout)
    assert end and int(end.group(1)) == check["max_position"], until
    # … and that position replays: the task as the ledger holds it now.
    last = run_forge("replay", TASK, "--until", end.group(1), home=home)
    assert last.returncode == 0 and "as of position" in last.stdout, last.stderr
    # The blocks the README names that this task never reached: one line naming the block
    # and the blocks the task has.
    cmp = _one_line_error(run_forge("compare", f"{TASK}/b1", f"{TASK}/b3", home=home))
    assert "b3" in cmp and "b1" in cmp and TASK in cmp, cmp
    rep = run_forge("reproduce", f"{TASK}:b3", home=home)
    assert rep.returncode == 2, (rep.stdout, rep.stderr)
    line = _one_line_error(rep)
    assert "b3" in line and "b1" in line, line


def test_forge_demo_again_continues_then_a_delivered_demo_reports(failed_demo):
    home, _ = failed_demo
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(demo_mod, "EngineEvaluator", lambda ws, task: ScriptedEvaluator())
        again = run_forge("demo", "--no-wiki", home=home, timeout=300)
        assert again.returncode == 0, again.stderr[-2000:]
        assert "reopened, continuing" in again.stdout
        memory = _memory(home)
        assert memory["exit_state"] == "delivered" and len(memory["accepted"]) == 1
        blocks = len(memory["execution_record"])
        assert blocks > 1
        # Delivered: running it again reports, measures nothing more, exits 0.
        third = run_forge("demo", "--no-wiki", home=home, timeout=300)
        assert third.returncode == 0, third.stderr[-2000:]
        assert "reopened" not in third.stdout and "exit: delivered" in third.stdout
        assert len(_memory(home)["execution_record"]) == blocks
    replay = run_forge("replay", TASK, home=home)
    assert "failed-unverifiable (reopened:" in replay.stdout, replay.stdout


def test_not_delivered_names_the_way_on_for_every_exit(tmp_path):
    assert not_delivered(tmp_path, TASK, "delivered", "passed every gate") is None
    budget = not_delivered(tmp_path, TASK, "failed-budget", "4 blocks of 4")
    assert "4 blocks of 4" in budget and "fresh home" in budget and "reopen" not in budget
    waiting = not_delivered(tmp_path, TASK, None, "an approval")
    assert "task memory" in waiting and "\n" not in waiting
    for state in ("failed-blocked", "failed-no-progress", "follow-up-handoff"):
        assert f"task reopen {TASK}" in not_delivered(tmp_path, TASK, state, "why")


class NoBetter(ScriptedEvaluator):
    """Every candidate measures as the baseline does: none passes the throughput gate."""

    def evaluate(self, candidate, *, repeats, ctx):
        return super().evaluate({}, repeats=repeats, ctx=ctx)


def test_a_demo_out_of_budget_says_to_start_afresh_when_run_again(tmp_path):
    home = tmp_path / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(demo_mod, "EngineEvaluator", lambda ws, task: NoBetter())
        first = run_forge("demo", "--no-wiki", home=home, timeout=300)
        memory = _memory(home)
        assert memory["exit_state"] == "failed-budget", memory["exit_reason"]
        again = run_forge("demo", "--no-wiki", home=home, timeout=300)
    for r in (first, again):
        line = _one_line_error(r)
        assert line.startswith("Error: the demo did not deliver (failed-budget): "
                               f"{memory['exit_reason']}; "), line
        assert "fresh home" in line and "reopen" not in line, line
    # It cannot be reopened, so nothing more was measured.
    assert "reopened" not in again.stdout
    assert len(_memory(home)["execution_record"]) == len(memory["execution_record"])
