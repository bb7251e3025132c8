"""The suite's in-process CLI runner (tests/conftest.py `run_forge`) answers as the installed
entry point does: the same exit code, stdout and stderr for a success, a usage error, a
package error and JSON output; and it leaves the test's process as it found it."""

from __future__ import annotations

import os
import signal

import pytest

from tests.conftest import run_forge

CASES = [
    ("--version",),
    ("init", "--json"),
    ("task", "list", "--json"),
    ("task", "show", "no-such-task"),  # a package error: one line, exit 1
    ("sql", "--no-such-flag"),  # a usage error: exit 2 with click's usage text
    ("log", "--limit", "0", "--json"),
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a))
def test_in_process_answers_as_the_entry_point(args, forge_home):
    run_forge("init")  # both runs see the same workspace
    inside = run_forge(*args)
    outside = run_forge(*args, process=True)

    def named(text: str) -> str:  # the subprocess is `python -m infer_forge.cli`; as `forge`:
        return text.replace("python -m infer_forge.cli", "forge")

    assert (inside.returncode, inside.stdout, inside.stderr) == \
        (outside.returncode, named(outside.stdout), named(outside.stderr))


def test_the_process_is_left_as_it_was(forge_home, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env, cwd = dict(os.environ), os.getcwd()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    r = run_forge("init", env={"FORGE_TEST_ONLY_VARIABLE": "x"})
    assert r.returncode == 0, r.stderr
    assert dict(os.environ) == env and os.getcwd() == cwd
    assert {s: signal.getsignal(s) for s in handlers} == handlers
