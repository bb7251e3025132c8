"""A build of a member's commit as a deployable environment (harness/engines/commit_build.py):
real git, a real virtual environment layered on a base Python, a real `pip install` run in
the sandbox, the build's module imported by the environment's own interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from infer_forge.harness.engines import commit_build
from infer_forge.repos import commands as rc

from tests.conftest import need
from tests.helpers.gitrepos import make_remote, write_manifest

PYPROJECT = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "tinypkg"
version = "{v}"

[tool.setuptools]
packages = [{packages}]
"""
INSTALL = "python -m pip install -q --no-deps --no-build-isolation -e ."


def _files(version: str, packages: str = '"tinypkg"') -> dict[str, str]:
    return {"pyproject.toml": PYPROJECT.format(v=version, packages=packages),
            "tinypkg/__init__.py": f'__version__ = "{version}"\n',
            ".gitignore": "*.egg-info/\n__pycache__/\n"}


@pytest.fixture
def mono(tmp_path, workspace):
    make_remote(tmp_path, "tinypkg", _files("1.0"), branches={
        "two": _files("2.0"),
        "empty": _files("3.0", packages=""),  # installs fine, with no package in it
    })
    rc.init(workspace, write_manifest(tmp_path / "m.yaml", [
        {"name": "tinypkg", "url": str(tmp_path / "remotes/tinypkg.git"),
         "deploy": {"install": INSTALL}}]))
    return rc.open_monorepo(workspace)


def _sha(mono, ref: str) -> str:
    return subprocess.run(["git", "-C", str(mono.member_dir("tinypkg")), "rev-parse",
                           f"origin/{ref}" if ref != "HEAD" else ref], check=True,
                          capture_output=True, text=True).stdout.strip()


def _import(python: str, cwd: Path) -> dict:
    r = subprocess.run([python, "-c", "import json, tinypkg; print(json.dumps("
                        "[tinypkg.__version__, tinypkg.__file__]))"], cwd=cwd,
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def test_a_commit_builds_into_its_own_environment_cached_by_its_inputs(mono, workspace,
                                                                        tmp_path):
    said: list[str] = []
    one = commit_build.build(workspace, mono, "tinypkg", _sha(mono, "HEAD"),
                             base_python=sys.executable, say=said.append)
    assert one.success, one.error
    assert one.kind == "venv" and one.version == "1.0" and not one.cached
    assert Path(one.origin).is_relative_to(Path(one.path))
    # The environment's own interpreter imports this build, and still sees forge's packages.
    version, origin = _import(one.python, tmp_path)
    assert version == "1.0" and Path(origin).is_relative_to(Path(one.path))
    subprocess.run([one.python, "-c", "import yaml, pydantic"], check=True, cwd=tmp_path)
    assert one.event is not None and one.event.tool == "deploy-build"
    assert one.event.input_digests["build"] == one.key and one.event.exit_code == 0
    # A second commit is a second build; each keeps its own environment.
    two = commit_build.build(workspace, mono, "tinypkg", _sha(mono, "two"),
                             base_python=sys.executable)
    assert two.success and two.version == "2.0" and two.key != one.key
    assert _import(one.python, tmp_path)[0] == "1.0"
    # The same inputs again: a hit, nothing run, the same logs.
    again = commit_build.build(workspace, mono, "tinypkg", _sha(mono, "HEAD"),
                               base_python=sys.executable)
    assert again.cached and again.key == one.key and again.python == one.python
    assert again.event.stdout_digest == one.event.stdout_digest
    # A build killed midway (no build.json) is built again, not trusted.
    (Path(one.path) / commit_build.MARKER).unlink()
    redo = commit_build.build(workspace, mono, "tinypkg", _sha(mono, "HEAD"),
                              base_python=sys.executable, say=said.append)
    assert redo.success and not redo.cached
    assert any("unfinished build" in s for s in said)


def test_an_install_that_puts_nothing_in_the_build_fell_back(mono, workspace, tmp_path):
    base = commit_build.build(workspace, mono, "tinypkg", _sha(mono, "HEAD"),
                              base_python=sys.executable)
    # Layered on an environment that has tinypkg 1.0 installed: the empty build imports it.
    out = commit_build.build(workspace, mono, "tinypkg", _sha(mono, "empty"),
                             base_python=base.python)
    assert not out.success
    assert "installed no tinypkg" in out.error and "fell back" in out.error
    assert "1.0" in out.error and base.path in out.error
    assert not (Path(out.path) / commit_build.MARKER).exists()  # never a hit


def test_a_failing_install_is_a_failed_build_as_data(tmp_path, workspace):
    make_remote(tmp_path, "tinypkg", _files("1.0"))
    rc.init(workspace, write_manifest(tmp_path / "m.yaml", [
        {"name": "tinypkg", "url": str(tmp_path / "remotes/tinypkg.git"),
         "deploy": {"install": "echo broken-recipe >&2; exit 3"}}]))
    mono = rc.open_monorepo(workspace)
    out = commit_build.build(workspace, mono, "tinypkg", _sha(mono, "HEAD"),
                             base_python=sys.executable)
    assert not out.success and "exited 3" in out.error and "broken-recipe" in out.error
    assert out.event is not None and out.event.exit_code == 3


def test_a_build_without_network_cannot_reach_it(tmp_path, workspace):
    """The install runs in the sandbox: no network unless `deploy.network` (recorded)."""
    from infer_forge.harness.guard.sandbox import find_bwrap

    need(find_bwrap()[0] is not None, "bubblewrap is not usable here")
    make_remote(tmp_path, "tinypkg", _files("1.0"))
    probe = ("python -c \"import socket; s = socket.socket(); s.settimeout(2); "
             "s.connect(('pypi.org', 443))\" && " + INSTALL)
    rc.init(workspace, write_manifest(tmp_path / "m.yaml", [
        {"name": "tinypkg", "url": str(tmp_path / "remotes/tinypkg.git"),
         "deploy": {"install": probe}}]))
    mono = rc.open_monorepo(workspace)
    out = commit_build.build(workspace, mono, "tinypkg", _sha(mono, "HEAD"),
                             base_python=sys.executable)
    assert not out.success and not out.network and "socket" in out.error
    assert out.event.sandbox["network"] is False


def test_identity_of_a_server_against_its_build():
    b = commit_build.Deployable(member="sglang", commit="abc1234def5678" + "0" * 26, key="k",
                                kind="venv", path="/b", module="sglang", network=False,
                                version="0.5.25.dev1+gabc1234")
    assert commit_build.identity_problem(b, "0.5.25.dev1+gabc1234", "s") is None
    assert "reports sglang 0.5.23" in commit_build.identity_problem(b, "0.5.23", "s")
    other = commit_build.Deployable(**{**vars(b), "version": "0.5.25.dev1+gdeadbee"})
    assert "reports commit deadbee" in commit_build.identity_problem(
        other, "0.5.25.dev1+gdeadbee", "s")
    assert commit_build.reported_commit("0.5.25.dev1+gabc1234.d20261202") == "abc1234"
    assert commit_build.reported_commit("0.5.23") is None
    assert commit_build.reported_commit(None, "gabc1234") == "abc1234"


def _profile(**kw):
    from infer_forge.ledger.specs import RuntimeProfile

    return RuntimeProfile.model_validate({
        "service": "s", "rev": 1, "engine": "sglang", "config": {"tp_size": 1},
        "framework": {"kind": "sglang", "version": "0.5.23"}, **kw})


def _built(kind: str, **kw) -> commit_build.Deployable:
    from infer_forge.ledger import events as E

    base = dict(member="sglang", commit="c" * 40, key="k", kind=kind, path="/b",
                module="sglang", network=False, version="0.5.25.dev1+gccccccc",
                event=E.ToolInvoked(tool="deploy-build", argv=["x"]))
    return commit_build.Deployable(**{**base, **kw})


def test_a_profile_runs_the_builds():
    """The engine's interpreter and pinned version become the build's; an image build is
    the profile's image; what cannot run a build is one line naming why."""
    venv = _built("venv", python="/b/env/bin/python")
    kernel = _built("venv", member="sgl-kernel", module="sgl_kernel", version="0.3.0",
                    python="/k/env/bin/python")
    p = commit_build.apply_builds(_profile(), {"sglang": venv, "sgl-kernel": kernel})
    assert p.config["python"] == "/k/env/bin/python"  # the last layer sees them all
    assert p.config["version"] == p.framework.version == "0.5.25.dev1+gccccccc"
    assert p.config["tp_size"] == 1
    assert p.config["env"] == {"PYTHONSAFEPATH": "1"}  # no checkout in the cwd shadows it
    digest = "sha256:" + "a" * 64
    img = _built("image", image=f"forge-build/sglang:cccccccccccc@{digest}",
                 extra={"name": "forge-build/sglang:cccccccccccc", "digest": digest})
    q = commit_build.apply_builds(_profile(), {"sglang": img})
    assert (q.image.name, q.image.digest) == ("forge-build/sglang:cccccccccccc", digest)
    assert q.framework.version == "0.5.25.dev1+gccccccc"
    for prof, builds, why in [
        (_profile(config={"launcher": ["numactl", "python"]}), {"sglang": venv}, "launcher"),
        (_profile(image={"name": "lmsysorg/sglang", "digest": digest}), {"sglang": venv},
         "a venv build cannot run there"),
        (_profile(), {"sglang": venv, "x": img}, "cannot run together"),
        (_profile(engine="external", endpoint="http://127.0.0.1:1"), {"sglang": venv},
         "external endpoint"),
        (_profile(engine="hf", framework=None, config={}), {"sglang": venv},
         "reports no version"),
    ]:
        with pytest.raises(commit_build.HarnessError, match=why):
            commit_build.apply_builds(prof, builds)


def _pkg(name: str, version: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {"pyproject.toml": PYPROJECT.replace("tinypkg", name).format(
        v=version, packages=f'"{name}"'),
        f"{name}/__init__.py": f'__version__ = "{version}"\n',
        ".gitignore": "*.egg-info/\n__pycache__/\nbuild/\n", **(extra or {})}


def test_each_member_is_layered_on_the_one_before_and_must_stay_its_own(tmp_path, workspace):
    """Two members the engine imports: the second's environment sees the first's build; an
    install that puts a released copy of the first over it is refused, naming both."""
    make_remote(tmp_path, "kern", _pkg("kern", "1.0"))
    # eng's `shadow` branch also installs a "released" kern of its own (as `pip install
    # sglang[all]` would pull a released sgl-kernel over the member's build).
    shadow = {f"vendored/{k}": v for k, v in _pkg("kern", "0.9").items()}
    make_remote(tmp_path, "eng", _pkg("eng", "2.0"), branches={"shadow": shadow})
    rc.init(workspace, write_manifest(tmp_path / "m.yaml", [
        {"name": "kern", "url": str(tmp_path / "remotes/kern.git"),
         "deploy": {"install": INSTALL}},
        {"name": "eng", "url": str(tmp_path / "remotes/eng.git"),
         "deploy": {"install": INSTALL + " && if [ -d vendored ]; then python -m pip install "
                               "-q --no-deps --no-build-isolation ./vendored; fi"}}]))
    mono = rc.open_monorepo(workspace)
    kern = commit_build.build(workspace, mono, "kern", _member_head(mono, "kern"),
                              base_python=sys.executable)
    assert kern.success, kern.error
    eng = commit_build.build(workspace, mono, "eng", _member_head(mono, "eng"),
                             base_python=kern.python)
    assert eng.success, eng.error
    assert commit_build.check_layered([kern, eng]) is None
    subprocess.run([eng.python, "-c", "import kern, eng; assert kern.__version__ == '1.0'"],
                   check=True, cwd=tmp_path)
    shadowed = commit_build.build(workspace, mono, "eng", _member_head(mono, "eng", "shadow"),
                                  base_python=kern.python)
    assert shadowed.success, shadowed.error  # eng itself is its own
    problem = commit_build.check_layered([kern, shadowed])
    assert problem is not None and "in the environment of eng" in problem
    assert "the build of kern@" in problem and "0.9" in problem


def _member_head(mono, member: str, branch: str | None = None) -> str:
    return subprocess.run(["git", "-C", str(mono.member_dir(member)), "rev-parse",
                           f"origin/{branch}" if branch else "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


def test_nested_submodules_are_in_the_build_source(tmp_path, workspace):
    """A member whose commit has a submodule with a submodule of its own (FlashMLA's
    csrc/cutlass): the build's source has both, at the commits the member pins."""
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    deep = make_remote(tmp_path, "deep", {"deep.h": "// deep\n"})
    git_c = ["git", "-c", "protocol.file.allow=always"]
    work = tmp_path / "seed-mid"
    work.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    (work / "mid.txt").write_text("mid\n")
    subprocess.run([*git_c, "-C", str(work), "submodule", "add", "-q", str(deep),
                    "csrc/cutlass"], check=True, env={**os.environ, **env})
    subprocess.run(["git", "-C", str(work), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(work), "commit", "-qm", "mid"], check=True,
                   env={**os.environ, **env})
    mid = tmp_path / "remotes/mid.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(mid)], check=True)
    top = tmp_path / "seed-top"
    top.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(top)], check=True)
    for k, v in _files("1.0").items():
        (top / k).parent.mkdir(parents=True, exist_ok=True)
        (top / k).write_text(v)
    subprocess.run([*git_c, "-C", str(top), "submodule", "add", "-q", str(mid), "third/mla"],
                   check=True, env={**os.environ, **env})
    subprocess.run(["git", "-C", str(top), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(top), "commit", "-qm", "top"], check=True,
                   env={**os.environ, **env})
    topbare = tmp_path / "remotes/top.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(top), str(topbare)], check=True)
    rc.init(workspace, write_manifest(tmp_path / "m.yaml", [
        {"name": "tinypkg", "url": str(topbare), "deploy": {
            "install": "test -f third/mla/csrc/cutlass/deep.h && " + INSTALL}}]))
    mono = rc.open_monorepo(workspace)
    out = commit_build.build(workspace, mono, "tinypkg", _sha(mono, "HEAD"),
                             base_python=sys.executable)
    assert out.success, out.error
    src = Path(out.path) / "src"
    assert (src / "third/mla/mid.txt").read_text() == "mid\n"
    assert (src / "third/mla/csrc/cutlass/deep.h").read_text() == "// deep\n"
