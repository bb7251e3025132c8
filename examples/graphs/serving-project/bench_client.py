"""Run the vendored SGLang's own bench client once per `+++`-separated argument list.

Run with the release importable (`python -m infer_forge.harness.engines.sglang_import ROOT
this_file ARGS...`): `python -m sglang.benchmark.serving ARGS` where the release has it (0.5.21
and later), else `sglang.bench_serving`, in this process, so the release's own code parses the
arguments, sends the requests and writes `--output-file`. No model hub (the tokenizer is a
local directory). The same driver as the conformance kit's
(tests/data/sglang/golden/bench/run_bench_client.py), kept beside the example that uses it.
"""

import os
import runpy
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import sglang  # noqa: E402  (after the offline switch)

root = sglang.__path__[0]
module = ("sglang.benchmark.serving"
          if os.path.exists(os.path.join(root, "benchmark", "serving.py"))
          else "sglang.bench_serving")
path = os.path.join(root, *module.split(".")[1:]) + ".py"
runs: list[list[str]] = [[]]
for arg in sys.argv[1:]:
    if arg == "+++":
        runs.append([])
    else:
        runs[-1].append(arg)
for args in runs:
    print(f"[bench_client] python -m {module} {' '.join(args)}", flush=True)
    sys.argv = [path, *args]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
