"""Log lines filled from real SGLang releases' own format strings (found with `ast` in the
unpacked wheels) against the golden lines, and the verdict diagnose gives on each."""

from __future__ import annotations

from pathlib import Path

import pytest
from infer_forge.harness.diagnose.rules import LogLine, apply_rules

from ...helpers import real_sglang
from .sglang_golden import GOLDEN, GOLDEN_VERSIONS, LOG_CASES, logs_path, render_logs

VERDICTS: dict[str, set[str]] = {
    "pd_decode_healthy": set(), "decode_healthy": set(), "retract": {"retractions"},
    "oom_prefill": {"oom"}, "oom_decode": {"oom"}, "oom_alloc": {"oom"},
    "oom_startup": {"oom"}, "hang": {"scheduler_stalled"},
    "cuda_graph": {"cuda_graph_capture_failed"}, "pd_transfer_failed": {"pd_transfer_failures"},
    "pd_bootstrap_timeout": {"pd_transfer_failures"},
    "pd_waiting_timeout": {"pd_transfer_failures"},
}
# What each golden release must have (the rest it may lack: PD arrived in 0.5).
MUST = {"0.4.0": {"decode_healthy", "retract", "oom_prefill", "oom_decode", "oom_startup",
                  "hang", "cuda_graph"}}


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, str]]:
    return {v: render_logs(v, real_sglang.release(v)) for v in GOLDEN_VERSIONS}


def test_golden_lines_are_the_releases_format_strings(rendered):
    assert set(VERDICTS) == set(LOG_CASES)
    for v, cases in rendered.items():
        for case, text in cases.items():
            path = logs_path(v, case)
            if text.startswith("not in "):
                assert not path.exists(), f"{path.name}: golden lines but {text}"
                continue
            assert path.exists() and path.read_text() == text, (
                f"{path.name}: the golden lines differ from the release's format strings; "
                "regenerate: python tests/harness/diagnose/sglang_golden.py regen")
        have = {c for c, t in cases.items() if not t.startswith("not in ")}
        assert MUST.get(v, set(VERDICTS)) <= have, (v, sorted(set(VERDICTS) - have))
    files = {p.name for p in (GOLDEN / "logs").glob("*.log")}
    assert files == {logs_path(v, c).name for v, cases in rendered.items()
                     for c, t in cases.items() if not t.startswith("not in ")}


def _lines(path: Path) -> list[LogLine]:
    return [LogLine(i + 1, t) for i, t in enumerate(path.read_text().splitlines())]


@pytest.mark.parametrize("version", GOLDEN_VERSIONS)
def test_each_golden_log_gets_exactly_its_verdict(version):
    paths = sorted((GOLDEN / "logs").glob(f"{version}-*.log"))
    assert paths
    for path in paths:
        case = path.name[len(version) + 1:-len(".log")]
        got = {f.rule for f in apply_rules([], _lines(path))}
        assert got == VERDICTS[case], f"{path.name}: fired {sorted(got)}, " \
            f"expected {sorted(VERDICTS[case])}"


def test_a_healthy_pd_decode_server_does_not_retract_and_a_real_retraction_does():
    """`#retracted-req: 0` is in every periodic line of a healthy PD decode server; a
    nonzero count is a retraction."""
    healthy = _lines(logs_path("0.5.23", "pd_decode_healthy"))
    assert "#retracted-req: 0," in healthy[0].text
    assert apply_rules([], healthy) == []
    busy = [LogLine(1, healthy[0].text.replace("#retracted-req: 0,", "#retracted-req: 4,"))]
    assert [f.rule for f in apply_rules([], busy)] == ["retractions"]
