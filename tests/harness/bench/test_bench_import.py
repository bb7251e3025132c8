"""`forge bench import`: sglang.bench_serving JSONL of several versions, and bad files."""

from __future__ import annotations

import json

import pytest
from infer_forge.harness.bench.importer import import_results, parse_results
from infer_forge.harness.errors import HarnessError

from tests.conftest import TESTS, run_forge
from tests.helpers.tasks import measurements, open_task

from ..loop.test_loop import make_task_dir

DATA = TESTS / "data" / "bench_serving"
V04 = DATA / "sglang-0.4.6.post5.jsonl"
V05 = DATA / "sglang-0.5.4.jsonl"
DUMP = DATA / "sglang-0.5.0rc0-metrics-dump.jsonl"


def test_04_results_are_keyed_by_what_they_have():
    runs, _ = parse_results(V04)
    assert [r.shape for r in runs] == ["0.4.3.post3–0.5.3"] * 2
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
    assert [r.shape for r in runs] == ["0.5.14+", "0.5.23+"]  # p90/p95 everywhere; --goodput
    a, b = runs
    assert a.meta["sglang_version"] == "0.5.4.post1"
    assert {"p90_ttft_ms", "p95_e2e_latency_ms", "max_concurrent_requests"} <= a.metrics.keys()
    assert "request_goodput" not in a.metrics
    assert b.metrics["slo_attainment"] == pytest.approx(0.696875)
    assert b.metrics["slo_attainment_by_metric.tpot"] == 1.0
    assert b.meta["goodput_slos_ms"] == {"ttft": 350.0, "tpot": 12.0}
    assert b.meta["request_rate"] == 16.0


# Real outputs of the released clients against the stand-in server (made by
# tests/helpers/real_bench_client.py; regenerated and compared in test_real_bench_client*.py).
GOLDEN = TESTS / "data" / "sglang" / "golden" / "bench"
REAL = {"0.4.0": "0.4.0–0.4.1.post4", "0.5.1": "0.4.3.post3–0.5.3", "0.5.6": "0.5.6–0.5.7",
        "0.5.23": "0.5.14+"}


@pytest.mark.parametrize("version", sorted(REAL))
def test_real_outputs_import_with_their_generation_and_every_key(version):
    runs, _ = parse_results(GOLDEN / f"sglang-{version}.jsonl")
    raw = [json.loads(x) for x in (GOLDEN / f"sglang-{version}.jsonl").read_text().splitlines()]
    for r, line in zip(runs, raw, strict=True):
        assert r.shape == (REAL[version] if "request_goodput" not in line else "0.5.23+")
        # Every number the client wrote is kept (the per-request arrays are details).
        numbers = {k for k, v in line.items() if isinstance(v, int | float) and
                   not isinstance(v, bool) and k not in {"request_rate", "max_concurrency",
                                                         "sharegpt_output_len",
                                                         "random_input_len",
                                                         "random_output_len",
                                                         "random_range_ratio"}}
        assert numbers <= r.metrics.keys()
        for sub, v in (line.get("cache_report") or {}).items():
            assert (f"cache_report.{sub}" in r.metrics) == isinstance(v, int | float)
        if isinstance(line.get("server_info"), dict):
            assert r.meta["sglang_version"] == line["server_info"]["version"]
            assert r.meta["sglang_version_source"] == "server_info"
    if version == "0.4.0":  # no request_throughput written: derived, and said so
        assert runs[0].meta["derived"] == ["request_throughput"]


def test_the_version_recorded_says_where_it_came_from(tmp_path):
    """A PD deployment's aggregated server_info (the client reads `["decode"][0]`); through a
    router server_info is null: the deployment's version when given, else the client's."""
    from infer_forge.harness.bench.importer import Given

    line = json.loads((GOLDEN / "sglang-0.5.23.jsonl").read_text().splitlines()[1])
    pd = tmp_path / "pd.jsonl"
    pd.write_text(json.dumps({**line, "server_info": {
        "prefill": [{"version": "0.5.23"}], "decode": [{"version": "0.5.23"}]}}) + "\n")
    (run,), _ = parse_results(pd)
    assert (run.meta["sglang_version"], run.meta["sglang_version_source"]) == (
        "0.5.23", "server_info.decode")
    routed = tmp_path / "router.jsonl"
    routed.write_text(json.dumps({**line, "server_info": None}) + "\n")
    (run,), _ = parse_results(routed)
    assert "sglang_version" not in run.meta  # nothing says: nothing invented
    for given, want in ((Given("0.5.22"), ("0.5.22", "deployment")),
                        (Given(client_version="0.5.23"), ("0.5.23", "bench_client")),
                        (Given("0.5.22", "0.5.23"), ("0.5.22", "deployment"))):
        (run,), _ = parse_results(routed, given)
        assert (run.meta["sglang_version"], run.meta["sglang_version_source"]) == want
    with pytest.raises(HarnessError, match=r"bench client version 'latest': expected a release"):
        parse_results(routed, Given(client_version="latest"))


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


def test_import_records_measurements_idempotently(workspace, tmp_path):
    block = open_task(workspace, tmp_path, "tune-qwen")
    out = import_results(workspace, V05, task_id="tune-qwen", block_id=block)
    assert out["runs"] == 2 and not out["duplicate"] and out["versions"] == ["0.5.4.post1"]
    evs = measurements(workspace, "tune-qwen")
    assert len(evs) == 2
    assert all(e.source == "sglang.bench_serving" and e.block_id == block for e in evs)
    assert evs[0].meta["client_shape"] == "0.5.14+" and evs[0].run_id == "sglang-0.5.4.jsonl:1"
    assert workspace.artifacts.get(evs[0].artifact_digest) == V05.read_bytes()
    again = import_results(workspace, V05, task_id="tune-qwen", block_id=block)
    assert again["duplicate"] and len(measurements(workspace, "tune-qwen")) == 2
    standalone = import_results(workspace, V04)
    assert standalone["stream"] == "measurements"
    assert len(workspace.ledger.stream_log("measurements")) == 2


def test_forge_bench_import_cli(forge_home, tmp_path):
    assert run_forge("init").returncode == 0
    assert run_forge("task", "new", str(make_task_dir(tmp_path / "specs"))).returncode == 0
    r = run_forge("bench", "import", str(V04), "--task", "t1", "--json")  # task-level
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["shapes"] == ["0.4.3.post3–0.5.3"]
    human = run_forge("bench", "import", str(DUMP))
    assert human.returncode == 0 and "recorded 1 bench_serving runs (0.5.5.post2–0.5.5.post3)" in \
        human.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"completed": 1}\n')
    r = run_forge("bench", "import", str(bad))
    assert r.returncode != 0
    assert f"{bad}:1: missing required field 'duration'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


# --- numbers the ledger cannot hold, bounded memory, resumable batches ---------------------

GOOD = V05.read_text().splitlines()[0]


def _with(**fields) -> str:
    obj = json.loads(GOOD)
    obj.update(fields)
    return json.dumps(obj)  # Python writes NaN / Infinity for non-finite floats


NON_FINITE = {
    "nan-required": ('"output_throughput": NaN', "field 'output_throughput' is not a finite"),
    "inf-required": ('"median_ttft_ms": Infinity', "field 'median_ttft_ms' is not a finite"),
    "minus-inf": ('"duration": -Infinity', "field 'duration' is not a finite"),
    "float-too-large": ('"p99_ttft_ms": 1e400', "field 'p99_ttft_ms' is not a finite"),
    "int-too-large-for-float": ('"completed": ' + "9" * 400,
                                "field 'completed' is not a finite number"),
    "nan-optional": ('"p99_itl_ms": NaN', "field 'p99_itl_ms' is not a finite"),
    "nan-nested": ('"slo_attainment_by_metric": {"ttft": NaN}',
                   "field 'slo_attainment_by_metric.ttft' is not a finite"),
    "arg-over-64-bits": ('"seed": ' + "1" * 30, "field seed: integer"),
}


@pytest.mark.parametrize("case", sorted(NON_FINITE))
def test_non_finite_numbers_are_refused_by_line_and_field(tmp_path, forge_home, case):
    insert, says = NON_FINITE[case]
    bad = GOOD[:-1] + ", " + insert + "}"
    f = tmp_path / "r.jsonl"
    f.write_text(GOOD + "\n" + GOOD + "\n" + bad + "\n")
    with pytest.raises(HarnessError) as e:
        parse_results(f)
    assert str(e.value).startswith(f"{f}:3: ") and says in str(e.value), str(e.value)
    # The CLI: one line, nothing recorded, no artifact stored (the good lines neither).
    assert run_forge("init").returncode == 0
    before = _rows(forge_home)
    r = run_forge("bench", "import", str(f))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert f"{f}:3: " in line and says in line
    assert _rows(forge_home) == before
    assert not [p for p in (forge_home / "artifacts").rglob("*") if p.is_file()]


def test_unbounded_rate_argument_stays_readable(tmp_path):
    """bench_serving writes `request_rate: Infinity` for no rate limit: a run argument, kept
    as text, never a number in the ledger."""
    (run,), _ = parse_results(_jsonl(tmp_path, _with(request_rate=float("inf"))))
    assert run.meta["request_rate"] == "inf"


def _jsonl(tmp_path, *lines: str, name: str = "r.jsonl"):
    f = tmp_path / name
    f.write_text("".join(line + "\n" for line in lines))
    return f


def _rows(home):
    import sqlite3

    with sqlite3.connect(home / "ledger.sqlite") as c:
        return c.execute("SELECT rowid, originator_id, originator_version, topic, state "
                         "FROM stored_events ORDER BY rowid").fetchall()


def test_bad_line_deep_in_a_file_records_nothing(workspace, tmp_path, monkeypatch):
    import infer_forge.harness.bench.importer as bi

    monkeypatch.setattr(bi, "BATCH", 2)
    lines = [_with(seed=i) for i in range(9)]
    lines[7] = "{not json"
    f = _jsonl(tmp_path, *lines)
    block = open_task(workspace, tmp_path)
    before = workspace.ledger.max_position()
    with pytest.raises(HarnessError, match=r":8: malformed JSON"):
        import_results(workspace, f, task_id="t1", block_id=block)
    assert workspace.ledger.max_position() == before
    assert list(workspace.artifacts.digests()) == []


@pytest.mark.parametrize(("raw", "says"), [
    (b"\xff\xfe\x00garbage\n", ":2: not UTF-8 text"),
    (b"\x00" * 64 + b"\n", ":2: malformed JSON"),
    (b"[" * 100_000 + b"\n", ":2: malformed JSON"),
])
def test_binary_and_hostile_lines_are_one_line(tmp_path, raw, says):
    f = tmp_path / "r.jsonl"
    f.write_bytes(GOOD.encode() + b"\n" + raw)
    with pytest.raises(HarnessError) as e:
        parse_results(f)
    assert str(e.value).startswith(str(f)) and says in str(e.value)
    assert "\n" not in str(e.value)


def test_overlong_line_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    import infer_forge.harness.bench.importer as bi

    monkeypatch.setattr(bi, "MAX_LINE_BYTES", 4096)
    f = _jsonl(tmp_path, GOOD, _with(tag="x" * 10_000))
    with pytest.raises(HarnessError, match=r"r.jsonl:2: line longer than"):
        parse_results(f)


def test_import_streams_in_bounded_batches_resumes_and_never_duplicates(workspace, tmp_path,
                                                                       monkeypatch):
    import pathlib

    import infer_forge.harness.bench.importer as bi

    monkeypatch.setattr(bi, "BATCH", 3)
    n = 10
    f = _jsonl(tmp_path, *[_with(seed=i) for i in range(n)], "", "")
    open_task(workspace, tmp_path)
    saves: list[int] = []
    real_save = workspace.ledger.save

    def save(*appends, **kw):
        saves.append(sum(len(a.events) for a in appends))
        if len(saves) == 2:
            raise OSError("power cut")  # the process dies after the first batch landed
        return real_save(*appends, **kw)

    monkeypatch.setattr(workspace.ledger, "save", save)

    def no_whole_file(self, *a, **k):
        raise AssertionError(f"read whole: {self}")

    monkeypatch.setattr(pathlib.Path, "read_bytes", no_whole_file)  # streaming only
    monkeypatch.setattr(pathlib.Path, "read_text", no_whole_file)
    with pytest.raises(OSError, match="power cut"):
        import_results(workspace, f, task_id="t1")  # task-level: no block
    assert len(measurements(workspace, "t1")) == 3
    out = import_results(workspace, f, task_id="t1")  # resumes where it stopped
    assert out["runs"] == n and out["recorded"] == n - 3 and not out["duplicate"]
    assert max(saves) <= 3
    evs = measurements(workspace, "t1")
    assert [e.run_id for e in evs] == [f"r.jsonl:{i + 1}" for i in range(n)]
    assert {e.block_id for e in evs} == {None}
    again = import_results(workspace, f, task_id="t1")
    assert again["duplicate"] and again["recorded"] == 0
    assert len(measurements(workspace, "t1")) == n
    assert len(out["measurements"]) == min(n, bi.LISTED)


def test_a_file_changed_between_the_passes_is_refused(workspace, tmp_path, monkeypatch):
    import infer_forge.harness.bench.importer as bi

    monkeypatch.setattr(bi, "BATCH", 2)
    f = _jsonl(tmp_path, *[_with(seed=i) for i in range(6)])
    real_put = workspace.artifacts.put_stream

    def put_then_edit(chunks):
        digest = real_put(chunks)
        lines = f.read_text().splitlines()
        lines[3] = _with(seed=99)
        f.write_text("\n".join(lines) + "\n")
        return digest

    monkeypatch.setattr(workspace.artifacts, "put_stream", put_then_edit)
    block = open_task(workspace, tmp_path)
    with pytest.raises(HarnessError, match="changed while it was imported"):
        import_results(workspace, f, task_id="t1", block_id=block)
    evs = measurements(workspace, "t1")
    assert [e.meta["seed"] for e in evs] == [0, 1]  # only what matched the checked file


def test_cli_summary_of_a_large_import_is_bounded(forge_home, tmp_path):
    assert run_forge("init").returncode == 0
    f = _jsonl(tmp_path, *[_with(seed=i) for i in range(30)])
    r = run_forge("bench", "import", str(f))
    assert r.returncode == 0, r.stderr
    assert "recorded 30 bench_serving runs" in r.stdout and "… and 10 more" in r.stdout
    assert len(r.stdout.splitlines()) == 22


# --- `forge measure --from-json` ------------------------------------------------------------

FROM_JSON = {
    "missing": (None, "cannot read: No such file or directory"),
    "binary": (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8 text"),
    "latin1": ('{"x": "caf\xe9"}'.encode("latin-1"), "not UTF-8 text"),
    "bad-json": (b'{\n  "output_throughput": 1,\n  oops\n}', ":3: malformed JSON"),
    "empty": (b"", ":1: malformed JSON"),
    "array": (b"[1, 2, 3]", "expected a JSON object of metrics, got an array"),
    "string": (b'"fast"', "expected a JSON object of metrics, got str"),
    "nan": (b'{"a": 1,\n "output_throughput": NaN}', ":2: field 'output_throughput': NaN is not"),
    "infinity": (b'{"median_ttft_ms": Infinity}', ":1: field 'median_ttft_ms': Infinity is not"),
    "minus-infinity": (b'{"x": -Infinity}', "field 'x': -Infinity is not a finite number"),
    "float-too-large": (b'{"x": 1e400}', "field 'x': 1e400 is not a finite number"),
    "int-over-64-bits": (b'{"x": ' + b"7" * 30 + b"}", "field 'x': integer"),
    "huge-int-text": (b'{"x": ' + b"7" * 5000 + b"}", "malformed JSON"),
    "deep": (b"[" * 100_000, "malformed JSON"),
}


@pytest.mark.parametrize("case", sorted(FROM_JSON))
def test_measure_from_json_bad_files_are_one_line(forge_home, tmp_path, case):
    from infer_forge.harness.bench.importer import metrics_from_json

    content, says = FROM_JSON[case]
    f = tmp_path / "m.json"
    if content is not None:
        f.write_bytes(content)
    with pytest.raises(HarnessError) as e:
        metrics_from_json(f)
    assert str(e.value).startswith(str(f)) and says in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
    from click.testing import CliRunner
    from infer_forge.cli import main

    assert CliRunner().invoke(main, ["init"]).exit_code == 0
    before = _rows(forge_home)
    r = CliRunner().invoke(main, ["measure", "t1", "--from-json", str(f)])
    assert r.exit_code == 1
    assert r.exception is None or isinstance(r.exception, SystemExit)
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"Error: {f}") and says in line
    assert _rows(forge_home) == before


def test_measure_from_json_takes_finite_top_level_numbers(tmp_path):
    from infer_forge.harness.bench.importer import metrics_from_json

    f = tmp_path / "m.json"
    f.write_text(_with(request_rate=float("inf")))  # a real result: rate is an argument
    got = metrics_from_json(f)
    assert got["output_throughput"] == json.loads(GOOD)["output_throughput"]
    assert "request_rate" not in got and "server_info" not in got
    assert all(isinstance(v, float) for v in got.values())
