"""Render `/metrics` pages with a released SGLang's own collector classes (run under the kit:
`sglang_release.run(version, this_file, CASE ...)`; prints `{case: [page, ...] | reason}` as
JSON).

How the real server makes its page, done the same way here:
- SGLang serves `/metrics` in prometheus_client's multiprocess mode: each scheduler rank (one
  process per TP/DP rank) and the tokenizer manager write their values to
  `$PROMETHEUS_MULTIPROC_DIR`, and the HTTP server renders them with
  `MultiProcessCollector` + `generate_latest`. Here each rank is a forked process that builds
  the release's `SchedulerMetricsCollector` with the labels its scheduler gives it
  (`model_name`, `engine_type`, `tp_rank`, `pp_rank`, `dp_rank`, `moe_ep_rank`, `priority`,
  whatever the release has: read from the scheduler's code, or through the release's own
  `init_new` after publishing its runtime context the way `run_scheduler_process` does) and
  calls its `log_stats` with a `SchedulerStats` holding the case's values. The tokenizer
  process builds the release's `TokenizerMetricsCollector` and observes the case's
  latencies into its TTFT / TPOT histograms and token counters (found by family name).
- A case may have several steps (scrapes); each step is rendered from its own directory.
- The page is canonicalised so that it can be compared: families sorted by name, samples
  sorted within a family, and the `pid` label of `all`-mode gauges replaced by the rank's
  index (a real pid changes every run).

A case's field that the release's `SchedulerStats` lacks is skipped; a case whose key metric
the release lacks is answered with the reason instead of pages.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import re
import sys
import tempfile

BASE = tempfile.mkdtemp(prefix="sglang-golden-")
os.environ["PROMETHEUS_MULTIPROC_DIR"] = BASE  # before prometheus_client is imported

MODEL = "golden-model"
TTFT_S = [0.08, 0.12, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6]
TPOT_S = [0.012, 0.014, 0.015, 0.016, 0.018, 0.02, 0.021, 0.022, 0.025, 0.03]
# Per-token gaps: mostly the requests' TPOT, with the stalls a prefill puts into running
# decodes (their p99 is far above any request's mean TPOT).
ITL_S = TPOT_S * 9 + [0.2, 0.22, 0.25, 0.3, 0.18, 0.21, 0.24, 0.19, 0.26, 0.23]
HEALTHY = {"num_running_reqs": 8, "num_queue_reqs": 0, "token_usage": 0.3,
           "num_used_tokens": 30000, "gen_throughput": 1500.0, "cache_hit_rate": 0.45}


def _ranks(n: int, **per_rank: list) -> list[dict]:
    return [{**HEALTHY, **{k: v[i] for k, v in per_rank.items()}} for i in range(n)]


# case -> {"dp": ranks (attention DP) or 1, "steps": [[stats per rank], ...], options}
CASES: dict[str, dict] = {
    "healthy": {"dp": 1, "steps": [_ranks(1), _ranks(1)]},
    "dp4_decode": {"dp": 4, "steps": [_ranks(4), _ranks(4)]},
    "priority": {"dp": 1, "priority": True, "needs": "priority",
                 "steps": [[{**HEALTHY, "by_priority": {"num_running_reqs": {0: 5, 10: 3},
                                                        "num_queue_reqs": {0: 0, 10: 0}}}]]},
    "queue_growing": {"dp": 1, "steps": [
        [{**HEALTHY, "num_running_reqs": 64, "num_queue_reqs": q, "token_usage": 0.9}]
        for q in (4, 15, 31)]},
    "kv_full": {"dp": 1, "steps": [
        [{**HEALTHY, "num_running_reqs": 40, "num_queue_reqs": 12, "token_usage": u}]
        for u in (0.99, 1.0)]},
    "retracting": {"dp": 1, "needs": ("num_retracted_reqs", "total_retracted_reqs"),
                   "steps": [[{**HEALTHY, "token_usage": 0.97, "num_retracted_reqs": 6,
                               "total_retracted_reqs": 6}]]},
    "dp4_imbalance": {"dp": 4, "steps": [
        _ranks(4, num_running_reqs=[48, 3, 2, 3], token_usage=[0.93, 0.08, 0.06, 0.07])] * 2},
    "spec_healthy": {"dp": 1, "needs": "spec_accept_length", "steps": [
        [{**HEALTHY, "spec_accept_length": 3.2, "spec_accept_rate": 0.74}]] * 2},
    "spec_collapse": {"dp": 1, "needs": "spec_accept_length", "steps": [
        [{**HEALTHY, "spec_accept_length": 1.05, "spec_accept_rate": 0.02}]] * 2},
    "eplb_healthy": {"dp": 1, "needs": "eplb_balancedness", "steps": [
        [{**HEALTHY, "eplb": [0.91, 0.88, 0.93] * (k + 1)}] for k in range(2)]},
    "eplb_imbalance": {"dp": 1, "needs": "eplb_balancedness", "steps": [
        [{**HEALTHY, "eplb": [0.41, 0.38, 0.45] * (k + 1)}] for k in range(2)]},
    "pd_transfer_failed": {"dp": 1, "needs": "num_transfer_failed_reqs", "pd": "decode",
                           "steps": [[{**HEALTHY, "transfer_failed": n}] for n in (1, 4)]},
}


def _collector_module():
    for name in ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise SystemExit("no metrics collector module in this release")


def _model_dir() -> str:
    """A local model directory (a config only) for ServerArgs: nothing is fetched."""
    d = os.path.join(BASE, "..", os.path.basename(BASE) + "-model")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                   "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 256,
                   "max_position_embeddings": 2048, "torch_dtype": "float32"}, f)
    return d


@functools.cache
def _server_args(dp: int, priority: bool, pd: str | None, eplb: bool = False):
    """The ServerArgs of a server started with the case's flags (the release's own parser;
    made once in the parent, before the forks, which each get their copy)."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    known = set(parser._option_string_actions)
    argv = ["--model-path", _model_dir(), "--served-model-name", MODEL, "--enable-metrics",
            "--device", "cpu"]  # a GPU server's labels; the device is only not probed here
    if dp > 1:  # --attn-dp-size from 0.5.22 (--enable-dp-attention deprecated there)
        argv += ["--tp-size", str(dp)] + (["--attn-dp-size", str(dp)]
                                          if "--attn-dp-size" in known else
                                          ["--dp-size", str(dp), "--enable-dp-attention"])
    if priority:
        argv.append("--enable-priority-scheduling")
    if pd:
        argv += ["--disaggregation-mode", pd]
    if eplb and "--expert-balancedness-report-mode" in known:  # 0.5.21+; before: an env var
        argv += ["--expert-balancedness-report-mode", "prometheus"]
    sa = ServerArgs.from_cli_args(parser.parse_args(argv))
    if hasattr(sa, "resolve_once"):  # 0.5.21+: what publish() does first; once, here
        sa.resolve_once()
    return sa


def _case_args(case: dict):
    return _server_args(case["dp"], case.get("priority", False), case.get("pd"),
                        "eplb" in case["steps"][0][0])


def _stats(mod, values: dict):
    stats = mod.SchedulerStats()
    by_priority = values.get("by_priority", {})
    for k, v in values.items():
        if k in ("by_priority", "transfer_failed", "eplb") or not hasattr(stats, k):
            continue
        cur = getattr(stats, k)
        if type(cur).__name__ == "QueueCount":
            v = type(cur)(total=v, by_priority=by_priority.get(k))
        setattr(stats, k, v)
    if hasattr(stats, "full_token_usage") and "full_token_usage" not in values:
        stats.full_token_usage = values.get("token_usage", 0.0)  # token_usage = max(pools)
    return stats


def _scheduler(mod, case: dict, rank: int):
    """The rank's collector, built the way the release's scheduler builds it."""
    cls = mod.SchedulerMetricsCollector
    dp = case["dp"]
    init_new = getattr(cls, "init_new", None)
    params = inspect.signature(init_new).parameters if init_new else {}
    if "enable_priority_scheduling" in params:  # 0.5.13+: the scheduler's own factory
        sa = _case_args(case)
        # The DP controller's placement with attention DP over the whole TP group
        # (attn_tp_size = tp / dp = 1): scheduler `rank` is attention-DP rank `rank`.
        dp_rank = rank if dp > 1 else None
        kw = {"server_args": sa, "enable_priority_scheduling": case.get("priority", False),
              "enable_lora": False, "enable_hierarchical_cache": False}
        if "ps" in params:  # 0.5.13-0.5.20: the scheduler's parallel state, passed in
            from types import SimpleNamespace

            kw.update(ps=SimpleNamespace(attn_tp_rank=0, attn_cp_rank=0, moe_ep_rank=0),
                      tp_rank=rank, pp_rank=0, dp_rank=dp_rank)
        else:  # 0.5.21+: published the way run_scheduler_process does
            _publish(sa, "scheduler", rank, dp_rank)
        return init_new(**kw).collector
    params = inspect.signature(cls.__init__).parameters
    labels: dict = {"model_name": MODEL}
    if "server_args" in params or len(params) > 2 or _mixin_has_ranks():
        engine = case.get("pd") or "unified"
        labels.update(engine_type=engine, tp_rank=rank, pp_rank=0)
        if dp > 1:
            labels["dp_rank"] = rank
    if "server_args" in params:
        return cls(labels=labels, server_args=_case_args(case))
    return cls(labels=labels)


def _publish(sa, role: str, rank: int | None = None, dp_rank: int | None = None) -> bool:
    """Publish the process's runtime context (0.5.21+), as the release's launcher does."""
    try:
        rc = importlib.import_module("sglang.srt.runtime_context")
    except ImportError:
        return False
    ranks = None
    if rank is not None:
        ranks = rc.SpawnRanks(world_rank=rc.spawn_world_rank(sa, tp_rank=rank, pp_rank=0),
                              dp_rank=dp_rank)
    rc.publish(sa, role=role, ranks=ranks)
    return True


@functools.cache
def _mixin_has_ranks() -> bool:
    """0.5.x's scheduler_metrics_mixin labels every rank; 0.4.0's scheduler only the model
    (its source read, not imported: importing it pulls in the whole scheduler)."""
    import importlib.util

    spec = importlib.util.find_spec("sglang.srt.managers.scheduler_metrics_mixin")
    if spec is None or not spec.origin:
        return False
    with open(spec.origin) as f:
        return '"tp_rank": tp_rank' in f.read()


def _family(collector, family: str):
    for v in vars(collector).values():
        if getattr(v, "_name", None) in (f"sglang:{family}", f"sglang:{family}".removesuffix(
                "_total")):
            return v
    return None


EXTRA_LABELS = {"is_streaming": "true"}  # a family's own labels beyond the collector's


def _labels(metric, base: dict) -> dict:
    return {n: base.get(n, EXTRA_LABELS.get(n, "")) for n in metric._labelnames}


def _tokenizer(mod, case: dict, step: int) -> None:
    cls = mod.TokenizerMetricsCollector
    params = inspect.signature(cls.__init__).parameters
    labels = {"model_name": MODEL}
    kw: dict = {}
    if "server_args" in params:
        sa = _case_args(case)
        kw["server_args"] = sa
        if _publish(sa, "tokenizer") and hasattr(mod, "tokenizer_metric_labels"):
            labels = mod.tokenizer_metric_labels()
    col = cls(labels=labels, **kw)
    for fam, values in (("time_to_first_token_seconds", TTFT_S),
                        ("time_per_output_token_seconds", TPOT_S),
                        ("request_time_per_output_token_seconds", TPOT_S),
                        ("inter_token_latency_seconds", ITL_S),
                        ("e2e_request_latency_seconds", [t * 40 for t in TTFT_S])):
        h = _family(col, fam)
        for v in values * (step + 1) if h is not None else ():  # cumulative over steps
            h.labels(**_labels(h, col.labels)).observe(v)
    for fam, n in (("prompt_tokens_total", 40000), ("generation_tokens_total", 12000),
                   ("num_requests_total", 10), ("num_aborted_requests_total", 1)):
        c = _family(col, fam)
        if c is not None:
            c.labels(**_labels(c, col.labels)).inc(n * (step + 1))


def _rank(mod, case: dict, rank: int, values: dict, out: str) -> None:
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = out
    if "eplb" in values:  # 0.5.7-0.5.20 switch the summary on with this variable
        os.environ["SGLANG_ENABLE_EPLB_BALANCEDNESS_METRIC"] = "1"
    col = _scheduler(mod, case, rank)
    for b in values.get("eplb", ()):
        col.increment_eplb_balancedness(forward_mode="decode", balancedness=b)
    col.log_stats(_stats(mod, values))
    for _ in range(values.get("transfer_failed", 0)):
        col.increment_transfer_failed_reqs()


def _fork(target, *args) -> None:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            target(*args)
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{args[1] if len(args) > 1 else ''}: a collector process failed")


def canonical(text: str, pids: dict[str, int]) -> str:
    """Families sorted by name, samples sorted, pids replaced by rank indices."""
    blocks: dict[str, list[str]] = {}
    order: list[str] = []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            blocks[name] = [line]
            order.append(name)
        elif line.strip():
            blocks[order[-1]].append(line)
    out = []
    for name in sorted(order):
        head = [ln for ln in blocks[name] if ln.startswith("#")]
        body = [re.sub(r'pid="(\d+)"', lambda m: f'pid="{pids.get(m.group(1), "?")}"', ln)
                for ln in blocks[name] if not ln.startswith("#")]
        out.extend(head + sorted(body, key=_sample_order))
    return "\n".join(out) + "\n"


def _sample_order(line: str) -> tuple:
    le = re.search(r'le="([^"]+)"', line)
    return (line.split("{", 1)[0], re.sub(r'le="[^"]+",?', "", line.rsplit(" ", 1)[0]),
            float(le.group(1)) if le else 0.0)


def render(mod, name: str) -> list[str] | str:
    case = CASES[name]
    need = case.get("needs")
    src = inspect.getsource(mod)
    if need == "priority":
        if "by_priority" not in src:
            return "no per-priority series in this release"
    elif need:
        alts = (need,) if isinstance(need, str) else need
        if not any(f'"sglang:{n}' in src for n in alts):
            return f"no sglang:{' or sglang:'.join(alts)} in this release"
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    if "server_args" in inspect.signature(mod.TokenizerMetricsCollector.__init__).parameters:
        _case_args(case)  # once, here, not in every forked process
    _mixin_has_ranks()
    pages = []
    for k, ranks in enumerate(case["steps"]):
        out = os.path.join(BASE, f"{name}-{k}")
        os.makedirs(out)
        pids: dict[str, int] = {}
        for rank, values in enumerate(ranks):
            before = set(os.listdir(out))
            _fork(_rank, mod, case, rank, values, out)
            for f in set(os.listdir(out)) - before:
                pids[f.rsplit("_", 1)[-1].removesuffix(".db")] = rank
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = out
        _fork(_tokenizer, mod, case, k)
        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg, path=out)
        pages.append(canonical(generate_latest(reg).decode(), pids))
    return pages


def main(names: list[str]) -> None:
    mod = _collector_module()
    import prometheus_client  # noqa: F401  (once, before the forks)

    print(json.dumps({n: render(mod, n) for n in (names or sorted(CASES))}))


if __name__ == "__main__":
    main(sys.argv[1:])
