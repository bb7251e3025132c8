"""The bench client against a real local server with known delays (a subprocess), the
datasets, recording, and `forge bench`."""

from __future__ import annotations

import json
import random
import urllib.request
import zlib

import pytest
from infer_forge.harness.bench.client import (
    BenchConfig,
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
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.testing.scripted_server import token_text

from tests.helpers.tasks import measurements, open_task

from .conftest import run_forge
from .test_loop import make_task_dir

D_MS, I_MS, TOKENS = 60.0, 8.0, 12


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
    assert 1 <= m["max_concurrent_requests"] <= 4
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
    assert res.metrics["max_concurrent_requests"] == 3


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
            conn.data_received(raw[pos:pos + n])
            pos += n
        if pos < len(raw):
            conn.data_received(raw[pos:])
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
