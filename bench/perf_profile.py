"""Profile overhead on throughput (`forge perf capture`, issue 15 item 1).

Against one real `transformers serve` on the generated tiny-llama (cpu, float32, sdpa), the
same load round (closed loop: `--concurrency`, `--requests` prompts of `--input-len` tokens,
`--output-len` output tokens) runs in three interleaved arms, `--repeats` times each:
- plain: no profiler anywhere;
- not capturing: the capture set up (a PySpyCapture built for the server's pid, nothing
  attached: forge attaches nothing and enables nothing outside a capture window, so this is
  the "hooks present, not capturing" arm, and its ratio to plain is the run's noise);
- capturing: py-spy attached for the round (`--rate` Hz, non-blocking), as
  `forge perf capture --engine hf` runs it.
Output throughput (tokens/s) medians per arm; ratios to plain. Goal: not capturing within
5 % of plain. On a shared host throughput swings with the neighbours' load, so the run also
reports figures that contention moves less: the server's own CPU seconds per 1000 output
tokens per arm (from /proc), and py-spy's CPU seconds per second of capture (its rusage once
reaped) — on a dedicated host the capture's cost is about that share of one core.
The last line printed is a JSON summary.

Run: .venv/bin/python bench/perf_profile.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
from pathlib import Path

from infer_forge.harness.bench.client import bench_command
from infer_forge.harness.engines.hf import HFEngine, process_metrics
from infer_forge.harness.models.weights import fetch_model
from infer_forge.harness.perf.capture import PySpyCapture, run_window


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--rate", type=int, default=100)
    a = ap.parse_args()
    repeats = 2 if a.quick else a.repeats
    with tempfile.TemporaryDirectory(prefix="forge-perf-bench-") as tmp:
        model = fetch_model(Path(tmp) / "home", "tiny-llama").path
        running = HFEngine().launch({"device": "cpu", "dtype": "float32",
                                     "attn_implementation": "sdpa"}, model=model,
                                    logs=Path(tmp) / "logs")
        with running:
            assert running.pid is not None

            pid = running.pid
            cpu_per_ktok: dict[str, list[float]] = {"plain": [], "not_capturing": [],
                                                    "capturing": []}

            def one_round(first: bool = False, arm: str | None = None) -> dict:
                cpu0 = process_metrics(pid)["process_cpu_seconds"]
                m = bench_command(url=running.base_url, model=running.model,
                                  tokenizer_dir=str(model), num_prompts=a.requests,
                                  input_len=a.input_len, output_len=a.output_len,
                                  max_concurrency=a.concurrency, warmup=1,
                                  engine="hf")["metrics"]
                cpu = process_metrics(pid)["process_cpu_seconds"] - cpu0
                if arm is not None:
                    cpu_per_ktok[arm].append(cpu / m["total_output_tokens"] * 1000)
                return m

            for _ in range(3):  # warm the server (first rounds pay lazy initialisation)
                one_round()
            arms: dict[str, list[float]] = {"plain": [], "not_capturing": [], "capturing": []}
            samples: list[int] = []
            spy_cpu_per_s: list[float] = []
            names = list(arms)
            for r in range(repeats):
                # The arms' order rotates each repeat, so a drift in the neighbours' load
                # or a lingering effect of one arm does not always land on the same one.
                for arm in names[r % 3:] + names[:r % 3]:
                    if arm == "plain":
                        arms[arm].append(one_round(arm=arm)["output_throughput"])
                    elif arm == "not_capturing":
                        idle = PySpyCapture(pid, Path(tmp), rate_hz=a.rate)  # built, unused
                        arms[arm].append(one_round(arm=arm)["output_throughput"])
                        assert idle.proc is None
                    else:
                        work = Path(tmp) / f"cap{r}"
                        work.mkdir()
                        cap = PySpyCapture(pid, work, rate_hz=a.rate)
                        ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                        bench, files = run_window(cap, duration_s=0.0,
                                                  round_fn=lambda f: one_round(f, "capturing"))
                        ch = resource.getrusage(resource.RUSAGE_CHILDREN)
                        spy_cpu_per_s.append((ch.ru_utime + ch.ru_stime - ch0.ru_utime
                                              - ch0.ru_stime) / bench["window_s"])
                        arms[arm].append(bench["output_throughput"])
                        samples.append(sum(int(line.rsplit(" ", 1)[1]) for line in
                                           files[0][1].decode().splitlines() if line.strip()))
                print(f"repeat {r}: " + ", ".join(f"{k} {v[-1]:.1f} tok/s"
                                                  for k, v in arms.items()), flush=True)
    med = {k: statistics.median(v) for k, v in arms.items()}
    out = {"repeats": repeats, "concurrency": a.concurrency, "requests": a.requests,
           "input_len": a.input_len, "output_len": a.output_len, "rate_hz": a.rate,
           "median_output_throughput": med,
           "not_capturing_ratio": med["not_capturing"] / med["plain"],
           "capturing_ratio": med["capturing"] / med["plain"],
           "py_spy_samples_median": statistics.median(samples),
           "server_cpu_s_per_1k_tokens_median": {k: statistics.median(v)
                                                 for k, v in cpu_per_ktok.items()},
           "py_spy_cpu_s_per_s_median": statistics.median(spy_cpu_per_s),
           "goal_not_capturing_overhead_le_5pct": med["not_capturing"] / med["plain"] >= 0.95}
    cpk = out["server_cpu_s_per_1k_tokens_median"]
    print(f"not capturing / plain: {out['not_capturing_ratio']:.3f}; "
          f"capturing / plain: {out['capturing_ratio']:.3f} (throughput medians)")
    print("server CPU s per 1k output tokens: " + ", ".join(f"{k} {v:.2f}"
                                                             for k, v in cpk.items())
          + f"; py-spy CPU {out['py_spy_cpu_s_per_s_median']:.3f} s per s of capture")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
