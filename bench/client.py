"""Bench client benchmarks: client overhead against a peer, and timing precision.

1. Overhead: against the instant scripted server (a separate process; the whole response is
   written at once, so the server costs little), our client's sustained requests/s and
   streamed tokens/s, and in the same run the same figures for NVIDIA AIPerf installed from
   PyPI in its own venv (same request count, concurrency, output tokens, server-reported
   token counts). Runs alternate ours/peer `--repeats` times; medians are compared.
2. Precision: against the scripted server with first token after D ms and a token every I ms,
   the error of TTFT, TPOT and ITL at concurrency 1 and 64 against the times the server
   actually wrote each token (`/forge/timeline`) and against the script, next to the
   server's own lateness (`/forge/stats`). Goal: every mean and p99 |error| against the
   server within 1 ms + 2 % of the truth; printed as PASS/FAIL with the load average. Each
   level runs with kernel receive timestamps (the client's default since issue 16) and, in
   the same run, with the time each read returned (the client before).

Run: .venv/bin/python bench/client.py [--quick] [--peer-bin /tmp/peer-venv/bin/aiperf]
Peer venv: python3.11 -m venv /tmp/peer-venv && /tmp/peer-venv/bin/pip install aiperf
The last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from pathlib import Path

from infer_forge.harness.bench import sse_client
from infer_forge.harness.bench.client import run_bench
from infer_forge.harness.bench.datasets import (
    Prompt,
    load_tokenizer,
    random_prompts,
    small_bpe_tokenizer,
)
from infer_forge.harness.bench.request import BenchConfig, parse_workers

REPO = Path(__file__).resolve().parent.parent


def make_tokenizer(out: Path) -> Path:
    """The same small byte-level BPE the tests use."""
    return small_bpe_tokenizer(out)


class Server:
    def __init__(self, *args: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "infer_forge.harness.testing.scripted_server", "--port", "0",
             *args],
            stdout=subprocess.PIPE, text=True, cwd=str(REPO))
        line = self.proc.stdout.readline()
        if not line.startswith("listening on "):
            raise SystemExit(f"scripted server did not start: {line!r}")
        self.url = line.split()[-1]

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            return json.loads(r.read())

    def reset(self) -> None:
        req = urllib.request.Request(self.url + "/forge/reset", data=b"", method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def ours(url: str, prompts: list[Prompt], concurrency: int, transport: str = "auto",
         workers: int | str = "auto") -> dict:
    cpu0 = time.process_time()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)  # worker processes, when any
    res = run_bench(BenchConfig(url=url, model="scripted", engine="scripted",
                                max_concurrency=concurrency, warmup=1, transport=transport,
                                workers=workers), prompts)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - cpu0 + (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    m = res.metrics
    assert m["failed"] == 0, [r.error for r in res.records if not r.success][:3]
    return {"req_s": m["request_throughput"], "tok_s": m["output_throughput"],
            "completed": m["completed"], "duration_s": m["duration"],
            "cpu_ms_per_req": cpu * 1000 / len(prompts)}


def aiperf(bin_path: str, url: str, tok_dir: Path, n: int, concurrency: int, isl: int,
           osl: int, out_dir: Path) -> dict:
    cmd = [bin_path, "profile", "--model", "scripted", "--url", url,
           "--endpoint-type", "completions", "--streaming", "--concurrency", str(concurrency),
           "--request-count", str(n), "--prompt-input-tokens-mean", str(isl),
           "--prompt-output-tokens-mean", str(osl), "--tokenizer", str(tok_dir),
           "--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry",
           "--artifact-dir", str(out_dir), "--warmup-request-count", "1",
           "--use-server-token-count"]
    out_dir.mkdir(parents=True, exist_ok=True)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=str(out_dir))
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    report = out_dir / "profile_export_aiperf.json"
    if p.returncode != 0 or not report.exists():
        tail = " ".join((p.stderr or p.stdout).split()[-40:])
        raise RuntimeError(f"aiperf exited {p.returncode}: {tail}")
    d = json.loads(report.read_text())
    return {"req_s": d["request_throughput"]["avg"], "tok_s": d["output_token_throughput"]["avg"],
            "completed": d["request_count"]["avg"], "duration_s": d["benchmark_duration"]["avg"],
            # all its processes, start-up and dataset generation included
            "cpu_ms_per_req": cpu * 1000 / n, "command": " ".join(cmd[1:])}


def overhead(a, tok_dir: Path, tmp: Path) -> dict:
    tok = load_tokenizer(tok_dir)
    prompts = random_prompts(tok, a.requests, a.input_len, a.output_len, 1.0, seed=1)
    server = Server()
    runs: dict[str, list[dict]] = {"ours": [], "ours_aiohttp": [], "aiperf": []}
    peer_error = None
    peer = a.peer_bin if a.peer_bin and Path(a.peer_bin).exists() else shutil.which("aiperf")
    if not peer:
        peer_error = f"aiperf not found (looked for {a.peer_bin})"
    try:
        for i in range(a.repeats):
            runs["ours"].append(ours(server.url, prompts, a.concurrency, workers=a.workers))
            print(f"  ours   run {i + 1}: {runs['ours'][-1]['req_s']:9.1f} req/s "
                  f"{runs['ours'][-1]['tok_s']:10.1f} tok/s "
                  f"{runs['ours'][-1]['cpu_ms_per_req']:.2f} CPU-ms/req  "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
            runs["ours_aiohttp"].append(ours(server.url, prompts, a.concurrency, "aiohttp"))
            print(f"  ours (aiohttp transport) run {i + 1}: "
                  f"{runs['ours_aiohttp'][-1]['req_s']:9.1f} req/s "
                  f"{runs['ours_aiohttp'][-1]['tok_s']:10.1f} tok/s "
                  f"{runs['ours_aiohttp'][-1]['cpu_ms_per_req']:.2f} CPU-ms/req  "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
            if peer and peer_error is None:
                try:
                    r = aiperf(peer, server.url, tok_dir, a.requests, a.concurrency,
                               a.input_len, a.output_len, tmp / f"aiperf-{i}")
                    runs["aiperf"].append(r)
                    print(f"  aiperf run {i + 1}: {r['req_s']:9.1f} req/s "
                          f"{r['tok_s']:10.1f} tok/s {r['cpu_ms_per_req']:.2f} CPU-ms/req  "
                          f"load {os.getloadavg()[0]:.2f}", flush=True)
                except (RuntimeError, subprocess.TimeoutExpired, KeyError) as e:
                    peer_error = " ".join(str(e).split())[:400]
    finally:
        server.close()

    def med(rs, k):
        return statistics.median(r[k] for r in rs) if rs else None

    out = {"requests": a.requests, "concurrency": a.concurrency, "input_len": a.input_len,
           "output_len": a.output_len, "repeats": a.repeats,
           "ours_req_s": med(runs["ours"], "req_s"), "ours_tok_s": med(runs["ours"], "tok_s"),
           "ours_cpu_ms_per_req": med(runs["ours"], "cpu_ms_per_req"),
           "ours_aiohttp_req_s": med(runs["ours_aiohttp"], "req_s"),
           "ours_aiohttp_tok_s": med(runs["ours_aiohttp"], "tok_s"),
           "ours_aiohttp_cpu_ms_per_req": med(runs["ours_aiohttp"], "cpu_ms_per_req"),
           "aiperf_cpu_ms_per_req": med(runs["aiperf"], "cpu_ms_per_req"),
           "aiperf_req_s": med(runs["aiperf"], "req_s"),
           "aiperf_tok_s": med(runs["aiperf"], "tok_s"), "peer_error": peer_error,
           "aiperf_command": runs["aiperf"][0]["command"] if runs["aiperf"] else None}
    if out["aiperf_req_s"]:
        out["ratio_req_s"] = out["ours_req_s"] / out["aiperf_req_s"]
        out["ratio_tok_s"] = out["ours_tok_s"] / out["aiperf_tok_s"]
    return out


def _summary(errs: list[float], truth: float) -> dict:
    abs_sorted = sorted(abs(e) for e in errs)
    p99 = abs_sorted[min(len(abs_sorted) - 1, int(0.99 * len(abs_sorted)))]
    mean = statistics.fmean(errs)
    tol = 1 + 0.02 * truth
    return {"mean_err_ms": mean, "median_err_ms": statistics.median(errs),
            "p99_abs_err_ms": p99, "tolerance_ms": tol, "mean_within_goal": abs(mean) <= tol,
            "p99_within_goal": p99 <= tol}


def _level(server: Server, conc: int, n: int, d_ms: float, i_ms: float, n_tok: int,
           stamps: bool, workers: int | str = "auto") -> dict:
    """One precision run at concurrency `conc`: the client's errors against the script and
    against what the server actually did. `stamps`: kernel receive times (the default) or,
    for comparison, the time each read returned."""
    prompts = [Prompt(f"precision prompt {k}", 3, n_tok) for k in range(n)]
    server.reset()
    sse_client.KERNEL_STAMPS = stamps
    try:
        # Warmup = concurrency: every connection is open before the clock runs, so the
        # figures are steady-state (a cold start adds TCP connects to the first TTFTs).
        res = run_bench(BenchConfig(url=server.url, model="scripted", engine="scripted",
                                    max_concurrency=conc, warmup=conc, workers=workers),
                        prompts)
    finally:
        sse_client.KERNEL_STAMPS = True
    load = os.getloadavg()[0]
    stats = server.get("/forge/stats")  # (its lateness includes the warmup's writes)
    timeline = server.get("/forge/timeline")
    recs = [r for r in res.records if r.success]
    assert len(recs) == n, [r.error for r in res.records if not r.success][:3]
    vs_script: dict[str, list[float]] = {"ttft": [], "tpot": [], "itl": []}
    vs_server: dict[str, list[float]] = {"ttft": [], "tpot": [], "itl": []}
    for p, r in zip(prompts, res.records, strict=True):
        w = timeline[str(zlib.crc32(p.prompt.encode()))]["writes"]
        tpot = (r.e2e - r.ttft) / (r.output_len - 1)
        vs_script["ttft"].append(r.ttft * 1000 - d_ms)
        vs_script["tpot"].append(tpot * 1000 - i_ms)
        vs_script["itl"] += [g * 1000 - i_ms for g in r.itl]
        vs_server["ttft"].append((r.ttft - (w[0] - r.start_time)) * 1000)
        vs_server["tpot"].append((tpot - (w[-1] - w[0]) / (len(w) - 1)) * 1000)
        vs_server["itl"] += [(g - (b - a_)) * 1000
                             for g, a_, b in zip(r.itl, w[:-1], w[1:], strict=True)]
    truth = {"ttft": d_ms, "tpot": i_ms, "itl": i_ms}
    vs = {k: _summary(v, truth[k]) for k, v in vs_server.items()}
    # Gaps of exactly 0: tokens the server wrote apart that arrived in one read (the client
    # was late by more than a gap) — where a kernel-stamped client's error comes from.
    shared = sum(1 for r in res.records for g in r.itl if g == 0.0)
    return {"concurrency": conc, "requests": n, "stamps": "kernel" if stamps else "read",
            "workers_used": res.config["workers_used"],
            "gaps": len(vs_server["itl"]), "gaps_in_one_read": shared,
            "load_avg_1m": load,
            "passed": all(v["mean_within_goal"] and v["p99_within_goal"] for v in vs.values()),
            "vs_server_actual": vs,
            "vs_script": {k: _summary(v, truth[k]) for k, v in vs_script.items()},
            "server_late_ms": {k: stats[k] for k in
                               ("mean_late_ms", "p50_late_ms", "p99_late_ms")}}


def _print_level(lv: dict) -> None:
    vs = lv["vs_server_actual"]
    parts = [f"{k.upper()} {v['mean_err_ms']:+.3f}/{v['p99_abs_err_ms']:.3f} "
             f"(goal {v['tolerance_ms']:.1f})" for k, v in vs.items()]
    failed = [f"{k.upper()} {w}" for k, v in vs.items() for w, ok in
              (("mean", v["mean_within_goal"]), ("p99", v["p99_within_goal"])) if not ok]
    verdict = "PASS" if lv["passed"] else "FAIL: " + ", ".join(failed)
    w = f"w={lv['workers_used']} " if lv["workers_used"] > 1 else ""
    print(f"  c={lv['concurrency']:<3} {w}{lv['stamps']:<6} vs server mean/p99|err| ms: "
          + "; ".join(parts) + f"  {verdict}  load {lv['load_avg_1m']:.2f}; "
          f"{lv['gaps_in_one_read']}/{lv['gaps']} gaps in one read", flush=True)
    sc = lv["vs_script"]
    print(f"  {'':5} {'':6} vs script: " + "; ".join(
        f"{k.upper()} {v['mean_err_ms']:+.3f}/{v['p99_abs_err_ms']:.3f}" for k, v in sc.items())
        + f"; server late mean {lv['server_late_ms']['mean_late_ms']:.3f} "
          f"p99 {lv['server_late_ms']['p99_late_ms']:.3f}", flush=True)


def precision(a) -> dict:
    """Errors of the client's TTFT/TPOT/ITL against (a) the script and (b) what the server
    actually did (its write times, same monotonic clock): (a) = server lateness + (b).
    Per level, with kernel receive times (the client's default) and, in the same run, with
    the time each read returned (what the client did before issue 16)."""
    d_ms, i_ms, n_tok = a.first_token_ms, a.itl_ms, a.tokens
    server = Server("--first-token-ms", str(d_ms), "--itl-ms", str(i_ms), "--tokens", str(n_tok),
                    "--record-timeline")
    out: dict = {"first_token_ms": d_ms, "itl_ms": i_ms, "tokens": n_tok,
                 "goal": "every TTFT/TPOT/ITL mean and p99 |error| vs the server's actual "
                         "writes within 1 ms + 2 % of the truth", "levels": []}
    counts = {1: a.precision_requests_c1, 64: a.precision_requests_c64}
    try:
        for conc in a.levels:
            n = counts.get(conc, 4 * conc)
            for stamps in (True, False) if a.compare_read_time else (True,):
                lv = _level(server, conc, n, d_ms, i_ms, n_tok, stamps, a.workers)
                out["levels"].append(lv)
                _print_level(lv)
    finally:
        server.close()
    kernel = [lv for lv in out["levels"] if lv["stamps"] == "kernel"]
    out["passed"] = all(lv["passed"] for lv in kernel)
    print(f"  goal (kernel stamps, every level): {'PASS' if out['passed'] else 'FAIL'}",
          flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peer-bin", default="/tmp/peer-venv/bin/aiperf")
    ap.add_argument("--first-token-ms", type=float, default=100.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--precision-requests-c1", type=int, default=30)
    ap.add_argument("--precision-requests-c64", type=int, default=256)
    ap.add_argument("--levels", default="1,64",
                    help="concurrency levels for precision (others: 4 × concurrency requests)")
    ap.add_argument("--workers", default="auto",
                    help="our client's worker processes: auto (1 here for c ≤ 64) or N")
    ap.add_argument("--no-compare-read-time", dest="compare_read_time", action="store_false",
                    help="skip the same-run comparison with read-return timestamps")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--skip-precision", action="store_true")
    a = ap.parse_args()
    a.levels = [int(x) for x in a.levels.split(",") if x.strip()]
    a.workers = parse_workers(a.workers)
    if a.quick:
        a.requests, a.repeats = 400, 1
        a.precision_requests_c1, a.precision_requests_c64 = 10, 128
    summary: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        tok_dir = make_tokenizer(tmp / "tok")
        if not a.skip_overhead:
            print("client overhead (instant server):", flush=True)
            summary["overhead"] = overhead(a, tok_dir, tmp)
            o = summary["overhead"]
            if o.get("ratio_req_s"):
                print(f"  ratio ours/aiperf: {o['ratio_req_s']:.2f}x req/s, "
                      f"{o['ratio_tok_s']:.2f}x tok/s  (goal ≥ 1: "
                      f"{'PASS' if o['ratio_req_s'] >= 1 else 'FAIL'})", flush=True)
            else:
                print(f"  peer: {o['peer_error']}")
        if not a.skip_precision:
            print(f"timing precision (D={a.first_token_ms} ms, I={a.itl_ms} ms):", flush=True)
            summary["precision"] = precision(a)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
