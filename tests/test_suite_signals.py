"""The suite's own footing: whatever SIGINT disposition the suite was started with (a
background job's is "ignored"), the processes the tests start get the default one, so a test's
Ctrl-C reaches them as a terminal's would (tests/conftest.py `pytest_sessionstart`)."""

from __future__ import annotations

import subprocess
import sys


def test_children_get_the_default_sigint_disposition():
    probe = ("import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "True"  # an ignored SIGINT would have stayed SIG_IGN in the child
