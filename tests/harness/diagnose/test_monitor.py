"""`forge monitor`: scrapes of a real scripted server's SGLang-shaped /metrics at the requested
interval, summaries in a real ledger, samples in the real index."""

from __future__ import annotations

import json
import re
import socket

import pytest
from infer_forge.harness.diagnose.monitor import monitor
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.testing.scripted_server import Script, ScriptedServer
from infer_forge.harness.testing.sglang_metrics import sglang_metrics
from infer_forge.ledger import events as E
from infer_forge.ledger.samples import decode_samples
from infer_forge.ledger.streams import ENDPOINTS_STREAM
from infer_forge.projections.index import open_index, rebuild
from infer_forge.projections.index.schema import fingerprint

from tests.conftest import run_forge


def queue_of_k(k: int) -> str:
    """Scrape k serves a queue of k requests (so each sample names its scrape)."""
    return sglang_metrics(queue=k, gen_tokens=100 * k, token_usage=0.5)


def summaries(ws) -> list[E.EndpointSummarized]:
    return [r.event for r in ws.ledger.stream(ENDPOINTS_STREAM)]


def test_monitor_samples_at_the_interval_into_the_index(workspace):
    interval = 0.2
    lines: list[str] = []
    with ScriptedServer(Script(metrics=queue_of_k)) as s:
        res = monitor(workspace, s.url, interval_s=interval, window_s=60, count=5,
                      echo=lines.append)
        assert s.scrapes == 5
    assert (res.samples, res.errors, res.summaries) == (5, 0, 1)
    (ev,) = summaries(workspace)
    assert ev.samples == 5 and ev.missed == 0 and ev.url == s.url
    assert ev.stats["num_queue_reqs"] == (4.0, 0.0, 4.0, 2.0)  # last, min, max, mean
    cols = decode_samples(workspace.artifacts.get(str(ev.samples_artifact)))
    t = cols["t"]
    # Drift-free: scrape k starts no earlier than k intervals after the first.
    assert all(t[k] - t[0] >= k * interval - 1e-6 for k in range(5))
    assert t[-1] - t[0] < 4 * interval + 2.0
    assert cols["metrics"]["num_queue_reqs"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    with open_index(workspace) as q:
        rows = q.con.execute(
            "SELECT epoch_us(t), value FROM endpoint_samples WHERE metric = 'num_queue_reqs' "
            "ORDER BY t").fetchall()
        assert [v for _, v in rows] == [0.0, 1.0, 2.0, 3.0, 4.0]
        assert [us / 1e6 for us, _ in rows] == pytest.approx(t, abs=1e-5)
        assert q.con.execute("SELECT url, samples, samples_loaded FROM endpoint_windows"
                             ).fetchall() == [(s.url, 5, True)]
        n_metrics = q.con.execute("SELECT count(DISTINCT metric) FROM endpoint_samples"
                                  ).fetchone()
        assert n_metrics is not None and n_metrics[0] == len(cols["metrics"]) > 10
        incremental = fingerprint(q.con)
    rebuild(workspace)
    with open_index(workspace) as q:
        assert fingerprint(q.con) == incremental
    assert len(lines) == 1 and "5 samples" in lines[0] and "queued 4" in lines[0]


def test_one_summary_per_window_and_every_sample_kept(workspace):
    lines: list[str] = []
    with ScriptedServer(Script(metrics=queue_of_k)) as s:
        res = monitor(workspace, s.url, interval_s=0.05, window_s=0.1, count=7,
                      echo=lines.append)
    evs = summaries(workspace)
    assert res.summaries == len(evs) == len(lines) >= 2
    assert sum(e.samples for e in evs) == 7
    assert all(a.end <= b.start for a, b in zip(evs, evs[1:], strict=False))
    with open_index(workspace) as q:
        assert q.con.execute("SELECT list(value ORDER BY t) FROM endpoint_samples "
                             "WHERE metric = 'num_queue_reqs'").fetchone() == (
            [float(k) for k in range(7)],)


def test_ctrl_c_records_the_partial_window(workspace):
    with ScriptedServer(Script(metrics=queue_of_k)) as s:
        from infer_forge.harness.engines.base import request_text

        calls = 0

        def fetch() -> str:
            nonlocal calls
            calls += 1
            if calls == 4:
                raise KeyboardInterrupt
            return request_text("GET", s.url + "/metrics")

        with pytest.raises(KeyboardInterrupt):
            monitor(workspace, s.url, interval_s=0.01, window_s=60, fetch=fetch)
    (ev,) = summaries(workspace)
    assert ev.samples == 3 and ev.stats["num_queue_reqs"][0] == 2.0
    with open_index(workspace) as q:
        assert q.con.execute("SELECT count(DISTINCT t) FROM endpoint_samples").fetchone() == (
            3,)


def test_failed_scrapes_are_counted_and_monitoring_goes_on(workspace):
    from infer_forge.harness.engines.base import request_text

    lines: list[str] = []
    dead = dead_url()
    with ScriptedServer(Script(metrics=queue_of_k)) as s:
        urls = iter([s.url] + [dead] * 2)  # the first scrape answers, then nothing listens

        res = monitor(workspace, s.url, interval_s=0.01, count=3, echo=lines.append,
                      fetch=lambda: request_text("GET", next(urls) + "/metrics"))
    assert (res.samples, res.errors) == (1, 2)
    (ev,) = summaries(workspace)
    assert ev.errors == 2 and ev.samples == 1 and "Connection refused" in ev.last_error, ev
    assert "2 failed" in lines[0]


def dead_url() -> str:
    """The URL of a local port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_an_endpoint_that_never_answers_is_one_line_non_zero_and_not_monitored(workspace):
    """`forge monitor` on a dead endpoint used to exit 0 after recording windows of failed
    scrapes, and the journal then listed it among the monitored endpoints."""
    from infer_forge.wiki.build import build

    dead = dead_url()
    r = run_forge("monitor", dead, "--interval", "0.01", "--count", "3", home=workspace.home)
    assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr)
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"Error: {dead}: no answer to the first scrape of /metrics (")
    assert line.endswith("nothing recorded"), line
    with ScriptedServer(Script(metrics=None)) as s:  # up, but /metrics is a 404
        with pytest.raises(HarnessError, match=r"first scrape .*HTTP 404"):
            monitor(workspace, s.url, interval_s=0.01, count=3)
    assert summaries(workspace) == []
    build(workspace, embeddings=False)
    assert not (workspace.home / "wiki" / "endpoints.md").exists()
    # Windows of failed scrapes only, as forge monitor recorded them before: not listed.
    from infer_forge.harness.diagnose.monitor import EndpointWindow, record_summary

    win = EndpointWindow(dead, 1.0, 0.0)
    for t in (1.0, 2.0):
        win.error(t, "GET /metrics: Connection refused")
    record_summary(workspace, *win.summary(3.0))
    build(workspace, embeddings=False)
    with open_index(workspace) as q:  # indexed, and still not listed
        assert q.con.execute("SELECT url, samples, errors FROM endpoint_windows").fetchall() \
            == [(dead, 0, 2)]
    assert not (workspace.home / "wiki" / "endpoints.md").exists()


def test_bad_arguments_are_one_line_errors(workspace):
    for kw, word in (({"interval_s": 0}, "--interval 0"), ({"count": 0}, "--count 0"),
                     ({"window_s": 0.001, "interval_s": 1}, "--window"),
                     ({"duration_s": float("nan")}, "--for nan")):
        with pytest.raises(HarnessError, match=word):
            monitor(workspace, "http://127.0.0.1:9", **kw)
    with pytest.raises(HarnessError, match="http://host:port"):
        monitor(workspace, "localhost:9", count=1)
    assert summaries(workspace) == []


def test_cli_monitor_prints_progress_and_json(workspace):
    with ScriptedServer(Script(metrics=queue_of_k)) as s:
        r = run_forge("monitor", s.url, "--interval", "0.05", "--count", "3", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["samples"] == 3
    assert "3 samples, window of 3" in r.stderr
    r = run_forge("monitor", "http://127.0.0.1:9", "--interval", "-1")
    assert r.returncode != 0 and "--interval -1" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_latency_series_are_of_the_requests_finished_between_scrapes(workspace):
    """Slow first tokens before monitoring began, fast ones since: the recorded TTFT p99 per
    scrape is the recent one, not the histogram's since-start quantile."""
    def m(k: int) -> str:
        return sglang_metrics(ttft_s=(5.0,) * 50 + (0.05,) * (5 * k),
                              tpot_s=(0.01,) * (10 + 5 * k))

    with ScriptedServer(Script(metrics=m)) as s:
        monitor(workspace, s.url, interval_s=0.01, count=4)
    (ev,) = summaries(workspace)
    cols = decode_samples(workspace.artifacts.get(str(ev.samples_artifact)))["metrics"]
    assert cols["ttft_ms_p99"][0] is None and all(
        50 < v < 100 for v in cols["ttft_ms_p99"][1:])
    assert all(v > 4.0 for v in cols["time_to_first_token_seconds_p99"])  # seconds
    assert all(5 < v <= 10 for v in cols["tpot_ms_p99"][1:])


def test_the_journal_plots_each_endpoint_with_the_slo_drawn(workspace):
    from infer_forge.wiki.build import build
    from infer_forge.wiki.lint import lint

    def m(k: int) -> str:
        return sglang_metrics(queue=k, ttft_s=(0.05,) * (5 * k) + (0.9,) * k,
                              tpot_s=(0.01,) * (10 + 5 * k))

    with ScriptedServer(Script(metrics=m)) as s:
        monitor(workspace, s.url, interval_s=0.01, count=5, slo={"ttft_ms.p99": 500.0})
    build(workspace, embeddings=False)
    md = (workspace.home / "wiki" / "endpoints.md").read_text()
    assert md.count("<svg") == 6  # queue, running, KV, throughput, TTFT, TPOT
    assert "SLO p99 500 ms" in md and "ttft_ms.p99 500" in md and s.url in md
    home = (workspace.home / "wiki" / "index.md").read_text()
    assert "[[endpoints|Monitored endpoints]]" in home
    rep = lint(workspace)
    assert rep.ok, rep.as_dict()
    build(workspace, embeddings=False, force=True)
    assert (workspace.home / "wiki" / "endpoints.md").read_text() == md


def test_no_endpoints_page_without_monitoring(workspace):
    from infer_forge.wiki.build import build

    build(workspace, embeddings=False)
    assert not (workspace.home / "wiki" / "endpoints.md").exists()


def nonfinite_k(k: int) -> str:
    """Scrape k as queue_of_k, but every other scrape's KV usage is `NaN`, its queue `+Inf`
    and its running count `-Inf` (legal Prometheus, SGLang's names)."""
    page = queue_of_k(k)
    if k % 2:
        for name, value in (("token_usage", "NaN"), ("num_queue_reqs", "+Inf"),
                            ("num_running_reqs", "-Inf")):
            page = re.sub(rf"^(sglang:{name}{{[^}}]*}}) .*$", rf"\g<1> {value}", page,
                          flags=re.M)
    return page


def test_nan_and_inf_samples_are_holes_and_monitoring_goes_on(workspace):
    """A page with NaN/±Inf samples used to stop the monitor at its first summary; they are
    holes (null) in the samples, left out of the stats, and every scrape counts."""
    lines: list[str] = []
    with ScriptedServer(Script(metrics=nonfinite_k)) as s:
        res = monitor(workspace, s.url, interval_s=0.01, window_s=60, count=6,
                      echo=lines.append)
        r = run_forge("monitor", s.url, "--interval", "0.01", "--count", "4", "--json",
                      home=workspace.home)
    assert (res.samples, res.errors, res.summaries) == (6, 0, 1)
    ev = summaries(workspace)[0]
    cols = decode_samples(workspace.artifacts.get(str(ev.samples_artifact)))
    assert cols["metrics"]["num_queue_reqs"] == [0.0, None, 2.0, None, 4.0, None]
    assert cols["metrics"]["token_usage"] == [0.5, None] * 3
    assert ev.stats["num_queue_reqs"] == (4.0, 0.0, 4.0, 2.0)  # last, min, max, mean
    assert "num_running_reqs" in ev.stats and len(lines) == 1
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["samples"] == 4

