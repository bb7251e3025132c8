"""The per-file time budgets' check (tests/budgets.py): it reads a real pytest JUnit report
and fails on a file over its budget, naming it."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

BUDGETS = REPO / "tests" / "budgets.py"


def _report(tmp_path, cases: list[tuple[str, float]]):
    rows = "".join(f'<testcase classname="{c}" name="t{i}" time="{t}"/>'
                   for i, (c, t) in enumerate(cases))
    p = tmp_path / "report.xml"
    p.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{rows}'
                 "</testsuite></testsuites>")
    return p


def _budgets(tmp_path, text: str):
    p = tmp_path / "budgets.toml"
    p.write_text(text)
    return p


def _check(report, budgets):
    return subprocess.run([sys.executable, str(BUDGETS), str(report), "--budgets", str(budgets)],
                          capture_output=True, text=True, timeout=60)


def test_a_file_over_its_budget_fails_the_run_naming_it(tmp_path):
    report = _report(tmp_path, [
        ("main.tests.harness.loop.test_loop", 30.0),
        ("main.tests.harness.loop.test_loop.TestX", 15.0),  # a class: same file
        ("tests.ledger.test_atomic", 2.0),
    ])
    ok = _check(report, _budgets(tmp_path, 'default = 10\n[files]\n'
                                           '"tests/harness/loop/test_loop.py" = 60\n'))
    assert ok.returncode == 0, ok.stderr
    assert "45.0 s" in ok.stdout and "tests/harness/loop/test_loop.py" in ok.stdout
    over = _check(report, _budgets(tmp_path, 'default = 10\n[files]\n'
                                             '"tests/harness/loop/test_loop.py" = 40\n'))
    assert over.returncode == 1
    assert over.stderr.strip() == ("budgets: tests/harness/loop/test_loop.py took 45.0 s, "
                                   "over its budget of 40 s")
    default_only = _check(report, _budgets(tmp_path, "default = 1\n"))
    assert default_only.returncode == 1 and "tests/ledger/test_atomic.py took 2.0 s" in \
        default_only.stderr


def test_a_budget_for_a_missing_file_or_a_bad_budgets_file_is_an_error(tmp_path):
    report = _report(tmp_path, [("tests.ledger.test_atomic", 1.0)])
    stale = _check(report, _budgets(tmp_path, 'default = 10\n[files]\n"tests/gone.py" = 5\n'))
    assert stale.returncode == 1 and "no test file tests/gone.py" in stale.stderr
    bad = _check(report, _budgets(tmp_path, "default = 'ten'\n"))
    assert bad.returncode == 2 and "budgets.toml" in bad.stderr
