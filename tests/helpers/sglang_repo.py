"""An SGLang-shaped git repository made in the tests, and a base environment with a
released-looking `sglang` installed (issue 30: "is my SGLang change faster than main?").

The repository has the real sgl-project/sglang layout and versioning, read from its
`python/pyproject.toml`: setuptools with a dynamic version from setuptools-scm
(`[tool.setuptools_scm]` root "..", version_file "sglang/_version.py", a describe command
`python3 .../get_version_tag.py`, fallback "0.0.0.dev0"; the stored upstream pyproject
names `python/tools/`, SGLang's tree now has the script in `scripts/release/`, used here: it
keeps the installed top level `sglang` alone, as the released wheel's). So a build of a tagged
commit is `0.5.24` with `sglang._version.__commit_id__ = None` (as the released 0.5.23 wheel's
`_version.py`), and a build of a later commit `0.5.25.dev1+g<sha7>` with `__commit_id__ =
"g<sha7>"`. `python/sglang/version.py` is the released 0.5.23 text. `python -m
sglang.launch_server` serves SGLang's HTTP API through the stand-in
`tests/data/sglang/fake_server.py` (its path written into the generated file) with the
package's own `sglang.__version__` and the per-token delay of its decode loop
(`python/sglang/srt/managers/scheduler.py`, DECODE_DELAY_MS).

Branches: `main` (the release commit, tag `v0.5.24`, 6 ms per token), `fast` (one commit on
it: 1 ms per token), `broken-install` (one commit on it whose pyproject change makes `pip
install -e python` succeed while installing no `sglang`, so `import sglang` finds whatever
the base environment has).

`installed_base(path)` is what a profile's base environment with a released SGLang looks
like: a venv layered on forge's own `.venv` with `sglang` 0.5.23 installed (a regular,
non-editable install of the same package built at a `v0.5.23` tag, as a release wheel is).
`layered_env(base_site, path)` is a venv that sees its own site-packages first, then the
base's (and what the base sees); `install(env, python_dir)` is `pip install
--no-build-isolation --no-deps -e python_dir --config-settings editable_mode=compat` in it,
offline. Plain `-e` is NOT enough on a layered env: setuptools' default editable install of
SGLang's flat `python/` layout is a meta-path finder that Python consults after the path
finder, so the base's installed `sglang` is imported instead of the build.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from infer_forge.repos.git import git, out

FAKE_SERVER = Path(__file__).resolve().parents[1] / "data" / "sglang" / "fake_server.py"
RELEASE_TAG = "v0.5.24"  # the tag on main's release commit
BASE_VERSION = "0.5.23"  # what the base environment has installed
SLOW_MS = 6.0  # main's decode step per token
FAST_MS = 1.0  # fast's

# The released 0.5.23 `sglang/version.py`, verbatim (it reads the `_version.py` the build
# generates; tests/harness/engines/test_sglang_repo.py holds it to the release's own file).
VERSION_PY = '''\
try:
    from sglang._version import __version__, __version_tuple__
except ImportError:
    try:
        import importlib.metadata

        __version__ = importlib.metadata.version("sglang")
        __version_tuple__ = tuple(__version__.split("."))
    except Exception:
        try:
            import pathlib

            from setuptools_scm import get_version

            # point to the directory containing pyproject.toml.
            project_root = pathlib.Path(__file__).parent.parent.parent
            __version__ = get_version(
                root=str(project_root), fallback_version="0.0.0.dev0"
            )
            __version_tuple__ = tuple(__version__.split("."))
        except Exception:
            # Fallback for development without build
            __version__ = "0.0.0.dev0"
            __version_tuple__ = (0, 0, 0, "dev0")
'''

# The versioning sections as SGLang's python/pyproject.toml has them; the rest trimmed to
# what this package needs (no dependencies: the build runs offline, --no-deps).
PACKAGES_FIND = '''\
[tool.setuptools.packages.find]
exclude = [
  "assets*",
  "benchmark*",
  "docs*",
  "dist*",
  "playground*",
  "scripts*",
  "tests*",
]
'''
# broken-install's change: the package directory "moved" to a src layout that does not exist,
# so setuptools finds no package and the install succeeds with nothing importable in it.
PACKAGES_FIND_BROKEN = PACKAGES_FIND.replace('exclude = [', 'where = ["src"]\nexclude = [')

PYPROJECT = '''\
[build-system]
requires = ["setuptools>=61.0", "setuptools-scm>=8.0", "wheel"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
dynamic = ["version"]
description = "An SGLang-shaped package made by infer-forge's tests."
readme = "README.md"
requires-python = ">=3.10"
dependencies = []

[project.scripts]
sglang = "sglang.cli.main:main"

{packages_find}
[tool.setuptools_scm]
root = ".."
version_file = "sglang/_version.py"
git_describe_command = ["python3", "scripts/release/get_version_tag.py"]
# Allow editable installs even when .git metadata is not available.
fallback_version = "0.0.0.dev0"
'''

# What SGLang's scripts/release/get_version_tag.py answers setuptools-scm (written here, same
# contract): a commit with a version tag is that bare tag (so setuptools-scm sees distance 0
# and no node: `__commit_id__ = None`); any other commit is `git describe --long` against the
# highest version tag (`v0.5.24-1-gabc1234`), counted from the merge base when that tag is on
# a release branch; no tag at all exits 1 (setuptools-scm's fallback version).
GET_VERSION_TAG = '''\
"""The version tag setuptools-scm builds from (SGLang's git_describe_command)."""

import re
import subprocess
import sys


def git(*args):
    p = subprocess.run(["git", *args], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else ""


def key(tag):
    m = re.match(r"^v(\\d+)\\.(\\d+)\\.(\\d+)(?:\\.?(rc|post)(\\d+))?$", tag)
    if not m:
        return (0, 0, 0, 0, 0)
    rank = {"rc": 0, None: 1, "post": 2}[m.group(4)]
    return (*map(int, m.group(1, 2, 3)), rank, int(m.group(5) or 0))


def main():
    exact = git("describe", "--tags", "--exact-match", "--match", "v*")
    if exact:
        print(exact)
        return 0
    tags = sorted(git("tag", "--list", "v*.*.*").splitlines(), key=key)
    if not tags:
        print("no version tag (v*.*.*): setuptools-scm falls back", file=sys.stderr)
        return 1
    described = git("describe", "--tags", "--long", "--match", tags[-1], "HEAD")
    if not described:  # the tag is on a release branch: count from where they forked
        fork = git("merge-base", tags[-1], "HEAD")
        if not fork:
            print(f"{tags[-1]} shares no history with HEAD (a shallow clone?)",
                  file=sys.stderr)
            return 1
        described = (f"{tags[-1]}-{git('rev-list', '--count', fork + '..HEAD')}"
                     f"-g{git('rev-parse', '--short', 'HEAD')}")
    print(described)
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

INIT_PY = '''\
"""SGLang public API (this package: its version and its server)."""

from sglang.version import __version__

__all__ = ["__version__"]
'''

SCHEDULER_PY = '''\
"""The scheduler's decode loop: every decode step produces one token per running request."""

# How long one decode step takes on this build (ms per token); the server streams each token
# after the one before this much later.
DECODE_DELAY_MS = {delay!r}
'''

LAUNCH_SERVER_PY = '''\
"""Launch the inference server: `python -m sglang.launch_server --model-path M [flags]`.

Serves SGLang's HTTP API through infer-forge's test stand-in (a GPU server cannot run in the
tests), claiming this package's own version and streaming at its decode loop's speed.
"""

import os
import sys

FAKE_SERVER = {fake_server!r}


def main(argv=None):
    from sglang.srt.managers.scheduler import DECODE_DELAY_MS
    from sglang.version import __version__

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:  # the help text alone, as the real parser prints it
        os.execv(sys.executable, [sys.executable, FAKE_SERVER, "--help"])
    if not any(a in ("--model-path", "--model") or a.startswith(("--model-path=", "--model="))
               for a in argv):
        print("launch_server.py: error: the following arguments are required: --model-path",
              file=sys.stderr)
        return 2
    print(f"[sglang] version={{__version__}} decode_delay_ms={{DECODE_DELAY_MS}} "
          f"package={{os.path.dirname(__file__)}}", flush=True)
    env = dict(os.environ, FAKE_SGLANG_VERSION=__version__,
               FAKE_SGLANG_ITL_MS=str(DECODE_DELAY_MS))
    # exec: the server is this process (its pid and process group are the launch's)
    os.execve(sys.executable, [sys.executable, FAKE_SERVER, *argv], env)


if __name__ == "__main__":
    sys.exit(main())
'''

CLI_MAIN_PY = '''\
"""The `sglang` command: `sglang serve --model-path M [flags]` launches the server."""

import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] != ["serve"]:
        print("usage: sglang serve --model-path MODEL_PATH [server flags]", file=sys.stderr)
        return 2
    from sglang.launch_server import main as launch

    return launch(argv[1:])
'''

GITIGNORE = '''\
__pycache__/
*.py[cod]
build/
dist/
*.egg-info/
python/sglang/_version.py
'''


@dataclass(frozen=True)
class SGLangRepo:
    """The repository and its commits (full ids). `main` is the tagged release commit."""

    path: Path
    main: str
    fast: str
    broken_install: str
    tag: str = RELEASE_TAG

    @property
    def branches(self) -> dict[str, str]:
        return {"main": self.main, "fast": self.fast, "broken-install": self.broken_install}

    @property
    def decode_delay_ms(self) -> dict[str, float]:
        """Each branch's per-token decode delay (broken-install keeps main's)."""
        return {"main": SLOW_MS, "fast": FAST_MS, "broken-install": SLOW_MS}

    def bare_clone(self, dest: Path) -> Path:
        """A bare clone at `dest` (every branch and tag): a remote to clone, fetch and push."""
        git(["clone", "-q", "--bare", str(self.path), str(dest)], dest.parent)
        return dest

    def sha7(self, commit: str) -> str:
        """The abbreviation a build's version carries (`+g<sha7>`)."""
        return out(["rev-parse", "--short=7", commit], self.path)

    def version_of(self, branch: str) -> str:
        """The version a build of that branch reports, as setuptools-scm computes it."""
        if branch == "main":
            return self.tag.lstrip("v")
        major, minor, patch = (int(x) for x in self.tag.lstrip("v").split("."))
        return f"{major}.{minor}.{patch + 1}.dev1+g{self.sha7(self.branches[branch])}"


def package_files(delay_ms: float, *, broken: bool = False) -> dict[str, str]:
    """The tree of one commit: {path relative to the repository root: text}."""
    return {
        ".gitignore": GITIGNORE,
        "README.md": "# sglang (made by infer-forge's tests)\n",
        "python/README.md": "SGLang-shaped package made by infer-forge's tests.\n",
        "python/pyproject.toml": PYPROJECT.format(
            packages_find=PACKAGES_FIND_BROKEN if broken else PACKAGES_FIND),
        "scripts/release/get_version_tag.py": GET_VERSION_TAG,
        "python/sglang/__init__.py": INIT_PY,
        "python/sglang/version.py": VERSION_PY,
        "python/sglang/launch_server.py": LAUNCH_SERVER_PY.format(fake_server=str(FAKE_SERVER)),
        "python/sglang/cli/__init__.py": "",
        "python/sglang/cli/main.py": CLI_MAIN_PY,
        "python/sglang/srt/__init__.py": "",
        "python/sglang/srt/managers/__init__.py": "",
        "python/sglang/srt/managers/scheduler.py": SCHEDULER_PY.format(delay=delay_ms),
    }


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


# Fixed identity and dates: the same fixture makes the same commits on one checkout.
_GIT_ENV = {"GIT_AUTHOR_NAME": "SGLang Dev", "GIT_AUTHOR_EMAIL": "dev@sglang.invalid",
            "GIT_COMMITTER_NAME": "SGLang Dev", "GIT_COMMITTER_EMAIL": "dev@sglang.invalid",
            "GIT_AUTHOR_DATE": "2026-11-02T12:00:00Z",
            "GIT_COMMITTER_DATE": "2026-11-02T12:00:00Z"}


def _commit(root: Path, files: dict[str, str], message: str) -> str:
    _write(root, files)
    git(["add", "-A"], root, env=_GIT_ENV)
    git(["commit", "-q", "-m", message], root, env=_GIT_ENV)
    return out(["rev-parse", "HEAD"], root)


def scm_version(python_dir: Path) -> str:
    """The version setuptools-scm gives a build of the checkout whose `python/` directory is
    `python_dir`, without building (`python -m setuptools_scm` there)."""
    p = subprocess.run([sys.executable, "-m", "setuptools_scm"], cwd=python_dir,
                       capture_output=True, text=True, timeout=60, check=True)
    return p.stdout.strip()


def make_sglang_repo(path: Path) -> SGLangRepo:
    """The repository at `path` (created; must not exist or be empty), `main` checked out."""
    path.mkdir(parents=True, exist_ok=True)
    git(["init", "-q", "-b", "main"], path)
    main = _commit(path, package_files(SLOW_MS), f"Release {RELEASE_TAG}")
    git(["tag", "-a", RELEASE_TAG, "-m", f"Release {RELEASE_TAG}"], path, env=_GIT_ENV)
    git(["checkout", "-q", "-b", "fast"], path)
    fast = _commit(path, {"python/sglang/srt/managers/scheduler.py":
                          SCHEDULER_PY.format(delay=FAST_MS)},
                   "scheduler: a faster decode step")
    git(["checkout", "-q", "-b", "broken-install", main], path)
    broken = _commit(path, {"python/pyproject.toml": PYPROJECT.format(
        packages_find=PACKAGES_FIND_BROKEN)}, "build: move the package to a src layout")
    git(["checkout", "-q", "main"], path)
    return SGLangRepo(path=path, main=main, fast=fast, broken_install=broken)


# --- environments -------------------------------------------------------------------------

def site_packages(env: Path) -> Path:
    """The purelib directory of the venv at `env`."""
    return Path(sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)}))


def forge_site_packages() -> Path:
    """forge's own environment's site-packages (the one running the tests)."""
    return Path(sysconfig.get_path("purelib"))


def layered_env(base_site: Path, path: Path) -> Path:
    """A venv at `path` (no pip of its own) that imports from its own site-packages first,
    then from `base_site` and everything `base_site`'s .pth files add (site.addsitedir)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True,
                   capture_output=True)
    # "zz": .pth files run in name order; the layer comes after what the env installs itself.
    (site_packages(path) / "zz_layered_base.pth").write_text(
        f"import site; site.addsitedir({str(base_site)!r})\n")
    return path


def python_of(env: Path) -> Path:
    return env / "bin" / "python"


# How `install` builds: "editable" is `pip install -e` as setuptools does it by default
# (for SGLang's flat python/ layout: a meta-path finder appended AFTER the path finder, so an
# `sglang` a base layer has installed is imported instead: see the tests); "compat" is
# `-e` with `--config-settings editable_mode=compat` (a .pth naming python/, ahead of the
# layer's .pth by name); "wheel" a regular install into the env's own site-packages.
MODES = ("compat", "editable", "wheel")


def install(env: Path, python_dir: Path, mode: str = "compat",
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`pip install --no-build-isolation --no-deps [-e] python_dir` in `env`, offline (the
    build backend, setuptools and setuptools-scm, come from the layers below), as `mode`
    says (MODES). Raises RuntimeError with pip's output when pip fails."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    how = {"compat": ["-e", str(python_dir), "--config-settings", "editable_mode=compat"],
           "editable": ["-e", str(python_dir)], "wheel": [str(python_dir)]}[mode]
    argv = [str(python_of(env)), "-m", "pip", "install", "-q", "--no-build-isolation",
            "--no-deps", "--no-index", "--disable-pip-version-check", *how]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "PIP_NO_INPUT": "1"})
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return p


def installed_base(path: Path) -> Path:
    """A base environment at `path/env` with `sglang` BASE_VERSION installed (the same
    package, built at a `v0.5.23` tag in `path/src` and installed non-editable, as a release
    wheel is), layered on forge's own environment. Returns the env's directory."""
    src = path / "src"
    src.mkdir(parents=True)
    git(["init", "-q", "-b", "main"], src)
    _commit(src, package_files(SLOW_MS), f"Release v{BASE_VERSION}")
    git(["tag", "-a", f"v{BASE_VERSION}", "-m", f"Release v{BASE_VERSION}"], src,
        env=_GIT_ENV)
    env = layered_env(forge_site_packages(), path / "env")
    install(env, src / "python", mode="wheel")
    return env


# --- an A/B on this machine (tests/harness/loop/test_ab.py, bench/ab.py) -------------------

# The member's `deploy.install`, as docs/ab.md has it, offline: the build backend comes from
# the base environment; `editable_mode=compat` so the build is imported before the base's.
DEPLOY_INSTALL = ("python -m pip install -q --no-deps --no-build-isolation --no-index "
                  "-e python --config-settings editable_mode=compat")


def ab_spec(d: Path, base_python: Path, *, input_len: int = 32, output_len: int = 24,
            prompts: int = 8, concurrency: int = 4, slo: dict | None = None) -> Path:
    """A point on this CPU (the generated tiny model, colocated) and its sglang profile whose
    base environment is `base_python`, written into `d`; the point file's path."""
    import yaml

    d.mkdir(parents=True, exist_ok=True)
    (d / "profile.yaml").write_text(yaml.safe_dump({
        "service": "sglang-ab", "rev": 1, "engine": "sglang",
        "config": {"python": str(base_python), "startup_timeout_s": 60},
        "framework": {"kind": "sglang", "version": BASE_VERSION}}))
    scenario: dict = {"modality": "text",
                      "traffic": {"input_len": input_len, "output_len": output_len,
                                  "range_ratio": 1.0, "concurrency": concurrency,
                                  "num_prompts": prompts}}
    if slo:
        scenario["slo"] = slo
    (d / "point.yaml").write_text(yaml.safe_dump({
        "name": "ab-cpu",
        "model": {"name": "tiny-llama", "source": "forge:tiny-llama", "revision": "1",
                  "modalities": ["text"]},
        "scenario": scenario,
        "topology": {"architecture": "colocated"},
        "runtime_profile": {"service": "sglang-ab", "rev": 1, "file": "profile.yaml"},
        "accelerator": {"vendor": "cpu", "model": "x86_64", "count": 1}}))
    return d / "point.yaml"
