"""The README's tour, top to bottom, as a person runs it after the demo, delivered or not
(issue 33): every line of the blocks README.md tags `<!-- tour … -->`, in a fresh checkout
folder and FORGE_HOME, gives no error the user did not cause.

- Each line runs in bash as written, in a folder standing for the checkout: its `.venv` is
  this interpreter's environment, and PATH has no `forge` until the tour's `source
  .venv/bin/activate`; `export`/`source` lines carry over to the lines after them, as in one
  shell. A line passes with exit 0, no `Error:`, no traceback and no progress bar on stderr.
- `forge demo` is the one line run otherwise: the real CLI in this process with the scripted
  evaluator of test_demo.py in place of the engine (test_demo.py runs the real one): a
  baseline that is not stable (exit 1, failed-unverifiable), or a stable one (delivered).
- Marks, in a line's comment: `[delivered demo]` passes after a delivered demo; after one
  that did not, it fails with one line naming the block it lacks, and passes once `forge
  demo` again (what the README says to run then) delivered. `[until Ctrl-C]` is listed and
  not run (`forge wiki serve`; tests/wiki/test_browser.py serves the site). A mark this test
  does not know fails it.
- The demo's own hints (`explore:`, the wiki's) run as printed, in the shell that ran it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from infer_forge.harness import demo as demo_mod

from tests.conftest import REPO, need, run_forge
from tests.e2e.test_demo import ScriptedEvaluator

TASK = "demo-tune-tiny-cpu"
UNSTABLE = (100.0, 150.0, 60.0)
MARKS = {"delivered demo", "until Ctrl-C"}
VENV = Path(sys.executable).parent.parent


def tour_lines(readme: str) -> list[str]:
    """The command lines of the tagged blocks, in order (continuations joined, comment-only
    and blank lines dropped)."""
    lines: list[str] = []
    for block in re.findall(r"<!-- tour\b[^>]*-->\n```[^\n]*\n(.*?)```", readme, re.S):
        pending = ""
        for raw in block.splitlines():
            if not raw.strip() or raw.lstrip().startswith("#"):
                continue
            pending += raw.rstrip()
            if pending.endswith("\\"):
                pending = pending[:-1]
                continue
            lines.append(pending)
            pending = ""
    return lines


def mark_of(line: str) -> str | None:
    m = re.search(r"#\s*\[([^\]]+)\]", line)
    return m.group(1) if m else None


def shell_env() -> dict[str, str]:
    """The environment of a new shell: no FORGE_HOME, no virtual environment, and no
    `forge` on PATH (the tour's `source .venv/bin/activate` puts it there)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("FORGE_HOME", "VIRTUAL_ENV", "FORGE_APPROVER_KEY_FILE")}
    env["PATH"] = os.pathsep.join(
        d for d in env.get("PATH", "").split(os.pathsep)
        if d and not (Path(d) / "forge").exists())
    return env


def bash(session: list[str], line: str, cwd: Path) -> subprocess.CompletedProcess:
    script = "\n".join([*session, line])
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=cwd,
                          env=shell_env(), timeout=300)


def clean(r: subprocess.CompletedProcess) -> bool:
    err = r.stderr
    return (r.returncode == 0 and "Traceback" not in err and "\r" not in err
            and not re.search(r"^Error", err, re.M) and "Loading weights" not in err)


class Tour:
    """One run of the tour in its own checkout folder; `demo` runs the demo line."""

    def __init__(self, root: Path, evaluator: ScriptedEvaluator):
        self.root, self.evaluator = root, evaluator
        self.session: list[str] = []
        self.demo_out = ""
        self.results: list[tuple[str, str | None, subprocess.CompletedProcess | None]] = []
        root.mkdir(parents=True)
        (root / ".venv").symlink_to(VENV, target_is_directory=True)

    def home(self) -> Path:
        r = bash(self.session, 'printf %s "$FORGE_HOME"', self.root)
        assert r.returncode == 0 and r.stdout, ("no FORGE_HOME after", self.session)
        return Path(r.stdout)

    def demo(self, evaluator: ScriptedEvaluator | None = None) -> subprocess.CompletedProcess:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(demo_mod, "EngineEvaluator",
                       lambda ws, task: evaluator or self.evaluator)
            r = run_forge("demo", home=self.home(), timeout=300)
        self.demo_out = r.stdout
        return r

    def run(self, line: str) -> subprocess.CompletedProcess | None:
        mark = mark_of(line)
        assert mark is None or mark in MARKS, f"README: unknown mark [{mark}] in {line!r}"
        words = shlex.split(line, comments=True)
        if mark == "until Ctrl-C":
            self.results.append((line, mark, None))
            return None
        if words and words[0] in ("source", "export"):
            r = bash(self.session, line, self.root)
            assert r.returncode == 0, (line, r.stderr)
            self.session.append(line)
        elif words == ["forge", "demo"]:
            r = self.demo()
        else:
            assert words[0] == "forge", f"README tour: not a forge line: {line!r}"
            r = bash(self.session, line, self.root)
        self.results.append((line, mark, r))
        return r


def run_tour(tmp_path: Path, name: str, evaluator: ScriptedEvaluator) -> Tour:
    readme = (REPO / "README.md").read_text()
    lines = tour_lines(readme)
    # The tour is there, starts by putting forge on PATH, and every command is bare `forge`.
    assert len(lines) >= 15, lines
    assert shlex.split(lines[0], comments=True) == ["source", ".venv/bin/activate"], lines[0]
    assert any(shlex.split(ln, comments=True) == ["forge", "demo"] for ln in lines)
    assert not [ln for ln in lines if ".venv/bin/forge" in ln.split("#")[0]]
    need((VENV / "bin" / "activate").is_file() and (VENV / "bin" / "forge").is_file(),
         f"{VENV} has no bin/activate and bin/forge (make venv)")
    tour = Tour(tmp_path / name, evaluator)
    for line in lines:
        tour.run(line)
    skipped = [ln for ln, mark, _ in tour.results if mark == "until Ctrl-C"]
    print(f"\n{name}: not run (marked [until Ctrl-C]): {skipped}")
    return tour


def check_passed(tour: Tour, *, delivered: bool) -> list[str]:
    """Every line ran clean, but the `[delivered demo]` ones after a demo that did not
    deliver: those are returned."""
    waiting = []
    for line, mark, r in tour.results:
        if r is None:
            continue
        if shlex.split(line, comments=True) == ["forge", "demo"]:
            assert r.returncode == (0 if delivered else 1), (r.stdout[-800:], r.stderr[-800:])
            continue
        if mark == "delivered demo" and not delivered:
            waiting.append(line)
            continue
        assert clean(r), (line, r.returncode, r.stdout[-600:], r.stderr[-1200:])
    return waiting


def test_the_tour_after_a_delivered_demo(tmp_path):
    tour = run_tour(tmp_path, "delivered", ScriptedEvaluator())
    assert check_passed(tour, delivered=True) == []
    # The demo's hints run as printed, in the shell that ran it (here: this process's PATH):
    # bare `forge` only where that shell finds this forge.
    hints = [ln.strip() for ln in tour.demo_out.splitlines()
             if ln.startswith("  ") and " --home " in ln and not ln.rstrip().endswith("serve")]
    assert len(hints) >= 6, tour.demo_out[-1500:]
    for hint in hints:
        r = subprocess.run(["bash", "-c", hint], capture_output=True, text=True, cwd=REPO,
                           timeout=120)
        assert clean(r), (hint, r.returncode, r.stderr[-800:])
    on_path = shutil.which("forge")
    assert hints[0].startswith("forge ") == (
        on_path is not None and Path(on_path).resolve() == (VENV / "bin" / "forge").resolve()
    ), hints[0]


def test_the_tour_after_a_demo_that_did_not_deliver(tmp_path):
    tour = run_tour(tmp_path, "failed", ScriptedEvaluator(UNSTABLE))
    waiting = check_passed(tour, delivered=False)
    assert waiting, "the README marks the lines a demo stopped at its baseline cannot answer"
    for line in waiting:  # one line naming what the task lacks, exit non-zero
        r = bash(tour.session, line, tour.root)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode != 0 and len(lines) == 1, (line, r.stderr)
        assert lines[0].startswith("Error:") and TASK in lines[0] and "b1" in lines[0], lines
    # What the README says to run then: `forge demo` again (here the engine is stable now).
    again = tour.demo(ScriptedEvaluator())
    assert again.returncode == 0 and "reopened, continuing" in again.stdout, again.stderr
    for line in waiting:
        r = bash(tour.session, line, tour.root)
        assert clean(r), (line, r.returncode, r.stderr[-800:])
