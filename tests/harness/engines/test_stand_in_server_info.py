"""The stand-in server's recorded answers against SGLang 0.5.23's own code: its
`/server_info` (tests/data/sglang/server_info.json) has exactly the keys the release's route
builds (`build_server_info` over a real `ServerArgs` from its own parser, plus the route's
fields), and its `--help` (help.txt) is the release's parser's own help text.

Regenerate both with
`.venv/bin/python -m tests.harness.engines.test_stand_in_server_info regen`."""

from __future__ import annotations

import ast
import json
import sys
import tempfile
from pathlib import Path

import pytest
from infer_forge.harness.engines import sglang_flags
from infer_forge.harness.engines.sglang import help_flags

from ...conftest import TESTS
from ...helpers import real_sglang

DATA = TESTS / "data" / "sglang"
SCRIPT = DATA / "kit" / "server_info.py"
RECORDED_MODEL = "Qwen/Qwen3-8B"  # the recorded file's model (the real one ran on tiny-llama)


def real_answers(model: Path, work: Path) -> dict:
    """{"server_info": what 0.5.23's /server_info answers for the stand-in's recorded launch
    (with the recorded scheduler handshake and internal states), "help": its --help}."""
    recorded = json.loads((DATA / "server_info.json").read_text())
    given = work / "given.json"
    given.write_text(json.dumps({
        "scheduler_info": {"status": "ready", "max_total_num_tokens":
                           recorded["max_total_num_tokens"], "max_req_input_len":
                           recorded["max_req_input_len"], "startup_time": 0.0,
                           "hicache_object_layout": None},
        "internal_states": recorded["internal_states"]}))
    out = real_sglang.run(real_sglang.LATEST, SCRIPT, str(given), "--model-path", str(model),
                          "--host", "127.0.0.1", "--port", "30000", "--enable-metrics",
                          "--device", "cpu")
    return json.loads(out.replace(str(model), RECORDED_MODEL))


@pytest.fixture(scope="module")
def real(tiny_model, tmp_path_factory) -> dict:
    return real_answers(tiny_model, tmp_path_factory.mktemp("server-info"))


def test_the_recorded_server_info_has_the_releases_keys(real):
    recorded = json.loads((DATA / "server_info.json").read_text())
    assert recorded["version"] == real_sglang.LATEST
    assert sorted(set(recorded) - set(real["server_info"])) == []  # nothing it does not send
    assert sorted(set(real["server_info"]) - set(recorded)) == []  # and everything it does


def model_info_keys(http_source: str) -> set[str]:
    """The keys the release's `/model_info` route always answers (its `result = {...}`)."""
    for node in ast.walk(ast.parse(http_source)):
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef) and any(
                isinstance(d, ast.Call) and d.args and isinstance(d.args[0], ast.Constant)
                and d.args[0].value == "/model_info" for d in node.decorator_list):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Dict):
                    return {k.value for k in sub.value.keys if isinstance(k, ast.Constant)}
    raise AssertionError("no /model_info route with a result dict")


def test_the_recorded_model_info_has_the_releases_keys():
    http = (real_sglang.release(real_sglang.LATEST) / "sglang" / "srt" / "entrypoints"
            / "http_server.py").read_text()
    recorded = json.loads((DATA / "model_info.json").read_text())
    assert set(recorded) == model_info_keys(http)


def test_the_stand_in_help_is_the_releases(real):
    shown = help_flags((DATA / "help.txt").read_text())
    assert shown == help_flags(real["help"])
    # every flag the table says the release has, that its help shows at all, is found there
    table = set(sglang_flags.table().flags_at(real_sglang.LATEST))
    assert len(table & shown) >= 0.9 * len(table)


if __name__ == "__main__":
    if sys.argv[1:] != ["regen"]:
        sys.exit("usage: python -m tests.harness.engines.test_stand_in_server_info regen")
    from infer_forge.harness.models.weights import fetch_model

    with tempfile.TemporaryDirectory() as tmp:
        model = fetch_model(Path(tmp), "tiny-llama").path
        got = real_answers(model, Path(tmp))
    # The keys are the release's; a value already recorded is kept (the recording is of an
    # H200 server after SGLang's start-up resolution, which ServerArgs alone does not run:
    # built here, auto-resolved fields such as attention_backend are still None).
    old = json.loads((DATA / "server_info.json").read_text())
    info = {k: old.get(k, v) for k, v in got["server_info"].items()}
    (DATA / "server_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    (DATA / "help.txt").write_text(got["help"])
    print(f"wrote {DATA / 'server_info.json'} ({len(info)} keys) and help.txt")
