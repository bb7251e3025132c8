"""Issue 9, items 1 and 3: nothing non-finite reaches the ledger, no bad event locks a reader
out of the history, and a damaged or missing ledger file is reported, never replaced.

Attacked as a class, in variants: NaN / ±Infinity / 1e999 / integers past 64 bits through
event construction, encoding, the CLI and evaluator output; stored rows that cannot be decoded
(the old bug's `null` metric, unknown types, corrupt JSON, invalid fields) against every
reader; ledger files truncated, emptied, deleted, overwritten or left with a write-ahead log.
Real SQLite files and `forge` subprocesses throughout.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from infer_forge.harness.bench.metrics import numeric_metrics
from infer_forge.harness.loop.command_evaluator import CommandEvaluator, parse_metrics_line
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.evaluator_protocol import EvalContext
from infer_forge.harness.loop.manual import record_measurement, start_block
from infer_forge.harness.loop.run import run_task
from infer_forge.ledger import codec
from infer_forge.ledger import events as E
from infer_forge.ledger import numbers as N
from infer_forge.ledger.check import check_home
from infer_forge.ledger.errors import (
    CorruptEventError,
    DamagedLedgerError,
    LedgerError,
    NonFiniteError,
)
from infer_forge.ledger.replay import replay_task
from infer_forge.ledger.store import Ledger
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.workspace import init_workspace, open_workspace
from infer_forge.projections import index as I
from infer_forge.projections.memory import task_memory

from tests.conftest import REPO, insert_raw_event, run_forge
from tests.helpers.index_ledger import build
from tests.helpers.tasks import measurements, open_task

from ..harness.loop.test_loop import make_task_dir

NAN, INF = float("nan"), float("inf")
HUGE = 2**64  # one past what orjson writes


def ledger_file(home: Path) -> Path:
    return home / "ledger.sqlite"


def one_line_error(res: subprocess.CompletedProcess) -> str:
    """A refusal: non-zero exit, exactly one line on stderr, no traceback."""
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip() and "\n" not in res.stderr.strip(), res.stderr
    return res.stderr.strip()


# --- 1a. the mechanism: no event is built or encoded with a number JSON cannot hold ----------


@pytest.mark.parametrize(("value", "path", "says"), [
    (NAN, "", "NaN is not a finite number"),
    (INF, "", "Infinity is not a finite number"),
    (-INF, "", "-Infinity is not a finite number"),
    (float("1e999"), "", "Infinity is not a finite number"),
    ({"a": {"b": [1.0, 2, {"c": NAN}]}}, ".a.b[2].c", "NaN"),
    ([1, (2.0, -INF)], "[1][1]", "-Infinity"),
    ({"engine.dtype": INF}, "['engine.dtype']", "Infinity"),
    (HUGE, "", "does not fit in 64 bits"),
    (-(2**63) - 1, "", "does not fit in 64 bits"),
    ({"deep": [[[10**40]]]}, ".deep[0][0][0]", "does not fit in 64 bits"),
])
def test_check_finite_names_the_path(value, path, says):
    with pytest.raises(NonFiniteError) as e:
        N.check_finite(value, "spec.yaml: contract")
    msg = str(e.value)
    assert msg.startswith(f"spec.yaml: contract{path}: ") and says in msg and "\n" not in msg
    assert isinstance(e.value, LedgerError)


@pytest.mark.parametrize("value", [0, 1.5, -2**63, 2**64 - 1, True, None, "NaN", "inf",
                                   {"a": [1, "x", None, {"b": 1e308}]}, [], {}])
def test_check_finite_passes_what_json_holds(value):
    N.check_finite(value, "x")  # no error


@pytest.mark.parametrize(("make", "says"), [
    (lambda: E.MeasurementRecorded(run_id="r", source="s",
                                   metrics={"output_throughput": NAN}),
     "MeasurementRecorded.metrics.output_throughput: NaN is not a finite number"),
    (lambda: E.MeasurementRecorded(run_id="r", source="s", metrics={"x": "-inf"}),
     "MeasurementRecorded.metrics.x: "),
    (lambda: E.MeasurementRecorded(run_id="r", source="s", metrics={"x": 1.0},
                                   meta={"runs": [{"ttft": [0.1, INF]}]}),
     "MeasurementRecorded.meta.runs[0].ttft[1]: Infinity is not a finite number"),
    (lambda: E.MeasurementRecorded(run_id="r", source="s", metrics={"x": 1.0}, repeat=HUGE),
     "MeasurementRecorded.repeat: integer 18446744073709551616 does not fit in 64 bits"),
    (lambda: E.VerificationRecorded(contract_hash="c", passed=True, verdict="pass",
                                    gates=[{"name": "tput", "kind": "absolute",
                                            "verdict": "pass", "passed": True, "median": NAN}]),
     "VerificationRecorded.gates[0].median: NaN"),
    (lambda: E.TaskDefined(title="t", task_type="x", goal="g", definition_hash="h",
                           definition={"contract": {"gates": [{"at_least": INF}]}}),
     "TaskDefined.definition.contract.gates[0].at_least: Infinity"),
    (lambda: E.ToolInvoked(tool="t", argv=["x"], duration_s=NAN),
     "ToolInvoked.duration_s: NaN"),
    (lambda: E.GraphRunFinished(run_id="r", outcome="completed", wall_s=-INF),
     "GraphRunFinished.wall_s: -Infinity"),
    (lambda: E.RuntimeProfileRevised(service="s", rev=1, profile_hash="h",
                                     profile={"config": {"mem_fraction_static": NAN}}),
     "RuntimeProfileRevised.profile.config.mem_fraction_static: NaN"),
    (lambda: E.NodeAdded(node={"id": "n", "weight": 10**30}),
     "NodeAdded.node.weight: integer 100000000000… (31 digits) does not fit in 64 bits"),
])
def test_events_cannot_be_built_with_non_finite_numbers(make, says):
    with pytest.raises(NonFiniteError) as e:
        make()
    assert says in str(e.value) and "\n" not in str(e.value)


def _measure(**kw) -> E.MeasurementRecorded:
    return E.MeasurementRecorded(run_id="r", source="s", metrics={"x": 1.0}, task_id="t1", **kw)


@pytest.mark.filterwarnings("ignore::UserWarning")  # pydantic on dumping an int dict key
@pytest.mark.parametrize(("bypass", "says"), [
    # Paths around validation: copies with updates and unvalidated construction.
    (lambda: _measure().model_copy(update={"metrics": {"output_throughput": NAN}}),
     "MeasurementRecorded.metrics.output_throughput: NaN"),
    (lambda: _measure().model_copy(update={"candidate": {"k": [INF]}}),
     "MeasurementRecorded.candidate.k[0]: Infinity"),
    (lambda: E.MeasurementRecorded.model_construct(
        **{**_measure().__dict__, "meta": {"n": HUGE}}),
     "MeasurementRecorded.meta.n: integer"),
    # What JSON cannot represent at all is refused the same way (not a TypeError).
    (lambda: _measure().model_copy(update={"meta": {1: "int key"}}),
     "MeasurementRecorded.meta: key 1 is not a string"),
    (lambda: _measure().model_copy(update={"candidate": {"s": {1, 2}}}),
     "MeasurementRecorded.candidate.s: set value cannot be stored"),
])
def test_encode_refuses_what_bypassed_construction_and_nothing_is_written(workspace, bypass,
                                                                          says):
    ledger = workspace.ledger
    ledger.append(task_stream("t1"), [_measure()])
    before = ledger.max_position()
    with pytest.raises(NonFiniteError) as e:
        codec.encode("task:t1", 2, bypass(), ledger.redactor)
    assert says in str(e.value)
    with pytest.raises(NonFiniteError):
        ledger.append(task_stream("t1"), [_measure(), bypass()])  # the whole save refused
    assert ledger.max_position() == before
    assert [r.version for r in ledger.stream(task_stream("t1"))] == [1]


@pytest.mark.parametrize("metric", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_stored_non_finite_text_never_decodes_to_a_non_finite_float(workspace, metric):
    """A typed float refuses "NaN"-like strings and NaN tokens on every read path."""
    ledger = workspace.ledger
    good = _measure()
    payload = {**good.model_dump(mode="json"), "_v": 1}
    for state in (orjson.dumps({**payload, "metrics": {"x": metric}}),
                  orjson.dumps(payload).replace(b'"x":1.0', f'"x":{metric}'.encode())):
        pos = insert_raw_event(workspace.home, "task:t1", 1, "MeasurementRecorded", state)
        with pytest.raises(CorruptEventError):
            codec.decode("task:t1", 1, "MeasurementRecorded", state)
        with pytest.raises(CorruptEventError, match=f"position {pos}"):
            replay_task(ledger, "t1")
        con = sqlite3.connect(ledger_file(workspace.home))
        con.execute("DELETE FROM stored_events WHERE rowid=?", (pos,))
        con.commit()
        con.close()


def test_decoding_does_not_run_the_construction_check():
    """The construction check must not slow every decode: pydantic calls a model's own
    __init__ from validation only for a 'custom' one."""
    assert E.MeasurementRecorded.__pydantic_custom_init__ is False
    ev = _measure(meta={"a": [1, 2.5]})
    assert codec.decode("task:t1", 1, ev.TYPE, codec.encode("task:t1", 1, ev, None).state) == ev


# --- 1b. every entry of a number: the CLI, the harness, evaluator output ---------------------


def _manual_task(home: Path) -> None:
    for args in (("init",), ("task", "new", "examples/tasks/tune-tiny-cpu.yaml"),
                 ("block", "start", "tune-tiny-cpu", "--sub-goal", "by hand")):
        res = run_forge(*args, home=home)
        assert res.returncode == 0, res.stderr


def test_forge_measure_refuses_non_finite_metrics_naming_them(forge_home):
    _manual_task(forge_home)
    with Ledger.open(forge_home) as ledger:
        before = ledger.max_position()
    for value in ["NaN", "nan", "Infinity", "-Infinity", "inf", "-inf", "1e999", "-1e400",
                  "1" + "0" * 400, "fast"]:
        res = run_forge("measure", "tune-tiny-cpu", "--metric", "median_ttft_ms=80",
                        "--metric", f"output_throughput={value}", home=forge_home)
        err = one_line_error(res)
        assert "--metric output_throughput" in err, (value, err)
    # --set values (a candidate) are refused the same way.
    res = run_forge("block", "start", "tune-tiny-cpu", "--sub-goal", "x",
                    "--set", "engine.continuous_batching=NaN", home=forge_home)
    assert "--set engine.continuous_batching: NaN is not a finite number" in \
        one_line_error(res)
    with Ledger.open(forge_home) as ledger:
        assert ledger.max_position() == before  # nothing written by any refusal
    ok = run_forge("measure", "tune-tiny-cpu", "--metric", "output_throughput=512.5",
                   home=forge_home)
    assert ok.returncode == 0, ok.stderr
    assert run_forge("check", home=forge_home).returncode == 0


@pytest.mark.parametrize("value", [NAN, INF, -INF, 10**400])
def test_record_measurement_refuses_before_reading_or_writing(workspace, tmp_path, value):
    define_task(workspace, make_task_dir(tmp_path / "specs"))
    start_block(workspace, "t1", "by hand")
    before = workspace.ledger.max_position()
    with pytest.raises(NonFiniteError, match="metric output_throughput: "):
        record_measurement(workspace, "t1", {"median_ttft_ms": 80.0,
                                             "output_throughput": value})
    assert workspace.ledger.max_position() == before


def test_numeric_metrics_omits_non_finite_numbers_with_the_reason():
    omitted: dict[str, str] = {}
    out = numeric_metrics({"output_throughput": NAN, "p99_ttft_ms": INF, "huge": 10**400,
                           "ok": 3, "flag": True, "nested": {"ttft": -INF, "tpot": 0.5},
                           "text": "x"}, omitted)
    assert out == {"ok": 3.0, "flag": 1.0, "nested.tpot": 0.5}
    assert omitted["output_throughput"] == "NaN is not a finite number"
    assert omitted["p99_ttft_ms"] == "Infinity is not a finite number"
    assert "too large for a float" in omitted["huge"]
    assert omitted["nested.ttft"] == "-Infinity is not a finite number"
    assert numeric_metrics({"x": NAN}) == {}  # without `omitted`: still left out, no crash


def test_evaluator_output_with_non_finite_numbers_is_omitted_not_fatal(tmp_path):
    line = ('{"output_throughput": NaN, "median_ttft_ms": Infinity, "p99": -Infinity, '
            '"big": 1e999, "huge": ' + "9" * 400 + ', "token_match": 1.0, '
            '"metrics": {"tpot": NaN, "itl": 2.5}}')
    metrics, rest = parse_metrics_line("warming up\n" + line)
    assert metrics == {"token_match": 1.0, "itl": 2.5}
    assert set(rest["omitted_metrics"]) == {"output_throughput", "median_ttft_ms", "p99", "big",
                                            "huge", "tpot"}
    # Through a real evaluator process: the run is data, the reasons are kept in meta.
    script = tmp_path / "ev.py"
    script.write_text(f"print({line!r})\n")
    ctx = EvalContext(workspace=None, task_id="t1", block_id="b1", point=None, profile=None)
    (run,) = CommandEvaluator([sys.executable, str(script)]).evaluate({}, repeats=1, ctx=ctx)
    assert run.metrics == {"token_match": 1.0, "itl": 2.5}
    assert "NaN is not a finite number" in run.meta["omitted_metrics"]["output_throughput"]


def test_bench_client_results_with_non_finite_numbers_are_recorded_without_them(workspace,
                                                                               tmp_path):
    from infer_forge.harness.bench.client import BenchResult
    from infer_forge.harness.bench.client import record_measurement as record_bench

    open_task(workspace, tmp_path)  # measurements go into a defined task

    res = BenchResult(config={"request_rate": "inf", "timeout_s": INF}, records=[],
                      warmup_records=[], duration_s=1.0,
                      metrics={"completed": 4, "failed": 0, "request_throughput": 4.0,
                               "output_throughput": NAN, "median_ttft_ms": INF,
                               "slo_attainment_by_metric": {"ttft": -INF, "tpot": 1.0}})
    ev = record_bench(workspace, res, task_id="t1")
    assert ev.metrics == {"completed": 4.0, "failed": 0.0, "request_throughput": 4.0,
                          "slo_attainment_by_metric.tpot": 1.0}
    assert ev.meta["omitted_metrics"] == {
        "output_throughput": "NaN is not a finite number",
        "median_ttft_ms": "Infinity is not a finite number",
        "slo_attainment_by_metric.ttft": "-Infinity is not a finite number",
        "meta.config.timeout_s": "Infinity is not a finite number"}
    assert ev.meta["config"]["timeout_s"] is None
    (stored,) = measurements(workspace, "t1")
    assert (stored.metrics, stored.meta) == (ev.metrics, ev.meta)
    assert check_home(workspace.home).ok


NAN_EVAL = r'''
import json, os, sys
cand = json.load(sys.stdin)
tput = "NaN" if not cand else "200.0"
print('{"output_throughput": %s, "median_ttft_ms": Infinity, "token_match": 1.0, '
      '"completed": 64, "failed": 0, "meta": {"note": NaN, "n": 1}}' % tput)
'''


def test_a_loop_whose_evaluator_prints_nan_records_no_null(workspace, tmp_path):
    task = make_task_dir(tmp_path / "specs", max_blocks=2)
    (task.parent / "evalscript.py").write_text(NAN_EVAL)
    define_task(workspace, task)
    result = run_task(workspace, "t1", progress=lambda _: None)
    assert result.status == "exited"
    runs = [r.event for r in workspace.ledger.stream(task_stream("t1"))
            if r.type == "MeasurementRecorded"]
    assert runs
    for ev in runs:
        assert all(math.isfinite(v) for v in ev.metrics.values())
        assert "median_ttft_ms" not in ev.metrics and "token_match" in ev.metrics
        omitted = ev.meta["omitted_metrics"]
        assert omitted["median_ttft_ms"] == "Infinity is not a finite number"
        assert ev.meta["note"] is None and omitted["meta.note"] == "NaN is not a finite number"
    baseline = [ev for ev in runs if not ev.candidate]
    assert baseline and all("output_throughput" not in ev.metrics for ev in baseline)
    assert b"null" not in b"".join(  # the old bug's trace: a null metric value
        orjson.dumps(ev.metrics) for ev in runs)
    assert check_home(workspace.home).ok


# --- 1c. readers survive events they cannot decode ---------------------------------------------


def _stored(ev: E.Event, **changes) -> bytes:
    return orjson.dumps({**ev.model_dump(mode="json"), **changes, "_v": ev.SCHEMA_VERSION})


def _bad_rows(task: str) -> list[tuple[str, bytes, str]]:
    """(type, stored state, what the error says) of undecodable events on a task stream."""
    m = E.MeasurementRecorded(task_id=task, block_id="b1", run_id="r-bad", source="manual",
                              metrics={"output_throughput": 1.0})
    v = E.VerificationRecorded(task_id=task, block_id="b1", contract_hash="c", passed=True,
                               verdict="pass")
    return [
        # The exact old bug: NaN written by orjson as null in a float field.
        ("MeasurementRecorded", _stored(m, metrics={"output_throughput": None}),
         "metrics.output_throughput"),
        ("EngineExploded", b'{"x": 1, "_v": 1}', "unknown event type 'EngineExploded'"),
        ("MeasurementRecorded", b'{"event_id": "x", "run_', "corrupt payload"),
        ("VerificationRecorded", _stored(v, verdict="maybe"), "verdict"),
        ("TaskExited", b"[1, 2]", "not an object"),
    ]


@pytest.fixture
def damaged(workspace):
    """The index test ledger (four tasks) with five undecodable events planted in the middle
    of task tune-tiny-cpu's stream and more good events after them."""
    build(workspace)
    ledger = workspace.ledger
    stream = task_stream("tune-tiny-cpu")
    version = ledger.version(stream)
    planted = []
    for i, (topic, state, says) in enumerate(_bad_rows("tune-tiny-cpu")):
        pos = insert_raw_event(workspace.home, stream, version + 1 + i, topic, state)
        planted.append((pos, version + 1 + i, topic, says))
    ledger.append(stream, [E.TaskReopened(task_id="tune-tiny-cpu", reason="after the damage")])
    ledger.append(task_stream("tune-qwen-h200"),
                  [E.TaskReopened(task_id="tune-qwen-h200", reason="elsewhere")])
    return workspace, planted


def _warned(stderr: str, planted) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr
    for pos, version, _topic, says in planted:
        hits = [ln for ln in lines if f"position {pos}:" in ln]
        assert len(hits) == 1, (pos, stderr)
        assert f"version {version}" in hits[0] and says in hits[0]
        assert "stream 'task:tune-tiny-cpu'" in hits[0] and "forge check" in hits[0]
    assert len(lines) == len(planted), stderr


def test_forge_log_and_export_keep_reading_past_bad_events(damaged):
    ws, planted = damaged
    home = ws.home
    good = [r for r in ws.ledger.log(on_error=lambda u: None)]
    log = run_forge("log", home=home)
    assert log.returncode == 0
    _warned(log.stderr, planted)
    assert len(log.stdout.splitlines()) == len(good)
    assert "after the damage" not in log.stdout and log.stdout.count("TaskReopened") == 2

    js = run_forge("log", "--json", home=home)
    assert js.returncode == 0
    _warned(js.stderr, planted)
    rows = [json.loads(line) for line in js.stdout.splitlines()]
    errors = [r for r in rows if r.get("undecodable")]
    assert [(r["position"], r["version"], r["type"]) for r in errors] == \
        [(p, v, t) for p, v, t, _ in planted]
    assert [r["position"] for r in rows] == sorted(r["position"] for r in rows)
    assert len(rows) - len(errors) == len(good)

    # Filtered by the damaged task: its bad events are reported, the other task's log is clean.
    t = run_forge("log", "--task", "tune-tiny-cpu", "--json", home=home)
    assert t.returncode == 0
    assert sum(bool(json.loads(x).get("undecodable")) for x in t.stdout.splitlines()) == 5
    other = run_forge("log", "--task", "tune-qwen-h200", home=home)
    assert other.returncode == 0 and other.stderr == "" and "TaskReopened" in other.stdout

    out = home / "all.jsonl"
    exp = run_forge("events", "export", "-o", str(out), home=home)
    assert exp.returncode == 0
    total = json.loads(run_forge("check", "--json", home=home).stdout)["events"]
    assert f"exported {len(good)} of {total} events" in exp.stderr, exp.stderr
    assert "5 undecodable" in exp.stderr
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    bad = [r for r in exported if r.get("undecodable")]
    assert [r["position"] for r in bad] == [p for p, *_ in planted]
    assert bad[2]["raw"] == '{"event_id": "x", "run_'  # the stored text is kept
    assert '"output_throughput":null' in bad[0]["raw"]


def test_task_readers_keep_reading_past_bad_events(damaged):
    ws, planted = damaged
    home = ws.home
    lst = run_forge("task", "list", "--json", home=home)
    assert lst.returncode == 0
    _warned(lst.stderr, planted)
    rows = {r["task_id"]: r for r in json.loads(lst.stdout)}
    assert len(rows) == 4 and rows["tune-tiny-cpu"]["damaged_events"] == [p for p, *_ in planted]
    assert rows["tune-tiny-cpu"]["status"] == "running"  # TaskReopened after the damage
    assert "damaged_events" not in rows["tune-qwen-h200"]
    human = run_forge("task", "list", home=home)
    assert human.returncode == 0 and "tune-tiny-cpu" in human.stdout

    show = run_forge("task", "show", "tune-tiny-cpu", "--json", home=home)
    assert show.returncode == 0
    _warned(show.stderr, planted)
    assert json.loads(show.stdout)["blocks"]

    mem = run_forge("task", "memory", "tune-tiny-cpu", "--json", home=home)
    assert mem.returncode == 0
    _warned(mem.stderr, planted)
    memory = json.loads(mem.stdout)
    runs = [m for b in memory["execution_record"] for m in b["measurements"]]
    assert runs and "r-bad" not in {m["run_id"] for m in runs}
    clean = run_forge("task", "memory", "tune-qwen-h200", home=home)
    assert clean.returncode == 0 and clean.stderr == ""

    # In-process, the strict default still refuses, naming the position.
    with pytest.raises(LedgerError, match=f"position {planted[0][0]}: "):
        task_memory(ws.ledger, "tune-tiny-cpu")


def test_replay_fails_clearly_for_the_damaged_task_only(damaged):
    ws, planted = damaged
    home = ws.home
    res = run_forge("replay", "tune-tiny-cpu", home=home)
    err = one_line_error(res)
    pos, version, _, says = planted[0]
    assert f"position {pos}:" in err and f"version {version}" in err and says in err
    assert "forge check" in err
    # Up to the position before the damage, and every other task, replay as usual.
    before = run_forge("replay", "tune-tiny-cpu", "--until", str(pos - 1), home=home)
    assert before.returncode == 0, before.stderr
    for task in ("tune-qwen-h200", "qwen-h200-rev2", "deepgemm-moe-h20"):
        ok = run_forge("replay", task, "--json", home=home)
        assert ok.returncode == 0 and ok.stderr == "", ok.stderr


def test_check_fails_naming_every_bad_event(damaged):
    ws, planted = damaged
    res = run_forge("check", home=ws.home)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    for pos, version, _topic, says in planted:
        line = next(ln for ln in res.stdout.splitlines() if f"problem: position {pos}:" in ln)
        assert f"version {version}" in line and says in line
    report = check_home(ws.home)
    assert not report.ok and report.events == ws.ledger.max_position()


def test_index_skips_bad_events_once_and_keeps_catching_up(damaged):
    ws, planted = damaged
    bad_positions = [p for p, *_ in planted]
    with I.open_index(ws) as s:
        assert I.tracked_position(s.con) == ws.ledger.max_position()
        skipped = s.con.execute("SELECT position, stream, version, type, error FROM skipped "
                                "ORDER BY position").fetchall()
        assert [r[0] for r in skipped] == bad_positions
        for (_pos, version, topic, says), row in zip(planted, skipped, strict=True):
            assert row[1:4] == ("task:tune-tiny-cpu", version, topic) and says in row[4]
        # Left out of every typed table: the null-metric run is not a measurement.
        assert s.con.execute("SELECT count(*) FROM measurement_runs WHERE run_id = 'r-bad'"
                             ).fetchone() == (0,)
        assert s.con.execute("SELECT count(*) FROM verifications WHERE position IN "
                             "(SELECT position FROM skipped)").fetchone() == (0,)
        # JSON objects stay in `events` as stored; corrupt text does not.
        kept = {r[0] for r in s.con.execute(
            "SELECT position FROM events WHERE position IN (SELECT position FROM skipped)"
        ).fetchall()}
        assert kept == {bad_positions[0], bad_positions[1], bad_positions[3]}
        first = I.fingerprint(s.con)
    # Exactly once: more events, another catch-up: the bad ones are not read again.
    ws.ledger.append(task_stream("tune-tiny-cpu"),
                     [E.TaskReopened(task_id="tune-tiny-cpu", reason="later")])
    with I.open_index(ws) as s:
        assert s.caught_up.events == 2 and s.caught_up.skipped == []
        assert s.con.execute("SELECT count(*) FROM skipped").fetchone() == (len(planted),)
        incremental = I.fingerprint(s.con)
    assert incremental != first
    with I.open_index(ws, rebuild=True) as s:
        assert I.fingerprint(s.con) == incremental  # rebuild == incremental, damage included
    report = run_forge("index", "update", "--json", home=ws.home)
    assert report.returncode == 0
    assert [u["position"] for u in json.loads(report.stdout)["skipped"]] == bad_positions


def test_wiki_builds_over_bad_events(damaged):
    ws, planted = damaged
    # A graph stream with damage too: its page is built from what decodes.
    ws.ledger.append("graph:g1", [E.GraphDefined(graph_id="g1", spec_hash="h", title="G")])
    insert_raw_event(ws.home, "graph:g1", 2, "NodeAdded", b'{"node": null, "_v": 1}')
    insert_raw_event(ws.home, "graph:g2", 1, "GraphDefined", b"{broken")
    res = run_forge("wiki", "build", "--no-embeddings", home=ws.home, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    site = ws.home / "site"
    assert (site / "index.html").exists()
    assert any("tune-tiny-cpu" in p.name for p in site.rglob("*.html"))
    assert any("g1" in p.name for p in (site / "graphs").glob("*.html"))


# --- 3. a damaged or missing ledger file ---------------------------------------------------------


def _fill(home: Path, n: int = 400) -> int:
    """Enough events for a ledger of several pages; returns the last position."""
    with Ledger.open(home) as ledger:
        for i in range(n // 20):
            ledger.append(task_stream("t1"), [
                E.MeasurementRecorded(task_id="t1", block_id="b1", run_id=f"r{i}-{j}",
                                      source="s", metrics={"output_throughput": 100.0 + j},
                                      meta={"pad": "x" * 200}) for j in range(20)])
        return ledger.max_position()


def _truncate_half(p: Path) -> None:
    os.truncate(p, p.stat().st_size // 2)


def _garbage_middle(p: Path) -> None:
    size = p.stat().st_size
    with p.open("r+b") as f:
        for off in range(size // 4, size * 3 // 4, 8192):
            f.seek(off)
            f.write(b"\xde\xad\xbe\xef" * 256)


DAMAGE = {
    "truncated-half": (_truncate_half, "truncated"),
    "truncated-100": (lambda p: os.truncate(p, 100), "truncated: 100 bytes"),
    "truncated-50": (lambda p: os.truncate(p, 50), "truncated to 50 bytes"),
    "empty": (lambda p: os.truncate(p, 0), "the file is empty (0 bytes)"),
    "deleted": (lambda p: p.unlink(), "the file is missing"),
    "not-sqlite": (lambda p: p.write_bytes(b"PK\x03\x04" + os.urandom(8000)),
                   "not an SQLite database"),
    "garbage-middle": (_garbage_middle, ""),
    "table-dropped": (lambda p: _sql(p, "DROP TABLE stored_events"),
                      "events table stored_events is missing"),
}


def _sql(path: Path, statement: str) -> None:
    con = sqlite3.connect(path)
    con.execute(statement)
    con.commit()
    con.close()


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_ledger_file_is_reported_not_replaced(forge_home, damage):
    init_workspace(forge_home)[0].close()
    _fill(forge_home)
    # The read commands keep their rows first (projections/fast_reads.py): a damaged file
    # is still reported, never answered from them.
    for args in (("log",), ("task", "list"), ("task", "memory", "t1")):
        assert run_forge(*args, home=forge_home).returncode == 0, args
    assert (forge_home / "reads.sqlite").is_file()
    db = ledger_file(forge_home)
    hurt, says = DAMAGE[damage]
    hurt(db)
    before = db.read_bytes() if db.exists() else None

    check = run_forge("check", home=forge_home)
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stderr
    problems = [ln for ln in check.stdout.splitlines() if ln.startswith("problem: ")]
    assert problems and str(db) in "\n".join(problems), check.stdout
    assert says in check.stdout
    for args in (("log",), ("task", "list"), ("task", "memory", "t1"), ("replay", "t1"),
                 ("events", "export"), ("index", "update")):
        res = run_forge(*args, home=forge_home)
        if damage == "garbage-middle" and res.returncode == 0:
            continue  # the pages this read needs may have survived; `check` still fails
        err = one_line_error(res)
        assert str(db) in err and "forge check" in err, (args, err)
        assert says in err
    # Nothing was created or rewritten in its place, not even by `forge init` (over garbage
    # in the middle, init may find its marker on surviving pages: then it writes nothing).
    init = run_forge("init", home=forge_home)
    if not (damage == "garbage-middle" and init.returncode == 0):
        assert str(db) in one_line_error(init)
    if damage != "garbage-middle":  # found by opening; garbage is found by reading
        with pytest.raises(DamagedLedgerError):
            open_workspace(forge_home)
    assert (db.read_bytes() if db.exists() else None) == before


def test_a_leftover_write_ahead_log_is_recovered_not_lost(forge_home):
    """A writer killed before closing leaves ledger.sqlite-wal holding committed events:
    SQLite's recovery must read them (not a damage), and a deleted main file beside a
    leftover log is still a missing ledger."""
    init_workspace(forge_home)[0].close()
    code = ("import os, sys\n"
            "from infer_forge.ledger.store import Ledger\n"
            "from infer_forge.ledger import events as E\n"
            "l = Ledger.open(sys.argv[1])\n"
            "for i in range(5):\n"
            "    l.append('task:t1', [E.TaskReopened(task_id='t1', reason=f'r{i}')])\n"
            "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", code, str(forge_home)], check=True, cwd=REPO)
    wal = forge_home / "ledger.sqlite-wal"
    assert wal.exists() and wal.stat().st_size > 0
    check = run_forge("check", home=forge_home)
    assert check.returncode == 0 and check.stdout.strip().endswith("ok"), check.stdout
    log = run_forge("log", home=forge_home)
    assert log.returncode == 0 and log.stdout.count("TaskReopened") == 5

    subprocess.run([sys.executable, "-c", code, str(forge_home)], check=True, cwd=REPO)
    saved = wal.read_bytes()
    ledger_file(forge_home).unlink()
    for args in (("check",), ("log",), ("task", "list"), ("init",)):
        res = run_forge(*args, home=forge_home)
        out = res.stdout if args == ("check",) else one_line_error(res)
        assert res.returncode == 1 and "the file is missing" in out, (args, out)
        assert "ledger.sqlite-wal is still there" in out
    assert not ledger_file(forge_home).exists() and wal.read_bytes() == saved


def test_init_still_creates_and_is_idempotent(forge_home):
    first = run_forge("init", home=forge_home)
    assert first.returncode == 0 and "created" in first.stdout
    again = run_forge("init", home=forge_home)
    assert again.returncode == 0 and "already exists" in again.stdout
    with Ledger.open(forge_home) as ledger:
        assert [r.type for r in ledger.log()] == ["WorkspaceInitialized"]
    # A ledger is never created by opening: only init makes one.
    fresh = forge_home.parent / "other-home"
    fresh.mkdir()
    (fresh / "forge.toml").write_text((forge_home / "forge.toml").read_text())
    with pytest.raises(DamagedLedgerError, match="the file is missing"):
        Ledger.open(fresh)
    assert not ledger_file(fresh).exists()
    shutil.rmtree(fresh)
    # An init that died after SQLite created the file (0 bytes, no forge.toml yet) can be
    # run again; with forge.toml the same empty file is damage.
    crashed = forge_home.parent / "crashed-init"
    crashed.mkdir()
    ledger_file(crashed).touch()
    res = run_forge("init", home=crashed)
    assert res.returncode == 0, res.stderr
    assert run_forge("check", home=crashed).returncode == 0


def test_a_missing_postgres_table_is_damage_not_a_fresh_start(pg_home):
    home = pg_home
    with Ledger.open(home) as ledger:
        ledger.append("task:t1", [E.TaskReopened(task_id="t1", reason="r")])
        table = f'"{ledger.recorder.datastore.schema}"."{ledger.recorder.events_table_name}"'
        with ledger.recorder.datastore.transaction(commit=True) as c:
            c.execute(f"DROP TABLE {table}")
    for args in (("log",), ("task", "list"), ("init",)):
        err = one_line_error(run_forge(*args, home=home))
        assert "events table" in err and "is missing" in err and "forge check" in err
    check = run_forge("check", home=home)
    assert check.returncode == 1 and "events table" in check.stdout
    with pytest.raises(DamagedLedgerError):
        Ledger.open(home)

