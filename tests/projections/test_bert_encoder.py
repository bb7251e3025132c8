"""The journal's MiniLM in numpy (projections/bert_encoder.py) against sentence-transformers
on the same model files: the same vectors to float32 rounding, the same `forge retrieve`
hits on a fixed workspace, and a first query without torch or a progress bar (issue 33)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from infer_forge.projections import bert_encoder
from infer_forge.projections import embed as E
from infer_forge.wiki import retrieve as R

from tests.conftest import REPO
from tests.helpers.index_ledger import build as build_ledger

TEXTS = [
    "why was bfloat16 rejected",
    "",
    "   padded with spaces   ",
    "Continuous batching raised output throughput 3.5x and met the TTFT SLO (96.6 ms p50).",
    "Crème brûlée — naïve façade, 東京, emoji 🚀 and MIXED case",
    "rejected: token match 0.451 < 0.99 " * 60,  # past 256 tokens: truncated as ST does
    "a",
]
QUERIES = ["why was bfloat16 rejected", "why was the DeepGEMM MoE runner rejected on H20?",
           "continuous batching hurt throughput on CPU", "accepted chunked prefill on H200",
           "which task ran out of budget", "handoff: next try eager attention"]


@pytest.fixture(scope="module")
def st_model():
    """sentence-transformers' model on the same files (the path forge took before)."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(E.model_path(None), device="cpu", local_files_only=True)


def test_the_default_model_loads_as_the_numpy_encoder():
    model = E.load_model(None)
    assert isinstance(model, bert_encoder.BertEncoder)
    assert model.max_seq_length == 256 and model.layers == 6 and model.hidden == 384


def test_vectors_match_sentence_transformers(st_model):
    ours = E.load_model(None).encode(TEXTS, batch_size=3, normalize_embeddings=True)
    theirs = st_model.encode(TEXTS, batch_size=3, normalize_embeddings=True,
                             convert_to_numpy=True, show_progress_bar=False)
    assert ours.dtype == np.float32 and ours.shape == (len(TEXTS), 384)
    cos = (ours * theirs).sum(1)
    assert cos.min() > 0.99999, cos
    assert np.abs(ours - theirs).max() < 2e-5
    # Batched or one at a time (padding masked out): the same vector.
    alone = np.stack([E.encode_query(t) for t in TEXTS])
    assert np.abs(alone - ours).max() < 2e-5


def test_retrieve_returns_the_hits_sentence_transformers_returned(workspace, st_model,
                                                                  monkeypatch):
    build_ledger(workspace)
    cache = workspace.home / "wiki" / "_embeddings.npz"

    def hits() -> list[list[tuple[str, float]]]:
        R._WARM.clear()
        cache.unlink(missing_ok=True)  # every corpus vector from this run's encoder
        return [[(x["id"], x["score"]) for x in R.retrieve(workspace, q, k=8)["results"]]
                for q in QUERIES]

    after = hits()
    monkeypatch.setitem(E._MODELS, E.model_path(None), st_model)  # the path before
    before = hits()
    for q, b, a in zip(QUERIES, before, after, strict=True):
        assert [i for i, _ in a] == [i for i, _ in b], q
        assert np.allclose([s for _, s in a], [s for _, s in b], atol=2e-4), q
    assert len(after[0]) == 8


def test_a_first_query_loads_no_torch_and_draws_nothing_on_stderr(workspace):
    build_ledger(workspace)
    code = (
        "import json, sys\n"
        "from click.testing import CliRunner\n"
        "from infer_forge.cli import main\n"
        f"r = CliRunner().invoke(main, ['--home', {str(workspace.home)!r}, 'retrieve',\n"
        "    'why was bfloat16 rejected', '--json'])\n"
        "print(json.dumps({'exit': r.exit_code, 'stderr': r.stderr, 'out': r.stdout,\n"
        "  'heavy': sorted(m for m in ('torch', 'transformers', 'sentence_transformers')\n"
        "                  if m in sys.modules)}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=str(REPO), timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["exit"] == 0 and got["stderr"] == "", got
    assert got["heavy"] == []
    assert json.loads(got["out"])["results"]


def test_a_model_of_another_shape_falls_back_or_says_why(tmp_path):
    # Not a sentence-transformers directory at all: one line naming the path.
    with pytest.raises(bert_encoder.Unsupported, match="modules.json"):
        bert_encoder.load(tmp_path)
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"}]))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    with pytest.raises(bert_encoder.Unsupported, match="pooling"):
        bert_encoder.load(tmp_path)
    # Through embed.load_model a broken directory of another shape is an EmbeddingError, one
    # line (sentence-transformers tried it).
    with pytest.raises(E.EmbeddingError, match="cannot load embedding model") as e:
        E.load_model(str(tmp_path))
    assert "\n" not in str(e.value)
