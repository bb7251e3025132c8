"""The bench client against a real local server with known delays (a subprocess), the
datasets, recording, and `forge bench`."""

from __future__ import annotations

import json
import random
import socket
import time
import urllib.request
import zlib

import pytest
from infer_forge.harness.bench.client import (
    format_table,
    record_measurement,
    run_bench,
)
from infer_forge.harness.bench.datasets import (
    Prompt,
    custom_prompts,
    load_tokenizer,
    random_prompts,
    shared_prefix_prompts,
)
from infer_forge.harness.bench.request import BenchConfig
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.testing.scripted_server import token_text

from tests.conftest import need, run_forge
from tests.helpers.tasks import measurements, open_task

from ..loop.test_loop import make_task_dir

D_MS, I_MS, TOKENS = 60.0, 8.0, 12


def in_flight_peak(records) -> int:
    """The most requests in flight at one instant (what a concurrency limit bounds; the
    `max_concurrent_requests` metric is bench_serving's count of requests active during one
    second, which a burst of short requests can push past the limit)."""
    edges = sorted([(r.start_time, 1) for r in records] +
                   [(r.start_time + r.e2e, -1) for r in records])  # an end before a start
    cur = peak = 0
    for _, d in edges:
        cur += d
        peak = max(peak, cur)
    return peak


def prompts(n: int, out: int = TOKENS) -> list[Prompt]:
    return [Prompt(f"prompt number {i}", 3, out) for i in range(n)]


def cfg(url: str, **kw) -> BenchConfig:
    return BenchConfig(url=url, model="scripted", engine=kw.pop("engine", "scripted"), **kw)


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_timings_land_around_the_scripted_truth(scripted_server, transport):
    url = scripted_server("--first-token-ms", str(D_MS), "--itl-ms", str(I_MS),
                          "--tokens", str(TOKENS))
    res = run_bench(cfg(url, max_concurrency=4, transport=transport), prompts(16))
    recs = res.records
    assert all(r.success for r in recs), [r.error for r in recs]
    d, i = D_MS / 1000, I_MS / 1000
    # The server cannot send before D: a TTFT below it would be a measuring bug.
    assert min(r.ttft for r in recs) >= d
    assert all(r.output_len == TOKENS for r in recs)  # from the server's usage chunk
    assert all(len(r.itl) == TOKENS - 1 for r in recs)
    assert all(r.e2e >= d + (TOKENS - 1) * i for r in recs)
    m = res.metrics
    # Generous bounds: this proves the logic; the precision figure is in bench/RESULTS.md.
    assert D_MS <= m["median_ttft_ms"] <= D_MS + 40
    assert I_MS - 4 <= m["median_itl_ms"] <= I_MS + 4
    assert I_MS - 3 <= m["mean_tpot_ms"] <= I_MS + 3
    assert m["completed"] == 16 and m["failed"] == 0
    assert m["total_output_tokens"] == 16 * TOKENS
    assert 1 <= in_flight_peak(res.records) <= 4
    assert res.warmup_records and all(r.warmup for r in res.warmup_records)


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_generated_text_and_chat_endpoint(scripted_server, transport):
    url = scripted_server("--tokens", "5")
    ps = prompts(3, out=5)
    for endpoint in ("completions", "chat"):
        res = run_bench(cfg(url, endpoint=endpoint, max_concurrency=2, transport=transport), ps)
        assert all(r.success for r in res.records)
        for p, r in zip(ps, res.records, strict=True):
            # The server's text depends on the prompt; the client must not lose or mix chunks.
            seed = zlib.crc32(p.prompt.encode())
            assert r.generated_text == "".join(token_text(seed, k) for k in range(5))


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_engine_extra_body_respects_transformers_serve(scripted_server, transport):
    # A server that 422s on ignore_eos/min_tokens, as transformers serve does.
    url = scripted_server("--reject-fields", "ignore_eos,min_tokens", "--tokens", "3")
    ok = run_bench(cfg(url, engine="hf", warmup=0, transport=transport), prompts(2, 3))
    assert all(r.success for r in ok.records)
    bad = run_bench(cfg(url, engine="sglang", warmup=0, transport=transport), prompts(2, 3))
    assert not any(r.success for r in bad.records)
    assert "HTTP 422" in bad.records[0].error and "ignore_eos" in bad.records[0].error
    with pytest.raises(HarnessError, match="warmup failed.*422"):
        run_bench(cfg(url, engine="sglang", warmup=1), prompts(2, 3))


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_failures_are_data(scripted_server, transport):
    url = scripted_server("--fail-every", "3", "--tokens", "2")
    res = run_bench(cfg(url, max_concurrency=1, warmup=0, transport=transport), prompts(9, 2))
    failed = [r for r in res.records if not r.success]
    assert len(failed) == 3 and all("HTTP 500" in r.error for r in failed)
    assert res.metrics["failed"] == 3 and res.metrics["completed"] == 6


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_unreachable_server_fails_cleanly(transport):
    with pytest.raises(HarnessError, match="warmup failed"):
        run_bench(cfg("http://127.0.0.1:9", transport=transport), prompts(2))
    res = run_bench(cfg("http://127.0.0.1:9", warmup=0, transport=transport), prompts(2))
    assert res.metrics["failed"] == 2 and "Connect" in res.records[0].error


def test_open_loop_poisson_arrivals_follow_the_seeded_schedule(scripted_server):
    url = scripted_server("--tokens", "2")
    rate, seed, n = 100.0, 7, 20
    res = run_bench(cfg(url, request_rate=rate, seed=seed, warmup=0), prompts(n, 2))
    rng = random.Random(seed)
    due = [0.0]
    for _ in range(n - 1):
        due.append(due[-1] + rng.expovariate(rate))
    t0 = res.records[0].start_time
    for r, d in zip(res.records, due, strict=True):
        # Never sent before its arrival time; late by at most a generous margin.
        assert d - 1e-3 <= r.start_time - t0 <= d + 0.25


def test_closed_loop_limits_concurrency(scripted_server):
    url = scripted_server("--first-token-ms", "20", "--itl-ms", "5", "--tokens", "4")
    res = run_bench(cfg(url, max_concurrency=3, warmup=0), prompts(12, 4))
    assert in_flight_peak(res.records) == 3


def test_record_measurement_stores_records_artifact(scripted_server, workspace, tmp_path):
    url = scripted_server("--tokens", "4")
    block = open_task(workspace, tmp_path)
    res = run_bench(cfg(url, max_concurrency=2, slo={"ttft": 1000.0}), prompts(4, 4))
    ev = record_measurement(workspace, res, task_id="t1", block_id=block)
    (got,) = measurements(workspace, "t1")
    assert got.event_id == ev.event_id
    assert got.block_id == block == "b1" and got.source == "forge-bench"
    assert got.metrics["completed"] == 4.0 and got.metrics["slo_attainment"] == 1.0
    rows = [json.loads(line) for line in workspace.artifacts.text(ev.artifact_digest).splitlines()]
    assert sum(1 for r in rows if not r["warmup"]) == 4 and all("itl" in r for r in rows)


# --- datasets -----------------------------------------------------------------------------


def test_random_prompts_have_exact_token_lengths(tiny_tokenizer_dir):
    tok = load_tokenizer(tiny_tokenizer_dir)
    ps = random_prompts(tok, 12, input_len=40, output_len=9, range_ratio=1.0, seed=3)
    assert all(p.prompt_len == 40 and p.output_len == 9 for p in ps)
    assert all(len(tok.encode(p.prompt, add_special_tokens=False)) == 40 for p in ps)
    varied = random_prompts(tok, 30, input_len=40, output_len=20, range_ratio=0.5, seed=3)
    assert all(20 <= p.prompt_len <= 40 and 10 <= p.output_len <= 20 for p in varied)
    assert len({p.prompt_len for p in varied}) > 3
    assert all(len(tok.encode(p.prompt, add_special_tokens=False)) == p.prompt_len
               for p in varied)
    assert varied == random_prompts(tok, 30, 40, 20, 0.5, seed=3)  # seeded
    assert varied != random_prompts(tok, 30, 40, 20, 0.5, seed=4)
    with pytest.raises(HarnessError, match="range_ratio"):
        random_prompts(tok, 2, 10, 10, range_ratio=1.5)


def test_shared_prefix_groups_share_their_prefix(tiny_tokenizer_dir):
    tok = load_tokenizer(tiny_tokenizer_dir)
    ps = shared_prefix_prompts(tok, num_groups=3, prompts_per_group=4, system_prompt_len=30,
                               question_len=8, output_len=5, seed=1)
    assert len(ps) == 12
    prefixes = {p.prompt.split("\n\n")[0] for p in ps}
    assert len(prefixes) == 3
    for pre in prefixes:
        assert sum(p.prompt.startswith(pre + "\n\n") for p in ps) == 4
        assert len(tok.encode(pre, add_special_tokens=False)) == 30
    assert all(p.prompt_len == len(tok.encode(p.prompt, add_special_tokens=False)) for p in ps)


def test_custom_jsonl_and_its_errors(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "hello there", "output_len": 4}\n\n{"prompt": "x"}\n')
    ps = custom_prompts(good, default_output_len=7)
    assert [(p.prompt, p.output_len) for p in ps] == [("hello there", 4), ("x", 7)]
    cases = {
        '{"prompt": "a", "output_len": 2}\n{"prompt": 5, "output_len": 2}\n': ":2: field 'prompt'",
        '{"prompt": "a", "output_len": 0}\n': ":1: field 'output_len'",
        '{"prompt": "a", "output_len": 2}\n{oops\n': ":2: malformed JSON",
        '[1, 2]\n': ":1: expected a JSON object",
    }
    for text, msg in cases.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        with pytest.raises(HarnessError) as e:
            custom_prompts(bad)
        assert str(bad) + msg in str(e.value) and "\n" not in str(e.value)


# --- the CLI --------------------------------------------------------------------------------


def test_forge_bench_cli_runs_and_records(scripted_server, tiny_tokenizer_dir, forge_home,
                                          tmp_path):
    url = scripted_server("--first-token-ms", "5", "--itl-ms", "1")
    assert run_forge("init").returncode == 0
    task = make_task_dir(tmp_path / "specs", "t-bench")
    assert run_forge("task", "new", str(task)).returncode == 0
    assert run_forge("block", "start", "t-bench", "--sub-goal", "bench").returncode == 0
    r = run_forge("bench", "--url", url, "--model", "scripted", "--tokenizer",
                  str(tiny_tokenizer_dir), "--dataset", "random", "--input-len", "16",
                  "--output-len", "6", "--num-prompts", "8", "--max-concurrency", "4",
                  "--engine", "scripted", "--goodput", "ttft:2000", "--json", "--record",
                  "--task", "t-bench", "--block", "b1")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    m = out["metrics"]
    assert m["completed"] == 8 and m["total_input_tokens"] == 8 * 16
    assert m["total_output_tokens"] == 8 * 6 and m["slo_attainment"] == 1.0
    assert out["measurement"]["stream"] == "task:t-bench"
    log = run_forge("log", "--task", "t-bench", "--type", "MeasurementRecorded", "--json")
    rows = [json.loads(line) for line in log.stdout.splitlines()]
    assert len(rows) == 1 and rows[0]["block_id"] == "b1"
    assert rows[0]["metrics"]["output_throughput"] > 0
    table = format_table(m)
    assert "Median (ms):" in table and "Successful requests:                     8" in table


def test_forge_bench_cli_errors_are_one_line(tmp_path):
    r = run_forge("bench", "--url", "http://127.0.0.1:9", "--model", "m", "--dataset", "random")
    assert r.returncode != 0 and "needs --tokenizer" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"prompt": ""}\n')
    r = run_forge("bench", "--url", "http://127.0.0.1:9", "--model", "m", "--dataset", "custom",
                  "--dataset-path", str(bad))
    assert r.returncode != 0 and f"{bad}:1: field 'prompt'" in r.stderr


# --- a real transformers serve (slow) -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_against_real_transformers_serve(hf_server, transport):
    tok = load_tokenizer(hf_server.model_dir)
    ps = random_prompts(tok, 4, 16, 8, 1.0, seed=1)
    res = run_bench(BenchConfig(url=hf_server.base_url, model=str(hf_server.model), engine="hf",
                                max_concurrency=2, transport=transport), ps)
    assert all(r.success for r in res.records), [r.error for r in res.records]
    m = res.metrics
    assert m["completed"] == 4 and m["failed"] == 0
    assert m["total_output_tokens"] == 4 * 8  # random weights run to max_tokens
    assert m["mean_ttft_ms"] > 0 and m["mean_itl_ms"] > 0 and m["mean_tpot_ms"] > 0
    assert all(len(r.itl) >= 1 and r.generated_text for r in res.records)
    # Greedy: the same prompts give the same texts on a second run.
    again = run_bench(BenchConfig(url=hf_server.base_url, model=str(hf_server.model),
                                  engine="hf", max_concurrency=2, warmup=0,
                                  transport=transport), ps)
    assert [r.generated_text for r in again.records] == [r.generated_text for r in res.records]


# --- the raw transport's HTTP parsing, at every split of the byte stream ------------------------


def _feed_response(raw: bytes, sizes) -> tuple:
    """Feed `raw` to one connection in pieces of the given sizes; returns (record, error)."""
    import asyncio

    from infer_forge.harness.bench.metrics import RequestRecord
    from infer_forge.harness.bench.sse_client import StreamState, _Conn

    class _T:  # the transport: the request bytes go nowhere
        def write(self, data):
            pass

        def close(self):
            pass

    async def go():
        conn = _Conn()
        conn.connection_made(_T())
        rec = RequestRecord()
        fut = asyncio.get_running_loop().create_future()
        conn.start(b"", StreamState(rec, False, 0.0), fut)
        pos = 0
        for n in sizes:
            if pos >= len(raw):
                break
            conn.data_received(raw[pos:pos + n], 1.0 + pos)
            pos += n
        if pos < len(raw):
            conn.data_received(raw[pos:], 1.0 + pos)
        if not fut.done():
            conn.connection_lost(None)
        try:
            await fut
        except ConnectionError as e:
            return rec, str(e)
        return rec, None

    return asyncio.run(go())


def _sse_response(texts, chunked=True) -> bytes:
    events = [json.dumps({"choices": [{"index": 0, "text": t}]}).encode() for t in texts]
    events.append(json.dumps({"choices": [], "usage": {"completion_tokens": len(texts)}}).encode())
    events.append(b"[DONE]")
    body = [b"data: " + e + b"\n\n" for e in events]
    if chunked:
        payload = b"".join(b"%x\r\n%s\r\n" % (len(b), b) for b in body) + b"0\r\n\r\n"
        return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n" + payload)
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + b"".join(body)


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 64, 10_000])
def test_raw_transport_parses_any_split(piece):
    texts = [" alpha", " beta", "", " gamma"]  # an empty chunk must not count as a token
    for chunked in (True, False):  # chunked, and close-delimited
        rec, err = _feed_response(_sse_response(texts, chunked), [piece] * 100_000)
        assert err is None and rec.success
        assert rec.generated_text == " alpha beta gamma" and rec.output_len == 4
        assert len(rec.itl) == 2  # three non-empty chunks: two gaps


def test_raw_transport_error_statuses_and_truncation():
    body = b'{"detail": "Extra inputs are not permitted"}'
    resp = b"HTTP/1.1 422 Unprocessable Entity\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    rec, err = _feed_response(resp, [5] * 1000)
    assert err is None and not rec.success and rec.error.startswith("HTTP 422")
    assert "Extra inputs" in rec.error
    cut = _sse_response([" a", " b"])[:-20]  # the server went away mid-stream
    rec, err = _feed_response(cut, [1000])
    assert err == "connection closed by server" and not rec.success


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
def test_server_closing_idle_connections_is_not_a_failure(scripted_server, transport):
    # Like uvicorn's keep-alive timeout: idle connections are closed between sparse requests.
    url = scripted_server("--idle-close-ms", "5", "--tokens", "2")
    res = run_bench(cfg(url, request_rate=20.0, seed=3, warmup=1, transport=transport),
                    prompts(6, 2))
    assert all(r.success for r in res.records), [r.error for r in res.records]
    with urllib.request.urlopen(url + "/forge/stats") as r:
        assert json.loads(r.read())["idle_closed"] >= 3


# --- kernel receive timestamps and worker processes (issue 16) ------------------------------


def _until_the_kernel_stamps():
    """A stamped loopback pair, returned once a read through it carries the kernel's stamp.

    Linux turns receive stamps on machine-wide through a deferred work item when the first
    socket asks (net_enable_timestamp), so on a loaded machine segments sent right after that
    setsockopt can arrive unstamped. Holding this pair open keeps stamping on; close it after.
    """
    from infer_forge.harness.bench.sse_client import _SO_TIMESTAMPNS as STAMPS

    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    a.setsockopt(socket.SOL_SOCKET, STAMPS, 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        b.send(b"?")
        _, anc, _, _ = a.recvmsg(16, socket.CMSG_SPACE(16))
        if any(kind == STAMPS for _, kind, _ in anc):
            return a, b
        time.sleep(0.005)  # polling a condition: give the kernel's worker the CPU
    a.close()
    b.close()
    pytest.fail("the kernel gave no receive stamp within 30 s of SO_TIMESTAMPNS")


def test_raw_transport_dates_a_read_by_its_arrival_not_by_when_it_was_read():
    import asyncio
    import sys

    from infer_forge.harness.bench import sse_client

    need(sys.platform == "linux", "kernel receive timestamps are Linux's SO_TIMESTAMPNS")
    probe = _until_the_kernel_stamps()

    class _Parser:  # records what the socket reader hands the HTTP parser
        def __init__(self):
            self.reads = []
            self.lost = None

        def connection_made(self, transport):
            pass

        def data_received(self, data, now):
            self.reads.append((data, now))

        def connection_lost(self, exc):
            self.lost = exc

    async def go():
        loop = asyncio.get_running_loop()
        with socket.create_server(("127.0.0.1", 0)) as listener:  # real TCP, as the client
            ours = socket.create_connection(listener.getsockname())
            theirs, _ = listener.accept()
        theirs.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ours.setblocking(False)
        parser = _Parser()
        sock = sse_client._Sock(loop, ours, parser)
        assert sock.stamped
        before = time.perf_counter()
        theirs.send(b"token")
        sent = time.perf_counter()
        time.sleep(0.2)  # a busy client: the loop reads late (this *is* the scenario)
        await asyncio.sleep(0)  # let the loop read
        while not parser.reads:
            await asyncio.sleep(0)
        data, at = parser.reads[0]
        read_after = time.perf_counter()
        theirs.close()
        while parser.lost is None and not sock.closed:
            await asyncio.sleep(0)
        sock.close()
        return data, before, sent, at, read_after

    try:
        data, before, sent, at, read_after = asyncio.run(go())
    finally:
        for end in probe:
            end.close()
    assert data == b"token"
    # Dated when the bytes reached the socket (during send), not when the late loop read them.
    # Slack for a loaded machine: loopback delivery can be deferred to ksoftirqd, and the
    # realtime -> perf_counter offset is read with two calls that can be preempted between.
    assert before - 0.001 <= at < sent + 0.1
    assert read_after - sent >= 0.2
    assert read_after - at > 0.1  # read late, yet dated early


def test_workers_merge_records_in_order_with_counts_and_errors(scripted_server):
    # Every 7th POST fails: failures stay data, each record stays with its prompt.
    url = scripted_server("--first-token-ms", "5", "--itl-ms", "2", "--tokens", "6",
                          "--fail-every", "7")
    ps = prompts(20, out=6)
    res = run_bench(cfg(url, max_concurrency=4, warmup=2, workers=2), ps)
    assert res.config["workers_used"] == 2
    assert [r.index for r in res.records] == list(range(20))
    assert [r.index for r in res.warmup_records] == [-1, -2]
    assert all(r.warmup for r in res.warmup_records)
    everything = res.warmup_records + res.records
    failed = [r for r in everything if not r.success]
    assert len(failed) == len(everything) // 7  # the server counted every POST once
    assert all(r.error.startswith("HTTP 500") for r in failed)
    for p, r in zip(ps, res.records, strict=True):
        assert r.prompt_len == p.prompt_len
        if r.success:  # the worker kept each stream's text with its own request
            seed = zlib.crc32(p.prompt.encode())
            assert r.generated_text == "".join(token_text(seed, k) for k in range(6))
            assert r.output_len == 6 and len(r.itl) == 5 and r.ttft > 0
    m = res.metrics
    assert m["completed"] == sum(r.success for r in res.records)
    assert m["failed"] == 20 - m["completed"]
    assert m["total_output_tokens"] == 6 * m["completed"]
    assert res.duration_s > 0


def test_workers_option_is_checked():
    for bad in (0, -1, "two", 1.5, True):
        with pytest.raises(HarnessError, match="workers"):
            cfg("http://127.0.0.1:9", max_concurrency=4, workers=bad).validate()
    with pytest.raises(HarnessError, match="needs a closed loop"):
        cfg("http://127.0.0.1:9", workers=2, request_rate=5.0, max_concurrency=4).validate()
    with pytest.raises(HarnessError, match="needs a closed loop"):
        cfg("http://127.0.0.1:9", workers=2).validate()  # no max_concurrency
    # One process for small or open-loop runs; never more workers than requests or streams.
    assert cfg("http://x", max_concurrency=64).worker_count(1000) == 1
    assert cfg("http://x", request_rate=5.0).worker_count(1000) == 1
    assert cfg("http://x", max_concurrency=3, workers=8).worker_count(1000) == 3
    assert cfg("http://x", max_concurrency=64, workers=8).worker_count(2) == 2
    import os
    want = max(1, min((os.cpu_count() or 1) // 2, 4))
    assert cfg("http://x", max_concurrency=256).worker_count(1000) == want
    r = run_forge("bench", "--url", "http://127.0.0.1:9", "--model", "m", "--tokenizer", "x",
                  "--workers", "two")
    assert r.returncode != 0 and "workers 'two'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def _stats(url: str) -> dict:
    with urllib.request.urlopen(url + "/forge/stats", timeout=10) as r:
        return json.loads(r.read())


def _wait_for_requests(url: str, n: int, proc=None) -> None:
    """Until the server has seen `n` POSTs (a condition, polled with a deadline)."""
    deadline = time.monotonic() + 60
    while _stats(url)["requests"] < n:
        assert proc is None or proc.poll() is None, "the client exited early"
        assert time.monotonic() < deadline, "the workers never sent"
        time.sleep(0.05)


def test_cancelled_worker_run_leaves_no_process(scripted_server):
    import asyncio
    import multiprocessing as mp
    import os

    from infer_forge.harness.bench.client import run_bench_async

    url = scripted_server("--first-token-ms", "600000")  # every request hangs
    pids: list[int] = []

    async def go():
        task = asyncio.ensure_future(
            run_bench_async(cfg(url, max_concurrency=4, warmup=0, workers=2), prompts(8)))
        await asyncio.to_thread(_wait_for_requests, url, 4)
        pids.extend(p.pid for p in mp.active_children())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert len(pids) == 2
    assert mp.active_children() == []  # stopped and joined
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}")


def _live_in_group(pgid: int) -> list[int]:
    """Processes of process group `pgid` that are not zombies (read from /proc)."""
    import os

    live = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(name))
    return live


_CLIENT = """
import sys
from infer_forge.harness.bench.client import run_bench
from infer_forge.harness.bench.request import BenchConfig
from infer_forge.harness.bench.datasets import Prompt
run_bench(BenchConfig(url=sys.argv[1], model="scripted", engine="scripted", max_concurrency=4,
                      warmup=0, workers=2), [Prompt(f"p {i}", 3, 4) for i in range(8)])
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_interrupted_or_killed_client_leaves_no_worker(scripted_server, how):
    import os
    import signal
    import subprocess
    import sys
    import time

    need(sys.platform == "linux", "reads process groups from /proc")
    url = scripted_server("--first-token-ms", "600000")  # every request hangs
    p = subprocess.Popen([sys.executable, "-c", _CLIENT, url], start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for_requests(url, 4, p)  # both workers are sending
        assert len(_live_in_group(p.pid)) >= 3  # the client and its two workers
        # Ctrl-C's SIGINT to the client alone (its workers ignore SIGINT anyway), or kill -9.
        os.kill(p.pid, getattr(signal, how))
        p.wait(60)
        assert p.returncode != 0
        deadline = time.monotonic() + 30
        while _live_in_group(p.pid):  # a worker notices its parent's pipe close
            assert time.monotonic() < deadline, f"orphans: {_live_in_group(p.pid)}"
            time.sleep(0.05)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(10)


@pytest.mark.parametrize("head,keep", [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", True),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", False),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", False),  # http.server's default
    (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", True),
])
def test_a_connection_is_kept_only_when_the_response_keeps_it(head, keep):
    """An HTTP/1.0 answer closes unless it says keep-alive: the raw client reused such
    connections and raced the server's close ("connection closed by server", a failed request
    on a stand-in server under load)."""
    import asyncio

    from infer_forge.harness.bench.metrics import RequestRecord
    from infer_forge.harness.bench.sse_client import StreamState, _Conn

    class _T:
        def write(self, data):
            pass

        def close(self):
            pass

    async def go() -> bool:
        conn = _Conn()
        conn.connection_made(_T())
        fut = asyncio.get_running_loop().create_future()
        conn.start(b"", StreamState(RequestRecord(), False, 0.0), fut)
        conn.data_received(head, 1.0)
        await fut
        return conn.keep_alive

    assert asyncio.run(go()) is keep
