"""A forge-like process for lifecycle tests: launches an engine, prints `READY <pid>`, then
waits for a signal. Usage: driver.py hf MODEL_DIR LOGDIR | driver.py sglang FAKE_SERVER LOGDIR"""

import sys
import time

from infer_forge.harness.engines import engine_for

kind, target, logs = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "hf":
    config, model = {"device": "cpu", "dtype": "float32"}, target
else:
    config = {"version": "0.5.23", "launcher": [sys.executable, target]}
    model = "Qwen/Qwen3-8B"
with engine_for(kind).launch(config, model=model, logs=logs) as running:
    print(f"READY {running.pid}", flush=True)
    while True:
        running.check()
        time.sleep(0.1)
