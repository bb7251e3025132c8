"""SGLang 0.5.23's own bench client against the stand-in server with a per-token decode
delay (FAKE_SGLANG_ITL_MS, what the SGLang-shaped repository's builds serve with:
tests/helpers/sglang_repo.py): each stream is then written event by event with chunked
encoding, and the real client completes every request of every backend with one ITL per
token after the first. One child process runs every client run."""

from __future__ import annotations

import http.client
import json

import pytest

from tests.helpers import real_bench_client as C

VERSION = "0.5.23"
BACKENDS = ("sglang", "sglang-oai", "sglang-oai-chat")


@pytest.fixture(scope="module")
def outputs(tiny_tokenizer_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench-client-itl")
    data = C.sharegpt(tmp / "sharegpt.json")
    outs = {b: tmp / f"{b}.jsonl" for b in BACKENDS}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FAKE_SGLANG_ITL_MS", "2")  # the stand-in inherits it
        with C.stand_in() as url:
            log = C.run(VERSION, [C.args(url, b, tiny_tokenizer_dir, data, out,
                                         "--output-details") for b, out in outs.items()])
            encoding = transfer_encoding(url)
    return outs, log, encoding


def transfer_encoding(url: str) -> str | None:
    """How the stand-in sends a streamed completion (its Transfer-Encoding header)."""
    host, port = url.rsplit("/", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v1/completions", json.dumps({"prompt": "a b", "stream": True}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    return resp.getheader("Transfer-Encoding")


def test_every_backend_completes_per_token_against_delayed_streams(outputs):
    outs, log, encoding = outputs
    assert encoding == "chunked"  # the delayed path: one chunk per event
    C.check_completed(outs, log, VERSION)
