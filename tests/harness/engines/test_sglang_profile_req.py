"""`/start_profile`'s request, checked against SGLang's own released code: the committed table
(harness/data/sglang_profile_req.json) against each kit release's route and request class,
and the release's real request model (validated by pydantic, as its server does) against
what the harness sends."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from infer_forge.harness.engines import sglang_profile_req as spr
from infer_forge.harness.errors import HarnessError

from ...conftest import REPO
from ...helpers import real_sglang

# Runs under the kit (sglang_import): validates each body with the release's own request type
# the way its FastAPI route does, and prints which keys survived.
VALIDATE = r'''
import json, sys
from pydantic import TypeAdapter
import sglang.srt.managers.io_struct as io
from infer_forge.harness.engines.sglang_import import is_stub
cls = getattr(io, "ProfileReqInput", None)
if cls is None or is_stub(cls):
    cls = io.ProfileReq
out = []
for body in json.loads(sys.argv[1]):
    obj = TypeAdapter(cls).validate_python(body)
    out.append(sorted(k for k in body if getattr(obj, k, None) == body[k]))
print(json.dumps(out))
'''


def test_table_matches_each_release_source():
    """The table's view of a release equals what that release's route and io_struct read
    (so a hand edit to the table, or a release the generator misread, fails)."""
    for version in real_sglang.KIT_VERSIONS:
        root = real_sglang.release(version) / "sglang" / "srt"
        http = root / "entrypoints" / "http_server.py"
        http_src = (http if http.exists() else root / "server.py").read_text()
        real = spr.fields_of(http_src, (root / "managers" / "io_struct.py").read_text())
        assert set(real) == spr.fields_for(version), version


@pytest.mark.parametrize("version", ["0.5.1", real_sglang.LATEST])  # before, after merge_profiles
def test_real_request_model_drops_what_the_table_lacks(version, tmp_path):
    """Why the harness must refuse an option: the release's own request model keeps the
    table's fields and silently drops every other key (no 4xx to notice)."""
    script = tmp_path / "validate.py"
    script.write_text(VALIDATE)
    every = {f: True if f.startswith(("merge", "profile_by", "with", "record", "detailed"))
             else (["CPU"] if f in ("activities", "profile_stages") else
                   (3 if f in ("num_steps", "start_step") else "x"))
             for f in spr.table()["fields"]}
    bodies = [{**every, "bogus_option": 1}, {"merge_profiles": True, "output_dir": "/t"}]
    kept = json.loads(real_sglang.run(version, script, json.dumps(bodies)))
    assert set(kept[0]) == spr.fields_for(version)
    assert ("merge_profiles" in kept[1]) == ("merge_profiles" in spr.fields_for(version))


def test_check_refuses_what_a_release_would_drop():
    spr.check({"output_dir": "/t", "activities": ["CPU"]}, "0.5.1")
    with pytest.raises(HarnessError) as e:
        spr.check({"merge_profiles": True}, "0.5.1")
    assert str(e.value) == ("sglang 0.5.1's /start_profile does not read merge_profiles "
                            "(0.5.4 and later)")
    with pytest.raises(HarnessError, match=r"0\.4\.0's .* output_dir .*SGLANG_TORCH_PROFILER_DIR"):
        spr.check({"output_dir": "/t"}, "0.4.0")
    with pytest.raises(HarnessError, match="unknown option bogus"):
        spr.check({"bogus": 1}, spr.table()["versions"][-1])
    spr.check({"profile_id": "a", "detailed_annotations": True}, "0.5.23")


def test_generator_folds_release_order_and_refuses_a_lost_field():
    data = spr.fold({"0.5.10": ["a", "b"], "0.5.9": ["a"], "0.4.0": []})
    assert data == {"versions": ["0.4.0", "0.5.9", "0.5.10"],
                    "fields": {"a": "0.5.9", "b": "0.5.10"}}
    with pytest.raises(HarnessError, match="0.5.10: /start_profile lost b"):
        spr.fold({"0.5.9": ["a", "b"], "0.5.10": ["a"]})


def test_the_stand_in_reads_the_same_table():
    from infer_forge.harness.testing import scripted_profiler

    for version in spr.table()["versions"]:
        assert scripted_profiler.fields_for(version) == spr.fields_for(version), version


def test_stand_in_profiler_speaks_the_claimed_release(tmp_path):
    """The stand-in (scripted_profiler) answers the info route of its release and keeps the
    same body fields the real request model keeps, so the client's refusal is what stops an
    option a real 0.5.1 would drop."""
    from infer_forge.harness.engines.external import ExternalEngine

    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": []}')
    p = subprocess.Popen([sys.executable, "-m", "infer_forge.harness.testing.scripted_profiler",
                          "--port", "0", "--trace", str(trace), "--version", "0.5.1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO))
    try:
        line = p.stdout.readline() if p.stdout else ""
        assert line.startswith("listening on "), line
        url = line.split()[-1]
        ext = ExternalEngine().launch({"base_url": url, "api": "sglang", "read_only": False})
        assert ext.server_info()["version"] == "0.5.1"  # via /get_server_info (before 0.5.6)
        with pytest.raises(HarnessError, match="does not read merge_profiles"):
            ext.start_profile(output_dir=str(tmp_path / "out"), merge_profiles=True)
        assert ext.start_profile(output_dir=str(tmp_path / "out"))["message"] == \
            "Start profiling."
        ext.stop_profile()
        assert [f.name.endswith("-TP-0.trace.json.gz") for f in (tmp_path / "out").iterdir()] \
            == [True]
    finally:
        p.terminate()
        p.wait(10)
