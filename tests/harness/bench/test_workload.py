"""The workload follows the point (issue 18, item 5): dataset, lengths, load, shared-prefix
groups and images come from the point's traffic, checked at a real scripted server that
records what it received; the SLO is the goodput definition and the default latency gates."""

from __future__ import annotations

import base64
import io
import json
import math
import urllib.request

import pytest
from infer_forge.harness.bench.client import run_bench
from infer_forge.harness.bench.datasets import Prompt, encode_text, load_tokenizer, random_prompts
from infer_forge.harness.bench.metrics import RequestRecord, compute_metrics
from infer_forge.harness.bench.request import BenchConfig
from infer_forge.harness.bench.slo import goodput_slo, slo_gates, with_slo_gates
from infer_forge.harness.bench.workload import sample_lengths, workload_for
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.loop.gates import judge
from infer_forge.harness.testing.received import image_size
from infer_forge.ledger.specs import SLO, Contract, DeploymentPoint, Distribution
from infer_forge.ledger.task import Run

from tests.conftest import run_forge
from tests.harness.bench.test_bench_client import in_flight_peak


def point(traffic: dict, modality: str = "text", slo: dict | None = None,
          modalities: tuple[str, ...] = ("text",)) -> DeploymentPoint:
    return DeploymentPoint.model_validate({
        "model": {"name": "m", "source": "x", "modalities": list(modalities)},
        "scenario": {"modality": modality, "traffic": {"concurrency": 4, **traffic},
                     "slo": slo or {}},
        "runtime_profile": {"service": "s", "rev": 1},
        "accelerator": {"vendor": "cpu", "model": "x86_64"}})


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir):
    return load_tokenizer(tiny_tokenizer_dir)


def received(url: str) -> list[dict]:
    with urllib.request.urlopen(url + "/forge/received", timeout=10) as r:
        return json.loads(r.read())


# --- lengths and datasets --------------------------------------------------------------------


def test_a_plain_text_point_sends_bench_servings_random_dataset(tok):
    w = workload_for(point({"input_len": 24, "output_len": 6, "num_prompts": 10,
                            "range_ratio": 0.5, "request_rate": 3.0}), tok)
    assert w.prompts == random_prompts(tok, 10, 24, 6, 0.5, 42)
    assert (w.endpoint, w.max_concurrency, w.request_rate, w.slo) == ("completions", 4, 3.0, None)
    cfg = w.bench_config("http://127.0.0.1:1", "m", "hf")
    assert (cfg.max_concurrency, cfg.request_rate, cfg.endpoint) == (4, 3.0, "completions")
    closed = workload_for(point({"input_len": 8, "output_len": 2, "num_prompts": 2}), tok)
    assert math.isinf(closed.request_rate) and closed.max_concurrency == 4


def test_length_distributions_are_sampled_and_seeded():
    import numpy as np

    def draw(d, n=400):
        return sample_lengths(np.random.default_rng(7), Distribution(**d), 1.0, n, "input_len")

    assert draw({"kind": "fixed", "mean": 33.4}) == [33] * 400
    u = draw({"kind": "uniform", "mean": 50, "min": 10, "max": 90})
    assert min(u) >= 10 and max(u) <= 90 and len(set(u)) > 50
    nrm = draw({"kind": "normal", "mean": 100, "std": 30, "min": 60, "max": 140})
    assert min(nrm) == 60 and max(nrm) == 140 and 90 < sum(nrm) / 400 < 110
    ln = draw({"kind": "lognormal", "mean": 200, "std": 100})
    assert min(ln) >= 1 and 180 < sum(ln) / 400 < 220 and max(ln) > 400  # the long tail
    assert draw({"kind": "lognormal", "mean": 200, "std": 100}) == ln  # seeded
    with pytest.raises(HarnessError, match="traffic.input_len: a uniform distribution needs"):
        draw({"kind": "uniform", "mean": 50})
    with pytest.raises(HarnessError, match="traffic.input_len: a normal distribution needs"):
        draw({"kind": "normal", "mean": 50})


def test_distribution_lengths_are_exact_at_token_level(tok):
    w = workload_for(point({"input_len": {"kind": "uniform", "mean": 20, "min": 5, "max": 40},
                            "output_len": {"kind": "fixed", "mean": 3}, "num_prompts": 12}), tok)
    assert {p.output_len for p in w.prompts} == {3}
    assert all(len(encode_text(tok, p.prompt)) == p.prompt_len for p in w.prompts)
    assert len({p.prompt_len for p in w.prompts}) > 3


@pytest.mark.parametrize("bad, message", [
    ({"dataset": "alpaca"}, "traffic.dataset 'alpaca': expected one of random"),
    ({"dataset": "sharegpt"}, "sharegpt needs a file"),
    ({"dataset": "random:groups=2"}, "random takes group=N"),
    ({"dataset": "sharegpt:/nonexistent/x.json"}, "file /nonexistent/x.json does not exist"),
    ({"media_count": 1, "resolution": "8x8"}, "traffic.media_count 1: scenario.modality is text"),
])
def test_a_point_the_generator_cannot_follow_is_refused_naming_the_field(tok, bad, message):
    with pytest.raises(HarnessError, match=message):
        workload_for(point({"num_prompts": 2, **bad}), tok)


@pytest.mark.parametrize("modality, traffic, modalities, message", [
    ("video", {"media_count": 1}, ("text", "video"), "makes images only"),
    ("image", {"media_count": 0}, ("text", "image"), "traffic.media_count must be ≥ 1"),
    ("image", {"media_count": 1, "resolution": "8x8"}, ("text",), "model.modalities"),
    ("multimodal", {"media_count": 1, "resolution": "big"}, ("text", "image"),
     "traffic.resolution 'big' is not WIDTHxHEIGHT"),
    ("image", {"media_count": 1}, ("text", "image"), "traffic.resolution None"),
])
def test_media_must_fit_the_scenario_and_the_model(tok, modality, traffic, modalities, message):
    with pytest.raises(HarnessError, match=message):
        workload_for(point({"num_prompts": 2, **traffic}, modality, modalities=modalities), tok)


def conversation(i: int) -> dict:
    return {"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"Question {i}: " + "how does water boil " * (1 + i % 3)},
        {"from": "gpt", "value": "It boils at one hundred degrees Celsius. " * (1 + i % 4)}]}


@pytest.mark.parametrize("form", ["json", "jsonl"])
def test_a_sharegpt_file_is_a_dataset(tok, tmp_path, form):
    rows = [conversation(i) for i in range(12)]
    rows.append({"messages": [{"role": "user", "content": "the fox jumps over the lazy dog"},
                              {"role": "assistant", "content": "the dog sleeps on"}]})
    rows.append({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt",
                                                                       "value": "hello there"}]})
    f = tmp_path / f"chats.{form}"
    f.write_text(json.dumps(rows) if form == "json" else "\n".join(map(json.dumps, rows)))
    w = workload_for(point({"num_prompts": 13, "dataset": f"sharegpt:chats.{form}"}), tok,
                     base_dir=tmp_path)
    assert w.dataset_path == str(f) and w.dataset_digest and w.dataset_digest.startswith("sha256:")
    firsts = {r["conversations"][0]["value"] if "conversations" in r else
              r["messages"][0]["content"]: r for r in rows}
    assert "hi" not in {p.prompt for p in w.prompts}  # under 4 tokens: pruned, as bench_serving
    for p in w.prompts:
        row = firsts[p.prompt]
        reply = row["conversations"][1]["value"] if "conversations" in row \
            else row["messages"][1]["content"]
        assert p.output_len == len(encode_text(tok, reply))
        assert p.prompt_len == len(encode_text(tok, p.prompt))
    with pytest.raises(HarnessError, match=r"has 13 usable conversations .* asks for 14"):
        workload_for(point({"num_prompts": 14, "dataset": f"sharegpt:{f}"}), tok)


def test_a_custom_jsonl_file_is_a_dataset_and_groups_default_to_eight(tok, tmp_path):
    (tmp_path / "p.jsonl").write_text(
        '{"prompt": "the quick brown fox", "output_len": 5}\n\n{"prompt": "lorem ipsum"}\n')
    w = workload_for(point({"num_prompts": 2, "output_len": 7, "dataset": "custom:p.jsonl"}),
                     tok, base_dir=tmp_path)
    assert [(p.prompt, p.output_len) for p in w.prompts] == [("the quick brown fox", 5),
                                                             ("lorem ipsum", 7)]
    (tmp_path / "p.jsonl").write_text('{"prompt": ""}\n')
    with pytest.raises(HarnessError, match=r"p.jsonl:1: field 'prompt' must be a non-empty"):
        workload_for(point({"num_prompts": 1, "dataset": "custom:p.jsonl"}), tok,
                     base_dir=tmp_path)
    with pytest.raises(HarnessError, match="prefix_reuse 0.5: shared prefixes are generated"):
        workload_for(point({"num_prompts": 1, "dataset": "custom:p.jsonl",
                            "prefix_reuse": 0.5}), tok, base_dir=tmp_path)
    w = workload_for(point({"input_len": 8, "output_len": 2, "num_prompts": 17,
                            "prefix_reuse": 0.5}), tok)
    assert w.groups is not None and sorted(w.groups.count(g) for g in set(w.groups)) == [1, 8, 8]


@pytest.mark.parametrize("text, message", [
    ('{"conversations": [{"from": "human", "value": "a b c d e"}]}\n{"conv": []}\n',
     r"chats.jsonl:2: field 'conversations' \(or 'messages'\) is missing"),
    ('{"conversations": [{"from": "human", "value": 3}]}\n',
     r"chats.jsonl:1: field 'conversations\[0\].value' must be a string"),
    ('\n{"conversations": [}\n', r"chats.jsonl:2: invalid JSON"),
    ('[{"conversations": []}, 7]', r"chats.jsonl: entry 1: expected a conversation object"),
    ('[{"conversations": [}]', r"chats.jsonl:1:\d+: invalid JSON"),
])
def test_a_bad_sharegpt_file_is_one_line_naming_file_and_line(tok, tmp_path, text, message):
    (tmp_path / "chats.jsonl").write_text(text)
    with pytest.raises(HarnessError, match=message) as e:
        workload_for(point({"num_prompts": 1, "dataset": "sharegpt:chats.jsonl"}), tok,
                     base_dir=tmp_path)
    assert "\n" not in str(e.value)


# --- what the server receives ------------------------------------------------------------------


def test_shared_prefix_groups_arrive_as_the_point_says(tok, scripted_server):
    url = scripted_server("--record-received", "--tokens", "2")
    pt = point({"input_len": 40, "output_len": 2, "num_prompts": 21, "prefix_reuse": 0.25,
                "dataset": "random:group=5"})
    w = workload_for(pt, tok)
    assert w.prefix_len == 10 and w.describe()["prefix_groups"] == 5
    res = run_bench(w.bench_config(url, "scripted", "scripted", warmup=0), w.prompts)
    assert all(r.success for r in res.records)
    got = received(url)
    assert len(got) == 21 and all(g["endpoint"] == "completions" for g in got)
    ids = [encode_text(tok, g["text"]) for g in got]
    assert all(len(x) == 40 for x in ids)  # exact lengths, prefix and suffix together
    groups: dict[tuple[int, ...], list[list[int]]] = {}
    for x in ids:
        groups.setdefault(tuple(x[:10]), []).append(x)
    # ceil(21 / 5) groups of 5, the last of 1; the prefix is shared, the rest is not.
    assert sorted(len(v) for v in groups.values()) == [1, 5, 5, 5, 5]
    for members in groups.values():
        assert len({tuple(m[10:]) for m in members}) == len(members)
    # Nothing longer is shared inside a group by accident of the draw: the 11th tokens differ.
    assert any(len({m[10] for m in v}) > 1 for v in groups.values() if len(v) > 1)
    # Shuffled: a group's members do not arrive one after another.
    order = [tuple(x[:10]) for x in ids]
    assert any(order[i] != order[i + 1] for i in range(4))
    # Seeded: the same point gives the same prompts.
    assert workload_for(pt, tok).prompts == w.prompts


def test_full_prefix_reuse_sends_one_text_per_group(tok):
    w = workload_for(point({"input_len": 12, "output_len": 2, "num_prompts": 6,
                            "prefix_reuse": 1.0, "dataset": "random:group=3"}), tok)
    assert len({p.prompt for p in w.prompts}) == 2 and {p.prompt_len for p in w.prompts} == {12}


def test_multimodal_requests_carry_the_points_images(tok, scripted_server):
    url = scripted_server("--record-received", "--tokens", "3")
    pt = point({"input_len": 16, "output_len": 3, "num_prompts": 5, "media_count": 3,
                "resolution": "96x40"}, "multimodal", modalities=("text", "image"))
    w = workload_for(pt, tok)
    res = run_bench(w.bench_config(url, "scripted", "scripted", warmup=0), w.prompts)
    assert all(r.success for r in res.records), [r.error for r in res.records]
    got = received(url)
    assert len(got) == 5 and all(g["path"] == "/v1/chat/completions" for g in got)
    assert all(g["image_errors"] == [] and len(g["images"]) == 3 for g in got)
    assert {(i["format"], i["width"], i["height"], i["mime"]) for g in got
            for i in g["images"]} == {("png", 96, 40, "image/png")}
    assert sorted(g["text"] for g in got) == sorted(p.prompt for p in w.prompts)
    # Fifteen distinct images (an engine's image cache must not serve one from another), and
    # they decode with a real imaging library at the point's resolution.
    urls = [u for p in w.prompts for u in p.media]
    assert len(set(urls)) == 15
    from PIL import Image

    im = Image.open(io.BytesIO(base64.b64decode(urls[0].split(",", 1)[1])))
    im.load()
    assert im.size == (96, 40) and im.mode == "RGB"
    import numpy as np

    px = np.asarray(im)  # 16×16 blocks of random colour: 6 × 3 of them, each one colour
    assert len(np.unique(px.reshape(-1, 3), axis=0)) == 18
    assert (px[:16, :16] == px[0, 0]).all() and (px[32:, 80:] == px[39, 95]).all()
    assert image_size(base64.b64decode(urls[-1].split(",", 1)[1])) == ("png", 96, 40)


def test_images_need_the_chat_endpoint(scripted_server):
    url = scripted_server()
    p = Prompt("x", 1, 1, ("data:image/png;base64,AAAA",))
    with pytest.raises(HarnessError, match="prompts with images need the chat endpoint"):
        run_bench(BenchConfig(url=url, model="scripted", engine="scripted", warmup=0), [p])


# --- the SLO: goodput and gates ------------------------------------------------------------------


def test_the_slo_is_the_goodput_definition():
    slo = SLO(ttft_ms={"p50": 100, "p99": 300}, tpot_ms={"mean": 20}, e2e_ms={"p90": 900})
    assert goodput_slo(slo) == {"ttft": 300.0, "tpot": 20.0, "e2el": 900.0}
    assert goodput_slo(SLO(throughput_floor=5)) is None
    assert [(g.name, g.metric, g.at_most) for g in slo_gates(slo)] == [
        ("slo.ttft_ms.p50", "median_ttft_ms", 100.0), ("slo.ttft_ms.p99", "p99_ttft_ms", 300.0),
        ("slo.tpot_ms.mean", "mean_tpot_ms", 20.0),
        ("slo.e2e_ms.p90", "p90_e2e_latency_ms", 900.0)]
    floor = slo_gates(SLO(throughput_floor=5))
    assert [(g.name, g.metric, g.at_least) for g in floor] == [
        ("slo.throughput_floor", "output_throughput", 5.0)]


def bench_serving_goodput(records: list[RequestRecord], duration: float,
                          slo_ms: dict[str, float]) -> tuple[float, float]:
    """bench_serving's formula, written out directly (../shared/REFERENCE.md): over the
    successful requests, zip each one's TTFT, TPOT (0 for one output token) and E2E with the
    configured SLOs; good when every one is within (s >= r); goodput = good / duration;
    attainment = good / all requests (failed ones stay in the denominator)."""
    ok = [r for r in records if r.success]
    columns, limits = [], []
    if "ttft" in slo_ms:
        columns.append([r.ttft for r in ok])
        limits.append(slo_ms["ttft"] / 1000)
    if "tpot" in slo_ms:
        columns.append([(r.e2e - r.ttft) / (r.output_len - 1) if r.output_len > 1 else 0.0
                        for r in ok])
        limits.append(slo_ms["tpot"] / 1000)
    if "e2el" in slo_ms:
        columns.append([r.e2e for r in ok])
        limits.append(slo_ms["e2el"] / 1000)
    good = sum(all(s >= r for s, r in zip(limits, req, strict=True))
               for req in zip(*columns, strict=True))
    return good / duration, good / len(records)


def test_the_points_slo_yields_bench_servings_goodput(tok, scripted_server):
    # 5 ms to the first token, 5 ms per token after it; outputs of 2..20 tokens; every 7th
    # request fails. An E2E bound of 60 ms splits the requests into good and bad.
    url = scripted_server("--first-token-ms", "5", "--itl-ms", "5", "--fail-every", "7")
    pt = point({"input_len": 8, "output_len": 20, "range_ratio": 0.1, "num_prompts": 28},
               slo={"ttft_ms": {"p50": 20, "p99": 200}, "tpot_ms": {"p90": 50},
                    "e2e_ms": {"p99": 60}})
    w = workload_for(pt, tok)
    assert w.slo == {"ttft": 200.0, "tpot": 50.0, "e2el": 60.0}
    res = run_bench(w.bench_config(url, "scripted", "scripted", warmup=0), w.prompts)
    m = res.metrics
    goodput, attainment = bench_serving_goodput(res.records, res.duration_s, w.slo)
    assert m["request_goodput"] == pytest.approx(goodput, rel=1e-12)
    assert m["slo_attainment"] == pytest.approx(attainment, rel=1e-12)
    good = round(attainment * len(res.records))
    assert m["failed"] == 4 and 0 < good < m["completed"]  # the bounds decided something
    # From the stored records alone (as a later reader has them), the same figures.
    rows = [json.loads(x) for x in res.records_jsonl().splitlines()]
    again = compute_metrics(rows, res.duration_s, w.slo)
    assert again["request_goodput"] == m["request_goodput"]
    assert again["slo_attainment_by_metric"] == m["slo_attainment_by_metric"]


def runs(**metrics: float) -> list[Run]:
    return [Run(dict(metrics)) for _ in range(3)]


def test_the_slo_becomes_the_default_latency_gates():
    pt = point({"num_prompts": 2}, slo={"ttft_ms": {"p99": 200}, "tpot_ms": {"p50": 30},
                                        "throughput_floor": 100})
    bare = Contract.model_validate({"gates": [
        {"name": "throughput", "metric": "output_throughput", "vs_baseline": "ratio",
         "at_least": 1.05}]})
    measured = runs(p99_ttft_ms=150, median_tpot_ms=35, output_throughput=120)
    c = with_slo_gates(bare, pt, measured, None)
    assert [g.name for g in c.gates] == ["throughput", "slo.ttft_ms.p99", "slo.tpot_ms.p50",
                                         "slo.throughput_floor"]
    verdict = judge(c, measured, None, skip_relative=True)
    by = {g.name: g.verdict for g in verdict.gates}
    assert by == {"slo.ttft_ms.p99": "pass", "slo.tpot_ms.p50": "fail",
                  "slo.throughput_floor": "pass"}
    assert verdict.verdict == "fail"  # 35 ms per token misses the point's 30 ms
    # An explicit latency gate: the contract's own word on latency; the floor still applies.
    own = Contract.model_validate({"gates": [
        {"name": "ttft", "metric": "median_ttft_ms", "at_most": 500}]})
    assert [g.name for g in with_slo_gates(own, pt, measured).gates] == [
        "ttft", "slo.throughput_floor"]
    # Runs that do not report a metric (a command evaluator's own): no gate on it.
    assert with_slo_gates(bare, pt, runs(throughput=3.0), None) is bare
    only_ttft = with_slo_gates(bare, pt, runs(p99_ttft_ms=1.0), None)
    assert [g.name for g in only_ttft.gates] == ["throughput", "slo.ttft_ms.p99"]
    # The baseline's metrics count too; a point without an SLO adds nothing.
    assert len(with_slo_gates(bare, pt, [], measured).gates) == 4
    assert with_slo_gates(bare, point({"num_prompts": 2}), measured) is bare


# --- the embedded engine (slow) -----------------------------------------------------------------


@pytest.mark.slow
def test_a_text_point_against_real_transformers_serve(hf_server):
    tok = load_tokenizer(hf_server.model_dir)
    pt = point({"input_len": 24, "output_len": 4, "num_prompts": 6, "prefix_reuse": 0.5,
                "dataset": "random:group=3", "concurrency": 2},
               slo={"ttft_ms": {"p99": 60000}, "tpot_ms": {"p99": 60000}})
    w = workload_for(pt, tok)
    assert w.slo == {"ttft": 60000.0, "tpot": 60000.0}
    res = run_bench(w.bench_config(hf_server.base_url, str(hf_server.model), "hf"), w.prompts)
    assert all(r.success for r in res.records), [r.error for r in res.records]
    m = res.metrics
    assert m["completed"] == 6 and m["total_input_tokens"] == 6 * 24
    assert m["total_output_tokens"] == 6 * 4  # random weights run to max_tokens
    assert 1 <= in_flight_peak(res.records) <= 2
    # Generous bounds: every request is good, and goodput is bench_serving's.
    assert m["slo_attainment"] == 1.0
    assert m["request_goodput"] == pytest.approx(
        bench_serving_goodput(res.records, res.duration_s, w.slo)[0])
    heads = {tuple(encode_text(tok, p.prompt)[:12]) for p in w.prompts}
    assert len(heads) == 2


# --- forge bench --point ---------------------------------------------------------------------

POINT_YAML = """\
name: vl-point
model: {name: vl, source: /m, modalities: [text, image]}
scenario:
  modality: multimodal
  traffic: {input_len: 24, output_len: 3, concurrency: 2, num_prompts: 6, prefix_reuse: 0.5,
            dataset: "random:group=3", media_count: 2, resolution: 40x24}
  slo: {ttft_ms: {p50: 900, p99: 5000}, e2e_ms: {p99: 9000}}
runtime_profile: {service: vl, rev: 1}
accelerator: {vendor: cpu, model: x86_64}
"""


def test_forge_bench_point_sends_the_points_workload(tmp_path, scripted_server,
                                                     tiny_tokenizer_dir):
    url = scripted_server("--record-received", "--tokens", "3")
    pf = tmp_path / "point.yaml"
    pf.write_text(POINT_YAML)
    base = ("bench", "--point", str(pf), "--url", url, "--model", "scripted", "--engine",
            "scripted", "--tokenizer", str(tiny_tokenizer_dir), "--warmup", "0")
    r = run_forge(*base, "--json", home=tmp_path / "home")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["workload"]["prefix_groups"] == 2 and out["workload"]["media_count"] == 2
    assert out["metrics"]["goodput_slos_ms"] == {"ttft": 5000.0, "e2el": 9000.0}
    assert out["metrics"]["completed"] == 6 and "request_goodput" in out["metrics"]
    assert out["config"]["endpoint"] == "chat" and out["config"]["max_concurrency"] == 2
    got = received(url)
    assert len(got) == 6 and all(len(g["images"]) == 2 for g in got)
    assert {(i["width"], i["height"]) for g in got for i in g["images"]} == {(40, 24)}
    # The point sets the workload: a flag that would change it is a usage error.
    r = run_forge(*base, "--input-len", "5", home=tmp_path / "home")
    assert r.returncode == 2 and "--point sets the workload; drop --input-len" in r.stderr
    pf.write_text(POINT_YAML.replace('"random:group=3"', "sharegpt:chats.json")
                  .replace("prefix_reuse: 0.5,", ""))
    (tmp_path / "chats.json").write_text('[{"conversations": 5}]')
    r = run_forge(*base, home=tmp_path / "home")
    assert r.returncode == 1
    assert f"{tmp_path / 'chats.json'}: entry 0: field 'conversations' must be a list" \
        in r.stderr and len(r.stderr.strip().splitlines()) == 1


# --- the loop's engine evaluator ---------------------------------------------------------------


def test_the_engine_evaluator_benchmarks_the_points_workload(workspace, tmp_path,
                                                             scripted_server, tiny_tokenizer_dir):
    import shutil

    from infer_forge.harness.loop.engine_evaluator import EngineEvaluator
    from infer_forge.harness.loop.evaluator_protocol import EvalContext
    from infer_forge.ledger.specs import load_profile, load_task

    from tests.conftest import REPO

    model = tmp_path / "model"
    shutil.copytree(tiny_tokenizer_dir, model)
    (model / "config.json").write_text("{}")
    url = scripted_server("--record-received", "--tokens", "3")
    pt = point({"input_len": 16, "output_len": 3, "num_prompts": 4, "concurrency": 2,
                "media_count": 2, "resolution": "32x16"}, "image",
               slo={"ttft_ms": {"p99": 30000}}, modalities=("text", "image"))
    pt = pt.model_copy(update={"model": pt.model.model_copy(update={"source": str(model)})})
    prof = load_profile(REPO / "examples/profiles/tiny-cpu.yaml").model_copy(update={
        "engine": "external", "endpoint": url, "config": {"model": "scripted"}})
    task = load_task(REPO / "examples/tasks/tune-tiny-cpu.yaml")
    runs = EngineEvaluator(workspace, task).evaluate(
        {}, repeats=2, ctx=EvalContext(workspace, "t", "b1", pt, prof))
    assert [r.success for r in runs] == [True, True], runs
    wl = runs[0].meta["workload"]
    assert (wl["media_count"], wl["resolution"], wl["endpoint"]) == (2, "32x16", "chat")
    assert runs[0].metrics["goodput_slos_ms.ttft"] == 30000.0
    assert runs[0].metrics["slo_attainment"] == 1.0 and runs[0].metrics["request_goodput"] > 0
    chats = [g for g in received(url) if g["endpoint"] == "chat"]
    # Warm-up windows (concurrency 2 each) and two repeats of four, each with the point's two
    # images.
    assert len(chats) == 2 * runs[0].meta["warmup"]["windows"] + 2 * 4
    assert {(i["width"], i["height"]) for g in chats for i in g["images"]} == {(32, 16)}
    assert all(len(g["images"]) == 2 for g in chats)
    # A point the generator cannot follow: a failed run saying why, nothing sent.
    before = len(received(url))
    video = pt.model_copy(update={"scenario": pt.scenario.model_copy(update={
        "modality": "video"})})
    (bad,) = EngineEvaluator(workspace, task).evaluate(
        {}, repeats=1, ctx=EvalContext(workspace, "t", "b2", video, prof))
    assert not bad.success and bad.error is not None
    assert bad.error.startswith("workload: scenario.modality video")
    assert len(received(url)) == before


def test_the_loop_judges_the_points_slo_when_the_contract_leaves_latency_to_it(workspace,
                                                                                tmp_path):
    """The same sweep as test_loop's full run, its contract without the TTFT gate: the point's
    SLO (tiny-cpu: TTFT p50 ≤ 500 ms) rejects the slow candidate in its place."""
    from infer_forge.harness.loop.define import define_task
    from infer_forge.harness.loop.run import run_task
    from infer_forge.projections.memory import task_memory

    from ..loop.test_loop import make_task_dir

    path = make_task_dir(tmp_path / "specs")
    text = path.read_text()
    gate = "    - {name: ttft-slo, metric: median_ttft_ms, at_most: 500}\n"
    assert gate in text
    path.write_text(text.replace(gate, ""))
    define_task(workspace, path)
    result = run_task(workspace, "t1")
    assert (result.exit_state, result.blocks) == ("delivered", 4)
    mem = task_memory(workspace.ledger, "t1")
    assert [b.decision for b in mem.execution_record] == [None, "rejected", "rejected",
                                                          "accepted"]
    assert "slo.ttft_ms.p50 fail" in mem.rejected[1]["reason"]
    assert "900" in mem.rejected[1]["reason"] and "500" in mem.rejected[1]["reason"]
    ver = [r.event for r in workspace.ledger.stream("task:t1")
           if r.type == "VerificationRecorded"]
    names = [[g.name for g in v.gates] for v in ver]
    assert len(names) == 4
    # The evaluator reports a median TTFT, not a TPOT: only the TTFT bound is judged.
    assert all(n[-1] == "slo.ttft_ms.p50" and "slo.tpot_ms.p50" not in n for n in names)
