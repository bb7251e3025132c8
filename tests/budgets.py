"""Each test file's time budget, checked after the suite from its JUnit report.

`make test` runs pytest with `--junitxml`, then this script: every file's time is the sum of
its tests' durations (setup, call and teardown, as pytest's JUnit report counts them, whatever
worker ran them), held against its budget in tests/budgets.toml (`default` for a file not
named). A file over budget fails the run with one line naming it, its time and its budget; the
table of the slowest files is printed either way. Outside pytest on purpose: a test cannot
judge the run it is part of, and a budget is about a whole file.

    .venv/bin/python tests/budgets.py REPORT.xml [--budgets tests/budgets.toml] [--top 15]
"""

from __future__ import annotations

import argparse
import sys
import tomllib
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent


def file_times(report: Path) -> dict[str, float]:
    """Seconds per test file (`tests/…/test_x.py`) in a JUnit report written by pytest."""
    times: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        # classname is the module's dotted path (`tests.harness.loop.test_loop`, or with a
        # class: `…test_loop.TestX`); pytest may prefix the root package's name.
        parts = case.get("classname", "").split(".")
        if "tests" in parts:
            parts = parts[parts.index("tests"):]
        while parts and not parts[-1].startswith("test_"):
            parts.pop()
        if parts:
            times["/".join(parts) + ".py"] += float(case.get("time") or 0.0)
    return dict(times)


def load_budgets(path: Path) -> tuple[float, dict[str, float]]:
    """(the default budget, {test file: budget}) from a budgets.toml; ValueError naming the
    fault when it is not one."""
    try:
        spec = tomllib.loads(path.read_text())
        return float(spec["default"]), {str(k): float(v)
                                        for k, v in spec.get("files", {}).items()}
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None


def over_budget(times: dict[str, float], budgets: dict[str, float], default: float
                ) -> list[tuple[str, float, float]]:
    """(file, seconds, budget) for every file over its budget, slowest first."""
    out = [(f, t, budgets.get(f, default)) for f, t in times.items()
           if t > budgets.get(f, default)]
    return sorted(out, key=lambda x: -x[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path)
    ap.add_argument("--budgets", type=Path, default=HERE / "budgets.toml")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args(argv)
    try:
        default, budgets = load_budgets(a.budgets)
    except ValueError as e:
        print(f"budgets: {e}", file=sys.stderr)
        return 2
    try:
        times = file_times(a.report)
    except (OSError, ET.ParseError) as e:
        print(f"budgets: {a.report}: {e}", file=sys.stderr)
        return 2
    unknown = sorted(f for f in budgets if not (HERE.parent / f).is_file())
    for f in unknown:
        print(f"budgets: {a.budgets}: no test file {f}", file=sys.stderr)
    print(f"test files: {len(times)}, sum of test time {sum(times.values()):.0f} s; slowest:")
    for f, t in sorted(times.items(), key=lambda x: -x[1])[:a.top]:
        print(f"  {t:7.1f} s  (budget {budgets.get(f, default):5.0f} s)  {f}")
    over = over_budget(times, budgets, default)
    for f, t, b in over:
        print(f"budgets: {f} took {t:.1f} s, over its budget of {b:.0f} s", file=sys.stderr)
    return 1 if over or unknown else 0


if __name__ == "__main__":
    sys.exit(main())
