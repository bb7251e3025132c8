"""The MMLU quick suite as lm_eval defines it (`mmlu_generative`: 57 subject tasks, the
answer letter), `limit` items per subject, read offline from a datasets cache in the hub's
layout, against scripted engines: item ids `<task>/<doc_id>`, one revision per subject,
and the paired judgement over the group's items."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml
from infer_forge.harness.bench.accuracy import judge_accuracy, run_task
from infer_forge.harness.testing.scripted_arith import ScriptedArith
from infer_forge.ledger.correctness import suite

from tests.conftest import need
from tests.helpers.hf_datasets import hub_cache

HAVE_LM_EVAL = importlib.util.find_spec("lm_eval") is not None
SHA = "c30699e8356da336a370243923dbaf21066bb9fe"
LIMIT = 2


def subjects() -> list[str]:
    import lm_eval

    d = Path(lm_eval.__file__).parent / "tasks" / "mmlu" / "generative"
    return sorted(yaml.safe_load(f.read_text())["dataset_name"]
                  for f in d.glob("mmlu_*.yaml"))


def _row(subject: str, a: int, b: int) -> dict:
    # the right value is choice B; C is the value + 1 a corrupting engine answers
    v = a + b
    return {"question": f"What is {a} + {b}?", "subject": subject,
            "choices": [str(v - 1), str(v), str(v + 1), str(v + 2)], "answer": 1}


@pytest.mark.slow
def test_mmlu_quick_reads_every_subject_and_pairs_by_item(tmp_path, monkeypatch):
    need(HAVE_LM_EVAL, "lm_eval not installed (pip install 'infer-forge[accuracy]')")
    import datasets.config
    import huggingface_hub.constants

    names = subjects()
    assert len(names) == 57
    cache = tmp_path / "cache"
    for k, s in enumerate(names):
        hub_cache(cache, tmp_path / "src" / s, "cais/mmlu", s,
                  {"test": [_row(s, 10 * k + i, i + 3) for i in range(3)],
                   "dev": [_row(s, 5 + i, 1) for i in range(5)]}, SHA)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    quick = suite("mmlu-quick")  # its task and endpoint; fewer items per subject here
    assert (quick.task, quick.limit, quick.items) == ("mmlu_generative", 5, 285)
    with ScriptedArith() as good, ScriptedArith(corrupt_every=4) as bad:
        base = run_task(good.url, "scripted-arith", quick.task, include_path=None,
                        limit=LIMIT, endpoint=quick.endpoint)
        cand = run_task(bad.url, "scripted-arith", quick.task, include_path=None,
                        limit=LIMIT, endpoint=quick.endpoint)
        altered = len(bad.altered)
    n = 57 * LIMIT
    assert len(base.items) == len(cand.items) == n
    ids = [i for i, _ in base.items]
    assert ids[0] == "mmlu_abstract_algebra_generative/0"
    assert {i.rsplit("/", 1)[1] for i in ids} == {str(d) for d in range(LIMIT)}
    assert base.accuracy == 1.0  # every answer letter right
    assert altered == n // 4 and cand.accuracy == pytest.approx(1 - altered / n)
    tasks = base.dataset["tasks"]
    assert len(tasks) == 57 and {t["revision"] for t in tasks.values()} == {SHA}
    assert tasks["mmlu_anatomy_generative"]["dataset_path"] == "cais/mmlu"
    assert tasks["mmlu_anatomy_generative"]["dataset_name"] == "anatomy"
    assert base.dataset["items_digest"] == cand.dataset["items_digest"]
    assert set(base.dataset["n_shot"].values()) == {0} and base.dataset["endpoint"] == "chat"
    r = judge_accuracy(base, cand, margin=0.02)
    assert r.verdict == "fail" and r.n == n, r.reason
    assert judge_accuracy(base, base).verdict == "pass"
