"""The journal's model calls (a page's narrative, a concept page's synthesis, a phrased answer)
go through the one outbound client (`cli.wiki_post` on harness/guard/outbound.py): against a
hostile server on 127.0.0.1 each is cut at its deadline or the byte cap with one line and
follows no redirect, so its key reaches no other origin; `forge wiki compile` and
`forge wiki ask` report the cut and keep their deterministic pages and extractive answer."""

from __future__ import annotations

import json
import time

import pytest
from infer_forge.cli import wiki_post
from infer_forge.harness.agents.models import MODEL_MAX_BYTES
from infer_forge.ledger.config import ModelSettings
from infer_forge.wiki import narrative
from infer_forge.wiki.concepts import compiler
from infer_forge.wiki.concepts.model import load_catalog
from infer_forge.wiki.errors import WikiError

from tests.conftest import run_forge
from tests.helpers.hostile_http import HostileHTTP

from .test_wiki_concepts import run_demo

KEY_ENV = "FORGE_TEST_WIKI_MODEL_KEY"


def _tier(url: str, timeout_s: float = 30.0) -> ModelSettings:
    return ModelSettings(url=f"{url}/v1", model="m", family="test", timeout_s=timeout_s,
                         api_key_env=KEY_ENV)


def _one_line(e: pytest.ExceptionInfo[WikiError]) -> str:
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


@pytest.mark.parametrize("mode", ["drip", "drip_head"])
def test_a_dripping_model_endpoint_is_cut_at_the_deadline(mode):
    with HostileHTTP(mode, gap_s=0.2) as srv:
        t = time.monotonic()
        with pytest.raises(WikiError) as e:
            compiler.ask(wiki_post, _tier(srv.url, timeout_s=1.0), "the synthesis, please")
        took = time.monotonic() - t
        assert srv.served()  # the connection was closed, not left to the server
        t = time.monotonic()
        with pytest.raises(WikiError) as n:  # the narrative's own timeout is the deadline
            narrative.ask(wiki_post, f"{srv.url}/v1", "m", "a page", timeout=1.0)
        took_n = time.monotonic() - t
        assert srv.served()
    for err in (e, n):
        assert _one_line(err).endswith("no complete response within 1 s (the deadline)")
    # a byte per 0.2 s kept each read of urllib's per-read timeout alive for hours
    assert 1.0 <= took < 5 and 1.0 <= took_n < 5
    assert srv.requests == ["POST /v1/chat/completions"] * 2


def test_an_endless_model_reply_is_cut_at_the_cap():
    with HostileHTTP("endless") as srv:
        with pytest.raises(WikiError) as e:
            compiler.ask(wiki_post, _tier(srv.url), "the synthesis, please")
        assert srv.served()
    assert _one_line(e).endswith(f"response over {MODEL_MAX_BYTES} bytes (the cap): cut there")
    assert MODEL_MAX_BYTES <= srv.written < 4 * MODEL_MAX_BYTES  # not read on past the cap


@pytest.mark.parametrize("status", [302, 307, 308])
def test_a_model_endpoint_redirecting_elsewhere_gets_no_request_followed(status, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-wiki-secret")
    reply = {"choices": [{"message": {"content": "from the other origin"}}]}
    with HostileHTTP("page", body=json.dumps(reply)) as other, \
            HostileHTTP("redirect", to=other.url, status=status) as srv:
        with pytest.raises(WikiError) as e:
            compiler.ask(wiki_post, _tier(srv.url), "the synthesis, please")
        with pytest.raises(WikiError) as n:
            narrative.ask(wiki_post, f"{srv.url}/v1", "m", "a page", api_key="sk-wiki-secret")
    for err in (e, n):
        assert f"POST {srv.url}/v1/chat/completions: HTTP {status}" in _one_line(err)
    assert srv.requests == ["POST /v1/chat/completions"] * 2
    assert other.requests == []  # urllib took a 302 there as a GET, with the bearer key


def test_no_client_given_is_a_failing_endpoint_not_a_request():
    with HostileHTTP("page", body="{}") as srv:
        with pytest.raises(WikiError) as e:
            compiler.ask(None, _tier(srv.url), "q")
    assert "no outbound HTTP client was given" in _one_line(e)
    assert srv.requests == []


def test_the_cli_compile_and_ask_report_the_cut_and_keep_the_deterministic_result(workspace):
    run_demo(workspace)
    home = workspace.home
    with HostileHTTP("drip", gap_s=0.2) as srv:
        with open(home / "forge.toml", "a") as f:
            f.write(f'\n[models.wiki]\nurl = "{srv.url}/v1"\nmodel = "m"\nfamily = "test"\n'
                    "timeout_s = 1\n")
        t = time.monotonic()
        r = run_forge("wiki", "compile", "--json", home=home, timeout=60)
        a = run_forge("wiki", "ask", "why was bfloat16 rejected?", "--json",
                      "--no-embeddings", home=home, timeout=60)
        took = time.monotonic() - t
        assert srv.served()
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["pages"] >= 5 and rep["model"]["failed"] == 1 and rep["model"]["asked"] == 0
    assert rep["model"]["error"].endswith("no complete response within 1 s (the deadline)")
    assert all(p.author == "compiler" for p in load_catalog(home / "wiki").pages.values())
    assert a.returncode == 0, a.stderr
    ans = json.loads(a.stdout)
    assert ans["mode"] == "extractive" and ans["claims"]
    assert "(the deadline)" in ans["note"] and "the extractive answer stands" in ans["note"]
    assert srv.requests == ["POST /v1/chat/completions"] * 2  # one try per command
    assert took < 40
