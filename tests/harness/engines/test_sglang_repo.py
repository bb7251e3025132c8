"""The SGLang-shaped repository the issue-30 tests build (tests/helpers/sglang_repo.py) holds
its facts with the real tools: real git, pip, setuptools and setuptools-scm build each
commit offline into a venv layered on a base environment with `sglang` 0.5.23 installed;
what a build generates is held to the released 0.5.23 wheel's own files; `python -m
sglang.launch_server` from a build serves that build's version at its decode loop's speed."""

from __future__ import annotations

import http.client
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from infer_forge.harness.engines.process import ServerProcess, free_port, http_get
from infer_forge.repos.git import git

from tests.helpers import real_bench_client, real_sglang
from tests.helpers import sglang_repo as R

# One child per environment: what `import sglang` finds there, and what pip's metadata says.
PROBE = """\
import importlib.metadata, json, sglang
try:
    import sglang._version as v
    commit = v.__commit_id__
except ImportError:
    commit = "<no _version>"
print(json.dumps({"version": sglang.__version__, "commit_id": commit,
                  "file": sglang.__file__, "metadata": importlib.metadata.version("sglang")}))
"""


def probe(env: Path, cwd: Path) -> dict:
    # cwd: not a python/ directory, whose `sglang` would shadow every install
    p = subprocess.run([str(R.python_of(env)), "-c", PROBE], capture_output=True, text=True,
                       cwd=cwd, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The repository, the base, a worktree per branch, and a build of each: `fast`,
    `main` and `broken-install` as `install` does it (editable, compat mode), `fast` again
    as a plain `pip install -e`."""
    tmp = tmp_path_factory.mktemp("sglang_repo")
    repo = R.make_sglang_repo(tmp / "repo")
    base = R.installed_base(tmp / "base")
    trees, envs, pip_out = {}, {}, {}
    for branch in ("fast", "main", "broken-install"):
        trees[branch] = tmp / "worktrees" / branch
        git(["worktree", "add", "-q", "--detach", str(trees[branch]), repo.branches[branch]],
            repo.path)
    builds = (("fast", "fast", "compat"), ("main", "main", "compat"),
              ("broken-install", "broken-install", "compat"), ("fast-plain-e", "fast", "editable"))
    for name, _, _ in builds:
        envs[name] = R.layered_env(R.site_packages(base), tmp / "envs" / name)
    with ThreadPoolExecutor(len(builds)) as pool:  # four pip processes at once
        for name, branch, mode in builds:
            pip_out[name] = pool.submit(R.install, envs[name], trees[branch] / "python", mode)
        pip_out = {k: f.result() for k, f in pip_out.items()}
    (tmp / "model").mkdir()
    return {"tmp": tmp, "repo": repo, "base": base, "trees": trees, "envs": envs,
            "pip": pip_out, "seen": {k: probe(e, tmp) for k, e in envs.items()},
            "base_seen": probe(base, tmp)}


def test_base_has_the_release_installed(world):
    seen, site = world["base_seen"], R.site_packages(world["base"])
    assert seen == {"version": "0.5.23", "commit_id": None, "metadata": "0.5.23",
                    "file": str(site / "sglang" / "__init__.py")}
    # installed as a release wheel installs: the package and its dist-info, nothing else
    assert {p.name for p in site.iterdir()} == {"sglang", "sglang-0.5.23.dist-info",
                                               "zz_layered_base.pth"}


def test_builds_generate_the_release_files(world):
    """version.py is the release's text; the `_version.py` setuptools-scm generates for a
    tag is the released 0.5.23 wheel's byte for byte, and a later commit's has its fields."""
    real = real_sglang.release("0.5.23") / "sglang"
    assert R.VERSION_PY == (real / "version.py").read_text()
    base_file = R.site_packages(world["base"]) / "sglang" / "_version.py"
    assert base_file.read_text() == (real / "_version.py").read_text()
    fast = (world["trees"]["fast"] / "python" / "sglang" / "_version.py").read_text()
    head = (real / "_version.py").read_text().split("__version__ = version")[0]
    assert fast.startswith(head)  # the same generator, fields and types


def test_a_build_of_a_later_commit_reports_the_commit(world):
    repo, seen = world["repo"], world["seen"]["fast"]
    sha7 = repo.sha7(repo.fast)
    assert seen["version"] == f"0.5.25.dev1+g{sha7}" == repo.version_of("fast")
    assert seen["commit_id"] == f"g{sha7}"
    assert seen["file"] == str(world["trees"]["fast"] / "python" / "sglang" / "__init__.py")


def test_a_build_of_the_tag_is_the_release_version_without_a_commit(world):
    seen = world["seen"]["main"]
    assert (seen["version"], seen["commit_id"], seen["metadata"]) == ("0.5.24", None, "0.5.24")
    assert seen["file"] == str(world["trees"]["main"] / "python" / "sglang" / "__init__.py")


def test_broken_install_succeeds_and_imports_the_base(world):
    """pip succeeded and recorded the build's version, yet `import sglang` is the base's:
    only the imported package (or the server's /server_info) tells."""
    repo, seen = world["repo"], world["seen"]["broken-install"]
    assert seen["version"] == "0.5.23" and seen["commit_id"] is None
    assert seen["file"] == str(R.site_packages(world["base"]) / "sglang" / "__init__.py")
    assert seen["metadata"] == f"0.5.25.dev1+g{repo.sha7(repo.broken_install)}"


def test_a_plain_editable_install_loses_to_the_base(world):
    """setuptools' default editable install of SGLang's flat python/ layout is a meta-path
    finder consulted after the path finder: on a layered env the base's sglang wins. Why
    `install` uses editable_mode=compat (or a regular install)."""
    repo, seen = world["repo"], world["seen"]["fast-plain-e"]
    assert seen["metadata"] == repo.version_of("fast")
    assert seen["version"] == "0.5.23"
    site = R.site_packages(world["envs"]["fast-plain-e"])
    assert any(p.name.endswith("_finder.py") for p in site.iterdir())


def test_the_version_needs_the_tags(world):
    """setuptools-scm versions a checkout from its tags: a clone without them (or a shallow
    one) still builds, as `0.0.0.devN+g<sha9>` (SGLang's fallback), so a build's version is
    only as good as the tags its worktree sees."""
    repo, tmp = world["repo"], world["tmp"]
    assert R.scm_version(world["trees"]["fast"] / "python") == repo.version_of("fast")
    clone = tmp / "clone-without-tags"
    git(["clone", "-q", "--no-tags", str(repo.path), str(clone)], tmp)
    git(["checkout", "-q", repo.fast], clone)
    version = R.scm_version(clone / "python")
    assert version.startswith("0.0.0.dev") and f"+g{repo.sha7(repo.fast)}" in version


@pytest.fixture(scope="module")
def servers(world):
    """`python -m sglang.launch_server` from the fast and main builds, healthy."""
    out = {}
    try:
        for name in ("fast", "main"):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            sp = ServerProcess(
                [str(R.python_of(world["envs"][name])), "-m", "sglang.launch_server",
                 "--port", str(port), "--model-path", str(world["tmp"] / "model"),
                 "--host", "127.0.0.1", "--enable-metrics"],
                health_url=f"{url}/health_generate", log_path=world["tmp"] / f"{name}.log",
                name=f"sglang-{name}", cwd=world["tmp"], startup_timeout_s=60)
            out[name] = (sp.start(), url)
            sp.wait_ready()
        yield out
    finally:
        for sp, _ in out.values():
            sp.stop()


@pytest.mark.parametrize("name", ["fast", "main"])
def test_launch_server_serves_its_build(world, servers, name):
    sp, url = servers[name]
    status, body = http_get(f"{url}/server_info")
    assert status == 200
    info = json.loads(body)
    assert info["version"] == world["repo"].version_of(name)
    assert info["model_path"] == str(world["tmp"] / "model")
    log = sp.log_path.read_text()
    delay = world["repo"].decode_delay_ms[name]
    assert f"[sglang] version={info['version']} decode_delay_ms={delay} " \
           f"package={world['trees'][name] / 'python' / 'sglang'}" in log
    assert f"[fake sglang] decode delay {delay:g} ms per token" in log


def _stream(url: str, path: str, body: dict) -> tuple[http.client.HTTPResponse, list[dict]]:
    host, port = url.rsplit("/", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    events = [json.loads(line[6:]) for line in resp.read().decode().splitlines()
              if line.startswith("data: {")]
    conn.close()
    for e in events:  # what differs between two servers' answers to one request
        for k in ("id", "created"):
            e.pop(k, None)
        e.get("meta_info", {}).pop("id", None)
    return resp, events


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "a b c", "max_tokens": 5, "ignore_eos": True,
                         "stream": True, "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a b"}],
                              "max_tokens": 4, "stream": True}),
    ("/generate", {"text": "a b c", "stream": True,
                   "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}}),
])
def test_a_delayed_stream_is_the_same_stream_chunked(servers, path, body):
    """With a decode delay the stand-in writes each event as its own chunk (as uvicorn
    streams); the events are exactly those of the stand-in without one."""
    _, url = servers["fast"]
    resp, events = _stream(url, path, body)
    assert resp.getheader("Transfer-Encoding") == "chunked"
    with real_bench_client.stand_in() as plain:
        plain_resp, want = _stream(plain, path, body)
    assert plain_resp.getheader("Content-Length") is not None
    assert events == want and len(events) >= 4


def test_launch_server_requires_a_model_path_and_helps(world):
    def launch(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(R.python_of(world["envs"]["fast"])), "-m",
                               "sglang.launch_server", *args], capture_output=True,
                              text=True, cwd=world["tmp"], timeout=60)

    p = launch("--port", "1")
    assert p.returncode == 2
    assert "the following arguments are required: --model-path" in p.stderr
    p = launch("--help")  # the recorded help text of the real parser, nothing before it
    assert p.returncode == 0 and p.stdout.startswith("usage: ")
    assert p.stdout.strip() == (R.FAKE_SERVER.parent / "help.txt").read_text().strip()
    serve = subprocess.run([str(world["envs"]["fast"] / "bin" / "sglang"), "serve", "--help"],
                           capture_output=True, text=True, cwd=world["tmp"], timeout=60)
    assert serve.returncode == 0 and serve.stdout == p.stdout  # the `sglang serve` script


def test_a_bare_clone_has_every_branch_and_the_tag(world):
    repo = world["repo"]
    bare = repo.bare_clone(world["tmp"] / "sglang.git")
    refs = git(["for-each-ref", "--format=%(refname) %(objectname)"], bare).stdout.decode()
    assert set(refs.split("\n")) - {""} >= {
        f"refs/heads/main {repo.main}", f"refs/heads/fast {repo.fast}",
        f"refs/heads/broken-install {repo.broken_install}"}
    tagged = git(["rev-parse", f"{repo.tag}^{{commit}}"], bare).stdout.decode().strip()
    assert tagged == repo.main

