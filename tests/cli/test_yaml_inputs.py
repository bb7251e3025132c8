"""Hostile YAML: numbers the ledger cannot hold, recursive anchors,
alias bombs, deep nesting, binary garbage and oversized files are refused by the one bounded
loader (`ledger.yamlio.load_yaml`) with one line per problem naming file, line and field; the
CLI exits 1 without a traceback and records nothing."""

from __future__ import annotations

import random
import time

import pytest
from click.testing import CliRunner
from infer_forge.cli import main
from infer_forge.ledger.graphspec import GraphSpecError, load_graph_spec
from infer_forge.ledger.specs import (
    SpecError,
    load_point,
    load_profile,
    load_spec,
    load_task,
    parse_spec,
)
from infer_forge.ledger.yamlio import MAX_YAML_BYTES

from tests.conftest import REPO, run_forge

EX = REPO / "examples"
POINT = (EX / "points/tiny-cpu.yaml").read_text()
PROFILE = (EX / "profiles/tiny-cpu.yaml").read_text()
TASK = (EX / "tasks/tune-tiny-cpu.yaml").read_text()


def _line(text: str, needle: str) -> int:
    return text[:text.index(needle)].count("\n") + 1


# (spec text, the text replaced, its replacement, field path, what the message says)
NUMBERS = {
    "int-over-64-bits": (POINT, "num_prompts: 64", "num_prompts: 99999999999999999999999",
                         "scenario.traffic.num_prompts", "does not fit in 64 bits"),
    "negative-int-over-64-bits": (POINT, "count: 1}", "count: -99999999999999999999999}",
                                  "accelerator.count", "does not fit in 64 bits"),
    "hex-int-over-64-bits": (POINT, "rev: 1,", "rev: 0x1ffffffffffffffffffff,",
                             "runtime_profile.rev", "does not fit in 64 bits"),
    "nan-threshold": (POINT, "{p50: 500}", "{p50: .nan}", "scenario.slo.ttft_ms.p50",
                      "NaN is not a finite number"),
    "inf-threshold": (POINT, "{p50: 500}", "{p50: .inf}", "scenario.slo.ttft_ms.p50",
                      "Infinity is not a finite number"),
    "minus-inf-threshold": (POINT, "{p50: 50}", "{p50: -.Inf}", "scenario.slo.tpot_ms.p50",
                            "-Infinity is not a finite number"),
    "float-too-large": (POINT, "{p50: 500}", "{p50: 1.0e+400}", "scenario.slo.ttft_ms.p50",
                        "Infinity is not a finite number"),
    "float-too-large-no-dot": (POINT, "{p50: 500}", "{p50: 1e400}",
                               "scenario.slo.ttft_ms.p50", "finite number"),
    "gate-nan": (TASK, "at_least: 1.05", "at_least: .nan", "contract.gates[0].at_least",
                 "NaN is not a finite number"),
    "gate-inf": (TASK, "at_most: 500", "at_most: .inf", "contract.gates[1].at_most",
                 "Infinity is not a finite number"),
    "free-form-engine-config-inf": (PROFILE, "cb_block_size: 32", "cb_block_size: .inf",
                                    "config.cb_block_size", "Infinity is not a finite number"),
    "free-form-engine-config-big-int": (PROFILE, "cb_num_blocks: 512",
                                        "cb_num_blocks: 123456789012345678901234567890",
                                        "config.cb_num_blocks", "does not fit in 64 bits"),
    "scope-value-nan": (TASK, "[false, true]", "[false, .nan]",
                        "scope.engine.continuous_batching[1]", "NaN is not a finite number"),
}


@pytest.mark.parametrize("case", sorted(NUMBERS))
def test_numbers_the_ledger_cannot_hold_are_refused_with_file_line_field(tmp_path, case):
    text, old, new, field, says = NUMBERS[case]
    assert old in text
    bad = text.replace(old, new, 1)
    f = tmp_path / "tasks" / "spec.yaml"
    f.parent.mkdir()
    f.write_text(bad)
    with pytest.raises(SpecError) as ei:
        load_spec(f)
    (problem,) = ei.value.problems
    assert problem.startswith(f"{f}:{_line(bad, new)}: {field}: "), problem
    assert says in problem and "\n" not in problem


def test_free_form_values_are_checked_without_yaml_too():
    """Direct validation (a candidate applied to a profile, a dict from elsewhere) refuses
    the same numbers: the Spec base checks free-form fields such as `config`."""
    prof = load_profile(EX / "profiles/tiny-cpu.yaml").model_dump(mode="python")
    for value, says in ((float("nan"), "NaN"), (float("inf"), "Infinity"), (2**70, "64 bits")):
        with pytest.raises(SpecError) as ei:
            parse_spec("profile", {**prof, "config": {"x": [1, {"y": value}]}})
        assert "config.x[1].y" in str(ei.value) and says in str(ei.value)


RECURSIVE = {
    "sequence": "a: &x [1, *x]\n",
    "mapping": "a: &m {k: *m}\n",
    "nested": "a: &a\n  - b:\n      - *a\n",
    "top-level": "&top\nk: *top\n",
}


@pytest.mark.parametrize("case", sorted(RECURSIVE))
def test_recursive_anchor_is_one_line(tmp_path, case):
    f = tmp_path / "rec.yaml"
    f.write_text(RECURSIVE[case])
    with pytest.raises(SpecError) as ei:
        load_point(f)
    (problem,) = ei.value.problems
    assert problem.startswith(f"{f}:") and "recursive alias" in problem


def _bomb(levels: int, width: int) -> str:
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("levels", "width"), [(9, 9), (30, 2), (4, 400)])
def test_alias_bomb_is_refused_quickly(tmp_path, forge_home, levels, width):
    f = tmp_path / "bomb.yaml"
    f.write_text(_bomb(levels, width))
    t0 = time.monotonic()
    with pytest.raises(SpecError, match="expands to more than"):
        load_task(f)
    assert time.monotonic() - t0 < 10  # was minutes (an upper bound, not a benchmark)
    assert run_forge("init").returncode == 0
    r = CliRunner().invoke(main, ["task", "new", str(f)])
    assert r.exit_code == 1 and "expands to more than" in r.stderr
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_anchors_within_bounds_still_work(tmp_path):
    """Ordinary anchors (a shared SLO, repeated gates) are YAML and stay allowed."""
    text = POINT.replace("slo: {ttft_ms: {p50: 500}, tpot_ms: {p50: 50}}",
                         "slo: {ttft_ms: &lat {p50: 500}, tpot_ms: *lat}")
    f = tmp_path / "p.yaml"
    f.write_text(text)
    assert load_point(f).scenario.slo.tpot_ms == {"p50": 500}


@pytest.mark.parametrize("text", ["a: " + "[" * 5000 + "]" * 5000 + "\n",
                                  "a:\n" + "".join(" " * i + "- \n" for i in range(1, 400)),
                                  "a: " + "{b: " * 3000 + "1" + "}" * 3000 + "\n"])
def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path, text):
    f = tmp_path / "deep.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as ei:
        load_point(f)
    assert ei.value.problems[0].startswith(f"{f}:")


def _garbage() -> dict[str, bytes]:
    rng = random.Random(9)
    return {
        "random-bytes": bytes(rng.randrange(256) for _ in range(4096)),
        "utf16": POINT.encode("utf-16"),
        "latin1": "name: caf\xe9\n".encode("latin-1"),
        "nul-bytes": b"name: a\x00b\nmodel: {}\n",
        "control-chars": b"name: \x07\x1b[31m\n",
        "elf-header": b"\x7fELF\x02\x01\x01" + bytes(200),
    }


@pytest.mark.parametrize("case", sorted(_garbage()))
def test_binary_garbage_given_as_a_spec_is_one_line(tmp_path, case):
    f = tmp_path / "garbage.yaml"
    f.write_bytes(_garbage()[case])
    with pytest.raises(SpecError) as ei:
        load_spec(f)
    assert all(p.startswith(f"{f}:") and "\n" not in p for p in ei.value.problems)


def test_oversized_spec_is_refused_before_parsing(tmp_path):
    f = tmp_path / "big.yaml"
    f.write_text("notes: '" + "x" * MAX_YAML_BYTES + "'\n")
    with pytest.raises(SpecError, match="larger than"):
        load_point(f)


def test_scope_that_cannot_be_enumerated_is_refused(tmp_path):
    f = tmp_path / "tasks" / "t.yaml"
    f.parent.mkdir()
    f.write_text(TASK.replace("engine.dtype: [float32, bfloat16]",
                              "engine.cb_block_size: {min: 0, max: 1.0e+18, step: 1}"))
    with pytest.raises(SpecError, match="more than 100000 values"):
        load_task(f)
    axes = "".join(f"  engine.k{i}: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n" for i in range(6))
    f.write_text(TASK.replace("  engine.dtype: [float32, bfloat16]\n", axes))
    with pytest.raises(SpecError, match="more than 100000 combinations"):
        load_task(f)


def test_graph_yaml_uses_the_same_bounded_loader(tmp_path):
    for text, says in (("name: g\nnodes: &n [*n]\n", "recursive alias"),
                       (_bomb(9, 9), "expands to more than"),
                       ("name: g\nname: h\n", "duplicate key")):
        f = tmp_path / "graph.yaml"
        f.write_text(text)
        with pytest.raises(GraphSpecError) as ei:
            load_graph_spec(f)
        assert says in str(ei.value) and "\n" not in str(ei.value)


def test_cli_refuses_each_shape_without_traceback_or_write(tmp_path, forge_home):
    """The real process: each bad spec is exit 1, `error: FILE:LINE: …` lines only, and the
    ledger does not move."""
    assert run_forge("init").returncode == 0
    from infer_forge.ledger.workspace import open_workspace

    with open_workspace(forge_home) as ws:
        before = ws.ledger.max_position()
    (tmp_path / "tasks").mkdir()
    cases = {
        "huge-int.yaml": TASK.replace("max_blocks: 8", "max_blocks: 99999999999999999999999"),
        "nan.yaml": TASK.replace("at_least: 1.05", "at_least: .nan"),
        "recursive.yaml": "id: x\ngoal: &g [*g]\n",
        "bomb.yaml": _bomb(9, 9),
    }
    for name, text in cases.items():
        f = tmp_path / "tasks" / name
        f.write_text(text)
    (tmp_path / "tasks" / "binary.yaml").write_bytes(_garbage()["random-bytes"])
    for f in sorted((tmp_path / "tasks").iterdir()):
        r = run_forge("task", "new", str(f))
        assert r.returncode == 1, (f.name, r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.strip(), f.name
        assert all(line.startswith(f"error: {f}:") for line in r.stderr.splitlines()), r.stderr
    with open_workspace(forge_home) as ws:
        assert ws.ledger.max_position() == before


@pytest.mark.parametrize("value", [
    "&a [*a]", "[" * 5000, ".nan", "x\n---\ny: 1", "yes", "{a: 1}", "</script>",
])
def test_set_values_that_are_not_json_stay_text(value):
    """No YAML on the command line: anchors, document markers and `yes` are text as typed."""
    from infer_forge.cli import parse_assignments

    assert parse_assignments([f"k={value}"], "--set") == {"k": value}


@pytest.mark.parametrize(("value", "says"), [
    ("NaN", "NaN is not a finite number"),
    ("99999999999999999999999", "does not fit in 64 bits"),
    ("[1, 1e999]", "Infinity is not a finite number"),
])
def test_set_values_the_ledger_cannot_hold_are_refused(value, says):
    from infer_forge.cli import parse_assignments
    from infer_forge.ledger.errors import LedgerError

    with pytest.raises(LedgerError) as ei:
        parse_assignments([f"threads={value}"], "--set")
    assert str(ei.value).startswith("--set threads") and says in str(ei.value)


@pytest.mark.parametrize(("raw", "value"), [
    ("true", True), ("8", 8), ("bfloat16", "bfloat16"), ("1e3", 1000.0), ("-2.5", -2.5),
    ("[1, 2]", [1, 2]), ("{a: 1}", "{a: 1}"), ('"8"', "8"), ("", ""),
    ("2024-01-01", "2024-01-01"), ("a=b", "a=b"),
])
def test_one_key_value_parser_for_every_command(raw, value):
    """--set (block start, engine up) and --metric read VALUE the same way."""
    from infer_forge.cli import parse_assignments

    assert parse_assignments([f" k ={raw}"], "--set") == {"k": value}
    if isinstance(value, int | float) and not isinstance(value, bool):
        assert parse_assignments([f"k={raw}"], "--metric", numbers=True) == {"k": float(value)}


@pytest.mark.parametrize(("item", "numbers", "says"), [
    ("k", False, "--x 'k': expected KEY=VALUE"),
    ("=1", False, "--x '=1': expected KEY=VALUE"),
    ("k=NaN", False, "--x k: NaN is not a finite number"),
    ("k=-Infinity", False, "--x k: -Infinity is not a finite number"),
    ("k=[1, 1e999]", False, "--x k"),
    ("k=fast", True, "--x k: 'fast' is not a number"),
    ("k=inf", True, "--x k: Infinity is not a finite number"),
    ("k=true", True, "--x k: True is not a number"),
])
def test_key_value_parser_refuses_with_one_line_naming_the_key(item, numbers, says):
    import click
    from infer_forge.cli import parse_assignments
    from infer_forge.ledger.errors import LedgerError

    with pytest.raises((click.ClickException, LedgerError)) as ei:
        parse_assignments([item], "--x", numbers=numbers)
    msg = ei.value.message if isinstance(ei.value, click.ClickException) else str(ei.value)
    assert msg.startswith(says) and "\n" not in msg, msg


@pytest.mark.parametrize("argv", [
    ["measure", "t1", "--metric", "x=" + "[" * 100_000],
    ["block", "start", "t1", "--sub-goal", "s", "--set", "engine.x=" + "[" * 100_000],
])
def test_deeply_nested_json_values_on_the_command_line_are_one_line(forge_home, argv):
    assert CliRunner().invoke(main, ["init"]).exit_code == 0
    r = CliRunner().invoke(main, argv)
    assert r.exit_code == 1 and (r.exception is None or isinstance(r.exception, SystemExit))
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("Error: ")
