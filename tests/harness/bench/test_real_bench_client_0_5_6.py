"""SGLang 0.5.6's own bench client (`python -m sglang.bench_serving`, from the released
wheel, under the kit) against the stand-in server with each backend; its output imported with
the right generation and version, and held against the committed golden output
(tests/data/sglang/golden/bench/sglang-0.5.6.jsonl). One child process for every run."""

from __future__ import annotations

import pytest
from infer_forge.harness.bench.importer import Given, parse_results

from tests.helpers import real_bench_client as C

VERSIONS = ("0.5.6",)
# The generation each release's keys put it in (importer.GENERATIONS).
GENERATION = {"0.5.6": "0.5.6–0.5.7"}


@pytest.fixture(scope="module")
def outputs(tiny_tokenizer_dir, tmp_path_factory):
    return C.run_releases(VERSIONS, tiny_tokenizer_dir, tmp_path_factory.mktemp("bench-client"))


@pytest.mark.parametrize("version", VERSIONS)
def test_every_backend_completes_against_the_stand_in(outputs, version):
    """0.5.6's chat client indexes `choices[0]` of every chunk: the stand-in sends no
    `"choices": []` chunk unless asked for usage, as the real server."""
    C.check_completed(*outputs[version], version)


@pytest.mark.parametrize("version", VERSIONS)
def test_outputs_import_with_their_generation(outputs, version):
    outs, _ = outputs[version]
    for name, out in outs.items():
        (run,), _ = parse_results(out, Given(client_version=version))
        assert run.shape == GENERATION[version], name
        assert run.metrics["completed"] == C.PROMPTS
        # The client read the stand-in's /get_server_info: the server's version.
        assert run.meta["sglang_version_source"] == "server_info"
        assert run.metrics["total_input_text_tokens"] == run.metrics["total_input_tokens"]
        assert "derived" not in run.meta


@pytest.mark.parametrize("version", VERSIONS)
def test_output_keys_match_the_golden_output(outputs, version):
    C.check_golden(outputs[version][0], version)
