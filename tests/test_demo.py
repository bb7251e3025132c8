"""The main job end to end: `forge demo` on the real embedded engine (slow; runs in CI)."""

from __future__ import annotations

import json

import pytest

from .conftest import run_forge

pytestmark = pytest.mark.slow


def test_demo_runs_the_loop_and_leaves_an_explorable_workspace(forge_home):
    r = run_forge("demo", home=forge_home, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    # Progress is visible and the table of candidates with verdicts is printed.
    assert "[4/4] running the loop" in out
    assert "baseline (profile as is)" in out
    assert "exit:" in out and "explore:" in out

    mem = run_forge("task", "memory", "demo-tune-tiny-cpu", "--json", home=forge_home)
    assert mem.returncode == 0, mem.stderr
    memory = json.loads(mem.stdout)
    assert memory["status"] == "exited"
    blocks = memory["execution_record"]
    assert blocks[0]["candidate"] == {}  # block 1 is the baseline
    assert all(len(b["measurements"]) == 3 for b in blocks if b["measurements"])
    # Every measured run carries the bench_serving metrics and the token match.
    run = blocks[0]["measurements"][0]["metrics"]
    for key in ("output_throughput", "median_ttft_ms", "p99_itl_ms", "token_match"):
        assert key in run
    assert run["token_match"] == 1.0
    if memory["exit_state"] != "failed-unverifiable":
        # Candidates beyond the baseline were judged: accepted or rejected with the numbers.
        decided = [b for b in blocks[1:] if b["decision"] in ("accepted", "rejected")]
        assert decided, blocks
        assert all(b["verification"]["gates"] for b in decided)

    check = run_forge("check", "--json", home=forge_home)
    assert check.returncode == 0, check.stdout + check.stderr
    assert json.loads(check.stdout)["ok"] is True

    # Running the demo again resumes from the ledger: nothing is measured twice.
    again = run_forge("demo", home=forge_home, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    mem2 = json.loads(run_forge("task", "memory", "demo-tune-tiny-cpu", "--json",
                                home=forge_home).stdout)
    assert len(mem2["execution_record"]) == len(blocks)
