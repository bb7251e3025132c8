"""forge sql / compare / filter, checked against the hand-built ledger
(tests/helpers/index_ledger.py)."""

from __future__ import annotations

import csv
import io
import json

import pytest
from infer_forge.projections import index as I
from infer_forge.projections import queries as Q
from infer_forge.projections.errors import ProjectionError

from tests.conftest import run_forge
from tests.helpers.index_ledger import build


@pytest.fixture
def built(workspace):
    build(workspace)
    return workspace


def test_compare_two_tasks(built):
    r = Q.compare_ws(built, "tune-qwen-h200", "deepgemm-moe-h20")
    assert r["a"]["scope"] == "accepted block b2"  # a task is compared by its deliverable
    assert r["b"]["scope"] == "last measured block b2"
    differ = {d["dimension"]: (d["a"], d["b"]) for d in r["differing_dimensions"]}
    assert differ["accelerator"] == ("H200", "H20")
    assert differ["parallelism"] == ("tp1-pp1-dp1-ep1", "tp8-pp1-dp1-ep8")
    assert differ["task_type"] == ("deployment-tuning", "kernel")
    assert "model" not in differ and r["same_dimensions"]["model"] == "Qwen3-30B-A3B"
    m = {x["metric"]: x for x in r["metrics"]}
    assert (m["output_throughput"]["a"], m["output_throughput"]["b"]) == (2200.0, 1100.0)
    assert m["output_throughput"]["delta"] == -1100.0
    assert m["output_throughput"]["delta_pct"] == pytest.approx(-50.0)
    assert m["token_match"]["b"] == 0.61 and m["token_match"]["b_n"] == 3
    gb = {g["gate"]: g["verdict"] for g in r["gates"]["b"]}
    assert gb == {"throughput": "pass", "correctness": "fail"}
    assert {g["verdict"] for g in r["gates"]["a"]} == {"pass"}


def test_compare_runtime_profiles_and_blocks(built):
    r = Q.compare_ws(built, "qwen-h200@1", "qwen-h200@2")
    assert [d["dimension"] for d in r["differing_dimensions"]] == ["runtime_profile",
                                                                   "point_hash"]
    m = {x["metric"]: x for x in r["metrics"]}
    assert m["output_throughput"]["delta"] == 200.0  # 2000 (rev 1 baseline) -> 2200
    assert m["median_ttft_ms"]["delta"] == 20.0
    r = Q.compare_ws(built, "tune-tiny-cpu/b1", "tune-tiny-cpu/b2")
    assert [d["dimension"] for d in r["differing_dimensions"]] == ["candidate_key"]
    m = {x["metric"]: x for x in r["metrics"]}
    assert (m["output_throughput"]["a"], m["output_throughput"]["b"]) == (460.0, 170.0)
    assert m["median_ttft_ms"]["delta"] == 47.0 - 900.0
    assert r["gates"]["a"] == []  # the baseline block was not verified
    with pytest.raises(ProjectionError, match="not a task, block"):
        Q.compare_ws(built, "tune-tiny-cpu", "no-such-thing")


# Side a is resolved in the calling thread while side b runs in a second one: an unresolved
# side a raised while side b was still using its cursor, and closing that cursor then
# raised duckdb's ResourceInUseException instead (about 3 runs in 8).
UNRESOLVED = [("no-such-thing", "tune-tiny-cpu", "no-such-thing"),  # a fails, b is slow
              ("no-such-thing", "deepgemm-moe-h20/b2", "no-such-thing"),
              ("tune-tiny-cpu", "no-such-thing", "no-such-thing"),  # b fails
              ("nope", "nada", "nope")]  # both fail: side a's error, every time


@pytest.mark.parametrize(("a", "b", "named"), UNRESOLVED)
def test_compare_of_an_unresolved_subject_is_one_error_every_time(built, a, b, named):
    with I.open_index(built) as s:
        for _ in range(50):
            with pytest.raises(ProjectionError) as exc:
                Q.compare(s.con, a, b)
            msg = str(exc.value)
            assert msg == (f"compare: {named!r} is not a task, block (task/block), runtime "
                           "profile (service@rev) or point hash in the index"), msg
        # The connection is still usable afterwards: a good compare works on it.
        assert Q.compare(s.con, "qwen-h200@1", "qwen-h200@2")["metrics"]


def test_compare_cli_of_an_unresolved_subject_is_one_line(built):
    for a, b, named in UNRESOLVED[:2]:
        r = run_forge("compare", a, b, home=built.home)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and "Exception" not in r.stderr, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and f"{named!r} is not a task, block" in lines[0], r.stderr


def _filter(ws, **kw):
    return {(r["task_id"], r["block_id"], r["metric"]): r["median"]
            for r in Q.filter_ws(ws, **kw).records()}


def test_filter_and_across_flags_or_within(built):
    rows = _filter(built, gpu=["H200", "h20"], metric=["output_throughput"])
    assert rows == {
        ("tune-qwen-h200", "b1", "output_throughput"): 2000.0,
        ("tune-qwen-h200", "b2", "output_throughput"): 2200.0,
        ("qwen-h200-rev2", "b1", "output_throughput"): 2200.0,
        ("deepgemm-moe-h20", "b1", "output_throughput"): 900.0,
        ("deepgemm-moe-h20", "b2", "output_throughput"): 1100.0,
    }
    assert _filter(built, model=["tiny-llama"], gpu=["H200"]) == {}  # AND: no such pair
    tiny = _filter(built, engine=["HF"], metric=["median_ttft_ms", "token_match"])
    assert set(tiny) == {("tune-tiny-cpu", b, m) for b in ("b1", "b2")
                         for m in ("median_ttft_ms", "token_match")}
    kern = _filter(built, task_type=["kernel"], metric=["token_match"])
    assert kern[("deepgemm-moe-h20", "b2", "token_match")] == 0.61
    with pytest.raises(ProjectionError, match="unknown criterion"):
        Q.filter_ws(built, color=["red"])


def test_filter_cli_repeated_flags(built):
    r = run_forge("filter", "--gpu", "H200", "--gpu", "H20", "--type", "kernel",
                  "--metric", "output_throughput", "--json", home=built.home)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [(x["task_id"], x["block_id"], x["median"]) for x in rows] == [
        ("deepgemm-moe-h20", "b1", 900.0), ("deepgemm-moe-h20", "b2", 1100.0)]
    r = run_forge("compare", "qwen-h200@1", "qwen-h200@2", home=built.home)
    assert r.returncode == 0, r.stderr
    assert "runtime_profile" in r.stdout and "output_throughput" in r.stdout


def test_sql_outputs(built):
    q = "SELECT task_id, kind FROM decisions ORDER BY task_id"
    r = run_forge("sql", q, "--json", home=built.home)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [
        {"task_id": "deepgemm-moe-h20", "kind": "rejected"},
        {"task_id": "tune-qwen-h200", "kind": "accepted"},
        {"task_id": "tune-tiny-cpu", "kind": "rejected"}]
    r = run_forge("sql", q, "--csv", home=built.home)
    assert list(csv.reader(io.StringIO(r.stdout)))[0:2] == [["task_id", "kind"],
                                                           ["deepgemm-moe-h20", "rejected"]]
    r = run_forge("sql", q, home=built.home)
    assert "tune-qwen-h200    accepted" in r.stdout and "(3 rows)" in r.stdout


@pytest.mark.parametrize("bad, needle", [
    ("SELEC * FROM tasks", "Parser Error"),
    ("SELECT nope FROM tasks", "Binder Error"),
    ("DROP TABLE events", "read-only"),
])
def test_bad_sql_one_line_nonzero_index_untouched(built, bad, needle):
    I.update(built)
    with I.open_index(built, update=False) as s:
        before = I.fingerprint(s.con)
    r = run_forge("sql", bad, home=built.home)
    assert r.returncode != 0
    err = r.stderr.strip()
    assert err.startswith("Error: ") and needle in err and "\n" not in err, err
    with I.open_index(built, update=False) as s:
        assert I.fingerprint(s.con) == before


def test_invalidated_runs_leave_compare_and_filter(built):
    """With an invalidation recorded, queries go through the `valid_runs` anti-join (with
    none they read the successful runs directly): the invalidated run no longer counts."""
    from infer_forge.ledger import events as E
    from infer_forge.ledger.streams import task_stream

    before = Q.compare_ws(built, "tune-tiny-cpu/b1", "tune-tiny-cpu/b2")
    nb = {x["metric"]: x["b_n"] for x in before["metrics"]}
    rows = [r for r in built.ledger.log(types=["MeasurementRecorded"])
            if r.event.task_id == "tune-tiny-cpu" and r.event.block_id == "b2"]
    built.ledger.append(task_stream("tune-tiny-cpu"), [E.MeasurementInvalidated(
        measurement_event_id=rows[0].event.event_id, reason="noisy neighbour",
        task_id="tune-tiny-cpu", block_id="b2", actor=E.Actor.tool("forge-test"))])
    after = Q.compare_ws(built, "tune-tiny-cpu/b1", "tune-tiny-cpu/b2")
    na = {x["metric"]: x["b_n"] for x in after["metrics"]}
    assert na == {m: n - 1 for m, n in nb.items()} and nb["output_throughput"] >= 2
    n = {(r["block_id"], r["metric"]): r["n"] for r in Q.filter_ws(
        built, task=["tune-tiny-cpu"], metric=["output_throughput"]).records()}
    assert n[("b2", "output_throughput")] == na["output_throughput"]
    with I.open_index(built) as s:
        assert Q.valid_runs(s.con) == "valid_runs"
