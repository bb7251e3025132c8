"""`forge eval accuracy`'s lm_eval goes through the one outbound client (the loopback relay,
harness/guard/relay.py): against a hostile engine on 127.0.0.1 its run is cut at the deadline
or the byte cap with one line naming it, and follows no redirect to another origin."""

from __future__ import annotations

import importlib.util
import json
import time
import urllib.error
import urllib.request

import pytest
from infer_forge.harness.bench.accuracy import run_task
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.guard import outbound
from infer_forge.harness.guard.relay import Relay

from tests.helpers.hostile_http import HostileHTTP

lm_eval_needed = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                                    reason="lm_eval is an optional extra")


def _one_line(e: pytest.ExceptionInfo[HarnessError]) -> str:
    msg = str(e.value)
    assert msg.startswith("lm_eval arith against http://127.0.0.1:") and "\n" not in msg
    return msg


@lm_eval_needed
@pytest.mark.parametrize("concurrency", [1, 2])  # lm_eval's requests, then its aiohttp
def test_a_dripping_engine_cuts_the_accuracy_run_at_the_deadline(concurrency):
    with HostileHTTP("drip", gap_s=0.2) as srv:
        t = time.monotonic()
        with pytest.raises(HarnessError) as e:
            run_task(srv.url, "m", limit=1, timeout_s=1, concurrency=concurrency)
        took = time.monotonic() - t
        assert srv.served()
    assert _one_line(e).endswith("no complete response within 1 s (the deadline)")
    assert srv.requests == ["POST /v1/completions"]  # max_retries=1: one try
    assert took < 30  # lm_eval's own import and setup included; a drip ran for hours


@lm_eval_needed
def test_an_endless_engine_reply_is_cut_at_the_cap():
    with HostileHTTP("endless") as srv:
        with pytest.raises(HarnessError) as e:
            run_task(srv.url, "m", limit=1, timeout_s=30)
        assert srv.served()
    cap = outbound.DEFAULT_MAX_BYTES
    assert _one_line(e).endswith(f"response over {cap} bytes (the cap): cut there")
    assert cap <= srv.written < 4 * cap


@lm_eval_needed
@pytest.mark.parametrize("status", [302, 307])
def test_an_engine_redirecting_elsewhere_gets_no_request_followed(status):
    answer = {"choices": [{"text": " 4", "index": 0, "finish_reason": "stop"}]}
    with HostileHTTP("page", body=json.dumps(answer)) as other, \
            HostileHTTP("redirect", to=other.url, status=status) as srv:
        with pytest.raises(HarnessError) as e:
            run_task(srv.url, "m", limit=1, timeout_s=10)
    assert f"POST {srv.url}/v1/completions: HTTP {status}" in _one_line(e)
    assert other.requests == []  # requests took a 302 there as a GET; aiohttp any of them


def test_the_relay_forwards_only_its_own_path():
    with HostileHTTP("page", body='{"ok": 1}') as srv, \
            Relay(f"{srv.url}/v1/completions", timeout_s=5) as relay:
        with urllib.request.urlopen(urllib.request.Request(
                relay.url, data=b"{}", method="POST")) as r:
            assert r.status == 200 and json.loads(r.read()) == {"ok": 1}
        guessed = relay.url.rsplit("/", 1)[0] + "/v1/completions"
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(guessed, data=b"{}", method="POST"))
        assert e.value.code == 404
    assert srv.requests == ["POST /v1/completions"] and relay.errors == []
