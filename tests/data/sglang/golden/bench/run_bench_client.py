"""Run a released SGLang's own bench client, as its command line, once or several times.

Run it under the kit (`sglang_release.run(VERSION, this_file, *ARGS)`, or
`python -m infer_forge.harness.engines.sglang_import ROOT this_file ARGS...`): it runs
`python -m sglang.benchmark.serving ARGS` where the release has it (0.5.21 and later), else
`python -m sglang.bench_serving ARGS`, in this process, so the release's own code parses the
arguments, sends the requests and writes `--output-file`. ARGS may hold several runs
separated by `+++` (one process, one import of the client, for a test module's batch). The
client is run from its file, as `runpy.run_module` would (the kit's loader offers no code
object; the client modules use no relative imports). No model hub: HF_HUB_OFFLINE=1.
"""

import os
import runpy
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the tokenizer is a local directory
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
    print(f"[run_bench_client] python -m {module} {' '.join(args)}", flush=True)
    sys.argv = [path, *args]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise
