"""A scripted agent (the command executor): proposes kernel commits in the task's worktree.

Reads Task Memory on stdin (JSON) and answers one JSON line. Its policy depends only on how
many candidate blocks the task has, so a resumed loop gets the same answer:
  1st: a running-sum version, committed — but it computes an exclusive scan (wrong);
  2nd: the fixed running sum, left uncommitted: the candidate is the worktree's state;
  then: stop.
"""

import json
import os
import pathlib
import subprocess
import sys

memory = json.load(sys.stdin)["memory"]
tried = [b for b in memory["execution_record"] if b.get("candidate")]
tree = pathlib.Path(os.environ["FORGE_WORKTREE_KERNELS"])
kernel = tree / "prefix_sum.py"

FAST_WRONG = '''"""Inclusive prefix sum, one pass (a running total)."""


def prefix_sum(xs):
    out, total = [], 0
    for x in xs:
        out.append(total)
        total += x
    return out
'''
FAST = FAST_WRONG.replace("        out.append(total)\n        total += x\n",
                          "        total += x\n        out.append(total)\n")


def git(*args):
    subprocess.run(["git", *args], cwd=tree, check=True, capture_output=True)


if len(tried) == 0:
    kernel.write_text(FAST_WRONG)
    git("commit", "-q", "-am", "prefix_sum: one pass with a running total")
    print(json.dumps({"action": "try", "candidate": {"code.kernels": "HEAD"},
                      "sub_goal": "one-pass running total", "model": "scripted-agent"}))
elif len(tried) == 1:
    kernel.write_text(FAST)
    print(json.dumps({"action": "try", "candidate": {"code.kernels": "worktree"},
                      "sub_goal": "running total, added before it is stored",
                      "model": "scripted-agent"}))
else:
    print(json.dumps({"action": "stop", "reason": "no further idea",
                      "model": "scripted-agent"}))
