"""The stand-in docker (tests/helpers/fake_docker.py) against the real one: the scenario of
the commands forge issues (tests/data/docker/scenario.py), run here on the stand-in, must
give what the real docker CLI, daemon and registry gave when tests/data/docker/record.py ran
it (golden.json: exit codes, what forge reads from stdout, and whether stderr says "no such
image/container")."""

from __future__ import annotations

import importlib.util
import json
import subprocess

from tests.conftest import REPO
from tests.helpers import fake_docker

DATA = REPO / "tests" / "data" / "docker"


def _scenario():
    """tests/data/docker/scenario.py, the recorder's own (a data file, not a package)."""
    spec = importlib.util.spec_from_file_location("docker_scenario", DATA / "scenario.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_stand_in_answers_the_scenario_as_the_real_docker_did(tmp_path):
    sc = _scenario()
    CONTAINER, DOCKERFILE, STEPS = sc.CONTAINER, sc.DOCKERFILE, sc.STEPS  # noqa: N806
    compared, fill, normalize = sc.compared, sc.fill, sc.normalize
    golden = json.loads((DATA / "golden.json").read_text())["steps"]
    state = tmp_path / "state"
    state.mkdir()
    exe = fake_docker.install(tmp_path / "bin", state)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(DOCKERFILE)
    (ctx / "a.txt").write_text("built\n")
    values = {"REG": "registry.test:5000", "CTX": str(ctx), "D1": "sha256:" + "1" * 64,
              "D2": "sha256:" + "2" * 64}
    repo = fill(sc.REPO, values)
    # The registry as the recorder left it: the tag moved from D1 to D2; D1 still served.
    (state / "registry.json").write_text(json.dumps({
        f"{repo}:v1": [values["D2"]], f"{repo}@{values['D1']}": [values["D1"]]}))
    seen = {}
    for name, argv, how in STEPS:
        if name == "container label":
            cname, labels = CONTAINER
            (state / "containers.json").write_text(json.dumps({cname: {"labels": labels}}))
        p = subprocess.run([str(exe), *[fill(a, values) for a in argv]], capture_output=True,
                           text=True, timeout=60)
        if name == "built id":
            values["ID"] = json.loads(p.stdout).partition(":")[2]
        seen[name] = {k: normalize(v, values) if isinstance(v, str) else v
                      for k, v in compared(how, p.returncode, p.stdout, p.stderr).items()}
    assert set(seen) == set(golden)
    differ = {n: {"stand-in": seen[n], "real": golden[n]} for n in golden
              if seen[n] != golden[n]}
    assert not differ, json.dumps(differ, indent=1)
