"""`forge engine up --point P --plan --check-parser`: every server's command line of a plan
parsed by the real argument parser of the pinned SGLang release (the kit's wheel), before a
GPU is taken: accepted for the example PD point; a flag the release lacks, slipped past the
planner through `extra_args`, rejected with the parser's own words and exit 1."""

from __future__ import annotations

import json
import os
import shutil

from ...conftest import REPO, run_forge
from ...helpers import real_sglang

POINT = REPO / "examples" / "points" / "qwen3-235b-pd-h200.yaml"


def _env() -> dict[str, str]:
    real_sglang.release(real_sglang.LATEST)  # skips (locally) / fails (CI) without the wheel
    return {**os.environ, "FORGE_SGLANG_CACHE": str(real_sglang.CACHE)}


def test_the_example_pd_point_parses_with_its_release():
    r = run_forge("engine", "up", "--point", str(POINT), "--plan", "--check-parser", "--json",
                  env=_env())
    assert r.returncode == 0, r.stderr
    check = json.loads(r.stdout)["parser_check"]
    assert check["version"] == "0.5.23" and check["ok"] is True
    assert [s["name"] for s in check["servers"]] == ["prefill-0", "decode-0"]


def test_a_flag_the_release_lacks_is_rejected_by_its_parser(tmp_path):
    shutil.copytree(REPO / "examples" / "points", tmp_path / "points")
    shutil.copytree(REPO / "examples" / "profiles", tmp_path / "profiles")
    profile = tmp_path / "profiles" / "qwen3-235b-pd-sglang.yaml"
    profile.write_text(profile.read_text().replace(
        "config:\n", "config:\n  extra_args: [--cuda-graph-bs, '8']\n", 1))
    r = run_forge("engine", "up", "--point", str(tmp_path / "points" / POINT.name), "--plan",
                  "--check-parser", env=_env())
    assert r.returncode == 1, r.stdout + r.stderr
    rejected = [ln for ln in r.stdout.splitlines() if "REJECTED" in ln]
    # the release's own words (argparse takes a prefix of a longer flag, so it is ambiguous)
    assert len(rejected) == 2 and all(
        "error: ambiguous option: --cuda-graph-bs could match --cuda-graph-bs-decode" in ln
        for ln in rejected), r.stdout


def test_check_parser_needs_a_plan():
    r = run_forge("engine", "up", "--point", str(POINT), "--check-parser")
    assert r.returncode == 2 and "--check-parser needs --point and --plan" in r.stderr
