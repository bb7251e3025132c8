"""`forge diagnose URL`: read an endpoint (only `GET /metrics`, and a log file) and record
what the rules (rules.py) find.

Contracts:
- Read-only: the only request is `GET <url>/metrics`, passed through the production guard
  first (`harness/guard/production.py`: a read, allowed on production endpoints). A router
  entry (a PD/EPD point: `/metrics` 404, `GET /workers` lists workers) is read server by
  server, each finding naming its server (targets.py).
- `samples` scrapes `interval_s` apart on a drift-free schedule (scrape k starts at or after
  first + k·interval), each parsed with `parse_prometheus` and summarised with `summarize`
  (the `sglang:` families; a server without them: all families; gauges per scheduler rank
  combined as metrics.py says: counts summed, fill levels the fullest rank's, a
  per-priority breakdown not counted twice), histogram buckets kept for window quantiles,
  and `rules.RANK_METRICS` kept per rank where the page has several ranks. A failed
  scrape is a HarnessError: an unreachable endpoint is not a diagnosis. Each scrape is one
  request through the outbound client (guard/outbound.py): `timeout_s` its deadline,
  `max_bytes` its body's cap; past either, one line naming the URL.
- Non-finite samples (`NaN`, `+Inf`, `-Inf`: legal Prometheus) are left out of the numbers
  (and any computed number that overflowed) and named by the `nonfinite_metrics` rule (but
  a gauge SGLang sets to NaN for "no sample yet", `rules.NAN_MEANS_UNSET`).
- The log is read from its tail: at most `tail_bytes` (a first partial line dropped), lines
  numbered as in the whole file. Secrets in it are redacted by the ledger on write.
- The SLO is `{"ttft_ms.p99": ms, ...}`: from `--slo` (`ttft_ms=500,tpot_ms.p50=40`; a bare
  metric means p99), else the deployment point's `scenario.slo` (`--point FILE`).
- The result is one `DiagnosisRecorded` on the `diagnoses` stream, or with `task_id` on
  that task's stream (in its open block, through harness/record.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.errors import NotFoundError
from ...ledger.specs import load_point
from ...ledger.streams import DIAGNOSES_STREAM
from ...ledger.workspace import Workspace
from ...projections.memory import read_memory
from ..engines.base import request_text
from ..engines.metrics import bucket_bound, nonfinite, parse_prometheus, per_rank, summarize
from ..errors import HarnessError
from ..guard import outbound, production
from ..record import append_to_task
from .rules import RANK_METRICS, RULES, Limits, LogLine, Scrape, apply_rules
from .targets import Target, is_not_found, router_targets, server_diagnosis

PREFIX = "sglang:"
DEFAULT_TAIL_BYTES = 8 * 1024 * 1024
WINDOW_METRICS = ("num_running_reqs", "num_queue_reqs", "token_usage",
                  "generation_tokens_total", "num_aborted_requests_total")
_STATS = ("p50", "p90", "p95", "p99", "mean")
_SLO_KEYS = ("ttft_ms", "tpot_ms")
SCRAPE_TIMEOUT_S = 30.0  # one scrape's deadline, the whole response
SCRAPE_MAX_BYTES = 64 * 1024 * 1024  # a page this big is not metrics (one grew to 5.5 GB)


def metrics_url(url: str) -> str:
    """`url`'s /metrics: a base URL gets `/metrics` appended (an OpenAI base URL's `/v1`
    dropped: servers serve /metrics at the root); one ending in `/metrics` is kept."""
    u = url.strip().rstrip("/")
    if not u.startswith(("http://", "https://")):
        raise HarnessError(f"URL {url!r}: give http://host:port (the endpoint's base URL)")
    if u.endswith("/metrics"):
        return u
    return (u[:-3] if u.endswith("/v1") else u) + "/metrics"


def to_scrape(t: float, text: str, source: str) -> Scrape:
    """One scrape's text parsed (module contract); non-finite samples left out and named."""
    fams = parse_prometheus(text, source)
    prefix = PREFIX if any(n.startswith(PREFIX) for n in fams) else ""
    values = summarize(fams, prefix)
    buckets: dict[str, dict[float, float]] = {}
    for name, fam in fams.items():
        if fam["type"] != "histogram" or not name.startswith(prefix):
            continue
        b = buckets.setdefault(name[len(prefix):], {})
        for s in fam["samples"]:
            le = bucket_bound(s["labels"])
            if s["name"] == name + "_bucket" and le is not None and math.isfinite(s["value"]):
                b[le] = b.get(le, 0.0) + s["value"]
        for le in [le for le, c in b.items() if not math.isfinite(c)]:  # a sum overflowed
            del b[le]
    ranks = {m: r for m in RANK_METRICS if len(r := per_rank(fams, prefix + m)) > 1}
    return Scrape(t, values, buckets, tuple(nonfinite(fams, prefix)), ranks)


def scrape_window(fetch: Callable[[], str], samples: int, interval_s: float, source: str,
                  parse: Callable[[float, str, str], Scrape] = to_scrape) -> list[Scrape]:
    """`samples` pages from `fetch`, `interval_s` apart, each read by `parse` (an SGLang
    server's page; router_health.to_router_scrape for a router's)."""
    out: list[Scrape] = []
    first = 0.0
    for k in range(samples):
        if k:  # drift-free: scrape k is due at first + k * interval
            time.sleep(max(0.0, first + k * interval_s - time.time()))
        t = time.time()
        if not k:
            first = t
        out.append(parse(t, fetch(), source))
    return out


def read_log_tail(path: str | Path, tail_bytes: int = DEFAULT_TAIL_BYTES) -> list[LogLine]:
    """The log's last `tail_bytes` as numbered lines (module contract)."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            size = f.seek(0, 2)
            start = max(0, size - tail_bytes)
            skipped = 0
            f.seek(0)
            pos = 0
            while pos < start:  # count the lines before the tail, a chunk at a time
                chunk = f.read(min(1 << 20, start - pos))
                if not chunk:
                    break
                skipped += chunk.count(b"\n")
                pos += len(chunk)
            data = f.read()
    except OSError as e:
        raise HarnessError(f"--log {path}: {e.strerror or e}") from None
    lines = data.decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    first_no = skipped + 1
    if start > 0 and lines:  # the tail began inside a line: drop that partial line
        lines = lines[1:]
        first_no += 1
    return [LogLine(first_no + i, t.rstrip("\r")) for i, t in enumerate(lines)]


def parse_slo(text: str) -> dict[str, float]:
    """`ttft_ms=500,tpot_ms.p50=40` -> {"ttft_ms.p99": 500.0, "tpot_ms.p50": 40.0}."""
    out: dict[str, float] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        key, eq, val = item.partition("=")
        metric, _, stat = key.strip().partition(".")
        stat = stat or "p99"
        if not eq or metric not in _SLO_KEYS or stat not in _STATS:
            raise HarnessError(f"--slo {item!r}: expected ttft_ms or tpot_ms (optionally "
                               f".{'/.'.join(_STATS)}) = milliseconds")
        try:
            ms = float(val)
        except ValueError:
            ms = float("nan")
        if not ms > 0 or ms == float("inf"):
            raise HarnessError(f"--slo {item!r}: {val.strip()!r} is not a positive number "
                               "of milliseconds")
        out[f"{metric}.{stat}"] = ms
    return out


def slo_of_point(path: str | Path) -> dict[str, float]:
    slo = load_point(path).scenario.slo
    return {f"{m}.{stat}": float(v) for m in _SLO_KEYS
            for stat, v in sorted(getattr(slo, m).items())}


def _check(name: str, v: float, lo: float, hi: float) -> None:
    if not lo <= v <= hi:  # also refuses NaN
        raise HarnessError(f"--{name} {v:g}: must be within {lo:g}..{hi:g}")


def diagnose(ws: Workspace, url: str, *, samples: int = 5, interval_s: float = 1.0,
             log: str | Path | None = None, tail_bytes: int = DEFAULT_TAIL_BYTES,
             slo: Mapping[str, float] | None = None, task_id: str | None = None,
             limits: Limits | None = None, actor: E.Actor = E.SYSTEM,
             fetch: Callable[[], str] | None = None, timeout_s: float = SCRAPE_TIMEOUT_S,
             max_bytes: int = SCRAPE_MAX_BYTES, router_metrics: str | None = None
             ) -> E.DiagnosisRecorded:
    """Scrape, read, apply the rules, record (module contract). Returns the event saved."""
    ev = diagnosis(ws, url, samples=samples, interval_s=interval_s, log=log,
                   tail_bytes=tail_bytes, slo=slo, task_id=task_id, limits=limits,
                   actor=actor, fetch=fetch, timeout_s=timeout_s, max_bytes=max_bytes,
                   router_metrics=router_metrics)
    if task_id is not None:
        blk = _open_block(ws, task_id)
        ev = ev.model_copy(update={"task_id": task_id, "block_id": blk})
        append_to_task(ws, task_id, [ev])
    else:
        ws.ledger.append(DIAGNOSES_STREAM, [ev])
    return ev


def diagnosis(ws: Workspace, url: str, *, samples: int = 5, interval_s: float = 1.0,
              log: str | Path | None = None, tail_bytes: int = DEFAULT_TAIL_BYTES,
              slo: Mapping[str, float] | None = None, task_id: str | None = None,
              limits: Limits | None = None, actor: E.Actor = E.SYSTEM,
              fetch: Callable[[], str] | None = None,
              envelope: Mapping[str, Any] | None = None, timeout_s: float = SCRAPE_TIMEOUT_S,
              max_bytes: int = SCRAPE_MAX_BYTES, router_metrics: str | None = None
              ) -> E.DiagnosisRecorded:
    """`diagnose` without the save: the event, with `envelope`'s fields (task, block, actor,
    input digests) when given; the caller records it (a verification step saves it with
    its verification). `router_metrics`: the router's own Prometheus page (its
    `--prometheus-port`), judged by router_health.py beside the servers behind a router
    entry; a URL that is not a router entry refuses it."""
    _check("samples", samples, 1, 10_000)
    _check("interval", interval_s, 0.01, 3600)
    _check("tail-mb", tail_bytes, 1, 1 << 34)
    _check("timeout", timeout_s, 0.01, 3600)
    murl = metrics_url(url)
    production.check(ws, murl, "GET /metrics", actor=actor, task_id=task_id)
    lines = read_log_tail(log, tail_bytes) if log is not None else []
    source = production.shown_url(murl)
    guard = outbound.Guard(ws, actor, task_id)  # a redirect hop is checked again
    def page() -> str:
        text = request_text("GET", murl, timeout=timeout_s, max_bytes=max_bytes, guard=guard)
        if router_metrics is not None:  # at the first page, not after the whole window
            raise HarnessError(f"--router-metrics: {production.shown_url(url)} serves its "
                               "own /metrics (a server, not a router entry)")
        return text

    try:
        scrapes = scrape_window(fetch or page, samples, interval_s, source)
    except HarnessError as e:
        if fetch is not None or not is_not_found(e):
            raise
        if router_metrics is not None:
            production.check(ws, metrics_url(router_metrics), "GET /metrics", actor=actor,
                             task_id=task_id)
        # A router entry (PD/EPD) has no /metrics: each server's, findings named (targets.py)
        targets = router_targets(url, timeout_s=timeout_s, guard=guard,
                                 check=lambda u, a: production.check(
                                     ws, u, a, actor=actor, task_id=task_id))
        return server_diagnosis(
            ws, url, targets, samples=samples, interval_s=interval_s, lines=lines, log=log,
            slo=slo or {}, limits=limits, actor=actor, task_id=task_id, envelope=envelope,
            timeout_s=timeout_s, max_bytes=max_bytes, guard=guard, scrape_window=scrape_window,
            window_metrics=WINDOW_METRICS,
            router=(Target("router", "router", metrics_url(router_metrics)[:-len("/metrics")])
                    if router_metrics is not None else None))
    findings = apply_rules(scrapes, lines, slo or {}, limits)
    ev = E.DiagnosisRecorded(
        url=production.shown_url(url.strip().rstrip("/")),
        start=datetime.fromtimestamp(scrapes[0].t, UTC),
        end=datetime.fromtimestamp(scrapes[-1].t, UTC), interval_s=interval_s,
        samples=len(scrapes),
        window={k: tuple(s.values.get(k) for s in scrapes) for k in WINDOW_METRICS
                if any(k in s.values for s in scrapes)},
        log_file=str(log) if log is not None else None, log_lines_read=len(lines),
        slo_ms=dict(slo or {}), rules=tuple(RULES), findings=tuple(findings),
        healthy=not findings, **{"actor": actor, **(envelope or {})})
    return ev


def _open_block(ws: Workspace, task_id: str) -> str | None:
    try:
        mem = read_memory(ws.ledger, task_id)[0]
    except NotFoundError:
        raise HarnessError(f"--task {task_id}: no such task (forge task list)") from None
    return mem.current_block.block_id if mem.current_block else None


def as_dict(ev: E.DiagnosisRecorded) -> dict[str, Any]:
    return ev.model_dump(mode="json", exclude={"input_digests", "causation_id",
                                               "command_id"})
