"""Start-up cost of the CLI: wall and CPU time of `forge --help`, of a group's help and of the
read commands on a workspace, each against its baseline measured in the same run, and which
libraries importing the CLI loads.

    .venv/bin/python bench/startup.py [--runs 9] [--home DIR [--task ID]] [REV ...]

Each forge command runs as the console script does (`infer_forge.entry.main`), for the working
tree and each git revision REV (exported with `git archive` into a temporary directory and
imported through PYTHONPATH). Baselines: `python -c pass` for the help commands; for each
read command a plain Python script (sqlite3 and json, nothing of forge's) that reads the same
rows from the workspace's ledger.sqlite and decodes their payloads. Runs are interleaved (each
round runs every baseline and every tree once) so that load from other work on the machine
hits each alike. Every tree is byte-compiled first, as an installed package is: with
PYTHONDONTWRITEBYTECODE set, each run would compile the package's sources again and measure
the compiler. CPU time (user + system, from the child's rusage) moves less with the machine's
load than wall time; both are reported as min and median, and the ratio is the command's
median wall time over its baseline's. Without --home only the help commands run (build a
workspace with `FORGE_HOME=DIR forge demo --no-wiki`). The read commands keep their rows in
the workspace (`reads.sqlite`, projections/fast_reads.py) after their first read; the cases
marked "(nothing kept)" remove it before each run: the first read through the models.
"(after a write)": each tree first writes to a task of its own (`forge task exit` and `task
reopen` in turn, on the task examples/tasks/tune-tiny-cpu.yaml defines, added when missing)
and then reads it: the write's time and the read's are each reported (a command that wrote
keeps its tasks' rows for the read that follows).
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("pyarrow", "numpy", "duckdb", "torch", "transformers", "sentence_transformers",
         "matplotlib", "markdown_it", "networkx", "aiohttp", "detect_secrets")
# What the ledger's models, spec files and event store load (issue 36: not for `--help`).
MODELS = ("pydantic", "yaml", "eventsourcing")
SKIP = re.compile(r"/(tests|notebooks|examples|bench|\.venv|\.git|\.forge)/")
# The console script's body (pyproject's `forge = "infer_forge.entry:main"`).
ENTRY = "import sys; from infer_forge.entry import main; sys.exit(main())"
# The rows the read commands keep in the workspace (projections/fast_reads.py READS_NAME).
READS = "reads.sqlite"
# The task the "(after a write)" cases write to and read (defined by the bench when missing).
WRITE_SPEC = REPO / "examples" / "tasks" / "tune-tiny-cpu.yaml"
WRITE_TASK = "tune-tiny-cpu"

# The baselines of the read commands: the same rows from the same SQLite file, decoded.
_OPEN = ("import json, sqlite3, sys\n"
         "db = sqlite3.connect(f'file:{sys.argv[1]}/ledger.sqlite?mode=ro', uri=True)\n"
         "def stream(s):\n"
         "    return [(p, v, t, json.loads(st)) for p, v, t, st in db.execute(\n"
         "        'SELECT rowid, originator_version, topic, state FROM stored_events '\n"
         "        'WHERE originator_id=? ORDER BY originator_version', (s,))]\n")
BASELINE_TASK_LIST = _OPEN + (
    # `task list`: the ids from the TaskDefined rows, then each task's stream.
    "ids = [s for (s,) in db.execute(\"SELECT originator_id FROM stored_events WHERE \"\n"
    "       \"topic='TaskDefined' AND originator_version=1 ORDER BY rowid\")]\n"
    "for s in ids:\n"
    "    print(s[5:], len(stream(s)))\n")
BASELINE_TASK_MEMORY = _OPEN + (
    # `task memory T`: the task's stream.
    "rows = stream('task:' + sys.argv[2])\n"
    "print(len(rows), rows[-1][3].get('occurred_at'))\n")
BASELINE_LOG_TASK = _OPEN + (
    # `log --task T`: the whole log in order, each payload decoded, kept if it is the task's
    # stream's or names the task (what `Ledger.events(task=T)` keeps).
    "task = sys.argv[2]\n"
    "for p, s, v, t, st in db.execute('SELECT rowid, originator_id, originator_version, '\n"
    "                                 'topic, state FROM stored_events ORDER BY rowid'):\n"
    "    ev = json.loads(st)\n"
    "    if t != 'CommandHandled' and (s == 'task:' + task or ev.get('task_id') == task):\n"
    "        print(p, ev.get('occurred_at'), t, s)\n")


def export(rev: str, into: Path) -> Path:
    """The tree at `rev` as an importable `infer_forge` under `into`; returns the folder to
    put on PYTHONPATH."""
    tree = into / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    compileall.compile_dir(str(tree), quiet=1, rx=SKIP)
    pkg = into / "pkg"
    pkg.mkdir()
    (pkg / "infer_forge").symlink_to(tree)
    return pkg


def _short(rev: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev], check=True,
                          capture_output=True, text=True).stdout.strip()


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one child process; its output is dropped, its failure raises."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env,
                   cwd=tempfile.gettempdir())
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)


def loaded_by(env: dict[str, str], names: tuple[str, ...]) -> str:
    code = ("import infer_forge.cli, sys\n"
            f"print(', '.join(m for m in {names!r} if m in sys.modules) or 'none')")
    return subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                          text=True, env=env, cwd=tempfile.gettempdir()).stdout.strip()


def cases(home: Path | None, task: str) -> list[tuple[str, list[str], list[str]]]:
    """(command, forge's arguments, the baseline's command line) for each command measured."""
    py = sys.executable
    out = [("forge --help", ["--help"], [py, "-c", "pass"]),
           ("forge task --help", ["task", "--help"], [py, "-c", "pass"])]
    if home is not None:
        h = str(home)
        out += [
            ("forge task list", ["--home", h, "task", "list"],
             [py, "-c", BASELINE_TASK_LIST, h]),
            (f"forge task memory {task}", ["--home", h, "task", "memory", task],
             [py, "-c", BASELINE_TASK_MEMORY, h, task]),
            (f"forge log --task {task}", ["--home", h, "log", "--task", task],
             [py, "-c", BASELINE_LOG_TASK, h, task]),
            # The same reads with nothing kept (projections/fast_reads.py): what the first
            # read after a write pays, through the models, keeping its rows. Last: the
            # memory case leaves the rows every read above uses in the next round.
            ("forge task list (nothing kept)", ["--home", h, "task", "list"],
             [py, "-c", BASELINE_TASK_LIST, h]),
            (f"forge task memory {task} (nothing kept)", ["--home", h, "task", "memory", task],
             [py, "-c", BASELINE_TASK_MEMORY, h, task]),
            # Timed by `main` with the write before it (see the module's doc).
            (f"forge task memory {WRITE_TASK} (after a write)",
             ["--home", h, "task", "memory", WRITE_TASK],
             [py, "-c", BASELINE_TASK_MEMORY, h, WRITE_TASK]),
        ]
    return out


_WRITES = (["task", "exit", WRITE_TASK, "--state", "aborted-by-human", "--reason", "bench"],
           ["task", "reopen", WRITE_TASK, "--reason", "bench"])


def _define_write_task(forge: list[str], home: Path) -> None:
    """The task the "(after a write)" cases write to, defined in `home` when missing, and
    open (an exit left by an interrupted run is reopened)."""
    subprocess.run([*forge, "--home", str(home), "task", "new", str(WRITE_SPEC)], check=True,
                   stdout=subprocess.DEVNULL, cwd=tempfile.gettempdir())
    subprocess.run([*forge, "--home", str(home), *_WRITES[1]], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, cwd=tempfile.gettempdir())  # fails when open


def _stats(xs: list[tuple[float, float]]) -> tuple[float, float, float, float]:
    wall, cpu = [w for w, _ in xs], [c for _, c in xs]
    return min(wall), statistics.median(wall), min(cpu), statistics.median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--home", type=Path, help="a workspace for the read commands")
    ap.add_argument("--task", default="demo-tune-tiny-cpu",
                    help="the task the read commands read (default: the demo's)")
    ap.add_argument("revs", nargs="*", help="git revisions to measure beside the working tree")
    args = ap.parse_args()
    if args.home is not None and not (args.home / "ledger.sqlite").is_file():
        sys.exit(f"--home {args.home}: no ledger.sqlite there (a SQLite workspace is needed)")
    tmp = Path(tempfile.mkdtemp(prefix="forge-startup-"))
    try:
        trees = {f"{rev} ({_short(rev)})": export(rev, tmp / str(i))
                 for i, rev in enumerate(args.revs)}
        compileall.compile_dir(str(REPO), quiet=1, rx=SKIP)
        envs = {name: dict(os.environ, PYTHONPATH=str(pkg)) for name, pkg in trees.items()}
        envs["working tree"] = dict(os.environ)
        base_env = dict(os.environ)
        todo = cases(args.home, args.task)
        forge = [sys.executable, "-c", ENTRY]
        if args.home is not None:
            _define_write_task(forge, args.home)
        writes = 0
        times: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for _ in range(args.runs + 1):  # the first round warms the file cache, not counted
            for command, argv, baseline in todo:
                sample = [("baseline", run_once(baseline, base_env))]
                for name, env in envs.items():
                    if command.endswith("(nothing kept)"):
                        (args.home / READS).unlink(missing_ok=True)
                    if command.endswith("(after a write)"):
                        assert args.home is not None
                        write = ["--home", str(args.home), *_WRITES[writes % 2]]
                        writes += 1
                        sample.append((f"{name}: the write", run_once([*forge, *write], env)))
                    sample.append((name, run_once([*forge, *argv], env)))
                if _ == 0:
                    continue
                for name, t in sample:
                    times.setdefault((command, name), []).append(t)
        print(f"{args.runs} interleaved runs each (s); ratio = median wall / the baseline's")
        print("| command | run | wall min | wall median | CPU min | CPU median | ratio |")
        print("|---|---|---|---|---|---|---|")
        for command, _argv, _baseline in todo:
            base = _stats(times[(command, "baseline")])
            for name in ["baseline", *envs, *(f"{e}: the write" for e in envs)]:
                if (command, name) not in times:
                    continue
                s = _stats(times[(command, name)])
                ratio = ("1" if name == "baseline" else "-" if name.endswith("the write")
                         else f"{s[1] / base[1]:.1f}x")
                print(f"| `{command}` | {name} | {s[0]:.3f} | {s[1]:.3f} | {s[2]:.3f} | "
                      f"{s[3]:.3f} | {ratio} |")
        for name, env in envs.items():
            print(f"importing infer_forge.cli ({name}) loads: heavy {loaded_by(env, HEAVY)}; "
                  f"models {loaded_by(env, MODELS)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
