"""Greedy token-match rate: the pure function, and collection from a real local server."""

from __future__ import annotations

import pytest
from infer_forge.harness.bench.correctness import (
    DEFAULT_PROMPTS,
    collect_greedy_outputs,
    compare_outputs,
    record_correctness,
    token_match,
)
from infer_forge.harness.bench.datasets import load_tokenizer
from infer_forge.harness.errors import HarnessError

from tests.helpers.tasks import measurements, open_task


def test_identical_outputs_match_fully():
    rate, per = token_match([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]])
    assert rate == 1.0 and all(p["exact"] and p["first_mismatch"] is None for p in per)


def test_divergence_counts_only_the_matched_prefix():
    # Prompt 0 diverges at token 2 (later agreement does not count); prompt 1 stops early.
    rate, per = token_match([[1, 2, 3, 4], [5, 6, 7, 8]], [[1, 2, 9, 4], [5, 6]])
    assert [p["matched_prefix"] for p in per] == [2, 2]
    assert [p["first_mismatch"] for p in per] == [2, 2]
    assert per[0]["match"] == 0.5 and per[1]["match"] == 0.5
    assert rate == pytest.approx(4 / 8)
    longer, per2 = token_match([[1, 2]], [[1, 2, 3, 4]])  # running on also loses
    assert longer == 0.5 and not per2[0]["exact"]


def test_empty_outputs_and_mismatched_sets():
    assert token_match([[]], [[]])[0] == 1.0
    assert token_match([[1]], [[]])[0] == 0.0
    with pytest.raises(HarnessError, match="same prompt set"):
        token_match([[1]], [[1], [2]])


def test_collect_from_a_server_and_compare(scripted_server, tiny_tokenizer_dir, workspace,
                                           tmp_path):
    tok = load_tokenizer(tiny_tokenizer_dir)
    url = scripted_server()
    base = collect_greedy_outputs(url, "scripted", tok, max_tokens=6, engine="scripted")
    again = collect_greedy_outputs(url, "scripted", tok, max_tokens=6, engine="scripted")
    assert len(base) == len(DEFAULT_PROMPTS) and all(o.success and o.token_ids for o in base)
    assert base[0].token_ids == list(tok.encode(base[0].text, add_special_tokens=False))
    rate, per = compare_outputs(base, again)
    assert rate == 1.0 and len(per) == len(DEFAULT_PROMPTS)
    # A candidate server that stops after 3 tokens: every prompt loses its tail.
    short_url = scripted_server("--tokens", "3")
    short = collect_greedy_outputs(short_url, "scripted", tok, max_tokens=6, engine="scripted")
    rate_s, per_s = compare_outputs(base, short)
    assert 0.0 < rate_s < 1.0 and not any(p["exact"] for p in per_s)
    # A candidate whose requests fail scores 0 and keeps the error per prompt.
    failing = scripted_server("--fail-every", "1")
    bad = collect_greedy_outputs(failing, "scripted", tok, max_tokens=6, engine="scripted")
    rate_f, per_f = compare_outputs(base, bad)
    assert rate_f == 0.0 and "HTTP 500" in per_f[0]["error"]
    block = open_task(workspace, tmp_path, "t")
    ev = record_correctness(workspace, rate_s, per_s, short, task_id="t", block_id=block)
    (got,) = measurements(workspace, "t")
    assert got.metrics["token_match"] == pytest.approx(rate_s)
    assert got.metrics["prompts"] == len(DEFAULT_PROMPTS)
    assert len(got.meta["per_prompt"]) == len(DEFAULT_PROMPTS) and got.block_id == block
    assert workspace.artifacts.exists(ev.artifact_digest)
