"""forge weights pull: the generated tiny-llama (deterministic digest, loadable, idempotent),
hub ids through the real huggingface_hub call (offline here -> a clear error)."""

from __future__ import annotations

import json
import os

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.models.weights import (
    MANIFEST,
    TINY_LLAMA,
    fetch_model,
    file_hashes,
    manifest_digest,
    model_path,
    parse_name,
    pull,
    verify_model,
)

from tests.conftest import run_forge


def test_tiny_llama_same_digest_in_two_homes_and_processes(tmp_path, tiny_model):
    """Pulled in-process (session fixture) and by the real CLI in another process with another
    hash seed and one torch thread: byte-identical files, the same digest."""
    home = tmp_path / "other-home"
    assert run_forge("init", home=home).returncode == 0
    r = run_forge("weights", "pull", "tiny-llama", "--json", home=home,
                  env={"PYTHONHASHSEED": "4242", "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    first = json.loads((tiny_model / MANIFEST).read_text())
    assert out["digest"] == first["digest"]
    assert out["reused"] is False
    assert file_hashes(home / "models" / "tiny-llama") == first["files"]
    assert set(first["files"]) == {"config.json", "generation_config.json", "model.safetensors",
                                   "special_tokens_map.json", "tokenizer.json",
                                   "tokenizer_config.json"}
    assert first["digest"] == manifest_digest(first["files"])


def test_tiny_llama_loads_with_transformers(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    assert len(tok) == TINY_LLAMA["vocab_size"]  # every id the model emits decodes
    assert tok.bos_token == "<|begin_of_text|>" and tok.eos_token == "<|end_of_text|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>")
    assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = tok("The harbour was quiet.")["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) < 12  # trained merges, not bytes
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.hidden_size == 256 and model.config.num_hidden_layers == 4
    n = sum(p.numel() for p in model.parameters())
    assert 4_000_000 < n < 6_000_000
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    assert out.shape[1] == len(ids) + 8


def test_pull_is_idempotent_and_recorded_once(workspace):
    first = pull(workspace, "tiny-llama")
    weights = first.path / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    second = pull(workspace, "forge:tiny-llama")
    assert (first.reused, second.reused) == (False, True)
    assert second.digest == first.digest and weights.stat().st_mtime_ns == mtime
    events = [r.event for r in workspace.ledger.stream("workspace")
              if r.type == "ModelPulled"]
    assert len(events) == 1
    assert events[0].digest == first.digest and events[0].recipe == TINY_LLAMA
    assert model_path(workspace.home, "tiny-llama") == first.path


def test_corrupted_model_is_detected_and_rebuilt(tmp_path):
    pulled = fetch_model(tmp_path, "tiny-llama")
    cfg = pulled.path / "config.json"
    cfg.write_text(cfg.read_text().replace('"hidden_size": 256', '"hidden_size": 512'))
    (pulled.path / "stray.txt").write_text("x")
    problems = verify_model(pulled.path)
    assert any("config.json: sha256" in p for p in problems)
    assert any("stray.txt: not in manifest" in p for p in problems)
    again = fetch_model(tmp_path, "tiny-llama")
    assert again.reused is False and again.digest == pulled.digest
    assert verify_model(again.path) == []
    assert not (again.path / "stray.txt").exists()
    assert [p.name for p in (tmp_path / "models").iterdir() if p.name.startswith(".tmp")] == []


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"},
                                 {"HF_ENDPOINT": "http://127.0.0.1:9"}])
def test_hub_id_without_network_fails_clearly(workspace, monkeypatch, env):
    """The real snapshot_download call; offline mode, or a hub that refuses connections."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(HarnessError) as e:
        pull(workspace, "acme/chat-model@v2")
    msg = str(e.value)
    assert msg.startswith("cannot download acme/chat-model: no network access to the model hub")
    assert "\n" not in msg
    models = workspace.home / "models"
    assert not (models / "acme--chat-model").exists()
    assert [p.name for p in models.iterdir() if p.is_dir()] == []
    assert not [r for r in workspace.ledger.stream("workspace") if r.type == "ModelPulled"]


def test_cli_error_is_one_line(tmp_path):
    home = tmp_path / "h"
    run_forge("init", home=home)
    r = run_forge("weights", "pull", "acme/chat-model", home=home,
                  env={"HF_HUB_OFFLINE": "1"})
    assert r.returncode == 1
    assert r.stderr.startswith("Error: cannot download acme/chat-model: no network access")
    assert len(r.stderr.strip().splitlines()) == 1


def test_names(tmp_path):
    assert parse_name("tiny-llama") == ("recipe", "tiny-llama", None)
    assert parse_name("hf:org/m@abc") == ("hub", "org/m", "abc")
    for bad in ("forge:nope", "just-a-name", "a/b/c", "../x"):
        with pytest.raises(HarnessError):
            parse_name(bad)
    with pytest.raises(HarnessError, match="run `forge weights pull tiny-llama`"):
        model_path(tmp_path, "tiny-llama")


def test_tokenizer_training_is_single_threaded_and_restores_env(monkeypatch):
    from infer_forge.harness.models.weights import train_tokenizer

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    a = train_tokenizer(TINY_LLAMA).to_str()
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
    assert train_tokenizer(TINY_LLAMA).to_str() == a
