"""One sanitiser for what forge prints from stored text (issue 27, item 12): a summary's
`\\r`, a metric name's OSC, ESC bytes in `forge sql --csv` show as escapes and never act on
the terminal; JSON output stays valid and decodes to the stored text; `forge approvals`
shows the action an approval is bound to, not only the requester's words."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from infer_forge.cli import main
from infer_forge.harness.guard import approvals
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import record_measurement, start_block
from infer_forge.ledger import events as E
from infer_forge.ledger.text import has_controls, printable

from ..harness.loop.test_loop import make_task_dir

TITLE = "\x1b]0;pwned\x07tps"  # an OSC: sets the terminal's title
CSI_C1 = "lat\x9b2Jms"  # a C1 CSI (clears the screen on terminals that take C1)
CONTROLS = (b"\x1b", b"\x07", b"\r", "\x9b".encode())


def forge(home, *args: str):
    r = CliRunner().invoke(main, ["--home", str(home), *args], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r


def clean(raw: bytes) -> bool:
    return not any(c in raw for c in CONTROLS)


def test_a_table_cell_never_prints_an_exponent():
    from infer_forge.cli import _cell
    assert [_cell(v) for v in (11734.5, 0.1234567, 2.5e-05, 1234567.8, 0.0, -20000.25)] == [
        "11734.5", "0.1235", "0.000025", "1234568", "0", "-20000.2"]
    assert _cell(float("nan")) == "nan" and _cell(3) == "3" and _cell(None) == ""


def test_printable_escapes_controls_and_keeps_text():
    assert printable("a\tb\u00e9\u4e2d") == "a\tb\u00e9\u4e2d"
    assert printable(TITLE) == "\\u001b]0;pwned\\u0007tps"
    assert printable("x\r\ny") == "x\\u000d\\u000ay"
    assert printable("x\r\ny", newlines=True) == "x\\u000d\ny"
    assert printable("\x7f\x85\x9f") == "\\u007f\\u0085\\u009f"
    assert not has_controls(printable("".join(map(chr, range(0xa0)))))


@pytest.fixture
def measured(workspace, tmp_path):
    define_task(workspace, make_task_dir(tmp_path / "specs"))
    start_block(workspace, "t1", "probe")
    record_measurement(workspace, "t1", {TITLE: 1.0, CSI_C1: 2.0})
    return workspace


def test_forge_sql_prints_stored_escape_bytes_as_escapes(measured):
    home = measured.home
    q = "SELECT DISTINCT metric FROM measurements WHERE metric NOT LIKE 'x%' ORDER BY metric"
    table = forge(home, "sql", q)
    assert clean(table.stdout_bytes), table.stdout_bytes
    assert "\\u001b]0;pwned\\u0007tps" in table.stdout and "lat\\u009b2Jms" in table.stdout
    csv_out = forge(home, "sql", q, "--csv")
    assert clean(csv_out.stdout_bytes), csv_out.stdout_bytes
    assert "\\u001b]0;pwned\\u0007tps" in csv_out.stdout
    # JSON: still valid, and it decodes to the metric names as stored.
    js = forge(home, "sql", q, "--json")
    assert clean(js.stdout_bytes), js.stdout_bytes
    assert {r["metric"] for r in json.loads(js.stdout)} >= {TITLE, CSI_C1}


def test_forge_approvals_shows_the_bound_action_and_an_inert_summary(workspace):
    approvals.request(workspace, "push", "lib:origin:refs/heads/main",
                      {"range": "1111111..2222222"},
                      summary="push docs typo fix\r\x1b[2Kpush docs typo fix (trivial)",
                      actor=E.Actor.agent("coder", "m"))
    r = forge(workspace.home, "approvals")
    assert clean(r.stdout_bytes), r.stdout_bytes
    lines = r.stdout.splitlines()
    assert "    action: push lib:origin:refs/heads/main range=1111111..2222222" in lines
    assert any(ln.startswith("    summary: push docs typo fix\\u000d\\u001b[2K")
               for ln in lines), lines
    js = forge(workspace.home, "approvals", "--json")
    (row,) = json.loads(js.stdout)
    assert row["action"] == "push lib:origin:refs/heads/main range=1111111..2222222"
    assert row["summary"].startswith("push docs typo fix\r\x1b[2K")  # data, as stored
