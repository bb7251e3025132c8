"""Human titles (ledger/titles.py): a candidate's from its keys and values, a task's from its
goal when it was given none."""

from __future__ import annotations

from infer_forge.ledger.titles import (
    candidate_title,
    candidate_title_of_key,
    dimension_value,
    task_title,
)

GOAL = ("Raise output throughput at concurrency 8 and meet the TTFT SLO without changing the "
        "outputs")


def test_a_candidate_reads_as_settings_then_switches():
    cand = {"engine.continuous_batching": False, "engine.dtype": "bfloat16"}
    assert candidate_title(cand) == "dtype=bfloat16, continuous batching off"
    assert candidate_title({"engine.cuda_graph": True}) == "cuda graph on"
    assert candidate_title({}) == candidate_title(None) == "baseline"
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert candidate_title({"code.sglang": commit, "prefill.tp": 2,
                            "topology.architecture": "pd", "profile.image": "x:1"}) == (
        "sglang@0123456, prefill.tp=2, image=x:1, architecture=pd")
    assert candidate_title({"engine.max_running_requests": [8, 16]}) == (
        "max_running_requests=[8, 16]")


def test_the_index_key_reads_the_same():
    assert candidate_title_of_key('{"engine.continuous_batching":true,"engine.dtype":"float32"}'
                                  ) == "dtype=float32, continuous batching on"
    assert candidate_title_of_key("{}") == candidate_title_of_key(None) == "baseline"
    assert candidate_title_of_key("not json") == "not json"
    assert candidate_title_of_key("[1]") == "[1]"


def test_a_compared_dimension_reads_its_candidate_by_title():
    assert dimension_value("candidate_key", '{"engine.dtype":"bfloat16"}') == "dtype=bfloat16"
    assert dimension_value("candidate_key", "{}") == "baseline"
    assert dimension_value("candidate_key", '{"engine.continuous_batching":true}, {}, '
                           '{"x":"a, b"}') == "continuous batching on; baseline; x=a, b"
    assert dimension_value("candidate_key", "{}, not json") == "baseline; not json"
    assert dimension_value("model", "Qwen3-8B") == "Qwen3-8B"
    assert dimension_value("repo_snapshot", None) == ""


def test_a_task_title_is_a_whole_clause_never_a_cut_word():
    assert task_title(None, GOAL) == (
        "Raise output throughput at concurrency 8 and meet the TTFT SLO")
    assert task_title(GOAL[:80], GOAL) == task_title(None, GOAL)  # forge's cut title
    assert task_title("Tune Qwen on H200", GOAL) == "Tune Qwen on H200"
    assert task_title(None, "Short goal") == "Short goal"
    words = " ".join(["throughput"] * 12)  # no clause end: cut at a word, marked
    title = task_title(None, words)
    assert title.endswith("…") and title[:-1].split(" ")[-1] == "throughput"
    assert len(title) <= 73
