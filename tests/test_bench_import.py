"""`forge bench import`: sglang.bench_serving JSONL of several versions, and bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from infer_forge.harness.bench_import import import_results, parse_results
from infer_forge.harness.errors import HarnessError

from .conftest import run_forge

DATA = Path(__file__).parent / "data" / "bench_serving"
V04 = DATA / "sglang-0.4.6.post5.jsonl"
V05 = DATA / "sglang-0.5.4.jsonl"
DUMP = DATA / "sglang-0.5.0rc0-metrics-dump.jsonl"


def test_04_results_are_keyed_by_what_they_have():
    runs, _ = parse_results(V04)
    assert [r.shape for r in runs] == ["0.4.x", "0.4.x"]
    first = runs[0].metrics
    assert first["completed"] == 200 and first["median_ttft_ms"] > 0
    assert "p99_tpot_ms" in first and "p95_itl_ms" in first
    assert not any(k.startswith("p90_") for k in first)  # never invented
    assert runs[0].meta["backend"] == "sglang" and runs[0].meta["request_rate"] == "inf"
    assert "failed" not in first  # 0.4 without details does not say
    assert runs[1].metrics["failed"] == 2 and runs[1].meta["has_details"]
    assert "input_lens" not in runs[1].metrics


def test_05_results_carry_server_info_and_goodput():
    runs, _ = parse_results(V05)
    assert [r.shape for r in runs] == ["0.5.x", "0.5.x"]
    a, b = runs
    assert a.meta["sglang_version"] == "0.5.4.post1"
    assert {"p90_ttft_ms", "p95_e2e_latency_ms", "max_concurrent_requests"} <= a.metrics.keys()
    assert "request_goodput" not in a.metrics
    assert b.metrics["slo_attainment"] == pytest.approx(0.696875)
    assert b.metrics["slo_attainment_by_metric.tpot"] == 1.0
    assert b.meta["goodput_slos_ms"] == {"ttft": 350.0, "tpot": 12.0}
    assert b.meta["request_rate"] == 16.0


def test_metrics_dump_aliases_and_nested_details():
    (run,), _ = parse_results(DUMP)
    assert run.metrics["total_input_tokens"] == 9 * 256  # from `total_input`
    assert "total_input" not in run.metrics
    assert run.metrics["failed"] == 1  # from details.errors
    assert run.metrics["total_throughput"] > run.metrics["output_throughput"]


BAD = {
    "malformed": ('{"completed": 1,\n', ":1: malformed JSON"),
    "not-object": ("[1, 2, 3]\n", ":1: expected a JSON object"),
    "missing": ('{"completed": 3, "duration": 1.0, "request_throughput": 3.0}\n',
                ":1: missing required field 'output_throughput'"),
    "wrong-type": ('{"completed": "3", "duration": 1.0, "request_throughput": 3.0, '
                   '"output_throughput": 1.0, "median_ttft_ms": 2.0}\n',
                   ":1: field 'completed' must be a number"),
    "bad-metric": ('{"completed": 3, "duration": 1.0, "request_throughput": 3.0, '
                   '"output_throughput": 1.0, "median_ttft_ms": 2.0, "p99_itl_ms": "fast"}\n',
                   ":1: field 'p99_itl_ms' must be a number"),
    "empty": ("\n\n", ": no bench_serving results"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_files_give_one_line_errors(tmp_path, case):
    text, msg = BAD[case]
    f = tmp_path / f"{case}.jsonl"
    # Prepend a good line where the case is about line 1 content, to check the line number.
    good = V05.read_text().splitlines()[0] + "\n"
    body = text if case in ("empty",) else good + text
    msg = msg.replace(":1:", ":2:") if case != "empty" else msg
    f.write_text(body)
    with pytest.raises(HarnessError) as e:
        parse_results(f)
    assert str(f) + msg in str(e.value)
    assert "\n" not in str(e.value)


def test_import_records_measurements_idempotently(workspace):
    out = import_results(workspace, V05, task_id="tune-qwen", block_id="b3")
    assert out["runs"] == 2 and not out["duplicate"] and out["versions"] == ["0.5.4.post1"]
    evs = [r.event for r in workspace.ledger.stream_log("task:tune-qwen")]
    assert [e.TYPE for e in evs] == ["MeasurementRecorded"] * 2
    assert all(e.source == "sglang.bench_serving" and e.block_id == "b3" for e in evs)
    assert evs[0].meta["client_shape"] == "0.5.x" and evs[0].run_id == "sglang-0.5.4.jsonl:1"
    assert workspace.artifacts.get(evs[0].artifact_digest) == V05.read_bytes()
    again = import_results(workspace, V05, task_id="tune-qwen", block_id="b3")
    assert again["duplicate"] and len(workspace.ledger.stream_log("task:tune-qwen")) == 2
    standalone = import_results(workspace, V04)
    assert standalone["stream"] == "measurements"
    assert len(workspace.ledger.stream_log("measurements")) == 2


def test_forge_bench_import_cli(forge_home, tmp_path):
    assert run_forge("init").returncode == 0
    r = run_forge("bench", "import", str(V04), "--task", "t1", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["shapes"] == ["0.4.x"]
    human = run_forge("bench", "import", str(DUMP))
    assert human.returncode == 0 and "recorded 1 bench_serving runs (0.5.x)" in human.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"completed": 1}\n')
    r = run_forge("bench", "import", str(bad))
    assert r.returncode != 0
    assert f"{bad}:1: missing required field 'duration'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
