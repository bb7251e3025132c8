"""`forge ab` overhead: the deployable build cache (miss vs hit) and the A/B's own cost around
its builds and measurements. Prints figures for bench/RESULTS.md.

    .venv/bin/python bench/ab.py [--rounds 3] [--prompts 24] [--output-len 48]

Everything in a temporary directory removed at the end: the SGLang-shaped repository of the
tests (tests/helpers/sglang_repo.py: SGLang's layout and setuptools-scm versioning; `main`
6 ms per token, `fast` 1 ms) as the MonoRepo member `sglang`, a base environment with a
released-looking sglang 0.5.23 installed, the generated tiny model, a point on this CPU.

1. Build cache: `commit_build.build` of `main`, a miss (a fresh workspace: the environment is
   made and the member installed by pip) and a hit (the same inputs again), per round.
2. The A/B: `harness.loop.ab.run_ab` (what `forge ab` calls) of `fast` against `main`, per
   round a new task; its wall time split into the builds (`commit_build.build`), the
   measurements (`EngineEvaluator.evaluate`: deploy, warm-up, greedy outputs, the repeats)
   and the rest: the A/B's own overhead (task file, define, the loop's steps and saves,
   snapshots, verification, decision, reading the result). Target: the rest is at most 5 %
   of the wall time beyond builds and measurements... i.e. rest / wall <= 5 %.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO.parent))
sys.path.insert(0, str(REPO))

from infer_forge.harness.engines import commit_build  # noqa: E402
from infer_forge.harness.loop import ab as ab_mod  # noqa: E402
from infer_forge.harness.loop import engine_evaluator  # noqa: E402
from infer_forge.harness.models.weights import pull  # noqa: E402
from infer_forge.ledger.workspace import init_workspace  # noqa: E402
from infer_forge.repos import commands as rc  # noqa: E402

from tests.helpers.gitrepos import write_manifest  # noqa: E402
from tests.helpers.sglang_repo import (  # noqa: E402
    DEPLOY_INSTALL,
    ab_spec,
    installed_base,
    make_sglang_repo,
    python_of,
)

INSTALL = DEPLOY_INSTALL


class Timer:
    """Wraps a function, summing the seconds spent in it."""

    def __init__(self, owner, name):
        self.owner, self.name, self.fn, self.total = owner, name, getattr(owner, name), 0.0
        setattr(owner, name, self)

    def __call__(self, *a, **kw):
        t0 = time.perf_counter()
        try:
            return self.fn(*a, **kw)
        finally:
            self.total += time.perf_counter() - t0

    def __get__(self, obj, objtype=None):  # as a method of the evaluator
        return self if obj is None else (lambda *a, **kw: self(obj, *a, **kw))

    def restore(self):
        setattr(self.owner, self.name, self.fn)


def workspace(base: Path, repo, model_src: Path | None):
    home = base / f"home-{time.monotonic_ns()}"
    ws, _ = init_workspace(home)
    rc.init(ws, write_manifest(base / f"m-{home.name}.yaml", [
        {"name": "sglang", "url": str(repo.path), "branch": "main",
         "deploy": {"install": INSTALL, "module": "sglang"}}]))
    if model_src is not None:
        shutil.copytree(model_src, home / "models" / model_src.name)
    return ws


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--output-len", type=int, default=48)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="forge-bench-ab-") as t:
        tmp = Path(t)
        repo = make_sglang_repo(tmp / "sglang")
        base_python = python_of(installed_base(tmp / "base"))
        point = ab_spec(tmp / "spec", base_python, input_len=64, output_len=a.output_len,
                        prompts=a.prompts)
        first = workspace(tmp, repo, None)
        model = Path(pull(first, "forge:tiny-llama").path)
        first.close()

        miss, hit = [], []
        for _ in range(a.rounds):
            ws = workspace(tmp, repo, None)
            mono = rc.open_monorepo(ws)
            for out in (miss, hit):
                t0 = time.perf_counter()
                b = commit_build.build(ws, mono, "sglang", repo.main,
                                       base_python=str(base_python))
                out.append(time.perf_counter() - t0)
                assert b.success, b.error
            ws.close()

        rows = []
        ws = workspace(tmp, repo, model)
        for i in range(a.rounds):
            builds = Timer(commit_build, "build")
            measure = Timer(engine_evaluator.EngineEvaluator, "evaluate")
            t0 = time.perf_counter()
            try:
                r = ab_mod.run_ab(ws, point=point, base="main", candidate="fast")
            finally:
                builds.restore()
                measure.restore()
            wall = time.perf_counter() - t0
            assert r.verdict == "accepted", r.reason
            rest = wall - builds.total - measure.total
            rows.append((wall, builds.total, measure.total, rest))
            print(f"round {i + 1}: wall {wall:.2f} s = builds {builds.total:.2f} + "
                  f"measurements {measure.total:.2f} + rest {rest:.2f} "
                  f"({100 * rest / wall:.1f} %)", flush=True)
        ws.close()

    med = statistics.median
    print()
    print("| figure (median s; min in brackets) | value |")
    print("|---|---|")
    print(f"| build, miss (venv made, pip install -e) | {med(miss):.3f} ({min(miss):.3f}) |")
    print(f"| build, hit (same inputs) | {med(hit):.3f} ({min(hit):.3f}) |")
    print(f"| ratio miss/hit | **{med(miss) / med(hit):.0f}x** |")
    for k, name in ((0, "A/B wall"), (1, "  builds (round 1 misses, then hits)"),
                    (2, "  measurements (deploy + warm-up + outputs + repeats), both sides"),
                    (3, "  the A/B's own overhead (the rest)")):
        vals = [r[k] for r in rows]
        print(f"| {name} | {med(vals):.2f} ({min(vals):.2f}) |")
    share = [r[3] / r[0] for r in rows]
    print(f"| overhead / wall (target <= 5 %) | **{100 * med(share):.1f} %** "
          f"(max {100 * max(share):.1f} %) |")


if __name__ == "__main__":
    main()
