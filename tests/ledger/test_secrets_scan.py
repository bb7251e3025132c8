"""`forge secrets scan`: a secret planted in each place a workspace stores text — a ledger
event (written around the store), an artifact file, a row of the index, a wiki page, a site
page — is found, reported as `where: kind` without the secret, and the scan exits 1; a
clean workspace that ran a real loop task and built its index and wiki exits 0."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import duckdb
import orjson
import pytest
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.run import run_task

from tests.conftest import insert_raw_event, run_forge

from ..harness.loop.test_loop import make_task_dir

GH = "ghp_" + "Zq9Xw8Ve7Ut6Sr5Qp4On3Ml2Kj1Ih0Gf9Ed8"
HF = "hf_" + "PlAnTeDaRtIfAcTtOkEnVaLuE0123456789"
SK = "sk-proj-" + "InDeXrOwPlAnTeD0123456789abcdefghijklmn"
PW = "wIkI-pAsSwOrD-77x"
PEM = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n"
       "AAAAAAABAAAAMwAAAAtzc2gtZWQyNTUxOQAAACD3\n-----END OPENSSH PRIVATE KEY-----")
PLANTED = [GH, HF, SK, PW, "b3BlbnNzaC1rZXktdjEAAAAABG5vbmU"]


@pytest.fixture
def explored(workspace, tmp_path, forge_home):
    """A demo-like workspace: a real loop task (command evaluator) run to delivery, its index
    caught up and its wiki and site built."""
    define_task(workspace, make_task_dir(tmp_path / "specs"))
    assert run_task(workspace, "t1").exit_state == "delivered"
    assert run_forge("index", "update", home=forge_home).returncode == 0
    r = run_forge("wiki", "build", "--no-embeddings", home=forge_home)
    assert r.returncode == 0, r.stderr
    return workspace


def test_a_clean_workspace_scans_clean(explored, forge_home):
    r = run_forge("secrets", "scan", home=forge_home)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == ""
    for source in ("ledger", "artifacts", "index", "wiki", "site"):
        assert f"scanning {source}" in r.stderr  # progress, on stderr
    assert "0 finding(s); scanned" in r.stderr and "lines/s" in r.stderr
    j = run_forge("secrets", "scan", "--json", home=forge_home)
    assert j.returncode == 0
    report = json.loads(j.stdout)
    assert report["hits"] == []
    for source in ("ledger", "artifacts", "index", "wiki", "site"):
        assert report["sources"][source]["lines"] > 0, source
    assert report["sources"]["ledger"]["items"] >= 60  # every event was read
    assert report["lines"] == sum(s["lines"] for s in report["sources"].values())
    assert report["lines_per_s"] > 0


def _plant_artifact(home: Path, text: str) -> Path:
    """An artifact file written around the store (so not redacted)."""
    data = text.encode()
    h = hashlib.sha256(data).hexdigest()
    path = home / "artifacts" / "sha256" / h[:2] / h[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_a_secret_planted_in_each_place_is_found(explored, forge_home):
    home = forge_home
    explored.close()
    # The ledger: an event written straight into SQLite, and one whose stream name is a token.
    state = {"event_id": str(uuid.uuid4()), "occurred_at": "2026-11-29T10:00:00+00:00",
             "task_id": "t9", "state": "aborted-by-human", "reason": f"leaked {GH}", "_v": 1}
    pos = insert_raw_event(home, "task:t9", 1, "TaskExited", orjson.dumps(state))
    pos2 = insert_raw_event(home, f"task:{GH}", 1, "TaskExited", b"{}")
    pos3 = insert_raw_event(home, "task:t8", 1, "TaskExited", b"not json: " + SK.encode())
    # An artifact, the index, a wiki page and a site page.
    art = _plant_artifact(home, f"starting\nok\nHF_TOKEN={HF}\nmore\n")
    con = duckdb.connect(str(home / "index.duckdb"))
    try:
        con.execute("UPDATE tasks SET goal = ? WHERE task_id = 't1'", [f"use {SK} to call"])
        (rowid,) = con.execute("SELECT rowid FROM tasks WHERE task_id = 't1'").fetchone()
    finally:
        con.close()
    page = home / "wiki" / "tasks" / "planted.md"
    page.write_text(f"# planted\n\ndb_password: {PW}\n")
    site = home / "site" / "planted.html"
    site.write_text(f"<html><body><pre>\n{PEM}\n</pre></body></html>\n")

    r = run_forge("secrets", "scan", home=home)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    rel = art.relative_to(home)
    for expected in (
        f"ledger position {pos} (task:t9 v1 TaskExited) reason: GitHub Token",
        f"ledger position {pos2}: stream name: GitHub Token",
        f"ledger position {pos3} (TaskExited): API Key",
        f"{rel} (sha256:{rel.parent.name}{art.name[:10]}…) line 3: HuggingFace Token",
        f"index tasks.goal row {rowid}: API Key",
        "wiki/tasks/planted.md line 3: named-secret",
        "site/planted.html line 2: Private Key Block",
    ):
        assert any(expected in line for line in lines), (expected, lines)
    assert len(lines) >= 6 and "finding(s)" in r.stderr
    for secret in PLANTED:  # where and what kind, never the secret
        assert secret not in r.stdout + r.stderr, secret

    j = run_forge("secrets", "scan", "--json", home=home)
    assert j.returncode == 1
    report = json.loads(j.stdout)
    assert {h["source"] for h in report["hits"]} == {"ledger", "artifacts", "index", "wiki",
                                                     "site"}
    assert all(set(h) == {"source", "where", "kind"} for h in report["hits"])
    for secret in PLANTED:
        assert secret not in j.stdout


def test_a_value_known_as_secret_after_it_was_stored_is_found(explored, forge_home):
    """What the redactor did not know when the text was written is found once it knows it:
    here, the value of a secret-named variable of the scanning process."""
    home = forge_home
    explored.close()
    _plant_artifact(home, "connecting with s3cr3t-Value-Of-The-Lab\n")
    assert run_forge("secrets", "scan", home=home).returncode == 0  # not a secret, yet
    r = run_forge("secrets", "scan", home=home, env={"MY_LAB_TOKEN": "s3cr3t-Value-Of-The-Lab"})
    assert r.returncode == 1 and "line 1: configured-secret" in r.stdout, r.stdout + r.stderr
    assert "s3cr3t-Value-Of-The-Lab" not in r.stdout + r.stderr
