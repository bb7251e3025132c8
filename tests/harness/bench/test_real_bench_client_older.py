"""Older releases' own bench clients (`python -m sglang.bench_serving` of 0.5.1 and 0.4.0,
from the released wheels, under the kit) against the stand-in server, each backend the
release has; their outputs imported with the right generation and version, and held against
the committed golden outputs (tests/data/sglang/golden/bench/sglang-VERSION.jsonl).
One child process per release, the two at once."""

from __future__ import annotations

import pytest
from infer_forge.harness.bench.importer import Given, parse_results

from tests.helpers import real_bench_client as C

VERSIONS = ("0.5.1", "0.4.0")
# The generation each release's keys put it in (importer.GENERATIONS).
GENERATION = {"0.5.1": "0.4.3.post3–0.5.3",  # the keys of every client 0.4.3.post3 … 0.5.3
              "0.4.0": "0.4.0–0.4.1.post4"}  # no request_throughput, no mean/p99 TTFT


@pytest.fixture(scope="module")
def outputs(tiny_tokenizer_dir, tmp_path_factory):
    return C.run_releases(VERSIONS, tiny_tokenizer_dir, tmp_path_factory.mktemp("bench-client"))


@pytest.mark.parametrize("version", VERSIONS)
def test_every_backend_completes_against_the_stand_in(outputs, version):
    """0.5.1's chat client indexes `choices[0]` of every chunk; 0.4.0's native client
    reads SSE from /generate."""
    C.check_completed(*outputs[version], version)


@pytest.mark.parametrize("version", VERSIONS)
def test_outputs_import_with_their_generation(outputs, version):
    outs, _ = outputs[version]
    for name, out in outs.items():
        (run,), _ = parse_results(out, Given(client_version=version))
        assert run.shape == GENERATION[version], name
        assert run.metrics["completed"] == C.PROMPTS
        # No server_info key before 0.5.4.post3: the client's release is recorded, and said.
        assert (run.meta["sglang_version"], run.meta["sglang_version_source"]) == (
            version, "bench_client")
        if version == "0.4.0":  # not written: the client's own formula, and said so
            assert run.meta["derived"] == ["request_throughput"]
            assert run.metrics["request_throughput"] == pytest.approx(
                run.metrics["completed"] / run.metrics["duration"])
        else:
            assert "derived" not in run.meta


@pytest.mark.parametrize("version", VERSIONS)
def test_output_keys_match_the_golden_output(outputs, version):
    C.check_golden(outputs[version][0], version)
