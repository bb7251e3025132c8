"""ledger/home.py: the glance at a workspace before the ledger loads (what `forge mcp`'s
first answer says), against real workspaces made and read by the real store."""

from __future__ import annotations

from infer_forge.ledger.home import EVENTS_TABLE, glance, no_workspace, unknown_task
from infer_forge.ledger.workspace import init_workspace, open_workspace

from tests.harness.mcp.test_mcp import define, make_task


def test_a_sound_workspace_and_its_task(forge_home, tmp_path):
    define(forge_home, make_task(tmp_path / "specs", "t1"))  # `forge init`, `forge task new`
    ws = open_workspace(forge_home)
    try:
        assert ws.ledger.recorder.events_table_name == EVENTS_TABLE  # the store's table
    finally:
        ws.close()
    assert glance(forge_home) is None
    assert glance(forge_home, "t1") is None
    assert glance(None, "t1") is None  # $FORGE_HOME, as the real open reads it
    assert glance(forge_home, "t2") == unknown_task("t2", forge_home.resolve())
    assert "forge task list" in unknown_task("t2", forge_home)


def test_what_keeps_a_session_from_starting(forge_home, tmp_path):
    assert glance(forge_home) == no_workspace(forge_home.resolve())
    assert not forge_home.exists()
    afile = tmp_path / "a-file"
    afile.write_text("x")
    assert "is not a directory" in (glance(afile) or "")

    init_workspace(forge_home)[0].close()
    db = forge_home / "ledger.sqlite"
    db.write_bytes(b"not a database at all" * 10)
    problem = glance(forge_home, "t1") or ""
    assert problem.startswith(f"ledger {db} cannot be read: ") and "forge check" in problem
    db.unlink()
    assert (glance(forge_home) or "").startswith(f"ledger {db} is missing")

    (forge_home / "forge.toml").write_text("[ledger\n")
    assert (glance(forge_home) or "").startswith(f"{forge_home / 'forge.toml'}: ")


def test_a_postgresql_ledger_is_left_to_the_real_open(forge_home):
    init_workspace(forge_home)[0].close()
    toml = forge_home / "forge.toml"
    toml.write_text(toml.read_text().replace('url = "sqlite:///ledger.sqlite"',
                                             'url = "postgresql://u@127.0.0.1:1/db"'))
    assert "postgresql://" in toml.read_text()
    assert glance(forge_home, "t1") is None  # no promise: the server's start opens it
