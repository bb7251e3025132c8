"""The ledger's CLI, as a user runs it (real subprocesses): init, log, replay, events export,
check; --help with an example everywhere; bad input gives one line and a non-zero exit."""

from __future__ import annotations

import json

import pytest
from infer_forge.ledger import events as E
from infer_forge.ledger.store import Ledger
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.workspace import init_workspace

from tests.conftest import run_forge

COMMANDS = [["init"], ["log"], ["replay"], ["events"], ["events", "export"], ["check"]]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A workspace with two small tasks, built once for the read-only CLI tests."""
    home = tmp_path_factory.mktemp("cli") / "forge"
    ws, _ = init_workspace(home)
    ws.close()
    with Ledger.open(home) as ledger:
        for task in ("alpha", "beta"):
            s = task_stream(task)
            ledger.append(s, [E.TaskDefined(task_id=task, title=f"tune {task}", task_type="t",
                                            goal="g", definition={}, definition_hash="h")])
            ledger.append(s, [E.LoopBlockStarted(task_id=task, block_id="b1", index=1,
                                                 sub_goal="try cb")])
            ledger.append(s, [E.MeasurementRecorded(task_id=task, block_id="b1", run_id=f"r{i}",
                                                    source="t", metrics={"tps": float(i)})
                              for i in range(3)])
            ledger.append(s, [E.TaskExited(task_id=task, state="delivered", reason="gates pass")])
    return home


def one_line_error(result) -> str:
    assert result.returncode != 0
    err = result.stderr.strip()
    assert err.startswith("Error: ") and "\n" not in err, result.stderr
    assert "Traceback" not in result.stderr
    return err


@pytest.mark.parametrize("cmd", COMMANDS, ids=" ".join)
def test_every_ledger_command_has_help_with_an_example(cmd):
    result = run_forge(*cmd, "--help")
    assert result.returncode == 0
    if cmd != ["events"]:
        assert "Example:" in result.stdout and "forge " in result.stdout.split("Example:")[1]


def test_init_creates_and_is_idempotent(tmp_path):
    target = tmp_path / "ws"
    first = run_forge("init", "--home", str(target), "--json")
    assert first.returncode == 0, first.stderr
    info = json.loads(first.stdout)
    assert info["created"] is True and info["ledger"] == "sqlite:///ledger.sqlite"
    assert (target / "forge.toml").is_file() and (target / "ledger.sqlite").is_file()
    for sub in ("artifacts", "models", "wiki", "site"):
        assert (target / sub).is_dir()
    again = run_forge("init", "--home", str(target))
    assert again.returncode == 0 and "already exists" in again.stdout
    log = run_forge("log", "--json", home=target)
    assert [json.loads(x)["type"] for x in log.stdout.splitlines()] == ["WorkspaceInitialized"]


def test_log_filters_by_task_type_and_time(home):
    everything = [json.loads(x) for x in run_forge("log", "--json", home=home).stdout.splitlines()]
    assert len(everything) == 1 + 2 * 6
    assert [r["position"] for r in everything] == sorted(r["position"] for r in everything)
    alpha = run_forge("log", "--task", "alpha", "--json", home=home).stdout.splitlines()
    assert {json.loads(x)["stream"] for x in alpha} == {"task:alpha"} and len(alpha) == 6
    ms = run_forge("log", "--type", "MeasurementRecorded", "--type", "TaskExited", "--json",
                   home=home).stdout.splitlines()
    assert sorted({json.loads(x)["type"] for x in ms}) == ["MeasurementRecorded", "TaskExited"]
    assert len(ms) == 8
    assert run_forge("log", "--since", "2999-01-01", home=home).stdout == ""
    assert len(run_forge("log", "--since", "2000-01-01T00:00:00+00:00",
                         home=home).stdout.splitlines()) == len(everything)
    human = run_forge("log", "--task", "beta", "--limit", "2", home=home).stdout.splitlines()
    assert len(human) == 2 and "TaskExited" in human[-1] and "beta" in human[-1]


def test_replay_and_replay_until_position(home):
    full = run_forge("replay", "alpha", "--json", home=home)
    assert full.returncode == 0, full.stderr
    state = json.loads(full.stdout)
    assert state["status"] == "exited" and state["measurements"] == 3
    again = json.loads(run_forge("replay", "alpha", "--json", home=home).stdout)
    assert again["fingerprint"] == state["fingerprint"]
    rows = [json.loads(x) for x in run_forge("log", "--task", "alpha", "--json",
                                             home=home).stdout.splitlines()]
    block_pos = rows[1]["position"]
    past = json.loads(run_forge("replay", "alpha", "--until", str(block_pos), "--json",
                                home=home).stdout)
    assert past["status"] == "running" and past["measurements"] == 0
    assert past["last_position"] == block_pos and past["fingerprint"] != state["fingerprint"]
    human = run_forge("replay", "beta", home=home)
    assert "status: exited" in human.stdout and "fingerprint: sha256:" in human.stdout


def test_events_export_jsonl(home, tmp_path):
    out = run_forge("events", "export", home=home)
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    assert len(lines) == 13 and all({"position", "stream", "type", "event_id"} <= set(x)
                                    for x in lines)
    target = tmp_path / "all.jsonl"
    res = run_forge("events", "export", "-o", str(target), "--include-bookkeeping", home=home)
    assert res.returncode == 0 and "exported" in res.stderr
    rows = [json.loads(x) for x in target.read_text().splitlines()]
    assert len(rows) > 13 and "CommandHandled" in {r["type"] for r in rows}
    assert [r["position"] for r in rows] == list(range(1, len(rows) + 1))
    # Its count is `forge check`'s, and nothing is said left out.
    total = json.loads(run_forge("check", "--json", home=home).stdout)["events"]
    assert res.stderr == f"exported {total} of {total} events to {target}\n"


def test_events_export_says_what_it_left_out(home, tmp_path):
    """It used to say "exported 14 events" where `forge check` counted 24."""
    target = tmp_path / "all.jsonl"
    res = run_forge("events", "export", "-o", str(target), home=home)
    assert res.returncode == 0, res.stderr
    total = json.loads(run_forge("check", "--json", home=home).stdout)["events"]
    n = len(target.read_text().splitlines())
    assert n == 13 < total
    assert res.stderr == (f"exported 13 of {total} events to {target}; {total - 13} left out: "
                          "CommandHandled markers, each closing a save (bookkeeping; "
                          "--include-bookkeeping exports them)\n")


def test_check_clean(home):
    res = run_forge("check", "--json", home=home)
    assert res.returncode == 0
    report = json.loads(res.stdout)
    assert report["ok"] and report["problems"] == [] and report["tasks"] == 2


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["replay", "nope"], "unknown task 'nope'"),
        (["replay", "alpha", "--until", "0"], "position 0"),
        (["replay", "alpha", "--until", "999999"], "past the end"),
        (["replay", "alpha", "--until", "abc"], "not a ledger position"),
        (["log", "--type", "Nope"], "unknown event type 'Nope'"),
        (["log", "--since", "yesterday"], "not an ISO-8601 time"),
    ],
)
def test_bad_input_is_one_line_and_non_zero(home, args, says):
    assert says in one_line_error(run_forge(*args, home=home))


@pytest.mark.parametrize("cmd", [["log"], ["replay", "alpha"], ["events", "export"], ["check"]],
                         ids=" ".join)
def test_missing_home_is_one_line_and_non_zero(tmp_path, cmd):
    err = one_line_error(run_forge(*cmd, home=tmp_path / "missing"))
    assert "no workspace at" in err and "forge init" in err
    assert not (tmp_path / "missing").exists()  # reading never creates a workspace


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (("lock_timeout_s = 5", "lock_timeout_s = 0"), "lock_timeout_s: expected a positive"),
        (('url = "sqlite:///ledger.sqlite"', 'url = "mysql://db/forge"'), "unsupported scheme"),
        (("[ledger]", "[ledger"), "forge.toml"),
    ],
)
def test_bad_forge_toml_is_one_line_naming_file_and_field(tmp_path, edit, says):
    home = tmp_path / "ws"
    assert run_forge("init", "--home", str(home)).returncode == 0
    cfg = home / "forge.toml"
    cfg.write_text(cfg.read_text().replace(*edit))
    err = one_line_error(run_forge("log", home=home))
    assert says in err and str(cfg) in err
