"""Fuzz-style inputs: seeded random mutations of the real example specs,
bench_serving files and forge.toml go through the real CLI. Every case must end with exit 0,
1 or 2, no uncaught exception and no traceback; a refusal is one `Error: …` line (or, for a
spec, `error: FILE:LINE: …` lines, one per problem); and a refused case leaves the ledger
exactly as it was (every stored row compared).

Many cases run in this one process through click's CliRunner (fast); a few run in the real
process (`run_forge`) to show that no traceback reaches a user there either. Seeds are fixed:
a failure names its case, and the case is reproducible."""

from __future__ import annotations

import hashlib
import random
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from infer_forge.cli import main

from tests.conftest import REPO, run_forge

EX = REPO / "examples"
BENCH = sorted((REPO / "tests/data/bench_serving").glob("*.jsonl"))
SPECS = sorted(p for sub in ("points", "profiles", "tasks") for p in (EX / sub).glob("*.yaml"))

# Values that have broken parsers somewhere: numbers the ledger cannot hold, YAML anchors and
# tags, JSON constants, structure characters, control bytes, a BOM, long text.
HOSTILE_VALUES = [
    ".nan", ".inf", "-.inf", "1e400", "1.0e+400", "99999999999999999999999", "-0x1ffffffffffff"
    "fffffffff", "NaN", "Infinity", "-Infinity", "&a [*a]", "*undefined", "&x", "!!binary ???",
    "!!python/object/apply:os.system ['true']", "!!timestamp 2024-13-45", "[", "{", "}", ": :",
    "? [a]", "- -", "''", '"\\x"', "null", "~", "[]", "{}", "true", "-1", "0", "\x00", "\x07",
    "\ufeff", "\u202e", "x" * 300, "${HOME}", "0o777777777777777777777777", "1_000", "1:30",
]
HOSTILE_LINES = [
    "a: &a [*a, *a]", "<<: *missing", "%YAML 9.9", "--- !!set", "...", "key: [unclosed",
    '{"completed": NaN}', "[1, 2, 3]", "\t- tab", "[ledger", "ledger = 5", "= x", "[[guard]]",
    "x = nan", "engines = [1]", "url = 'postgresql://u:pw@h/db'",
]


def _lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True) or [b""]


def mutate(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    """One random mutation of `data`: (its name, the mutated bytes)."""
    kind = rng.choice(["flip", "truncate", "delete-line", "duplicate-line", "swap-lines",
                       "inject-line", "replace-value", "replace-value", "random-bytes",
                       "splice", "empty"])
    if kind == "flip":
        b = bytearray(data or b"\x00")
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return kind, bytes(b)
    if kind == "truncate":
        return kind, data[:rng.randrange(len(data) + 1)]
    lines = _lines(data)
    if kind == "delete-line":
        del lines[rng.randrange(len(lines))]
        return kind, b"".join(lines)
    if kind == "duplicate-line":
        i = rng.randrange(len(lines))
        lines.insert(i, lines[i])
        return kind, b"".join(lines)
    if kind == "swap-lines":
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
        return kind, b"".join(lines)
    if kind == "inject-line":
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(HOSTILE_LINES).encode() + b"\n")
        return kind, b"".join(lines)
    if kind == "replace-value":
        text = data.decode("utf-8", "surrogateescape")
        spots = [m.span(2) for m in re.finditer(r"([:=]\s*)([^\s,}\]\[{][^,}\]\n]*)", text)]
        if not spots:
            return kind, data
        a, b = rng.choice(spots)
        value = rng.choice(HOSTILE_VALUES)
        return kind, (text[:a] + value + text[b:]).encode("utf-8", "surrogateescape")
    if kind == "random-bytes":
        return kind, bytes(rng.randrange(256) for _ in range(rng.randint(1, 600)))
    if kind == "splice":  # the head of this file, the tail of another kind of file
        other = rng.choice(SPECS + BENCH).read_bytes()
        return kind, data[:rng.randrange(len(data) + 1)] + other[rng.randrange(len(other)):]
    return kind, b""


def _ledger_state(home: Path) -> tuple[int, str]:
    """(rows, sha256 of every stored row in order): equal means the ledger did not change."""
    h = hashlib.sha256()
    n = 0
    with sqlite3.connect(f"file:{home / 'ledger.sqlite'}?mode=ro", uri=True) as c:
        for row in c.execute("SELECT rowid, originator_id, originator_version, topic, state "
                             "FROM stored_events ORDER BY rowid"):
            n += 1
            h.update(repr(row).encode())
    return n, h.hexdigest()


def _check_result(case: str, r, spec_lines_ok: bool = False) -> None:
    out = r.output + (r.stderr or "")
    assert r.exit_code in (0, 1, 2), (case, r.exit_code, out[-2000:])
    assert r.exception is None or isinstance(r.exception, SystemExit), \
        (case, repr(r.exception), out[-2000:])
    assert "Traceback" not in out, (case, out[-2000:])
    if r.exit_code == 0:
        return
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines, (case, "a refusal says why", r.output[-500:])
    if r.exit_code == 2:  # click's usage error: Usage/Try lines, then one Error line
        assert sum(ln.startswith("Error: ") for ln in lines) == 1, (case, lines)
        return
    if spec_lines_ok and lines[0].startswith("error: "):
        assert all(ln.startswith("error: ") for ln in lines), (case, lines)
        return
    assert len(lines) == 1 and lines[0].startswith("Error: "), (case, lines)


@pytest.fixture
def fuzz_home(forge_home):
    r = CliRunner().invoke(main, ["init"])
    assert r.exit_code == 0, r.output
    return forge_home


def _run_cases(home: Path, cases: list[tuple[str, list[str], Callable[[], None]]],
               spec_lines_ok: bool = False) -> dict[int, int]:
    """Run each (name, argv, prepare) case; returns how many ended with each exit code."""
    runner = CliRunner()
    codes: dict[int, int] = {}
    state = _ledger_state(home)
    for name, argv, prepare in cases:
        prepare()
        r = runner.invoke(main, argv, catch_exceptions=True)
        _check_result(name, r, spec_lines_ok)
        codes[r.exit_code] = codes.get(r.exit_code, 0) + 1
        now = _ledger_state(home)
        if r.exit_code != 0:
            assert now == state, (name, "a refused case changed the ledger")
        state = now
    return codes


def test_fuzzed_specs(fuzz_home, tmp_path):
    """Mutated points, profiles and tasks: `point validate`, `task new` and `profile record`
    (tasks find their point and profile next to them, as in examples/)."""
    for sub in ("points", "profiles", "tasks"):
        (tmp_path / sub).mkdir()
        for f in (EX / sub).glob("*.yaml"):
            (tmp_path / sub / f.name).write_bytes(f.read_bytes())
    cases = []
    for n, src in enumerate(SPECS):
        rng = random.Random(1000 + n)
        for i in range(14):
            kind, data = mutate(rng, src.read_bytes())
            target = tmp_path / src.parent.name / f"fuzz-{n}-{i}.yaml"

            def prepare(target=target, data=data) -> None:
                target.write_bytes(data)

            name = f"{src.parent.name}/{src.name}#{i} {kind}"
            cases.append((name + " validate", ["point", "validate", str(target)], prepare))
            cases.append((name + " task new", ["task", "new", str(target)], prepare))
            cases.append((name + " profile record", ["profile", "record", str(target)],
                          prepare))
    codes = _run_cases(fuzz_home, cases, spec_lines_ok=True)
    assert codes.get(1, 0) > len(cases) // 4, codes  # the mutations do bite
    assert CliRunner().invoke(main, ["check"]).exit_code == 0


def test_fuzzed_bench_files(fuzz_home, tmp_path):
    from infer_forge.harness.loop.define import define_task
    from infer_forge.ledger.workspace import open_workspace

    from ..harness.loop.test_loop import make_task_dir

    with open_workspace(fuzz_home) as ws:  # bench import records only into a defined task
        define_task(ws, make_task_dir(tmp_path / "specs", "fuzz"))
    cases = []
    for n, src in enumerate(BENCH):
        rng = random.Random(2000 + n)
        for i in range(30):
            kind, data = mutate(rng, src.read_bytes())
            target = tmp_path / f"fuzz-{n}-{i}.jsonl"

            def prepare(target=target, data=data) -> None:
                target.write_bytes(data)

            cases.append((f"{src.name}#{i} {kind}",
                          ["bench", "import", str(target), "--task", "fuzz", "--json"], prepare))
    codes = _run_cases(fuzz_home, cases)
    assert codes.get(1, 0) > len(cases) // 4 and codes.get(0, 0) > 0, codes
    assert CliRunner().invoke(main, ["check"]).exit_code == 0


def test_fuzzed_forge_toml(fuzz_home):
    cfg = fuzz_home / "forge.toml"
    original = cfg.read_bytes()
    rng = random.Random(3000)
    cases = []
    for i in range(70):
        kind, data = mutate(rng, original)

        def prepare(data=data) -> None:
            cfg.write_bytes(data)

        argv = rng.choice([["log"], ["task", "list"], ["check"],
                           ["bench", "import", str(BENCH[0])]])
        cases.append((f"forge.toml#{i} {kind} {' '.join(argv[:2])}", argv, prepare))
    codes = _run_cases(fuzz_home, cases)
    assert codes.get(1, 0) > len(cases) // 4, codes
    cfg.write_bytes(original)
    assert CliRunner().invoke(main, ["check"]).exit_code == 0


def test_fuzzed_inputs_in_the_real_process(fuzz_home, tmp_path):
    """A few of each kind through the real `forge` process: no traceback reaches a user."""
    rng = random.Random(4000)
    cfg = fuzz_home / "forge.toml"
    original = cfg.read_bytes()
    runs = []
    for src, args in ((EX / "tasks/tune-tiny-cpu.yaml", ["task", "new"]),
                      (BENCH[0], ["bench", "import"]),
                      (EX / "points/tiny-cpu.yaml", ["point", "validate"])):
        for _ in range(2):
            kind, data = mutate(rng, src.read_bytes())
            f = tmp_path / f"real-{len(runs)}{src.suffix}"
            f.write_bytes(data)
            runs.append((f"{src.name} {kind}", [*args, str(f)]))
    before = _ledger_state(fuzz_home)
    for name, argv in runs:
        r = run_forge(*argv, home=fuzz_home)
        assert r.returncode in (0, 1, 2) and "Traceback" not in r.stderr, (name, r.stderr)
        if r.returncode:
            assert r.stderr.strip(), name
            if argv[0] == "task" or argv[0] == "point":
                lines = r.stderr.strip().splitlines()
                assert all(ln.startswith(("error: ", "Error: ")) for ln in lines), (name, lines)
            else:
                assert len(r.stderr.strip().splitlines()) == 1, (name, r.stderr)
            assert _ledger_state(fuzz_home) == before, name
        before = _ledger_state(fuzz_home)
    kind, data = mutate(random.Random(4001), original)
    cfg.write_bytes(b"[ledger]\nurl = 5\n\x00\xff" + data)
    r = run_forge("log", home=fuzz_home)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
