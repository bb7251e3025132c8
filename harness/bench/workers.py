"""A closed-loop benchmark spread over worker processes, as load generators do.

Why: one event loop reads every stream; when tokens arrive faster than it can read them
(hundreds of streams, a few ms apart), reads fall behind and tokens that arrive together share
one timestamp. Each worker is a process with its own event loop and the lean transport.

Contracts (`run_in_workers(cfg, prompts, n)`, n ≥ 2, a closed loop without probe limits):
- Assignment is deterministic: request i goes to worker i mod n, which sends its share in
  order with its share of `max_concurrency` (and of `warmup`; the warmup requests are the
  first prompt's, as in one process). The split of concurrency differs from one pool in one
  way only: a worker's streams pull from its own share, not the shared queue.
- Workers start (spawned, so no event loop or thread is inherited) with the parent's
  resolved address of the URL's host (guard/addresses.py `pin`: where its production check
  looked, never a lookup of their own), open their connections
  and run their warmup, then wait; the parent starts the clock and tells all to go at once.
  Timestamps are `time.perf_counter` in each worker: CLOCK_MONOTONIC, one clock for every
  process on a Linux machine, so records from different workers compare.
- Records come back as `RequestRecord`s (same shape as in one process), placed by index; the
  run's duration is from the go to the last worker's end. Failures stay data; if every warmup
  request fails, `HarnessError` names the first error, as in one process; a worker that
  crashes is a `HarnessError` naming it.
- No orphans: workers ignore SIGINT (Ctrl-C reaches the parent, which stops them); on any
  exit of the parent's wait (error, cancel, KeyboardInterrupt) each worker is told to stop,
  then terminated, then killed if still there, and joined. A worker whose parent is gone sees
  its pipe close and exits.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import signal
import time
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import urlsplit

from ..errors import HarnessError
from ..guard import addresses
from . import sse_client
from .datasets import Prompt
from .metrics import RequestRecord
from .request import BenchConfig, freeze_gc, open_session, request_body, stream_request
from .sse_client import RawClient

_STOP_WAIT_S = 3.0  # for a worker to stop when told, then after SIGTERM


async def _recv(conn: Connection) -> Any:
    """The next message on `conn` without blocking the loop (EOFError when it closed)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future = loop.create_future()
    fd = conn.fileno()

    def readable() -> None:
        loop.remove_reader(fd)
        if fut.done():
            return
        try:
            fut.set_result(conn.recv())
        except (EOFError, OSError) as e:
            fut.set_exception(EOFError(str(e)))

    loop.add_reader(fd, readable)
    try:
        return await fut
    finally:
        loop.remove_reader(fd)


# --- the worker ------------------------------------------------------------------------------

def _worker_main(conn: Connection, cfg: BenchConfig, items: list[tuple[int, int, int, bytes]],
                 warm: tuple[int, int, int, bytes], concurrency: int, stamps: bool,
                 pins: tuple[tuple[str, int, tuple[tuple[int, str], ...]], ...] = ()) -> None:
    """Process entry: run this worker's share; every outcome goes back on `conn`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C
    sse_client.KERNEL_STAMPS = stamps  # as the parent's (a fresh import says True)
    for host, port, addrs in pins:  # connect where the parent's production check looked
        addresses.pin(host, port, addrs)
    try:
        asyncio.run(_work(conn, cfg, items, warm, concurrency))
    except EOFError:
        pass  # the parent is gone or told us to stop: nothing to report to
    except BaseException as e:  # reported, then the process ends
        try:
            conn.send(("error", f"{type(e).__name__}: {' '.join(str(e).split())}"[:500]))
        except OSError:
            pass
    finally:
        conn.close()


async def _work(conn: Connection, cfg: BenchConfig, items: list[tuple[int, int, int, bytes]],
                warm: tuple[int, int, int, bytes], concurrency: int) -> None:
    chat = cfg.endpoint == "chat"
    url = cfg.api_url()
    raw = RawClient(url, cfg.timeout_s) if cfg.use_raw() else None
    session = None if raw else open_session(max(concurrency, warm[0], 1), cfg.timeout_s)

    async def post(payload: bytes, rec: RequestRecord) -> None:
        if raw is not None:
            await raw.request(payload, rec, chat)
        else:
            await stream_request(session, url, payload, rec, chat)

    try:
        count, plen, olen, wp = warm
        warm_recs = [RequestRecord(prompt_len=plen, output_len=olen, warmup=True)
                     for _ in range(count)]
        await asyncio.gather(*(post(wp, r) for r in warm_recs))
        conn.send(("ready", warm_recs))
        if await _recv(conn) != "go":
            return
        records = [RequestRecord(prompt_len=p, output_len=o, index=i) for i, p, o, _ in items]
        it = iter(range(len(items)))
        freeze_gc()  # as in one process; this process ends with the run

        async def stream() -> None:
            for k in it:
                await post(items[k][3], records[k])

        run = asyncio.ensure_future(asyncio.gather(*(stream() for _ in range(concurrency))))
        stop = asyncio.ensure_future(_recv(conn))  # "stop", or EOF: the parent is gone
        await asyncio.wait((run, stop), return_when=asyncio.FIRST_COMPLETED)
        if not run.done():
            run.cancel()
            raise EOFError("stopped by the parent")
        stop.cancel()
        run.result()
        conn.send(("done", records, time.perf_counter()))
    finally:
        if raw is not None:
            raw.close()
        if session is not None:
            await session.close()


# --- the parent ------------------------------------------------------------------------------

async def run_in_workers(cfg: BenchConfig, prompts: Sequence[Prompt], n: int
                         ) -> tuple[list[RequestRecord], list[RequestRecord], float]:
    """(warmup records, records in prompt order, duration_s) of the run over `n` worker
    processes (see module contract)."""
    assert cfg.max_concurrency and n >= 2  # BenchConfig.worker_count
    extra = cfg.body_extra()
    p0 = prompts[0]
    wlen = min(p0.output_len, 32)
    wp = request_body(cfg, p0, wlen, extra)
    base = replace(cfg, probe=None)
    ctx = mp.get_context("spawn")
    u = urlsplit(cfg.api_url())
    port = u.port or (443 if u.scheme == "https" else 80)
    pins = ((u.hostname or "", port, addresses.resolve(u.hostname or "", port)),)
    procs: list[Any] = []
    conns: list[Connection] = []
    try:
        for w in range(n):
            items = [(i, p.prompt_len, p.output_len, request_body(cfg, p, p.output_len, extra))
                     for i, p in enumerate(prompts) if i % n == w]
            share = cfg.max_concurrency // n + (w < cfg.max_concurrency % n)
            warm = (cfg.warmup // n + (w < cfg.warmup % n), p0.prompt_len, wlen, wp)
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, name=f"forge-bench-worker-{w}",
                               args=(theirs, base, items, warm, max(1, share),
                                     sse_client.KERNEL_STAMPS, pins), daemon=True)
            proc.start()
            theirs.close()  # so a worker's death reads as EOF here
            procs.append(proc)
            conns.append(mine)
        warm_recs: list[RequestRecord] = []
        for msg in await _each(conns):
            warm_recs += msg[1]
        for k, r in enumerate(warm_recs):
            r.index = -1 - k
        if warm_recs and not any(r.success for r in warm_recs):
            raise HarnessError(f"warmup failed against {cfg.api_url()}: {warm_recs[0].error}")
        start = time.perf_counter()
        for c in conns:
            c.send("go")
        done = await _each(conns)
        records: list[RequestRecord | None] = [None] * len(prompts)
        for msg in done:
            for r in msg[1]:
                records[r.index] = r
        assert all(r is not None for r in records)  # each index was one worker's
        end = max(msg[2] for msg in done)
        return warm_recs, [r for r in records if r is not None], end - start
    finally:
        _stop(procs, conns)


async def _each(conns: list[Connection]) -> list[tuple]:
    """The next message from every worker; on the first failure the other waits are
    cancelled and finished (their readers removed) before it propagates."""
    tasks = [asyncio.ensure_future(_expect(c, w)) for w, c in enumerate(conns)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _expect(conn: Connection, w: int) -> tuple:
    try:
        msg = await _recv(conn)
    except EOFError:
        raise HarnessError(f"bench worker {w} exited without a result") from None
    if msg[0] == "error":
        raise HarnessError(f"bench worker {w} failed: {msg[1]}")
    return msg


def _stop(procs: list[Any], conns: list[Connection]) -> None:
    """Stop, then terminate, then kill, and join every worker; close the pipes."""
    for c in conns:
        try:
            c.send("stop")
        except OSError:
            pass  # that worker is gone already
    deadline = time.monotonic() + _STOP_WAIT_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(_STOP_WAIT_S)
        if p.is_alive():
            p.kill()
            p.join()
    for c in conns:
        c.close()
