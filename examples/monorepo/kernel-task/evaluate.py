"""Verify the kernel of the task's worktree against the reference and measure it.

Reads the built tree from $FORGE_WORKTREE_KERNELS (set by the loop), refuses a tree whose
build/kernels.json does not match its sources, and prints one JSON line: max_abs_err against
the reference, element_reads (deterministic cost: element reads of the input), latency_ms.
"""

import hashlib
import importlib.util
import json
import os
import pathlib
import random
import sys
import time

tree = pathlib.Path(os.environ["FORGE_WORKTREE_KERNELS"])
built = json.loads((tree / "build" / "kernels.json").read_text())
src = tree / "prefix_sum.py"
if built.get("prefix_sum.py") != hashlib.sha256(src.read_bytes()).hexdigest():
    print(json.dumps({"success": False, "error": "build/kernels.json is not the build of "
                      "prefix_sum.py"}))
    sys.exit(0)
spec = importlib.util.spec_from_file_location("prefix_sum", src)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)


class Counted(list):
    """A list that counts element reads (indexing, slicing, iteration)."""

    reads = 0

    def __getitem__(self, i):
        v = super().__getitem__(i)
        Counted.reads += len(v) if isinstance(i, slice) else 1
        return v

    def __iter__(self):
        for v in super().__iter__():
            Counted.reads += 1
            yield v


def reference(xs):
    out, total = [], 0
    for x in xs:
        total += x
        out.append(total)
    return out


rng = random.Random(0)
cases = [[rng.randint(-1000, 1000) for _ in range(n)] for n in (0, 1, 2, 17, 300)]
err = 0
for xs in cases:
    got = mod.prefix_sum(list(xs))
    want = reference(xs)
    err = max(err, 10**9 if len(got) != len(want) else
              max((abs(a - b) for a, b in zip(got, want, strict=True)), default=0))
Counted.reads = 0
t0 = time.perf_counter()
mod.prefix_sum(Counted(cases[-1]))
latency_ms = (time.perf_counter() - t0) * 1000
print(json.dumps({"max_abs_err": err, "element_reads": Counted.reads,
                  "latency_ms": round(latency_ms, 4)}))
