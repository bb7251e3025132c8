"""The correctness gate a task type gets by default (ledger/correctness.py): the one table,
its expansion into a task's contract, explicit gates winning, `forge task show`."""

from __future__ import annotations

import json

import pytest
import yaml
from infer_forge.ledger.correctness import (
    CORRECTNESS_DEFAULTS,
    correctness_of,
    default_correctness,
)
from infer_forge.ledger.ids import LEDGER_CONTEXT
from infer_forge.ledger.specs import (
    TASK_TYPES,
    SpecError,
    TaskDefinition,
    canonical,
    load_task,
    spec_hash,
)

from tests.conftest import REPO, run_forge

POINT = REPO / "examples" / "points" / "tiny-cpu.yaml"
THROUGHPUT = {"name": "throughput", "metric": "output_throughput", "vs_baseline": "ratio",
              "at_least": 1.05}
NUMERIC = {"kernel", "quantization", "moe-backend", "attention-backend",
           "speculative-decoding", "communication"}
IDENTICAL = {"scheduler", "routing", "deployment-tuning", "engine-integration",
             "upstream-sync"}
NO_OUTPUTS = {"evaluation", "diagnosis", "profiling"}


def task_file(tmp_path, task_type, gates=(THROUGHPUT,), correctness="default", name="t"):
    contract: dict = {"gates": [dict(g) for g in gates]}
    if correctness is not None:
        contract["correctness"] = correctness
    data = {"id": name, "type": task_type, "goal": "go faster", "point": str(POINT),
            "contract": contract}
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def test_the_table_covers_every_task_type_and_splits_them_by_numerics():
    assert set(CORRECTNESS_DEFAULTS) == set(TASK_TYPES) == NUMERIC | IDENTICAL | NO_OUTPUTS
    for t in TASK_TYPES:
        d = default_correctness(t)
        want = "accuracy" if t in NUMERIC else "token_match" if t in IDENTICAL else None
        assert (d.kind if d else None) == want, t
        assert d is None or d.why
    with pytest.raises(ValueError, match="'kernal' has no entry"):
        default_correctness("kernal")


@pytest.mark.parametrize("task_type", sorted(TASK_TYPES))
def test_each_type_gets_its_default_gate(tmp_path, task_type):
    path = task_file(tmp_path, task_type)
    if task_type in NO_OUTPUTS:
        with pytest.raises(SpecError, match=f"task type {task_type} changes no serving "
                                            "outputs"):
            load_task(path)
        return
    t = load_task(path)
    names = [g.name for g in t.contract.gates]
    assert names == ["throughput", "correctness"]
    gate = t.contract.gates[1]
    if task_type in NUMERIC:
        assert gate.kind == "accuracy"
        assert (gate.task, gate.limit, gate.margin, gate.endpoint) == ("gsm8k", 300, 0.03,
                                                                      "chat")
    else:
        assert gate.kind == "absolute"
        assert (gate.metric, gate.at_least) == ("token_match", 0.99)
    # stored expanded: read back from the ledger's shape, the same gates, the same hash
    again = TaskDefinition.model_validate(canonical(t), context=LEDGER_CONTEXT)
    assert again == t and spec_hash(again) == spec_hash(t)
    assert correctness_of(canonical(t))["source"] == "default"


@pytest.mark.parametrize("explicit", [
    {"name": "same-tokens", "metric": "token_match", "at_least": 0.95},
    {"name": "acc", "kind": "accuracy", "task": "arith", "margin": 0.05},
])
def test_an_explicit_correctness_gate_wins(tmp_path, explicit):
    t = load_task(task_file(tmp_path, "kernel", gates=(THROUGHPUT, explicit)))
    assert [g.name for g in t.contract.gates] == ["throughput", explicit["name"]]
    c = correctness_of(canonical(t))
    assert c == {"type": "kernel", "gates": [explicit["name"]], "source": "explicit",
                 "default": "accuracy gsm8k (300 items, margin 0.03, chat)"}


def test_a_new_engine_judged_numeric_task_gets_its_accuracy_gate_unasked(tmp_path):
    # Saying nothing: the type's default joins, and the definition says so.
    t = load_task(task_file(tmp_path, "kernel", correctness=None))
    assert [g.name for g in t.contract.gates] == ["throughput", "correctness"]
    assert canonical(t)["contract"]["correctness"] == "default"
    assert correctness_of(canonical(t))["source"] == "default"
    # `none` opts out, said in the definition.
    t = load_task(task_file(tmp_path, "kernel", correctness="none"))
    assert [g.name for g in t.contract.gates] == ["throughput"]
    assert correctness_of(canonical(t))["source"] == "opted out"
    # A command evaluator's metrics are its own: nothing added.
    p = task_file(tmp_path, "kernel", correctness=None, name="cmd")
    data = yaml.safe_load(p.read_text())
    data["evaluator"] = {"kind": "command", "argv": ["true"]}
    p.write_text(yaml.safe_dump(data))
    assert [g.name for g in load_task(p).contract.gates] == ["throughput"]
    # A type without outputs gets none, and saying nothing is no error; an output-identical
    # type gets token match only when asked (measured by hand, there are no greedy outputs).
    for typ in ("profiling", "deployment-tuning", "scheduler"):
        t = load_task(task_file(tmp_path, typ, correctness=None, name=typ))
        assert [g.name for g in t.contract.gates] == ["throughput"], typ
        assert "correctness" not in canonical(t)["contract"]
    # An explicit gate stays as written, the field unset: the example's hash is as before.
    ex = load_task(REPO / "examples" / "tasks" / "tune-tiny-cpu.yaml")
    assert "correctness" not in canonical(ex)["contract"]
    assert correctness_of(canonical(ex)) == {
        "type": "deployment-tuning", "gates": ["correctness"], "source": "explicit",
        "default": "token_match >= 0.99"}


def test_a_definition_read_back_from_the_ledger_is_never_changed(tmp_path):
    # A task defined before the default (no correctness field, no gate) keeps its gates and
    # its hash when the ledger reads it.
    data = yaml.safe_load(task_file(tmp_path, "kernel", correctness=None).read_text())
    data["point"] = str(POINT)
    old = TaskDefinition.model_validate(data, context=LEDGER_CONTEXT)
    assert [g.name for g in old.contract.gates] == ["throughput"]
    again = TaskDefinition.model_validate(canonical(old), context=LEDGER_CONTEXT)
    assert again == old and spec_hash(again) == spec_hash(old)
    assert correctness_of(canonical(old))["source"] == "none"


def test_a_gate_named_correctness_that_checks_nothing_is_refused(tmp_path):
    clash = {"name": "correctness", "metric": "median_ttft_ms", "at_most": 500}
    with pytest.raises(SpecError, match="gate name 'correctness' is taken"):
        load_task(task_file(tmp_path, "kernel", gates=(clash,)))
    with pytest.raises(SpecError, match="contract.correctness"):
        load_task(task_file(tmp_path, "kernel", correctness="always"))


def test_forge_task_show_says_where_the_correctness_gate_came_from(tmp_path, forge_home):
    run_forge("init", home=forge_home)
    for name, typ, corr in (("k1", "quantization", None), ("s1", "scheduler", "none")):
        p = task_file(tmp_path, typ, correctness=corr, name=name)
        made = run_forge("task", "new", str(p), home=forge_home)
        assert made.returncode == 0, made.stderr
    shown = run_forge("task", "show", "k1", home=forge_home)
    assert shown.returncode == 0, shown.stderr
    assert ("  correctness: correctness (default; a quantization task's default: accuracy "
            "gsm8k (300 items, margin 0.03, chat))") in shown.stdout.splitlines()
    js = json.loads(run_forge("task", "show", "s1", "--json", home=forge_home).stdout)
    assert js["correctness"] == {"type": "scheduler", "gates": [], "source": "opted out",
                                 "default": "token_match >= 0.99"}
    gates = js["definition"]["contract"]["gates"]
    assert [g["name"] for g in gates] == ["throughput"]
    # An agent's task_show (MCP and the executor: the same registry) answers the same.
    from infer_forge.harness.agents import tool_registry as T
    from infer_forge.harness.mcp.loop_tools import TOOLS
    from infer_forge.ledger import events as E
    from infer_forge.ledger.workspace import open_workspace

    with open_workspace(forge_home) as ws:
        r = T.call(T.ToolContext(ws, E.Actor.agent("reader", "m1"), task_id="k1", tools=TOOLS),
                   "task_show", {"task_id": "k1"})
    assert r.ok, r.error
    assert json.loads(r.text())["correctness"] == {
        "type": "quantization", "gates": ["correctness"], "source": "default",
        "default": "accuracy gsm8k (300 items, margin 0.03, chat)"}


@pytest.mark.parametrize(("n", "flips", "verdict"), [
    (300, 0.03, "pass"), (300, 0.05, "inconclusive"), (1200, 0.05, "pass")])
def test_the_quick_suite_size_decides_what_the_docs_say(n, flips, verdict):
    # unchanged accuracy (80 %), `flips` of the items lost and as many gained
    from infer_forge.harness.bench.accuracy import AccuracyRun, judge_accuracy
    from infer_forge.ledger.correctness import QUICK_MARGIN

    base = [(i, i % 10 < 8) for i in range(n)]
    k = int(n * flips)
    right = [i for i, c in base if c][:k]
    wrong = [i for i, c in base if not c][:k]
    cand = [(i, (not c) if i in right or i in wrong else c) for i, c in base]
    r = judge_accuracy(AccuracyRun("gsm8k", 0.8, base), AccuracyRun("gsm8k", 0.8, cand),
                       margin=QUICK_MARGIN)
    assert r.ratio == 0.0 and r.verdict == verdict, r.reason


@pytest.mark.parametrize(("task_type", "correctness", "want"), [
    ("engine-integration", "default", ("token_match", 0.99)),
    ("kernel", "default", ("gsm8k", 300)),
    ("profiling", "default", None),
    ("kernel", 0.95, ("token_match", 0.95)),
    ("kernel", None, None),
])
def test_forge_ab_writes_the_types_default_correctness_gate(tmp_path, workspace, task_type,
                                                           correctness, want):
    from infer_forge.harness.loop.ab import ab_task
    from infer_forge.repos import commands as rc

    from tests.helpers.gitrepos import make_remote, write_manifest

    make_remote(tmp_path, "alpha", {"a.py": "x = 1\n"}, {"fast": {"a.py": "x = 2\n"}})
    rc.init(workspace, write_manifest(tmp_path / "manifests" / "stack.yaml", [
        {"name": "alpha", "url": "../remotes/alpha.git", "branch": "main"}]))
    _, path, content = ab_task(workspace, point=POINT, member="alpha", base="main",
                               candidate="fast", task_type=task_type,
                               correctness=correctness)
    t = load_task(path)
    assert t.type == content["type"] == task_type
    gates = {g.name: g for g in t.contract.gates}
    assert set(gates) - {"correctness"} == {"faster", "stability"}
    g = gates.get("correctness")
    got = None if g is None else (g.metric, g.at_least) if g.kind == "absolute" else (
        g.task, g.limit)
    assert got == want


def test_forge_ab_refuses_an_unknown_type(tmp_path, workspace):
    from infer_forge.harness.errors import HarnessError
    from infer_forge.harness.loop.ab import ab_task

    with pytest.raises(HarnessError, match="--type 'kernal': not a task type"):
        ab_task(workspace, point=POINT, member="alpha", base="main", candidate="fast",
                task_type="kernal")


def test_the_named_suites_say_what_they_cost():
    from infer_forge.ledger.correctness import SUITES, suite

    assert {n: (s.task, s.items, s.endpoint) for n, s in SUITES.items()} == {
        "gsm8k-quick": ("gsm8k", 300, "chat"), "gsm8k": ("gsm8k", 1319, "chat"),
        "mmlu-quick": ("mmlu_generative", 285, "chat"),
        "mmlu": ("mmlu_generative", 14042, "chat")}
    quick = suite("gsm8k-quick")
    d = default_correctness("kernel")
    assert (d.gate["task"], d.gate["limit"], d.gate["endpoint"]) == (
        quick.task, quick.limit, quick.endpoint)
    with pytest.raises(ValueError, match="suite 'gsm8k-fast': not one of gsm8k-quick"):
        suite("gsm8k-fast")
    shown = run_forge("eval", "suites")
    assert shown.returncode == 0
    row = next(ln for ln in shown.stdout.splitlines() if ln.startswith("mmlu-quick"))
    assert row.split()[:5] == ["mmlu-quick", "mmlu_generative", "285", "14042", "chat"]
    js = json.loads(run_forge("eval", "suites", "--json").stdout)
    assert [s["name"] for s in js] == list(SUITES) and js[0]["items"] == 300
    bad = run_forge("eval", "accuracy", "--url", "http://127.0.0.1:9", "--model", "m",
                    "--suite", "gsm8k-fast")
    assert bad.returncode == 2 and "suite 'gsm8k-fast': not one of" in bad.stderr
