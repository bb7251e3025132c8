"""A `diagnose` verification step: the endpoint diagnosed with `forge diagnose`'s rules over a
real scripted server's SGLang-shaped /metrics, at a block's verification (manual path, real
ledger); it passes when no rule fired and its DiagnosisRecorded is saved with the
verification."""

from __future__ import annotations

import pytest
from infer_forge.harness.loop.manual import verify_block
from infer_forge.harness.testing.scripted_server import Script, ScriptedServer
from infer_forge.ledger import codec
from infer_forge.ledger import events as E
from infer_forge.ledger.specs import SpecError, TaskDefinition, load_spec
from infer_forge.ledger.store import task_stream

from ..loop.test_loop import make_task_dir
from ..loop.test_verification_steps import measured_baseline, with_path
from .test_diagnose import growing_queue, healthy


def _stored(ws, cls):
    return [r.event for r in ws.ledger.stream(task_stream("t1")) if isinstance(r.event, cls)]


@pytest.mark.parametrize("metrics, outcome", [(healthy, "pass"), (growing_queue, "fail")])
def test_diagnose_step_passes_when_no_rule_fired(workspace, tmp_path, metrics, outcome):
    with ScriptedServer(Script(metrics=metrics)) as s:
        step = (f"{{name: healthy, diagnose: {{url: '{s.url}', samples: 4, interval_s: 0.05, "
                "slo: {ttft_ms: 500}}}")
        path = with_path(make_task_dir(tmp_path / "s", executor="{kind: manual}"),
                         ["measure", step, "gates", "decide"])
        measured_baseline(workspace, path)
        out = verify_block(workspace, "t1")
        assert s.scrapes == 4
    [ver] = _stored(workspace, E.VerificationRecorded)
    [diag] = _stored(workspace, E.DiagnosisRecorded)
    res = ver.steps[1]
    assert (res.name, res.kind, res.outcome) == ("healthy", "diagnose", outcome)
    assert out["verdict"] == outcome and str(diag.event_id) in ver.evidence
    assert (diag.task_id, diag.block_id, diag.samples) == ("t1", "b1", 4)
    assert diag.slo_ms == {"ttft_ms.p99": 500.0}
    # Replay's fast path and the index read the stored step as it is.
    rows = workspace.ledger.stream_rows(task_stream("t1"))
    assert all(codec.load_current(topic, raw) is not None for _p, _v, topic, raw in rows
               if topic == "VerificationRecorded")
    fired = [f.rule for f in diag.findings]
    if outcome == "pass":
        assert diag.healthy and not fired and res.detail.startswith("healthy")
        assert [x.outcome for x in ver.steps] == ["pass", "pass", "pass", "deferred"]
    else:
        assert fired and res.detail == "rules fired: " + ", ".join(fired)
        assert all(r in res.output_tail for r in fired)
        assert [x.outcome for x in ver.steps] == ["pass", "fail", "not-run", "deferred"]


def test_unreachable_endpoint_fails_the_step(workspace, tmp_path):
    with ScriptedServer(Script()) as s:
        url = s.url  # closed once the block starts: nothing listens there
    step = f"{{name: up, diagnose: {{url: '{url}', samples: 1}}}}"
    path = with_path(make_task_dir(tmp_path / "s", executor="{kind: manual}"),
                     ["measure", step, "gates"])
    measured_baseline(workspace, path)
    out = verify_block(workspace, "t1")
    [ver] = _stored(workspace, E.VerificationRecorded)
    assert out["verdict"] == "fail" and ver.steps[1].kind == "diagnose"
    assert ver.steps[1].detail.startswith("diagnosis failed:")
    assert _stored(workspace, E.DiagnosisRecorded) == []


@pytest.mark.parametrize("step, problem", [
    ("{name: d, sh: x, diagnose: {url: 'http://h:1'}}", "give exactly one of argv, sh, diagnose"),
    ("{name: d, diagnose: {url: 'http://h:1', samples: 0}}", "greater than or equal to 1"),
    ("{name: d, diagnose: {url: 'http://h:1', slo: {itl_ms: 5}}}", "slo 'itl_ms'"),
    ("{name: d, diagnose: {url: 'http://h:1', slo: {ttft_ms: -1}}}", "not a positive"),
    ("{name: d, diagnose: {url: 'http://h:1', retries: 2}}", "Extra inputs"),
])
def test_bad_diagnose_step_is_refused(tmp_path, step, problem):
    path = with_path(make_task_dir(tmp_path / "s"), ["gates", step])
    with pytest.raises(SpecError, match="verification") as e:
        load_spec(path, "task")
    assert problem in str(e.value)


def test_a_path_without_diagnose_keeps_its_stored_shape(tmp_path):
    path = with_path(make_task_dir(tmp_path / "s"), ["gates", "{name: a, sh: 'true'}"])
    task = load_spec(path, "task")
    assert isinstance(task, TaskDefinition)
    [_, cmd] = task.model_dump(mode="json")["verification"]
    assert "diagnose" not in cmd
