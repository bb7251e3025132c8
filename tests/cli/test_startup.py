"""Startup stays cheap: importing the CLI, asking any command for its help, or importing any
module of the package loads none of the heavy libraries. They are imported where they are
used (the index's catch-up, SQL, the wiki's renderer and vectors, the bench's metrics, the
engines), so `forge --help` or a command that fails on its input does not pay for them.
Asking for help loads no pydantic model, YAML reader or event store either (issue 36):
cli.py imports the ledger inside each command."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.conftest import REPO, run_forge

HEAVY = ("pyarrow", "numpy", "duckdb", "torch", "transformers", "sentence_transformers",
         "matplotlib", "markdown_it", "networkx", "aiohttp", "detect_secrets")
# What the ledger's models, spec files and event store load: no `--help` needs them.
MODELS = ("pydantic", "pydantic_core", "yaml", "eventsourcing", "orjson")


def _loaded_after(code: str) -> object:
    """Run `code` in a fresh interpreter; it prints one JSON value as its last line."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=str(REPO), timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_importing_the_cli_loads_no_heavy_library():
    loaded = _loaded_after(
        "import infer_forge.cli, sys, json\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    assert loaded == []


def test_importing_the_cli_loads_only_the_error_bases_and_the_printing_edge():
    # Each command imports the ledger, harness, projections, wiki or repos module it calls:
    # importing the CLI (what every `forge` call pays) loads none of them but their errors
    # and the printing edge, and so no pydantic model, no yaml, no event store.
    loaded = _loaded_after(
        "import infer_forge.cli, sys, json\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('infer_forge.')\n"
        f"  or m.split('.')[0] in {MODELS!r})))")
    ours = [m for m in loaded if m.startswith("infer_forge.")]
    light = {"infer_forge.cli", "infer_forge.ledger.numbers", "infer_forge.ledger.text"}
    beyond = [m for m in ours
              if m.count(".") > 1 and not m.endswith(".errors") and m not in light]
    assert beyond == []
    assert "infer_forge.ledger.errors" in ours  # the walk saw the modules
    assert [m for m in loaded if not m.startswith("infer_forge.")] == []


def _console_script_loads(argv: list[str]) -> object:
    """What the console script (entry.py `main`, as `forge` runs it) has loaded once it
    has answered `argv`: third-party model, YAML and event-store modules and the ledger's."""
    return _loaded_after(
        "import json, sys\n"
        f"sys.argv = ['forge', *{argv!r}]\n"
        "from infer_forge.entry import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {MODELS!r}\n"
        "  or m.startswith('infer_forge.ledger.'))))")


def test_help_through_the_console_script_loads_no_model_no_yaml_no_store():
    # `forge --help` and a group's --help: click and the error bases, nothing of the ledger's
    # models (pydantic), its YAML reader or the event store.
    for argv in (["--help"], ["task", "--help"], ["bench", "import", "--help"]):
        loaded = _console_script_loads(argv)
        assert isinstance(loaded, list)
        assert [m for m in loaded if not m.startswith("infer_forge.")] == [], argv
        # The error bases and the printing edge (cli.py), the glance at a workspace and the
        # streams' names (the MCP front): standard library only.
        assert set(loaded) <= {f"infer_forge.ledger.{m}" for m in (
            "errors", "numbers", "text", "home", "streams")}, argv
        assert "infer_forge.ledger.errors" in loaded  # the walk saw the modules


def test_a_command_loads_what_it_calls_not_every_command():
    # `forge task list` reads Task Memory: the loop, graph, bench, engines and wiki stay
    # unloaded. Run in-process through click, as the console script runs it.
    loaded = _loaded_after(
        "import json, sys, tempfile\n"
        "from click.testing import CliRunner\n"
        "from infer_forge.cli import main\n"
        "from infer_forge.ledger.workspace import init_workspace\n"
        "home = tempfile.mkdtemp()\n"
        "init_workspace(home)[0].close()\n"
        "r = CliRunner().invoke(main, ['--home', home, 'task', 'list', '--json'])\n"
        "import shutil; shutil.rmtree(home)\n"
        "print(json.dumps({'exit': r.exit_code, 'output': r.output,\n"
        "  'mods': sorted(m for m in sys.modules if m.startswith('infer_forge.'))}))")
    assert loaded["exit"] == 0, loaded["output"]
    assert "infer_forge.projections.memory" in loaded["mods"]
    for pkg in ("harness.loop", "harness.graph", "harness.bench", "harness.engines",
                "harness.agents", "wiki.build", "projections.index"):
        assert not any(m.startswith(f"infer_forge.{pkg}") for m in loaded["mods"]), pkg


def _read_command_loads(home: object, argv: list[str]) -> dict[str, Any]:
    """Run `forge --home HOME *argv --json` as the console script runs it, in a fresh
    interpreter: its JSON output and the YAML, pydantic and ledger modules it loaded."""
    loaded = _loaded_after(
        "import io, json, sys\n"
        f"sys.argv = ['forge', '--home', {str(home)!r}, *{argv!r}, '--json']\n"
        "out, sys.stdout = sys.stdout, io.StringIO()\n"
        "from infer_forge.entry import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "result, sys.stdout = json.loads(sys.stdout.getvalue()), out\n"
        "print(json.dumps({'out': result, 'mods': sorted(m for m in sys.modules\n"
        "  if m.split('.')[0] in ('yaml', 'pydantic') or m.startswith('infer_forge.ledger.'))}))")
    assert isinstance(loaded, dict)
    return loaded


def test_read_commands_load_no_yaml_and_task_list_no_specs(workspace, forge_home):
    # `forge task list` on a workspace with a task: each row comes from the task's fold
    # (ledger/task.py), not from Task Memory's views, which need the specs (the contract's
    # primary metric). `forge task memory` reads the stored contract: the specs, but not
    # the YAML reader (spec files only). The models' path: nothing kept (`task new` kept the
    # task's rows; the read-after-write test below).
    r = run_forge("task", "new", "examples/tasks/tune-tiny-cpu.yaml")
    assert r.returncode == 0, r.stderr
    (forge_home / "reads.sqlite").unlink()
    listed = _read_command_loads(forge_home, ["task", "list"])
    assert [(x["task_id"], x["status"], x["blocks"]) for x in listed["out"]] == [
        ("tune-tiny-cpu", "defined", 0)]
    assert "infer_forge.ledger.task" in listed["mods"]  # the fold was read
    assert "infer_forge.ledger.specs" not in listed["mods"]
    (forge_home / "reads.sqlite").unlink()
    memory = _read_command_loads(forge_home, ["task", "memory", "tune-tiny-cpu"])
    assert memory["out"]["primary_metric"] == "output_throughput"  # the contract was read
    assert "infer_forge.ledger.specs" in memory["mods"]
    for loaded in (listed, memory):
        assert "yaml" not in loaded["mods"]
        assert "infer_forge.ledger.yamlio" not in loaded["mods"]


def _console_script_run(home: object, argv: list[str]) -> dict[str, Any]:
    """Run `forge --home HOME *argv` as the console script runs it, in a fresh interpreter:
    its exit code, its output and the package's and the models' modules it loaded."""
    loaded = _loaded_after(
        "import io, json, sys\n"
        f"sys.argv = ['forge', '--home', {str(home)!r}, *{argv!r}]\n"
        "out, sys.stdout = sys.stdout, io.StringIO()\n"
        "from infer_forge.entry import main\n"
        "try:\n"
        "    main()\n"
        "    code = 0\n"
        "except SystemExit as e:\n"
        "    code = e.code or 0\n"
        "text, sys.stdout = sys.stdout.getvalue(), out\n"
        "print(json.dumps({'code': code, 'out': text, 'mods': sorted(m for m in sys.modules\n"
        f"  if m.split('.')[0] in {MODELS!r} or m.startswith('infer_forge.'))}}))")
    assert isinstance(loaded, dict)
    return loaded


def test_read_commands_answer_without_the_models_once_their_rows_are_kept(workspace,
                                                                          forge_home):
    # `forge task list`, `forge task memory T` and `forge log --task T` (issue 36: <= 0.15 s):
    # the first read goes through the models (the event store, the fold, Task Memory) and
    # keeps its rows (projections/fast_reads.py); the next ones read SQLite and stored JSON
    # only: no pydantic, no event store, no event model, no fold, and the same bytes out.
    from tests.helpers.index_ledger import build

    build(workspace)
    task = "tune-tiny-cpu"
    for argv in (["task", "list"], ["task", "memory", task], ["log", "--task", task]):
        for args in (argv, [*argv, "--json"]):
            (forge_home / "reads.sqlite").unlink(missing_ok=True)  # nothing kept
            first = _console_script_run(forge_home, args)
            assert first["code"] == 0 and first["out"], (args, first)
            assert "infer_forge.ledger.events" in first["mods"], args  # the models' path
            again = _console_script_run(forge_home, args)
            assert again["code"] == 0 and again["out"] == first["out"], args
            models = {m.split(".")[0] for m in again["mods"] if not m.startswith("infer_forge.")}
            assert models <= {"orjson"}, (args, models)  # orjson: the stored JSON's reader
            ours = {m for m in again["mods"] if m.startswith("infer_forge.")}
            for heavy in ("ledger.events", "ledger.store", "ledger.codec", "ledger.task",
                          "ledger.config", "ledger.workspace", "ledger.specs",
                          "projections.memory"):
                assert f"infer_forge.{heavy}" not in ours, (args, heavy)
            assert "infer_forge.projections.fast_reads" in ours


def test_the_help_of_every_command_loads_no_heavy_library():
    # Every command and group, at every depth, renders its --help (each one's parameters,
    # defaults and choices are built): none of that may import a heavy library.
    loaded = _loaded_after(
        "import json, sys\n"
        "import click\n"
        "from click.testing import CliRunner\n"
        "from infer_forge.cli import main\n"
        "paths, todo = [], [((), main)]\n"
        "while todo:\n"
        "    path, cmd = todo.pop()\n"
        "    paths.append(path)\n"
        "    if isinstance(cmd, click.Group):\n"
        "        todo += [((*path, n), c) for n, c in cmd.commands.items()]\n"
        "runner = CliRunner()\n"
        "bad = [p for p in paths if runner.invoke(main, [*p, '--help']).exit_code != 0]\n"
        f"heavy = sorted(m for m in {HEAVY + MODELS!r} if m in sys.modules)\n"
        "print(json.dumps({'commands': len(paths), 'failed': bad, 'heavy': heavy}))")
    assert loaded["commands"] > 40  # the walk reached the subcommands
    assert loaded["failed"] == []
    assert loaded["heavy"] == []  # (a group's body runs before its subcommand's --help)


def test_importing_any_package_module_loads_no_heavy_library():
    # Every module of the package, one after the other in one interpreter: the first whose
    # import pulls in a heavy library is named (with what it pulled in).
    loaded = _loaded_after(
        "import importlib, json, pkgutil, sys\n"
        "import infer_forge\n"
        "modules, offenders = [], {}\n"
        "def walk(pkg):\n"
        "    for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + '.'):\n"
        "        if m.name == 'infer_forge.tests' or offenders:\n"
        "            continue\n"
        "        mod = importlib.import_module(m.name)\n"
        "        modules.append(m.name)\n"
        f"        heavy = [h for h in {HEAVY!r} if h in sys.modules]\n"
        "        if heavy:\n"
        "            offenders[m.name] = heavy\n"
        "        elif m.ispkg:\n"
        "            walk(mod)\n"
        "walk(infer_forge)\n"
        "print(json.dumps({'modules': len(modules), 'offenders': offenders}))")
    assert loaded["offenders"] == {}
    assert loaded["modules"] > 80  # the walk reached the subpackages


def test_the_read_after_a_write_command_is_answered_from_rows_the_writer_kept(workspace,
                                                                             forge_home):
    # A command that saved to a task stream and ended well keeps that task's rows (cli.py
    # `_keep_reads`): the agent's next `task memory` / `task list` does not pay the models.
    from tests.helpers.index_ledger import build

    build(workspace)
    task = "tune-tiny-cpu"
    for argv in (["task", "list"], ["task", "memory", task]):
        _console_script_run(forge_home, argv)  # every task's rows kept by a first read
    r = run_forge("task", "reopen", task, "--reason", "the blocker is gone", home=forge_home)
    assert r.returncode == 0, r.stderr
    for argv in (["task", "memory", task, "--json"], ["task", "list"]):
        after = _console_script_run(forge_home, argv)
        assert after["code"] == 0, after
        assert "infer_forge.ledger.events" not in after["mods"], argv  # the kept rows
        (forge_home / "reads.sqlite").rename(forge_home / "reads.kept")
        models = _console_script_run(forge_home, argv)  # nothing kept: the models' path
        assert "infer_forge.ledger.events" in models["mods"]
        assert after["out"] == models["out"], argv
        (forge_home / "reads.kept").replace(forge_home / "reads.sqlite")
    mem = json.loads(_console_script_run(forge_home, ["task", "memory", task, "--json"])["out"])
    assert mem["status"] != "exited" and mem["exit_state"] is None  # the reopen, read back
