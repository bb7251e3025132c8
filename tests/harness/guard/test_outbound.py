"""The one outbound HTTP client (issue 27, item 4): the production guard judges the address a
URL reaches, not its spelling; a redirect is a new request, checked again; every response has
a byte cap and a deadline. Real servers on 127.0.0.1: an SGLang-like production stand-in that
logs what reaches it, and a hostile one that redirects, never ends, or drips."""

from __future__ import annotations

import socket
import time

import pytest
from infer_forge.harness.agents import models
from infer_forge.harness.agents.models import call_model
from infer_forge.harness.bench.client import bench_command
from infer_forge.harness.diagnose import collect
from infer_forge.harness.engines import engine_for
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.guard import addresses, outbound
from infer_forge.harness.guard.production import ProductionRefusedError
from infer_forge.ledger import events as E
from infer_forge.ledger.config import ModelSettings
from infer_forge.ledger.workspace import open_workspace

from tests.conftest import run_forge
from tests.helpers.hostile_http import HostileHTTP
from tests.helpers.sglang_like import SGLangLike

from .test_production import configure, prompts_file, refusals

AGENT = E.Actor.agent("tester", "m")


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


SPELLINGS = ["localhost", "127.1", "2130706433", "0x7f.0.0.1", "0.0.0.0", "LOCALHOST",
             pytest.param("[::ffff:127.0.0.1]", marks=pytest.mark.skipif(
                 not _ipv6_loopback(), reason="no IPv6 on this machine"))]


@pytest.mark.parametrize("host", SPELLINGS)
def test_every_spelling_of_a_production_endpoint_is_refused_and_recorded(forge_home, tmp_path,
                                                                        host):
    """Production is marked as http://127.0.0.1:PORT; the same server under another name
    gets neither a profiler start (external engine, what `forge perf capture` calls), a raw
    POST through the outbound client, nor bench load."""
    data = prompts_file(tmp_path, 4)
    with SGLangLike() as srv:
        configure(forge_home, [srv.url])
        spelled = f"http://{host}:{srv.port}"
        ws = open_workspace(forge_home)
        try:
            eng = engine_for("external").launch(
                {"base_url": spelled, "api": "sglang", "read_only": False, "model": "prod"},
                ws=ws, event_fields={"actor": AGENT})
            with pytest.raises(ProductionRefusedError, match="start_profile refused"):
                eng.start_profile()
            with pytest.raises(ProductionRefusedError, match="flush_cache refused"):
                outbound.fetch("POST", spelled + "/flush_cache", body=b"{}",
                               guard=outbound.Guard(ws, AGENT))
            with pytest.raises(ProductionRefusedError, match="no finite request rate"):
                bench_command(url=spelled, model="prod", dataset="custom",
                              dataset_path=str(data), engine="external", guard_ws=ws,
                              actor=AGENT, num_prompts=4, request_rate=float("inf"))
            got = refusals(ws)
        finally:
            ws.close()
        seen = srv.paths()
    assert [e.action for e in got] == ["POST /start_profile", "POST /flush_cache",
                                       "POST /v1/completions"]
    assert all(e.actor == AGENT for e in got)
    assert seen == []  # nothing reached the production server


def test_a_read_under_another_spelling_still_passes(forge_home):
    """The control: reads are allowed on production whatever the spelling (so the refusals
    above are about what was asked, not about the name)."""
    with SGLangLike() as srv:
        configure(forge_home, [srv.url])
        ws = open_workspace(forge_home)
        try:
            r = outbound.fetch("GET", f"http://localhost:{srv.port}/metrics",
                               guard=outbound.Guard(ws, AGENT)).ok("GET")
        finally:
            ws.close()
        assert b"sglang:gen_throughput" in r.body and srv.paths() == ["GET /metrics"]


@pytest.mark.parametrize("status", [302, 307])
def test_a_redirect_to_production_is_checked_again_and_refused(forge_home, status):
    """A non-production URL redirects the profiler start to the production server: the hop is
    a new request (302: GET, 307: POST again), refused and recorded there; with no guard the
    redirect to another origin is refused outright. The client's first request, the server's
    version (which /start_profile options it reads), is a read and reaches production."""
    with SGLangLike() as srv, HostileHTTP("redirect", to=srv.url, status=status) as bad:
        configure(forge_home, [srv.url])
        ws = open_workspace(forge_home)
        cfg = {"base_url": bad.url, "api": "sglang", "read_only": False, "model": "prod"}
        try:
            eng = engine_for("external").launch(cfg, ws=ws, event_fields={"actor": AGENT})
            with pytest.raises(ProductionRefusedError, match="start_profile refused"):
                eng.start_profile()
            got = refusals(ws)
            unguarded = engine_for("external").launch(cfg, ws=None)
            with pytest.raises(HarnessError, match="redirected to another origin") as e:
                unguarded.flush_cache()
        finally:
            ws.close()
        seen = srv.paths()
    method = "GET" if status == 302 else "POST"
    assert [(x.action, x.url) for x in got] == [(f"{method} /start_profile",
                                                srv.url + "/start_profile")]
    assert "\n" not in str(e.value)
    assert bad.requests == ["GET /server_info", "POST /start_profile", "POST /flush_cache"]
    assert seen == ["GET /server_info"]


def test_a_checked_redirect_to_a_non_production_server_is_followed(forge_home):
    """The control: a redirect is not refused as such; with a guard its hop is checked (not
    production here) and followed; without one, a hop to another origin is refused."""
    with SGLangLike() as srv, HostileHTTP("redirect", to=srv.url) as hop:
        configure(forge_home, ["http://127.0.0.1:1"])
        with pytest.raises(HarnessError, match="redirected to another origin"):
            outbound.fetch("GET", hop.url + "/v1/models")
        ws = open_workspace(forge_home)
        try:
            r = outbound.fetch("GET", hop.url + "/v1/models", guard=outbound.Guard(ws, AGENT))
        finally:
            ws.close()
        assert r.status == 200 and b"prod" in r.body and srv.paths() == ["GET /v1/models"]


def test_an_endless_metrics_page_is_cut_at_the_cap(forge_home):
    """A /metrics that never ends (one grew to 5.5 GB): diagnose stops at the byte cap with
    one line naming the URL, having read little more than the cap."""
    with HostileHTTP("endless") as bad:
        configure(forge_home, [])
        ws = open_workspace(forge_home)
        try:
            t0 = time.monotonic()
            with pytest.raises(HarnessError) as e:
                collect.diagnose(ws, bad.url, samples=1, max_bytes=2 << 20)
            took = time.monotonic() - t0
            assert bad.served(timeout=5)  # the connection was closed, not left open
        finally:
            ws.close()
    msg = str(e.value)
    assert "\n" not in msg and f"{bad.url}/metrics" in msg
    assert f"response over {2 << 20} bytes (the cap)" in msg
    assert took < 20 and bad.written < 64 << 20


@pytest.mark.parametrize("mode", ["drip", "drip_head"])
def test_a_drip_is_cut_at_the_deadline(forge_home, mode):
    """One byte per 0.5 s (of the body, or of a header line) keeps every read alive; the
    deadline is on the whole response."""
    with HostileHTTP(mode, gap_s=0.5) as bad:
        t0 = time.monotonic()
        with pytest.raises(HarnessError, match=r"no complete response within 1.5 s") as e:
            outbound.fetch("GET", bad.url + "/metrics", timeout_s=1.5)
        took = time.monotonic() - t0
        assert bad.served(timeout=5)
    assert 1.4 < took < 6 and "\n" not in str(e.value)


def test_forge_diagnose_and_monitor_end_with_one_line_on_a_drip(forge_home):
    with HostileHTTP("drip", gap_s=0.5) as bad:
        configure(forge_home, [])
        t0 = time.monotonic()
        d = run_forge("diagnose", bad.url, "--samples", "2", "--timeout", "1")
        took_d = time.monotonic() - t0
        t0 = time.monotonic()
        m = run_forge("monitor", bad.url, "--interval", "1", "--count", "2", "--json")
        took_m = time.monotonic() - t0
    assert d.returncode == 2 and "Traceback" not in d.stderr
    (line,) = d.stderr.strip().splitlines()
    assert "no complete response within 1 s (the deadline)" in line and bad.url in line
    assert took_d < 15
    # The monitor's first scrape is cut: it ends at once with that one line, not hanging,
    # and records nothing (test_monitor.py: a scrape cut after the first answered counts).
    assert m.returncode == 1 and m.stdout == "", m.stdout
    (mline,) = m.stderr.strip().splitlines()
    assert "no answer to the first scrape" in mline and "the deadline" in mline, mline
    assert took_m < 20


def test_addresses_are_canonical():
    c = addresses.canonical
    assert c("127.0.0.1") == c("127.0.0.2") == c("0.0.0.0") == c("::1") == addresses.LOCAL
    assert c("::ffff:127.0.0.1") == addresses.LOCAL
    assert c("::ffff:192.0.2.7") == "192.0.2.7" and c("192.0.2.7") == "192.0.2.7"
    assert addresses.host_addresses("2130706433") == {addresses.LOCAL}
    assert addresses.host_addresses("no-such-host.invalid") == frozenset()


# --- model tiers: the openai client on the outbound rules ----------------------------------


def _tier(url: str, timeout_s: float = 30.0) -> ModelSettings:
    return ModelSettings(url=url + "/v1", model="m", family="f", timeout_s=timeout_s)


def test_a_model_tier_follows_no_redirect(workspace):
    """openai's own client follows a 302 (POST becomes GET) to wherever it points: here the
    production stand-in's /flush_cache, which SGLang serves on GET too."""
    with SGLangLike() as srv, HostileHTTP("redirect", to=srv.url + "/flush_cache#") as bad:
        reply = call_model(workspace, "t", [{"role": "user", "content": "hi"}],
                           settings=_tier(bad.url))
        seen = srv.paths()
    assert not reply.success and reply.error_kind == "http" and "302" in reply.error
    assert bad.requests == ["POST /v1/chat/completions"] and seen == []


def test_a_model_tier_reply_is_cut_at_the_cap_and_the_deadline(workspace, monkeypatch):
    monkeypatch.setattr(models, "MODEL_MAX_BYTES", 1 << 20)
    with HostileHTTP("endless") as bad:
        reply = call_model(workspace, "t", [{"role": "user", "content": "hi"}],
                           settings=_tier(bad.url))
        assert bad.served(timeout=5)
    assert not reply.success and reply.error_kind == "bad-response"
    assert f"response over {1 << 20} bytes (the cap)" in reply.error
    with HostileHTTP("drip", gap_s=0.2) as bad:
        t0 = time.monotonic()
        reply = call_model(workspace, "t", [{"role": "user", "content": "hi"}],
                           settings=_tier(bad.url, timeout_s=1.0))
        took = time.monotonic() - t0
    assert not reply.success and "no complete response within 1 s" in reply.error
    assert took < 5 and "\n" not in reply.error


@pytest.mark.parametrize("transport,workers", [("raw", 1), ("aiohttp", 1), ("raw", 2)])
def test_the_bench_connects_only_to_the_address_the_guard_judged(forge_home, tmp_path,
                                                                 monkeypatch, transport,
                                                                 workers):
    """A name only forge's resolver knows (the system's has never heard of it): the production
    check judges addresses.resolve's answer, and both bench transports connect to that same
    answer, never to a lookup of their own (which a changing DNS could answer otherwise):
    worker processes too, which get the parent's answer."""
    data = prompts_file(tmp_path, 3)
    with SGLangLike() as srv:
        name = f"http://forge-pinned.invalid:{srv.port}"
        monkeypatch.setitem(addresses._RESOLVED, ("forge-pinned.invalid", srv.port),
                            ((socket.AF_INET, "127.0.0.1"),))
        kw = dict(url=name, model="prod", dataset="custom", dataset_path=str(data),
                  engine="external", actor=AGENT, num_prompts=3, transport=transport,
                  request_rate=float("inf"), workers=workers, max_concurrency=2)
        configure(forge_home, [srv.url])
        ws = open_workspace(forge_home)
        try:
            with pytest.raises(ProductionRefusedError):
                bench_command(guard_ws=ws, **kw)  # type: ignore[arg-type]
        finally:
            ws.close()
        assert srv.paths() == []
        other = tmp_path / "other"  # a workspace where it is not production: it runs
        configure(other, ["http://127.0.0.1:1"])
        ws = open_workspace(other)
        try:
            out = bench_command(guard_ws=ws, **kw)  # type: ignore[arg-type]
        finally:
            ws.close()
        assert out["metrics"]["completed"] == 3, out["metrics"]
        assert len(srv.completions()) == 4  # the warmup and the three
