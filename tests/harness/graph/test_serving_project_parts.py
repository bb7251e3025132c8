"""The serving-project example's real parts, one by one (the whole graph runs in
test_graph_run.py): the flag gate with the vendored release's own parser, and with the flag
table in fast mode; the production endpoint's replay as SGLang /metrics."""

from __future__ import annotations

import importlib.util
import json

import pytest
from infer_forge.harness.diagnose.collect import to_scrape

from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "graphs" / "serving-project"


def _load(name: str, path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def tasks(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_WORKDIR", str(tmp_path))
    monkeypatch.setenv("FORGE_NODE", "tune-runtime-profile")
    return _load("serving_project_tasks", EXAMPLE / "tasks.py")


def test_the_flag_gate_is_the_vendored_releases_parser(tasks, tmp_path, capsys):
    from tests.helpers import real_sglang

    root = real_sglang.release(tasks.SGLANG_VERSION)  # holds sglang/, as the member's python/
    (tmp_path / "member").mkdir()
    (tmp_path / "member" / "python").symlink_to(root)
    tasks.SGLANG, tasks.FAST = tmp_path / "member", False
    good = {"chunked_prefill_size": 512, "max_running_requests": 96,
            "moe_runner_backend": "triton", "cuda_graph_max_bs_decode": 32}
    assert tasks.check_flags(good) == {"flags_rejected": 0,
                                       "flags_parser": "sglang 0.5.23 (vendored)"}
    # 0.5.23 split --cuda-graph-max-bs into -decode/-prefill: the short form is ambiguous
    bad = {"chunked_prefill_size": 512, "cuda_graph_max_bs": 32}
    assert tasks.check_flags(bad)["flags_rejected"] == 2
    assert "ambiguous option: --cuda-graph-max-bs" in capsys.readouterr().err
    argv = json.loads((tmp_path / "out" / "tune-runtime-profile" / "argv.json").read_text())
    assert argv == [["--model-path", "serving-project", "--chunked-prefill-size", "512",
                     "--cuda-graph-max-bs", "32"]]


def test_fast_mode_checks_the_flags_against_the_table(tasks, capsys):
    tasks.FAST = True
    assert tasks.check_flags({"moe_runner_backend": "triton", "cuda_graph_max_bs_decode": 8}
                             )["flags_rejected"] == 0
    assert tasks.check_flags({"moe_runner_backend": "no-such-backend"})["flags_rejected"] == 1
    assert "no-such-backend" in capsys.readouterr().err


def test_the_production_endpoint_replays_the_hour_as_sglang_metrics():
    serve = _load("serving_project_serve", EXAMPLE / "prod-endpoint" / "serve.py")
    hour = serve.SAMPLES
    assert len(hour) == 60
    scrapes = [to_scrape(float(k), serve.page(k), "prod") for k in range(62)]
    for k, s in enumerate(scrapes):  # minute k mod 60: its gauges
        m = hour[k % 60]
        assert s.values["num_queue_reqs"] == m["queue_depth"], k
        assert s.values["num_running_reqs"] == m["running"], k
    # the counter keeps counting through the loop: round(arrivals/s * 60) a minute
    totals = [s.values["num_requests_total"] for s in scrapes]
    assert [b - a for a, b in zip(totals, totals[1:], strict=False)] == \
        [round(hour[k % 60]["arrivals_per_s"] * 60) for k in range(1, 62)]
    # each minute's requests: first-token times spread up to its recorded TTFT p99
    n, ttft = serve.minute_requests(hour[7])
    assert len(ttft) == n and max(ttft) == pytest.approx(hour[7]["ttft_p99_ms"] / 1000)
