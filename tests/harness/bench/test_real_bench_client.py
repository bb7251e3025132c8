"""SGLang 0.5.23's own bench client (`python -m sglang.benchmark.serving`, from the released
wheel, under the kit) against the stand-in server (tests/data/sglang/fake_server.py) with each
backend — `sglang` (streaming `/generate`), `sglang-oai`, `sglang-oai-chat` — and against the
scripted server's `/generate`; its output imported by `forge bench import`, and its keys held
against the committed golden output (tests/data/sglang/golden/bench/sglang-0.5.23.jsonl).
One child process runs every client run of this module."""

from __future__ import annotations

import json
import urllib.request

import pytest
from infer_forge.harness.bench.importer import Given, parse_results
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.testing.scripted_server import ScriptedServer

from tests.conftest import run_forge
from tests.helpers import real_bench_client as C
from tests.helpers import real_sglang

VERSION = "0.5.23"


@pytest.fixture(scope="module")
def outputs(tiny_tokenizer_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench-client-0.5.23")
    data = C.sharegpt(tmp / "sharegpt.json")
    with C.stand_in() as url, ScriptedServer() as scripted:
        outs, log = C.run_release(VERSION, {"stand-in": url, "scripted": scripted.url},
                                  tiny_tokenizer_dir, data, tmp)
    return outs, log


def test_every_backend_completes_against_the_stand_in(outputs):
    """Every request of every backend succeeds, each generates exactly the asked length
    (chat asks with `max_completion_tokens`), and the streams are per token (ITLs)."""
    C.check_completed(*outputs, VERSION)


def test_outputs_import_with_their_generation_and_every_key(outputs):
    outs, _ = outputs
    runs = {name: parse_results(out, Given(client_version=VERSION))[0][0]
            for name, out in outs.items()}
    assert {n: r.shape for n, r in runs.items()} == {
        "native": "0.5.14+", "completions": "0.5.14+", "chat": "0.5.23+",  # --goodput
        "native-scripted": "0.5.14+"}
    for r in runs.values():
        assert r.metrics["total_input_text_tokens"] == r.metrics["total_input_tokens"] > 0
        assert r.metrics["total_input_vision_tokens"] == 0
        assert r.meta["bench_client_version"] == VERSION
    chat = runs["chat"]
    assert chat.metrics["cache_report.total_prompt_tokens"] == chat.metrics["total_input_tokens"]
    assert chat.metrics["cache_report.cache_hit_rate_pct"] == 0
    assert chat.metrics["request_goodput"] > 0 and chat.metrics["slo_attainment"] == 1.0
    assert chat.meta["goodput_slos_ms"] == {"ttft": 60000.0, "tpot": 60000.0}
    # The stand-in answers /server_info: the version is the server's own.
    assert (chat.meta["sglang_version"], chat.meta["sglang_version_source"]) == (
        "0.5.23", "server_info")
    # The scripted server has no /server_info (as through a router): server_info is null,
    # so the version recorded is the bench client's, and says so ...
    bare = runs["native-scripted"]
    assert (bare.meta["sglang_version"], bare.meta["sglang_version_source"]) == (
        VERSION, "bench_client")
    # ... unless the deployment's servers' version is given.
    (given,), _ = parse_results(outs["native-scripted"], Given("0.5.22", VERSION))
    assert (given.meta["sglang_version"], given.meta["sglang_version_source"]) == (
        "0.5.22", "deployment")
    # A client that cannot have written these keys, or a version contradicting server_info.
    with pytest.raises(HarnessError, match=r":1: the bench client of sglang 0\.5\.6 cannot "):
        parse_results(outs["completions"], Given(client_version="0.5.6"))
    with pytest.raises(HarnessError, match=r":1: server_info says sglang 0\.5\.23, but "):
        parse_results(outs["completions"], Given(server_version="0.5.22"))


def test_output_keys_match_the_golden_output(outputs):
    """The golden file is the real client's output (regenerate: see real_bench_client.py);
    a client run today writes the same keys, nested the same, with the same kinds."""
    C.check_golden(outputs[0], VERSION)


def test_forge_bench_import_of_the_real_output(forge_home, outputs):
    outs, _ = outputs
    assert run_forge("init").returncode == 0
    r = run_forge("bench", "import", str(outs["native-scripted"]), "--client-version", VERSION,
                  "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["shapes"], out["versions"], out["version_sources"]) == (
        ["0.5.14+"], [VERSION], ["bench_client"])
    bad = run_forge("bench", "import", str(outs["chat"]), "--client-version", "0.5.1")
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1
    assert "the bench client of sglang 0.5.1 cannot have written this line" in bad.stderr


def _sse(url: str, body: dict) -> list[dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        events = [e for e in r.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    return [json.loads(e.removeprefix("data: ")) for e in events[:-1]]


def test_the_stand_ins_chat_stream_is_the_releases_own_chunks():
    """The stand-in's chat chunks are those 0.5.23's own chunk builder makes (the builder
    serving_chat.py streams with); a usage chunk (`"choices": []`) comes only when asked."""
    with C.stand_in() as url:
        body = {"model": "m", "messages": [{"role": "user", "content": "a b c"}],
                "max_completion_tokens": 2, "stream": True}
        plain = _sse(url + "/v1/chat/completions", body)
        asked = _sse(url + "/v1/chat/completions",
                     {**body, "stream_options": {"include_usage": True}})
    head = plain[0]
    real = json.loads(real_sglang.run(VERSION, C.GOLDEN / "render_chat_stream.py", head["id"],
                                      str(head["created"]), "m", "length", "a", "b"))
    assert plain == real
    assert asked[:-1] == [{**c, "id": asked[0]["id"], "created": asked[0]["created"]}
                          for c in real]
    assert asked[-1]["choices"] == [] and asked[-1]["usage"]["completion_tokens"] == 2
