"""One id rule (ledger/ids.py), applied wherever an id enters: task files (`id:` and the file
name), `--task` / `--block` of the commands that open records, graph and node ids; graph repo
nodes stay inside the graph's work dir."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.graph.commands import define_graph
from infer_forge.harness.graph.run import run_graph
from infer_forge.ledger import events as E
from infer_forge.ledger.graphspec import (
    GraphSpecError,
    NodeSpec,
    load_graph_spec,
    parse_graph_spec,
    parse_node,
)
from infer_forge.ledger.ids import (
    LEDGER_CONTEXT,
    MAX_ID,
    InvalidIdError,
    check_id,
    is_id,
)
from infer_forge.ledger.specs import TaskDefinition
from infer_forge.ledger.streams import graph_stream
from infer_forge.ledger.workspace import open_workspace
from infer_forge.projections.graph import load_graph, node_task_id
from infer_forge.wiki.build import build as build_wiki

from tests.conftest import REPO, run_forge

BAD = ["", "a b", "A", "Tune", "x.", "x-", "-x", ".x", "x\n", "x\r", "a\nb", "a/b", "a\\b",
       "../x", "<script>", "[[x|y]]", "é", "a\x00b", "a:b", "x" * (MAX_ID + 1), " x", "x "]
GOOD = ["a", "t1", "b1", "b12", "tune-tiny-cpu", "demo-tune-tiny-cpu", "serving-project.kern",
        "serving-project.kernel-rope.a3", "a_b", "1x", "x" * MAX_ID, "a.b-c_d"]


@pytest.mark.parametrize("value", BAD)
def test_the_rule_refuses(value):
    assert not is_id(value)
    with pytest.raises(InvalidIdError) as e:
        check_id(value, "task id")
    msg = str(e.value)
    assert msg.startswith("task id ") and "\n" not in msg and len(msg) < 250
    assert repr(value)[:40] in msg  # the value as typed, visible (newlines escaped)


@pytest.mark.parametrize("value", GOOD)
def test_the_rule_accepts(value):
    assert check_id(value, "task id") == value


def test_graph_and_node_ids_compose_task_ids_without_clashes():
    # No dot in a graph or node id, at most 63 characters: `<graph>.<node>.a<n>` is an id
    # and tells its graph and node apart.
    for bad in ("a.b", "x" * 64, "A", "a-"):
        with pytest.raises(InvalidIdError):
            check_id(bad, "node id", part=True)
    longest = "g" * 63
    assert is_id(f"{node_task_id(longest, longest)}.a9999")


def test_ids_in_examples_and_tests_fit_the_rule():
    for f in sorted((REPO / "examples/tasks").glob("*.yaml")):
        data = yaml.safe_load(f.read_text())
        assert is_id(data.get("id") or f.stem), f
    spec = load_graph_spec(REPO / "examples/graphs/serving-project.yaml")
    assert all(is_id(node_task_id(spec.name, n.id)) for n in spec.nodes)


# --- at the CLI: one line, non-zero, nothing written -------------------------------------


def cli(home: Path, *args: str):
    from infer_forge.cli import main

    return CliRunner().invoke(main, ["--home", str(home), *args])


def refused(home: Path, *args: str) -> str:
    with open_workspace(home) as ws:
        before = ws.ledger.max_position()
    r = cli(home, *args)
    assert r.exit_code not in (0, None) and isinstance(r.exception, SystemExit), r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].lower().startswith("error: "), r.output
    with open_workspace(home) as ws:
        assert ws.ledger.max_position() == before, "something was written"
    return lines[0]


def _task_dir(root: Path, stem: str, tid: str | None) -> Path:
    for sub in ("points", "profiles", "tasks"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for kind in ("points", "profiles"):
        (root / kind / "tiny-cpu.yaml").write_text(
            (REPO / "examples" / kind / "tiny-cpu.yaml").read_text())
    data = {"type": "deployment-tuning", "goal": "g", "point": "../points/tiny-cpu.yaml",
            "contract": {"gates": [{"name": "t", "metric": "output_throughput",
                                    "at_least": 1}]}, "executor": {"kind": "manual"}}
    if tid is not None:
        data["id"] = tid
    f = root / "tasks" / f"{stem}.yaml"
    f.write_text(yaml.safe_dump(data))
    return f


@pytest.mark.parametrize("stem", ["Bad Name", "x.", "UPPER", "t" * 240, "a\nb", "<b>x",
                                  "[[javascript:x|y]]"])
def test_task_id_from_a_file_name_follows_the_rule(workspace, tmp_path, stem):
    f = _task_dir(tmp_path, stem, None)
    line = refused(workspace.home, "task", "new", str(f))
    assert "task id taken from the file name" in line and repr(stem)[:30] in line


@pytest.mark.parametrize("tid", ["x\n", "a b", "A", "t" * (MAX_ID + 1), "-x", "x."])
def test_task_id_in_the_file_follows_the_rule(workspace, tmp_path, tid):
    f = _task_dir(tmp_path, "ok-name", tid)
    line = refused(workspace.home, "task", "new", str(f))
    assert str(f) in line and "id" in line and repr(tid)[:30] in line


def test_a_valid_file_name_still_names_the_task(workspace, tmp_path):
    f = _task_dir(tmp_path, "from-the-name", None)
    r = cli(workspace.home, "task", "new", str(f))
    assert r.exit_code == 0, r.output
    assert "from-the-name" in cli(workspace.home, "task", "list").output


@pytest.mark.parametrize("opts", [["--task", "a b"], ["--task", "A"], ["--task", "x\n"],
                                  ["--task", "t" * 300], ["--task", "t", "--block", "b1\n"],
                                  ["--task", "t", "--block", "<b>"]])
def test_bench_import_ids_follow_the_rule(workspace, opts):
    line = refused(workspace.home, "bench", "import",
                   str(REPO / "tests/data/bench_serving/sglang-0.5.4.jsonl"), *opts)
    assert "id" in line


@pytest.mark.parametrize("args", [["measure", "a b", "--metric", "x=1"],
                                  ["replay", "X\n"], ["block", "start", "A", "--sub-goal", "s"],
                                  ["run", "--task", "<x>", "--", "true"]])
def test_lookups_of_impossible_ids_say_why(workspace, args):
    line = refused(workspace.home, *args)
    assert "unknown task" in line and "an id is" in line


def test_one_subprocess_run_gives_one_line_and_no_traceback(workspace, tmp_path):
    f = _task_dir(tmp_path, "Bad Name", None)
    p = run_forge("task", "new", str(f), home=workspace.home)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip().count("\n") == 0 and "'Bad Name'" in p.stderr


# --- graphs: ids and repo paths ----------------------------------------------------------

WORK = {"sh": "true", "verify": [{"name": "ok", "sh": "true"}]}


@pytest.mark.parametrize("bad", ["a.b", "n" * 64, "A", "a-", "a b", "a\n"])
def test_node_and_graph_ids_follow_the_rule(bad):
    with pytest.raises(GraphSpecError, match=re.escape(f"node id {bad!r}"[:30])):
        parse_graph_spec({"name": "g", "nodes": [{"id": bad, "type": "kernel", "work": WORK}]})
    with pytest.raises(GraphSpecError, match="graph name"):
        parse_graph_spec({"name": bad, "nodes": [{"id": "a", "type": "kernel", "work": WORK}]})
    with pytest.raises(GraphSpecError, match="node id"):
        parse_node({"id": bad, "type": "kernel", "work": WORK})


@pytest.mark.parametrize("path", ["../x", "/etc", "a/../../b", "~/x", "a\\..\\b", "", " ",
                                  "repos/../../.."])
def test_repo_paths_stay_in_the_work_dir(path):
    with pytest.raises(GraphSpecError, match="relative path inside"):
        parse_graph_spec({"name": "g", "nodes": [{"id": "r", "kind": "repo", "path": path}]})


def test_repo_path_through_a_symlink_out_is_refused_before_the_run(workspace, tmp_path):
    graph = {"name": "g", "nodes": [{"id": "r", "kind": "repo", "path": "link/sub"},
                                    {"id": "t", "type": "kernel", "work": WORK}],
             "edges": [{"from": "r", "to": "t", "kind": "state"}]}
    f = tmp_path / "g.yaml"
    f.write_text(yaml.safe_dump(graph))
    define_graph(workspace, f)
    work = workspace.home / "graphs" / "g" / "work"
    work.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (work / "link").symlink_to(outside)
    version = workspace.ledger.version(graph_stream("g"))
    with pytest.raises(HarnessError, match="outside the graph's work dir"):
        run_graph(workspace, "g", jobs=1)
    assert workspace.ledger.version(graph_stream("g")) == version  # no run recorded
    assert not (outside / "sub").exists()


def test_what_the_ledger_already_holds_stays_readable(workspace):
    # Ids an older version accepted (a trailing dash, capitals in a task's id:) are not
    # refused when read back, so old ledgers still replay, run and build their wiki.
    assert TaskDefinition.model_validate(
        {"id": "Old_Task", "type": "kernel", "goal": "g", "point": "p.yaml",
         "contract": {"gates": [{"name": "t", "metric": "m", "at_least": 1}]}},
        context=LEDGER_CONTEXT).id == "Old_Task"
    with pytest.raises(ValueError, match="task id 'Old_Task'"):
        TaskDefinition.model_validate(
            {"id": "Old_Task", "type": "kernel", "goal": "g", "point": "p.yaml",
             "contract": {"gates": [{"name": "t", "metric": "m", "at_least": 1}]}})
    node = {"id": "old-", "type": "kernel", "work": WORK}
    assert NodeSpec.model_validate(node, context=LEDGER_CONTEXT).id == "old-"
    workspace.ledger.append(graph_stream("old"), [E.GraphDefined(
        graph_id="old", spec_hash="sha256:" + "0" * 64, nodes=[node])])
    assert list(load_graph(workspace.ledger, "old").nodes) == ["old-"]
    rep = build_wiki(workspace, embeddings=False)
    assert (Path(rep.site_dir) / "graphs" / "old.html").is_file()
