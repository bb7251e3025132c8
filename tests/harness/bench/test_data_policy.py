"""Data policy (issue 13, item 4): prompts and responses of class production are never stored.

Production prompts carrying a marker are planted in a bench run (a dataset classed production
in forge.toml, and an endpoint marked production), a correctness check and a model call to a
production-class model endpoint; the servers echo the prompt, so the responses carry the
marker too. Then every file under FORGE_HOME (ledger, artifacts, index, wiki and site) is
searched: the marker is absent, and the counts, lengths and digests are there. The same run
with the classes set to public finds the marker (the search can see it)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from infer_forge.harness.agents.models import call_model
from infer_forge.harness.bench.client import bench_command
from infer_forge.harness.bench.correctness import (
    collect_greedy_outputs,
    compare_outputs,
    record_correctness,
)
from infer_forge.harness.bench.datasets import load_tokenizer
from infer_forge.harness.guard import data_policy
from infer_forge.harness.record import append_to_task
from infer_forge.harness.testing.scripted_chat import ScriptedChat
from infer_forge.ledger.streams import task_stream
from infer_forge.ledger.workspace import init_workspace, open_workspace

from tests.conftest import run_forge
from tests.helpers.sglang_like import SGLangLike
from tests.helpers.tasks import open_task

MARKER = "quokkavioletharbor"  # distinctive, and nothing a secret scanner would redact
PROMPTS = [f"tell me about {MARKER} number {i}" for i in range(3)]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def configure(home: Path, *, cls: str, bench_url: str, prod_url: str, chat_url: str) -> None:
    """forge.toml: the dataset `prod-prompts`, the bench endpoint and the model endpoint of
    class `cls`; `prod_url` marked production (class production by default) only when `cls`
    is production; a model tier on the chat endpoint; no embeddings (no model download)."""
    ws, _ = init_workspace(home)
    ws.close()
    path = home / "forge.toml"
    text = path.read_text()
    if cls == "production":
        text = text.replace("production_endpoints = []",
                            f"production_endpoints = [{json.dumps(prod_url)}]", 1)
        text = text.replace("max_rps = 1.0", "max_rps = 50.0", 1)
    chat_host = chat_url.split("//", 1)[1].split("/", 1)[0]  # host:port
    classes = {"prod-prompts": cls, bench_url: cls, chat_host: cls}
    if cls != "production":
        classes[prod_url] = cls
    text += "\n[data.classes]\n" + "".join(f"{json.dumps(k)} = {json.dumps(v)}\n"
                                           for k, v in classes.items())
    text += (f"\n[models.small]\nurl = {json.dumps(chat_url)}\nmodel = \"prod-chat\"\n"
             "family = \"prodfam\"\n\n[wiki]\nembeddings = false\n")
    path.write_text(text)


def files_with(root: Path, needle: bytes) -> list[str]:
    """Every file under `root` whose bytes hold `needle` (relative paths)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and needle in p.read_bytes())


def plant(home: Path, tmp_path: Path, tokenizer_dir: Path, cls: str) -> dict:
    """Bench runs, a correctness check and a model call with the marker, recorded in a task;
    then the index and the wiki built. Returns what was recorded."""
    data = tmp_path / "prod-prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "output_len": 8}) + "\n" for p in PROMPTS))
    other = tmp_path / "unclassed.jsonl"  # class from the production endpoint only
    other.write_text(data.read_text())
    echo = {"content": None}

    def answer(req: dict) -> dict:
        return {"content": "you said: " + req["messages"][-1]["content"]}

    with SGLangLike() as bench_srv, SGLangLike() as prod_srv, \
            ScriptedChat([answer]) as chat:
        configure(home, cls=cls, bench_url=bench_srv.url, prod_url=prod_srv.url,
                  chat_url=chat.url)
        ws = open_workspace(home)
        try:
            block = open_task(ws, tmp_path, "dp")
            a = bench_command(url=bench_srv.url, model="prod", dataset="custom",
                              dataset_path=str(data), num_prompts=3, request_rate=20.0,
                              warmup=0, engine="external", ws=ws, task_id="dp",
                              block_id=block)
            b = bench_command(url=prod_srv.url, model="prod", dataset="custom",
                              dataset_path=str(other), num_prompts=3, request_rate=20.0,
                              warmup=0, engine="external", ws=ws, task_id="dp",
                              block_id=block)
            tok = load_tokenizer(tokenizer_dir)
            outs = collect_greedy_outputs(bench_srv.url, "prod", tok, prompts=PROMPTS,
                                          max_tokens=8, engine="external")
            rate, per = compare_outputs(outs, outs)
            corr = record_correctness(ws, rate, per, outs, task_id="dp", block_id=block,
                                      data_class=data_policy.class_of(
                                          ws, dataset_path=str(data)))
            reply = call_model(ws, "small", [{"role": "user", "content": PROMPTS[0]}],
                               event_fields={"task_id": "dp", "block_id": block})
            assert reply.success and MARKER in reply.content, reply.error
            echo["content"] = reply.content
            assert reply.event is not None
            append_to_task(ws, "dp", [reply.event])
            events = {r.type: r.event for r in ws.ledger.stream_log(task_stream("dp"))}
        finally:
            ws.close()
    for args in (("index", "rebuild"), ("wiki", "build", "--no-embeddings")):
        r = run_forge(*args, home=home, timeout=300)
        assert r.returncode == 0, r.stderr
    assert (home / "site").is_dir() and (home / "wiki").is_dir()
    return {"bench": (a, b), "correctness": corr, "model": events["ModelCalled"],
            "reply": echo["content"], "events": events}


def artifact_lines(home: Path, digest: str) -> list[dict]:
    path = home / "artifacts" / "sha256" / digest[7:9] / digest[9:]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def artifact(home: Path, digest: str) -> dict:
    path = home / "artifacts" / "sha256" / digest[7:9] / digest[9:]
    return json.loads(path.read_text())


def test_production_prompts_and_responses_are_nowhere_in_the_workspace(
        forge_home, tmp_path, tiny_tokenizer_dir):
    got = plant(forge_home, tmp_path, tiny_tokenizer_dir, "production")
    assert files_with(forge_home, MARKER.encode()) == []
    assert files_with(forge_home, MARKER.upper().encode()) == []
    # What is kept instead: counts, lengths (characters, tokens) and digests.
    for out in got["bench"]:
        assert out["config"]["data_class"] == "production"
        rows = artifact_lines(forge_home, out["measurement"]["artifact"])
        assert len(rows) == 3 and out["metrics"]["completed"] == 3
        for row in rows:
            assert row["generated_text"] == "" and row["data_class"] == "production"
            assert row["generated_text_chars"] > len(MARKER) and row["output_len"] == 6
        echoed = sorted(" " + " ".join(p.split()) for p in PROMPTS)  # the server's echo
        assert sorted(r["generated_text_sha256"] for r in rows) == sorted(map(sha, echoed))
    rows = artifact_lines(forge_home, got["correctness"].artifact_digest)
    assert [r["prompt_sha256"] for r in rows] == [sha(p) for p in PROMPTS]
    assert all(r["prompt"] == "" and r["text"] == "" and r["token_ids"] == [] for r in rows)
    assert all(r["token_ids_chars"] > 0 and r["text_chars"] > 0 for r in rows)
    m = got["model"]
    assert m.tokens_in > 0 and m.tokens_out > 0  # token lengths, on the event
    prompt = artifact(forge_home, m.prompt_digest)
    assert prompt["data_class"] == "production" and prompt["model"] == "prod-chat"
    msg = prompt["messages"][0]
    assert msg["role"] == "user" and msg["content"] == {"chars": len(PROMPTS[0]),
                                                         "sha256": sha(PROMPTS[0])}
    response = artifact(forge_home, m.response_digest)
    content = response["choices"][0]["message"]["content"]
    assert content == {"chars": len(got["reply"]), "sha256": sha(got["reply"])}
    assert response["usage"]["completion_tokens"] == m.tokens_out


def test_the_same_run_of_class_public_keeps_the_text(forge_home, tmp_path,
                                                     tiny_tokenizer_dir):
    """The control: nothing scrubbed, so the search above would have seen the marker."""
    got = plant(forge_home, tmp_path, tiny_tokenizer_dir, "public")
    hits = files_with(forge_home, MARKER.encode())
    for out in got["bench"]:
        assert out["config"]["data_class"] == "public"
        digest = out["measurement"]["artifact"]
        assert f"artifacts/sha256/{digest[7:9]}/{digest[9:]}" in hits
        assert all(MARKER in r["generated_text"]
                   for r in artifact_lines(forge_home, digest))
    for digest in (got["correctness"].artifact_digest, got["model"].prompt_digest,
                   got["model"].response_digest):
        assert f"artifacts/sha256/{digest[7:9]}/{digest[9:]}" in hits


@pytest.mark.parametrize("value", [{"a": "x"}, ["x", 1, True, None], "x"])
def test_scrub_json_keeps_shape_numbers_and_structure(value):
    out = data_policy.scrub_json({"role": "user", "v": value, "n": 3})
    assert out["role"] == "user" and out["n"] == 3
    assert "x" not in json.dumps(out).replace('"chars"', "").replace('"sha256"', "")


def test_classes_take_the_strictest_match(workspace):
    ws = workspace
    (Path(ws.home) / "forge.toml").write_text(
        (Path(ws.home) / "forge.toml").read_text().replace(
            "production_endpoints = []", 'production_endpoints = ["prod.example:8000"]') +
        '\n[data.classes]\n"chat" = "public"\n"http://10.0.0.5:8000" = "internal"\n'
        '"prod.example:8000" = "public"\n')
    ws2 = open_workspace(ws.home)
    try:
        c = data_policy.class_of
        assert c(ws2, dataset="chat") == "public"
        assert c(ws2, dataset="nothing") == "internal"
        assert c(ws2, dataset="chat", url="http://10.0.0.5:8000/v1") == "internal"
        # production endpoints are production, whatever data.classes says
        assert c(ws2, dataset="chat", url="https://prod.example:8000/v1") == "production"
        assert data_policy.stores_text(ws2, "internal")
        assert not data_policy.stores_text(ws2, "production")
    finally:
        ws2.close()


@pytest.mark.parametrize("cls", ["production", "public"])
def test_a_bench_serving_import_of_production_texts_keeps_only_digests(forge_home, tmp_path,
                                                                         cls):
    from infer_forge.harness.bench.importer import import_results

    ws, _ = init_workspace(forge_home)
    ws.close()
    path = forge_home / "forge.toml"
    path.write_text(path.read_text() + f'\n[data.classes]\n"prod-traffic" = "{cls}"\n')
    texts = [f"answer about {MARKER} {i}" for i in range(2)]
    line = {"completed": 2, "duration": 1.0, "request_throughput": 2.0,
            "output_throughput": 10.0, "median_ttft_ms": 5.0, "dataset_name": "prod-traffic",
            "input_lens": [3, 3], "output_lens": [5, 5], "generated_texts": texts,
            "errors": ["", ""]}
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps(line) + "\n")
    ws = open_workspace(forge_home)
    try:
        out = import_results(ws, results)
    finally:
        ws.close()
    results.unlink()  # the user's own file is not the workspace
    hits = files_with(forge_home, MARKER.encode())
    [row] = artifact_lines(forge_home, out["artifact"])
    if cls == "public":
        assert hits and row["generated_texts"] == texts
        return
    assert hits == []
    assert row["generated_texts"] == [] and row["data_class"] == "production"
    assert row["generated_texts_described"] == {
        "data_class": "production", "count": 2, "chars": [len(t) for t in texts],
        "sha256": [sha(t) for t in texts]}
    assert row["output_lens"] == [5, 5] and out["recorded"] == 1
