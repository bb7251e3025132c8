"""The benchmark client: async, streaming, OpenAI-compatible; sglang.bench_serving's metrics.

Contracts:
- Transport: for `http://` URLs the lean asyncio client of `sse_client` (parses once per
  socket read, each read dated by the kernel's receive time on Linux); otherwise (or
  `transport="aiohttp"`) one `aiohttp` session, connection limit ≥ concurrency. Either way,
  each request POSTs `/v1/completions` (or `/v1/chat/completions`) with `stream: true`,
  `stream_options.include_usage`, `temperature: 0` (greedy) and `max_tokens` = the prompt's
  output length, plus the engine's extra body fields (`ENGINE_EXTRA_BODY`: `ignore_eos` only
  for sglang, since `transformers serve` answers 422 to it) and any `extra_body`.
- Timing as bench_serving: the clock (perf_counter) starts just before the POST (connection
  acquisition included); TTFT at the first chunk with non-empty text; ITL = gaps between
  consecutive non-empty chunks; E2E at the last SSE line. Chunks that arrive in one network
  read share one timestamp (they arrived together). output_len = the server's usage
  `completion_tokens`, else the requested max.
- Load: closed loop with `max_concurrency` (a semaphore) and/or open loop at `request_rate`
  requests/s with seeded Poisson arrivals (`inf` = all at t = 0). `warmup` requests (the first
  prompt, at most 32 output tokens, sent together) run first and are excluded; if every warmup
  request fails, `HarnessError` names the first error (a broken setup, not a measurement).
- Failures are data: a request that fails is a record with `success=False` and `error`.
- Workers (`workers`, see `workers.py`): a closed loop may spread its streams over worker
  processes, each with its own event loop; records come back with the same shape and order.
  `auto` = one per 64 streams, at most half the CPUs (1 on a 2-core machine); 1 = this
  process only. More than one needs a closed loop and no probe limits.
- `run_bench` returns a `BenchResult` (records, duration, `compute_metrics` output);
  `record_measurement` stores the records as a JSONL artifact and appends one
  `MeasurementRecorded` (to the task stream when a task is given, else `measurements`).
- Production (harness/guard/production.py): with a `BenchGuard` (the workspace whose
  forge.toml marks production endpoints, and who sends), a plan against a production URL is
  checked before anything is sent (warmup included in its request count): over the probe
  budget it is refused and recorded, never started. Within it, the run holds to the limits:
  request starts at least 1/max_rps apart (warmup too), no start past max_requests or
  max_duration_s from the first, and a request still running at that deadline is cut off
  (an error record). `bench_command` always checks when it has a workspace. The check is
  on the resolved address (`localhost`, `127.1`, a decimal IP are the endpoint they reach),
  both transports connect only to that address (addresses.resolve), and no redirect is
  followed.
- Data policy (harness/guard/data_policy.py): a run whose dataset or endpoint is of class
  production stores its per-request records (artifact, `--records-out`) with the generated
  text replaced by its length and sha256 (`BenchResult.scrub`).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from typing import Any

import orjson

from ...ledger import events as E
from ...ledger.ids import check_optional_id
from ...ledger.numbers import without_non_finite
from ...ledger.streams import MEASUREMENTS_STREAM, task_stream
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from ..guard import data_policy, production
from ..record import check_measurement_target, record_measurements
from .datasets import Prompt, build_prompts
from .metrics import RequestRecord, compute_metrics, numeric_metrics, parse_slo
from .request import (
    BenchConfig,
    freeze_gc,
    open_session,
    parse_workers,
    request_body,
    stream_request,
    thaw_gc,
)
from .sse_client import RawClient
from .workers import run_in_workers


@dataclass
class BenchResult:
    config: dict[str, Any]
    records: list[RequestRecord]
    warmup_records: list[RequestRecord]
    duration_s: float
    metrics: dict[str, Any]
    # Data policy: the records' texts are stored as lengths and digests only.
    scrub: bool = False

    def records_jsonl(self) -> bytes:
        rows = [r.to_dict() for r in self.warmup_records + self.records]
        if self.scrub:
            rows = data_policy.scrub(rows, data_policy.PRODUCTION)
        return b"".join(orjson.dumps(r) + b"\n" for r in rows)

    def summary(self) -> dict[str, Any]:
        return {"config": self.config, "metrics": self.metrics}


@dataclass(frozen=True)
class BenchGuard:
    """Who sends a run's traffic, for the production guard: the workspace whose forge.toml
    marks production endpoints (and that records refusals), the actor, the task (and its
    block) refusals name; `in_step` inside a loop step (see production.check)."""

    ws: Workspace
    actor: E.Actor = E.SYSTEM
    task_id: str | None = None
    block_id: str | None = None
    in_step: bool = False


def guarded(cfg: BenchConfig, n: int, guard: BenchGuard | None) -> BenchConfig:
    """`cfg` checked by the production guard for `n` requests plus its warmup: refused
    (ProductionRefusedError, recorded) over the probe budget; with the limits to hold to
    against a production endpoint; unchanged otherwise."""
    if guard is None:
        return cfg
    path = "/v1/chat/completions" if cfg.endpoint == "chat" else "/v1/completions"
    limits = production.check(
        guard.ws, cfg.url, f"POST {path}", rps=cfg.request_rate, requests=n + cfg.warmup,
        actor=guard.actor, task_id=guard.task_id, block_id=guard.block_id,
        in_step=guard.in_step)
    return cfg if limits is None else replace(cfg, probe=limits)


class Pacer:
    """Probe limits held while sending (see production.ProbeLimits): a start slot is taken
    before sleeping, so concurrent senders on the event loop get distinct slots; the gap
    holds on the clock too (`last`: the latest actual start), so a sender that woke late
    does not start nearer the next one than 1/max_rps."""

    def __init__(self, limits: production.ProbeLimits):
        self.gap = 1.0 / limits.max_rps if math.isfinite(limits.max_rps) else 0.0
        self.limits = limits
        self.next = 0.0
        self.last = -math.inf
        self.deadline: float | None = None
        self.started = 0

    async def slot(self) -> str | None:
        """Wait for the next start slot; None to go, else why the request is not sent."""
        now = time.perf_counter()
        if self.deadline is None:
            self.deadline, self.next = now + self.limits.max_duration_s, now
        if self.started >= self.limits.max_requests:
            return f"not sent: the probe budget's max_requests ({self.limits.max_requests})"
        at = max(now, self.next)
        if at >= self.deadline:
            return self._past_duration()
        self.next, self.started = at + self.gap, self.started + 1
        if at > now:
            await asyncio.sleep(at - now)
        # A late wake-up (a loaded machine) leaves less than the gap to the next slot: wait
        # it out against the last actual start, not only the slots' schedule.
        while (wait := self.last + self.gap - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        now = time.perf_counter()
        if now >= self.deadline:
            return self._past_duration()
        self.last = now
        return None

    def _past_duration(self) -> str:
        return (f"not sent: past the probe budget's max_duration_s "
                f"({self.limits.max_duration_s:g} s)")

    def remaining(self) -> float:
        return max(0.0, (self.deadline or 0.0) - time.perf_counter())


async def run_bench_async(cfg: BenchConfig, prompts: Sequence[Prompt], *,
                          guard: BenchGuard | None = None) -> BenchResult:
    cfg.validate()
    if not prompts:
        raise HarnessError("no prompts to send")
    cfg = guarded(cfg, len(prompts), guard)  # before anything is sent
    nw = cfg.worker_count(len(prompts))
    if nw > 1:
        if cfg.probe is not None:
            raise HarnessError(f"workers {cfg.workers} cannot hold a production endpoint's "
                               "probe limits (one process paces them): use workers 1")

        warm_w, records_w, duration_w = await run_in_workers(cfg, prompts, nw)
        return _result(cfg, records_w, warm_w, duration_w, nw)
    pacer = Pacer(cfg.probe) if cfg.probe is not None else None
    url = cfg.api_url()
    chat = cfg.endpoint == "chat"
    extra = cfg.body_extra()
    n = len(prompts)
    limit = max(cfg.max_concurrency or n, cfg.warmup, 1)
    raw = RawClient(url, cfg.timeout_s) if cfg.use_raw() else None
    session = None if raw else open_session(limit, cfg.timeout_s)

    async def post(payload: bytes, rec: RequestRecord) -> None:
        if raw is not None:
            await raw.request(payload, rec, chat)
        else:
            await stream_request(session, url, payload, rec, chat)

    async def send(payload: bytes, rec: RequestRecord) -> None:
        if pacer is None:
            await post(payload, rec)
            return
        why = await pacer.slot()
        if why is not None:
            rec.error = why
            return
        try:
            await asyncio.wait_for(post(payload, rec), pacer.remaining())
        except TimeoutError:
            rec.error = (f"cut off at the probe budget's max_duration_s "
                         f"({pacer.limits.max_duration_s:g} s)")

    frozen = False
    try:
        warm: list[RequestRecord] = []
        if cfg.warmup:
            p0 = prompts[0]
            wp = request_body(cfg, p0, min(p0.output_len, 32), extra)
            warm = [RequestRecord(prompt_len=p0.prompt_len, output_len=min(p0.output_len, 32),
                                  index=-1 - i, warmup=True) for i in range(cfg.warmup)]
            await asyncio.gather(*(send(wp, r) for r in warm))
            if not any(r.success for r in warm):
                raise HarnessError(f"warmup failed against {url}: {warm[0].error}")
        records = [RequestRecord(prompt_len=p.prompt_len, output_len=p.output_len, index=i)
                   for i, p in enumerate(prompts)]
        payloads = [request_body(cfg, p, p.output_len, extra) for p in prompts]
        frozen = freeze_gc()
        start = time.perf_counter()
        if math.isinf(cfg.request_rate) and cfg.max_concurrency:
            # Closed loop: `max_concurrency` workers pull requests in order (FIFO, as a
            # semaphore over all requests would, with fewer waiting tasks).
            it = iter(range(n))

            async def worker() -> None:
                for i in it:
                    await send(payloads[i], records[i])

            await asyncio.gather(*(worker() for _ in range(min(cfg.max_concurrency, n))))
        else:
            sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
            rng = random.Random(cfg.seed)

            async def limited(i: int) -> None:
                if sem is None:
                    await send(payloads[i], records[i])
                else:
                    async with sem:
                        await send(payloads[i], records[i])

            tasks = []
            for i in range(n):
                tasks.append(asyncio.create_task(limited(i)))
                if not math.isinf(cfg.request_rate) and i + 1 < n:
                    await asyncio.sleep(rng.expovariate(cfg.request_rate))
            await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    finally:
        thaw_gc(frozen)
        if raw is not None:
            raw.close()
        if session is not None:
            await session.close()
    return _result(cfg, records, warm, duration, 1)


def _result(cfg: BenchConfig, records: list[RequestRecord], warm: list[RequestRecord],
            duration: float, workers: int) -> BenchResult:
    metrics = compute_metrics(records, duration, cfg.slo)
    conf = asdict(cfg)
    conf["request_rate"] = "inf" if math.isinf(cfg.request_rate) else cfg.request_rate
    conf["num_prompts"] = len(records)
    conf["extra_body_sent"] = cfg.body_extra()
    conf["workers_used"] = workers
    return BenchResult(conf, records, warm, duration, metrics)


def run_bench(cfg: BenchConfig, prompts: Sequence[Prompt], *,
              guard: BenchGuard | None = None) -> BenchResult:
    """Run the benchmark to completion (see module contract)."""
    return asyncio.run(run_bench_async(cfg, prompts, guard=guard))


def _storable_meta(meta: dict[str, Any], omitted: dict[str, str]) -> dict[str, Any]:
    """The event's meta with NaN / infinite numbers (e.g. a config's infinite timeout)
    replaced by None, and every left-out number's reason under `omitted_metrics`."""
    meta, dropped = without_non_finite(meta, "meta")
    omitted = {**omitted, **dropped}
    return {**meta, "omitted_metrics": omitted} if omitted else meta


def record_measurement(ws: Workspace, result: BenchResult, *, task_id: str | None = None,
                       block_id: str | None = None, run_id: str | None = None,
                       source: str = "forge-bench", candidate: Mapping[str, Any] | None = None,
                       repeat: int | None = None, meta: Mapping[str, Any] | None = None,
                       actor: E.Actor | None = None):
    """Store the records artifact and append one MeasurementRecorded (by `actor`, default
    the system); returns the event."""
    check_optional_id(task_id, "task id")  # the one id rule: this may open a task's stream
    check_optional_id(block_id, "block id")
    digest = ws.artifacts.put(result.records_jsonl())
    m = result.metrics
    failed = int(m.get("failed", 0))
    omitted: dict[str, str] = {}  # NaN / infinite metrics: left out, the reason kept in meta
    metrics = numeric_metrics(m, omitted)
    ev = E.MeasurementRecorded(
        task_id=task_id, block_id=block_id,
        run_id=run_id or f"bench-{digest[7:19]}",
        source=source,
        metrics=metrics,
        candidate=dict(candidate or {}),
        repeat=repeat,
        success=m.get("completed", 0) > 0,
        error=(f"{failed} of {failed + int(m.get('completed', 0))} requests failed"
               if failed else None),
        artifact_digest=digest,
        meta=_storable_meta({"config": result.config, "client": "infer-forge", **(meta or {})},
                            omitted),
        **({"actor": actor} if actor is not None else {}),
    )
    # The one measurement writer: a task's open block (or task-level), else `measurements`.
    record_measurements(ws, [ev], task_id=task_id,
                        command_id=f"bench:{task_id or ''}:{block_id or ''}:{digest}")
    return ev


METRIC_ROWS = (
    ("Successful requests:", "completed", "{:.0f}"),
    ("Failed requests:", "failed", "{:.0f}"),
    ("Benchmark duration (s):", "duration", "{:.2f}"),
    ("Total input tokens:", "total_input_tokens", "{:.0f}"),
    ("Total generated tokens:", "total_output_tokens", "{:.0f}"),
    ("Request throughput (req/s):", "request_throughput", "{:.2f}"),
    ("Input token throughput (tok/s):", "input_throughput", "{:.2f}"),
    ("Output token throughput (tok/s):", "output_throughput", "{:.2f}"),
    ("Total token throughput (tok/s):", "total_throughput", "{:.2f}"),
    ("Concurrency:", "concurrency", "{:.2f}"),
    ("Max concurrent requests:", "max_concurrent_requests", "{:.0f}"),
    ("Request goodput (req/s):", "request_goodput", "{:.2f}"),
    ("SLO attainment:", "slo_attainment", "{:.4f}"),
)


def format_table(metrics: Mapping[str, Any]) -> str:
    """bench_serving-style result block."""
    lines = ["{:=^60}".format(" Serving Benchmark Result ")]
    for label, key, fmt in METRIC_ROWS:
        if key in metrics:
            lines.append(f"{label:<40} {fmt.format(metrics[key])}")
    for title, name in (("End-to-End Latency", "e2e_latency"), ("Time to First Token", "ttft"),
                        ("Time per Output Token (excl. 1st token)", "tpot"),
                        ("Inter-Token Latency", "itl")):
        lines.append(f"{title:-^60}")
        for stat in ("mean", "median", "std", "p90", "p95", "p99"):
            k = f"{stat}_{name}_ms"
            if k in metrics:
                lines.append(f"{stat.capitalize() + ' (ms):':<40} {metrics[k]:.2f}")
    lines.append("=" * 60)
    return "\n".join(lines)


def bench_command(*, url: str, model: str, dataset: str = "random",
                  tokenizer_dir: str | None = None, dataset_path: str | None = None,
                  num_prompts: int = 64, input_len: int = 128, output_len: int = 64,
                  range_ratio: float = 1.0, max_concurrency: int | None = None,
                  request_rate: float = math.inf, warmup: int = 1, seed: int = 42,
                  engine: str = "hf", endpoint: str = "completions",
                  extra_body: Mapping[str, Any] | None = None, goodput: Sequence[str] = (),
                  transport: str = "auto", workers: int | str = "auto",
                  gsp: Mapping[str, int] | None = None,
                  ws: Workspace | None = None, task_id: str | None = None,
                  block_id: str | None = None, records_out: str | None = None,
                  candidate: Mapping[str, Any] | None = None, actor: E.Actor | None = None,
                  guard_ws: Workspace | None = None, guard_home: str | None = None,
                  prompts: Sequence[Prompt] | None = None,
                  ) -> dict[str, Any]:
    """`forge bench`: build the prompts, run, optionally record; returns a JSON-able summary
    (`metrics`, `config`, and `measurement` when recorded). The production guard and the
    data policy read `ws`, else `guard_ws`, else the workspace at `guard_home` (FORGE_HOME
    when None) when it has a forge.toml. `prompts` (a point's workload, bench/workload.py)
    replace the ones `dataset` would build."""
    check_optional_id(task_id, "task id")  # before the run, not after it
    check_optional_id(block_id, "block id")
    if ws is not None:
        check_measurement_target(ws, task_id, block_id)
    cfg = BenchConfig(url=url, model=model, endpoint=endpoint, max_concurrency=max_concurrency,
                      request_rate=request_rate, warmup=warmup, seed=seed, engine=engine,
                      extra_body=dict(extra_body or {}), slo=parse_slo(list(goodput)),
                      transport=transport, workers=parse_workers(workers))
    cfg.validate()
    with ExitStack() as stack:
        gws = ws or guard_ws
        if gws is None:
            gws = production.workspace_for_guard(guard_home)
            if gws is not None:
                stack.callback(gws.close)
        cls = data_policy.DEFAULT_CLASS
        if gws is not None:
            # Refused here, before prompts are built or anything is sent (num_prompts bounds
            # a custom dataset's count).
            cfg = guarded(cfg, num_prompts, BenchGuard(
                gws, actor or E.Actor.tool("forge-bench"), task_id, block_id))
            cls = data_policy.class_of(gws, url=url, dataset=dataset, dataset_path=dataset_path)
        if prompts is None:
            prompts = build_prompts(dataset, tokenizer_dir=tokenizer_dir,
                                    dataset_path=dataset_path, num_prompts=num_prompts,
                                    input_len=input_len, output_len=output_len,
                                    range_ratio=range_ratio, seed=seed, **dict(gsp or {}))
        result = run_bench(cfg, prompts)
        result.scrub = gws is not None and not data_policy.stores_text(gws, cls)
    result.config.update(dataset=dataset, input_len=input_len, output_len=output_len,
                         range_ratio=range_ratio, tokenizer=tokenizer_dir, data_class=cls)
    out: dict[str, Any] = result.summary()
    if records_out:
        with open(records_out, "wb") as f:
            f.write(result.records_jsonl())
    if ws is not None:
        ev = record_measurement(ws, result, task_id=task_id, block_id=block_id,
                                candidate=candidate, actor=actor)
        out["measurement"] = {"event_id": str(ev.event_id), "run_id": ev.run_id,
                              "artifact": ev.artifact_digest,
                              "stream": task_stream(task_id) if task_id
                              else MEASUREMENTS_STREAM}
    return out
