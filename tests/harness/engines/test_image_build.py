"""An image built from a member's commit, addressed by digest (harness/engines/image_build.py)
and run by that digest (harness/engines/image.py's local builds).

No container runtime runs here: the builds go through the stand-in `docker` on PATH
(tests/helpers/fake_docker.py: docker 28's legacy-builder output, its classic image store's
lookups, `run` executing the image's own code), and every flag forge passes is checked
against the real docker CLI binary's own `--help` (its Go flag sets), where the host has
it. The member is a real git repository of SGLang's layout (`python/sglang/...`)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from infer_forge.harness.engines import engine_for
from infer_forge.harness.engines.base import engine_config_of
from infer_forge.harness.engines.image import (
    ContainerRuntime,
    container_argv,
    detect_runtime,
    ensure_image,
    image_ref,
    image_use,
)
from infer_forge.harness.engines.image_build import (
    PROBE,
    apply_image,
    build_argv,
    build_image,
    commit_matches,
    find_argv,
    labels_argv,
    probe_argv,
)
from infer_forge.harness.engines.plan import wrap_plan
from infer_forge.harness.errors import HarnessError
from infer_forge.ledger.specs import DeploymentPoint, RuntimeProfile
from infer_forge.repos.git import git, out
from infer_forge.repos.manifest import Deploy

from tests.conftest import TESTS
from tests.helpers import fake_docker, real_sglang
from tests.helpers.gitrepos import make_remote

FAKE_SGLANG = TESTS / "data" / "sglang" / "fake_server.py"
REAL_DOCKER = "/usr/local/bin/docker"
KEY = "sha256:" + "1f" * 32
DOCKERFILE = """\
# the layout of SGLang's docker/Dockerfile with BRANCH_TYPE=local: the context copied in
FROM python:3.12-slim
ARG BUILD_TYPE=all
WORKDIR /sgl-workspace/sglang
COPY python /sgl-workspace/sglang/python
ENV PYTHONPATH=/sgl-workspace/sglang/python
LABEL org.sglang.build-type=${BUILD_TYPE}
"""
# python -m sglang.launch_server in the image: the stand-in server, claiming this tree's version
LAUNCH = f"""\
import os, sys
from sglang._version import __version__
os.environ["FAKE_SGLANG_VERSION"] = __version__
os.execv(sys.executable, [sys.executable, {str(FAKE_SGLANG)!r}, *sys.argv[1:]])
"""


def version_file(version: str, commit_id: str | None) -> str:
    """`_version.py` as vcs-versioning writes it at install time (SGLang 0.5.23's wheel)."""
    return (f"__version__ = version = {version!r}\n"
            f"__commit_id__ = commit_id = {commit_id!r}\n")


@pytest.fixture
def docker(tmp_path, monkeypatch) -> Path:
    """The stand-in `docker` first on PATH; its state directory."""
    state = tmp_path / "docker-state"
    state.mkdir()
    fake_docker.install(tmp_path / "bin", state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    return state


def member_src(tmp_path: Path, dockerfile: str = DOCKERFILE, commit_id: str | None = "auto"
               ) -> tuple[Path, str]:
    """A clone of an SGLang-shaped member at its commit, with the `_version.py` its install
    writes (commit id `g` + 9 hex of the commit, or `commit_id` when given)."""
    make_remote(tmp_path, "sglang", {
        "Dockerfile": dockerfile, ".gitignore": "_version.py\n",
        "python/pyproject.toml": "[project]\nname = \"sglang\"\ndynamic = [\"version\"]\n",
        "python/sglang/__init__.py": "from sglang._version import __version__\n",
        "python/sglang/launch_server.py": LAUNCH})
    src = tmp_path / "builds" / "sglang" / "src"
    git(["clone", "-q", str(tmp_path / "remotes" / "sglang.git"), str(src)], tmp_path)
    commit = out(["rev-parse", "HEAD"], src).strip()
    cid = f"g{commit[:9]}" if commit_id == "auto" else commit_id
    (src / "python" / "sglang" / "_version.py").write_text(
        version_file(f"0.5.23.dev4+g{commit[:9]}", cid))
    return src, commit


def calls(state: Path) -> list[list[str]]:
    return [json.loads(x) for x in (state / "calls.jsonl").read_text().splitlines()]


def build(workspace, src: Path, commit: str, key: str = KEY, **deploy) -> object:
    said: list[str] = []
    d = Deploy(kind="image", module=deploy.pop("module", "sglang"), **deploy)
    return build_image(workspace, member="sglang", commit=commit, src=src, deploy=d, key=key,
                       task=None, sandbox=None, say=said.append)


def profile(**kw) -> RuntimeProfile:
    return RuntimeProfile.model_validate({
        "service": "qwen-h200", "rev": 3, "engine": "sglang",
        "config": {"chunked_prefill_size": 4096},
        "image": {"name": "lmsysorg/sglang:v0.5.23", "digest": "sha256:" + "ab" * 32},
        "image_fallback": "local",
        "framework": {"kind": "sglang", "version": "0.5.23"}, **kw})


def test_a_commit_builds_into_an_image_addressed_by_its_id_labelled_and_probed(
        docker, tmp_path, workspace):
    src, commit = member_src(tmp_path)
    got = build(workspace, src, commit, build_args={"BUILD_TYPE": "srt"})
    built = json.loads((docker / "built.json").read_text())
    [(hexid, img)] = built.items()
    name = f"forge-build/sglang:{commit[:12]}"
    assert (got.name, got.digest, got.ref) == (name, f"sha256:{hexid}",
                                               f"{name}@sha256:{hexid}")
    assert img["tags"] == [name] and img["network"] == "none"
    assert img["labels"] == {"infer-forge.member": "sglang", "infer-forge.commit": commit,
                             "infer-forge.build": KEY, "org.sglang.build-type": "srt"}
    # the probe ran in the image: the version and commit its install wrote, its file there
    assert (got.version, got.commit_id) == (f"0.5.23.dev4+g{commit[:9]}", f"g{commit[:9]}")
    assert got.origin.endswith("/sgl-workspace/sglang/python/sglang/__init__.py")
    assert not got.cached
    seen = calls(docker)
    assert seen[0][:2] == ["image", "ls"]  # the cache first
    assert seen[1] == ["build", "-f", str(src / "Dockerfile"),
                       "--label", "infer-forge.member=sglang",
                       "--label", f"infer-forge.commit={commit}",
                       "--label", f"infer-forge.build={KEY}",
                       "--build-arg", "BUILD_TYPE=srt", "--network", "none",
                       "-t", name, str(src)]
    assert seen[-1][:8] == ["run", "--rm", "--network", "none", "--entrypoint", "python3",
                            f"sha256:{hexid}", "-c"]
    ev = got.event
    assert ev.tool == "build" and ev.exit_code == 0 and ev.input_digests == {"build": KEY}
    assert "Successfully built " + hexid[:12] in workspace.artifacts.text(ev.stdout_digest)
    assert ev.sandbox["kind"] == "none" and ev.sandbox["network"] is False
    assert "network none" in ev.sandbox["reason"]

    # the same key again: found by its label, nothing rebuilt, the same image
    n = len(calls(docker))
    again = build(workspace, src, commit, build_args={"BUILD_TYPE": "srt"})
    assert again.cached and (again.ref, again.version) == (got.ref, got.version)
    assert "build" not in [c[0] for c in calls(docker)[n:]]
    assert again.event.exit_code == 0 and again.event.input_digests == {"build": KEY}

    # deploy.network: true lets the RUN steps reach the network (no --network none)
    net = build(workspace, src, commit, key="sha256:" + "2e" * 32, network=True)
    argv = next(c for c in calls(docker) if c[0] == "build" and "sha256:" + "2e" * 32 in
                " ".join(c))
    assert "--network" not in argv and not net.cached
    assert net.event.sandbox["network"] is True


def test_a_failed_build_is_one_line_naming_member_and_commit(docker, tmp_path, workspace):
    src, commit = member_src(tmp_path, DOCKERFILE + "RUN exit 3\n")
    with pytest.raises(HarnessError) as e:
        build(workspace, src, commit)
    assert str(e.value) == (f"image build of member sglang at commit {commit[:12]}: docker "
                            "build exited 3: The command '/bin/sh -c exit 3' returned a "
                            "non-zero code: 3")
    assert not (docker / "built.json").exists()  # nothing to reuse
    with pytest.raises(HarnessError, match=r"deploy.dockerfile docker/Dockerfile is not a "
                                           r"file in the commit's source"):
        build(workspace, src, commit, dockerfile="docker/Dockerfile")


def test_an_image_that_is_not_the_commit_is_refused(docker, tmp_path, workspace):
    # the module in the image reports another commit (a Dockerfile that cloned upstream)
    src, commit = member_src(tmp_path, commit_id="g0123456789")
    with pytest.raises(HarnessError) as e:
        build(workspace, src, commit)
    assert re.fullmatch(f"image build of member sglang at commit {commit[:12]}: sglang in "
                        r"image sha256:[0-9a-f]{64} was built from commit g0123456789 "
                        rf"\(sglang._version.__commit_id__\), not {commit[:12]}",
                        str(e.value)), str(e.value)
    # a module the image does not hold
    with pytest.raises(HarnessError, match=r"module sglang_nope in image sha256:[0-9a-f]{64}: "
                                           r"no module named 'sglang_nope'"):
        build(workspace, src, commit, key="sha256:" + "3d" * 32, module="sglang_nope")
    # an image labelled with the key but built from another commit is not this build
    state = json.loads((docker / "built.json").read_text())
    for img in state.values():
        img["labels"]["infer-forge.commit"] = "f" * 40
    (docker / "built.json").write_text(json.dumps(state))
    with pytest.raises(HarnessError, match=f"is not this build: its labels say "
                                           f"infer-forge.commit={'f' * 40} \\(wanted {commit}\\)"):
        build(workspace, src, commit, key="sha256:" + "3d" * 32, module="sglang_nope")
    assert commit_matches("g" + commit[:9], commit) and commit_matches(commit, commit)
    assert not commit_matches("g0123456789", commit) and not commit_matches("g12", commit)


def test_the_profile_runs_in_the_built_image_by_its_id(docker, tmp_path, workspace):
    src, commit = member_src(tmp_path)
    got = build(workspace, src, commit)
    p = apply_image(profile(), got)
    assert (p.image.name, p.image.digest) == (got.name, got.digest)
    assert p.image_fallback == "refuse" and p.framework.version == got.version
    assert image_ref(p) == got.ref
    use = image_use(p)
    assert use is not None and use.local and use.target == got.digest
    # the launch command names the image by its ID (docker's classic store resolves
    # name@sha256:<ID> only by repo digests, which a local build has none of)
    argv = container_argv(use, [sys.executable, "-m", "sglang.launch_server"], name="c")
    assert argv[-4:] == [got.digest, "python3", "-m", "sglang.launch_server"]
    assert got.ref not in argv
    point = DeploymentPoint.model_validate({
        "model": {"name": "m", "source": str(tmp_path)},
        "scenario": {"traffic": {"concurrency": 4}},
        "topology": {"architecture": "colocated"},
        "runtime_profile": {"service": "qwen-h200", "rev": 3},
        "accelerator": {"vendor": "nvidia", "model": "H200", "count": 1}})
    from infer_forge.harness.engines.plan import plan_point

    wrapped = wrap_plan(plan_point(point, p, None, model=str(tmp_path)), use)
    assert all(got.digest in q.argv for q in wrapped.processes)
    # the start check: present by its ID, never pulled
    n = len(calls(docker))
    assert ensure_image(use) == got.digest
    assert [c[:2] for c in calls(docker)[n:]] == [["image", "inspect"]]
    assert calls(docker)[-1][-1] == got.digest
    other = apply_image(profile(), type(got)(**{**got.__dict__, "digest": "sha256:" + "0" * 64,
                                                 "ref": f"{got.name}@sha256:{'0' * 64}"}))
    with pytest.raises(HarnessError) as e:
        ensure_image(image_use(other))
    assert str(e.value) == (f"runtime profile qwen-h200 rev 3: image {got.name}@sha256:"
                            f"{'0' * 64} is a local build and docker has no image sha256:"
                            f"{'0' * 64} on this host (a local build is never pulled: build "
                            "the commit again here)")
    assert "pull" not in [c[0] for c in calls(docker)]
    # podman prints the ID without its sha256: prefix; the same image, the same check
    exe = fake_docker.install(tmp_path / "pbin", docker, kind="podman")
    pod = type(use)(ContainerRuntime("podman", str(exe)), use.ref, use.digest, use.profile)
    assert ensure_image(pod) == got.digest and calls(docker)[-1][-1] == got.digest


@pytest.mark.slow
def test_the_sglang_engine_serves_from_the_built_image(docker, tmp_path, workspace):
    src, commit = member_src(tmp_path)
    got = build(workspace, src, commit)
    name, config = engine_config_of(apply_image(profile(), got))
    with engine_for(name).launch(config, model="Qwen/Qwen3-8B", ws=workspace) as running:
        info = running.describe()
        cmd = info["launch_command"]
        assert cmd[cmd.index(got.digest) + 1:][:3] == ["python3", "-m", "sglang.launch_server"]
        # the server that answered is the image's own code: it reports the build's version
        assert info["version"] == got.version == f"0.5.23.dev4+g{commit[:9]}"
    # a profile pinning another version is refused at the start check
    name, config = engine_config_of(apply_image(profile(), got).model_copy(update={
        "framework": profile().framework}))
    with pytest.raises(HarnessError, match=r"pins sglang 0.5.23, the server reports "
                                           r"0.5.23.dev4"):
        engine_for(name).launch(config, model="Qwen/Qwen3-8B", ws=workspace)


def test_the_probe_reads_real_sglang_releases_without_importing_them():
    # SGLang's own released trees: 0.5.23 has the _version.py vcs-versioning wrote (commit id
    # None: built from an sdist), 0.4.0 and 0.5.6 only sglang/version.py. Their package
    # __init__ imports torch and more; the probe must not need it.
    check = PROBE + "print('IMPORTED', name in sys.modules)\n"
    for v in ("0.4.0", "0.5.6", "0.5.23"):
        root = real_sglang.release(v)
        r = subprocess.run([sys.executable, "-c", check, "sglang"], capture_output=True,
                           text=True, timeout=60, env={"PYTHONPATH": str(root)})
        lines = r.stdout.splitlines()
        got = json.loads(lines[0].removeprefix("FORGE-IMAGE-PROBE "))
        assert got == {"version": v, "commit_id": None, "error": None,
                       "origin": str(root / "sglang" / "__init__.py")}, (v, r.stderr)
        assert lines[1] == "IMPORTED False"


def test_the_real_docker_cli_without_a_daemon_fails_the_build_in_one_line(
        tmp_path, monkeypatch, workspace):
    exe = Path(REAL_DOCKER)
    if not exe.is_file():
        pytest.skip("the docker CLI binary is not on this host")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "docker").symlink_to(exe)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    sock = tmp_path / "none.sock"  # no daemon listens here, whatever the host runs
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")
    src, commit = member_src(tmp_path)
    with pytest.raises(HarnessError) as e:
        build(workspace, src, commit)
    assert str(e.value) == (f"image build of member sglang at commit {commit[:12]}: docker "
                            f"image ls exited 1: Cannot connect to the Docker daemon at "
                            f"unix://{sock}. Is the docker daemon running?")


def _flags(argv: list[str]) -> set[str]:
    return {a for a in argv if re.fullmatch(r"--?[a-z][a-z-]*", a)}


def test_every_flag_forge_passes_exists_in_the_real_docker_cli(tmp_path):
    exe = shutil.which("docker", path="/usr/local/bin:/usr/bin") or REAL_DOCKER
    if not Path(exe).is_file():
        pytest.skip("the docker CLI binary is not on this host")
    rt = ContainerRuntime("docker", exe)
    d = Deploy(kind="image", build_args={"A": "1"}, module="sglang")
    pairs = {
        "build": build_argv(rt, member="m", commit="c" * 40, src=tmp_path, deploy=d, key=KEY),
        "image ls": find_argv(rt, KEY),
        "image inspect": labels_argv(rt, "sha256:" + "a" * 64),
        "run": probe_argv(rt, "sha256:" + "a" * 64, "sglang"),
    }
    for sub, argv in pairs.items():
        assert argv[1:1 + len(sub.split())] == sub.split()
        help_text = subprocess.run([exe, *sub.split(), "--help"], capture_output=True,
                                   text=True, timeout=30).stdout
        # the runtime's own options: up to the image (run), or the whole command line
        own = argv[:argv.index("sha256:" + "a" * 64)] if sub == "run" else argv
        for flag in _flags(own[1 + len(sub.split()):]):
            assert re.search(rf"(^|[ ,]){re.escape(flag)}([ =,]|$)", help_text, re.M), \
                f"docker {sub} has no {flag}"
    # the probe is Python the image's python3 compiles
    compile(PROBE, "<probe>", "exec")
    assert detect_runtime(lambda n: exe if n == "docker" else None) == rt
