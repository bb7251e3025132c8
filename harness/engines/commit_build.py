"""A build of a MonoRepo member's commit as something an engine deploys (the manifest's
`deploy:`, repos/manifest.py), recorded and cached by its inputs.

Contract:
- `build(ws, mono, member, commit, base_python=…)` → `Deployable` (failures as data:
  `success`, `error`). The build lives in `FORGE_HOME/builds/<member>/<hex>/`: `src/` (a
  shared clone of the member checked out at the commit, nested submodules initialised when
  `deploy.submodules`), and for `kind: venv` `env/`: a virtual environment made by the base
  Python (the profile's interpreter) that sees the base's packages after its own
  (`zz_forge_base.pth`: `site.addsitedir` of the base's site directories, so the base's own
  `.pth` files work too), with the member installed from `src/` by `deploy.install` (run
  in `src/` in the Safety Guard's sandbox, the environment first on PATH, writing only the
  build's directory; network only when `deploy.network`, said in the record). For
  `kind: image`, `image_build.build_image` builds the image from `src/`.
- Identity: after the install, `deploy.module` (default: the member's name) is imported by
  the environment's own interpreter from a neutral directory; its `__file__` must lie inside
  this build (the source or the environment), else the build failed: the install fell back
  to the installed package. Its `__version__` and `_version.__commit_id__` (what a
  setuptools-scm build writes, as SGLang's own releases do) are the build's identity;
  `identity_problem` holds a server's reported version against it.
- The key (`build_key`) is a digest of the member, commit, deploy recipe, the base Python
  (its executable, version and installed distributions) and the sandbox's settings. A
  finished build writes `build.json` (atomically, last); a hit returns it with
  `cached=True` and runs nothing; a directory without it (a build killed midway) is removed
  and built again. Builds of one key hold an exclusive flock on `<hex>.lock`: two builds of
  one key run it once. A failed build leaves no `build.json` (the next asks again).
- The install is a `ToolInvoked(tool="deploy-build", input_digests={build: key})`, returned
  unsaved (a hit: the same event shape with the cached logs' digests).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.atomic import write_atomic
from ...ledger.clock import digest, utcnow
from ...ledger.payloads import Digest
from ...ledger.specs import RuntimeProfile, SandboxSpec
from ...ledger.workspace import Workspace
from ...repos.errors import RepoError
from ...repos.git import git
from ...repos.manifest import Deploy
from ...repos.root import MonoRepo
from ..errors import HarnessError
from ..guard.sandbox import prepare, settings_key
from ..proc import last_line
from ..tool_calls.build import held_lock
from ..tool_calls.calls import run_tool

Progress = Callable[[str], None]
BUILDS_DIR = "builds"
MARKER = "build.json"
MARKER_VERSION = 1
BASE_PTH = "zz_forge_base.pth"  # processed after the environment's own .pth files
# setuptools-scm's local version part: `+g<sha>` (a dirty tree adds `.dYYYYMMDD`).
SCM_COMMIT = re.compile(r"\+g([0-9a-f]{7,40})(?:\.|$)")

# What the base Python is: a change to it (an upgrade, a package installed) is a new build.
_BASE_PROBE = r"""
import json, os, site, sys
dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
dists = sorted(n for d in dirs for n in os.listdir(d) if n.endswith((".dist-info", ".egg-info")))
print(json.dumps({"executable": sys.executable, "version": sys.version, "prefix": sys.prefix,
                  "site": dirs, "dists": dists}))
"""

# Where a module comes from in an environment (run from a neutral directory, no -c path).
_MODULE_PROBE = r"""
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        m = importlib.import_module(name)
    except Exception as e:
        out[name] = {"error": f"{type(e).__name__}: {e}"}
        continue
    cid = None
    try:
        cid = getattr(importlib.import_module(name + "._version"), "__commit_id__", None)
    except Exception:
        pass
    out[name] = {"file": getattr(m, "__file__", None),
                 "version": str(getattr(m, "__version__", "") or "") or None,
                 "commit_id": cid if isinstance(cid, str) else None}
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Deployable:
    """One member's commit, built (or why not). `python`: the environment's interpreter
    (venv); `image`: `name@sha256:…` (image). `version`/`commit_id`/`origin`: what the
    build's module says of itself."""

    member: str
    commit: str
    key: str
    kind: str
    path: str
    module: str
    network: bool
    success: bool = True
    error: str | None = None
    python: str | None = None
    image: str | None = None
    version: str | None = None
    commit_id: str | None = None
    origin: str | None = None
    cached: bool = False
    duration_s: float = 0.0
    event: E.ToolInvoked | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """What a run's `meta.builds[<member>]` says of it."""
        out = {"commit": self.commit, "key": self.key, "kind": self.kind,
               "module": self.module, "version": self.version, "commit_id": self.commit_id,
               "network": self.network, "cached": self.cached,
               "duration_s": round(self.duration_s, 3)}
        if self.image:
            out["image"] = self.image
        return out


def module_of(member: str, deploy: Deploy) -> str:
    return deploy.module or member.replace("-", "_")


def reported_commit(version: str | None, commit_id: str | None = None) -> str | None:
    """The commit a version string or a setuptools-scm `commit_id` names (hex), or None."""
    for text in (commit_id, version):
        if not text:
            continue
        m = SCM_COMMIT.search(text) if text is version else \
            re.fullmatch(r"g?([0-9a-f]{7,40})", text)
        if m:
            return m.group(1)
    return None


def identity_problem(built: Deployable, server_version: str | None, where: str) -> str | None:
    """Why the server at `where` (reporting `server_version`) is not this build, or None."""
    name = f"the build of {built.member}@{built.commit[:12]}"
    if built.version is None:
        return None
    if server_version != built.version:
        return (f"{where} reports {built.module} {server_version}, but {name} is "
                f"{built.version}: not the candidate's build; not measured")
    named = reported_commit(server_version)
    if named is not None and not built.commit.startswith(named):
        return (f"{where} reports commit {named} in its version {server_version}, but "
                f"{name} is commit {built.commit[:12]}; not measured")
    return None


# --- the base Python ------------------------------------------------------------------------


def _run_json(argv: Sequence[str], what: str, cwd: Path | None = None,
              env: Mapping[str, str] | None = None) -> Any:
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=300, cwd=cwd,
                           env=dict(env) if env is not None else None)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HarnessError(f"{what}: {e}") from None
    if r.returncode != 0:
        raise HarnessError(f"{what} exited {r.returncode}: {last_line(r.stderr or r.stdout)}")
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise HarnessError(f"{what}: no JSON answer ({r.stdout[-200:]!r})") from None


def _clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """forge's environment without what would change where Python imports from."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    return {**env, **(extra or {})}


def _stamps(dirs: Sequence[str]) -> tuple[int, ...]:
    """When each site directory last changed (an install or removal changes it)."""
    out = []
    for d in dirs:
        try:
            out.append(os.stat(d).st_mtime_ns)
        except OSError:
            out.append(-1)
    return tuple(out)


class BaseProbes:
    """The base interpreters seen in this process: a probe (a Python start, ~70 ms) is
    asked again only when one of its site directories changed since."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[tuple[int, ...], dict[str, Any]]] = {}

    def __call__(self, python: str) -> dict[str, Any]:
        seen = self._seen.get(python)
        if seen is not None and _stamps(seen[1]["site"]) == seen[0]:
            return seen[1]
        info = _run_json([python, "-c", _BASE_PROBE], f"base Python {python}",
                         env=_clean_env())
        if not isinstance(info, dict) or not isinstance(info.get("site"), list):
            raise HarnessError(f"base Python {python}: unexpected answer {info!r}")
        self._seen[python] = (_stamps(info["site"]), info)
        return info


# The base interpreter: executable, version, site directories, installed distributions.
base_of = BaseProbes()


def build_key(member: str, commit: str, deploy: Deploy, base: Mapping[str, Any],
              sandbox: Mapping[str, Any]) -> str:
    return digest({"v": MARKER_VERSION, "member": member, "commit": commit,
                   "deploy": deploy.model_dump(mode="json"),
                   "base": {k: base.get(k) for k in ("executable", "version", "dists")},
                   "sandbox": dict(sandbox)})


def probe_modules(python: str | Path, modules: Sequence[str], cwd: Path) -> dict[str, Any]:
    """{module: {file, version, commit_id} or {error}} as that interpreter imports them."""
    out = _run_json([str(python), "-c", _MODULE_PROBE, *modules],
                    f"import {', '.join(modules)} with {python}", cwd=cwd, env=_clean_env())
    if not isinstance(out, dict):
        raise HarnessError(f"probe of {python}: unexpected answer {out!r}")
    return out


def origin_problem(found: Mapping[str, Any], module: str, member: str, commit: str,
                   inside: Path) -> str | None:
    """Why `module` as found is not this build's (it must come from `inside`), or None."""
    name = f"the build of {member}@{commit[:12]}"
    if "error" in found:
        return f"{name}: `import {module}` fails in its environment: {found['error']}"
    f = found.get("file")
    if not f or not Path(f).resolve().is_relative_to(inside.resolve()):
        return (f"{name} installed no {module}: its environment imports {module} "
                f"{found.get('version') or '?'} from {f} — the install fell back to the "
                "installed package")
    return None


# --- the build ------------------------------------------------------------------------------


def builds_dir(ws: Workspace) -> Path:
    return ws.home / BUILDS_DIR


def _read_marker(d: Path, key: str) -> dict[str, Any] | None:
    try:
        m = json.loads((d / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or m.get("key") != key or m.get("v") != MARKER_VERSION:
        return None
    if m.get("python") and not Path(m["python"]).exists():
        return None
    return m


def _source(mono: MonoRepo, member: str, commit: str, src: Path, deploy: Deploy) -> None:
    """`src`: the member at `commit` (a shared clone: no object copies), submodules in."""
    try:
        git(["clone", "-q", "--shared", "--no-checkout", str(mono.member_dir(member)),
             str(src)])
        git(["checkout", "-q", "--detach", commit], src)
        if deploy.submodules and (src / ".gitmodules").is_file():
            # A member's submodules may name local paths (git refuses file:// by default).
            git(["-c", "protocol.file.allow=always", "submodule", "update", "-q", "--init",
                 "--recursive"], src, timeout=3600)
    except RepoError as e:
        raise HarnessError(f"source of {member}@{commit[:12]}: "
                           f"{' '.join(str(e).split())[:300]}") from None


def _venv(base_python: str, base: Mapping[str, Any], env_dir: Path) -> Path:
    r = subprocess.run([base_python, "-m", "venv", "--without-pip", str(env_dir)],
                       capture_output=True, text=True, timeout=300, env=_clean_env())
    if r.returncode != 0:
        raise HarnessError(f"python -m venv with {base_python}: "
                           f"{last_line(r.stderr or r.stdout)}")
    python = env_dir / "bin" / "python"
    site_dirs = _run_json([str(python), "-c", "import json, site; "
                           "print(json.dumps(site.getsitepackages()))"],
                          f"the new environment {env_dir}", env=_clean_env())
    own = Path(site_dirs[0])
    lines = [f"import site; site.addsitedir({d!r})" for d in base["site"]]
    (own / BASE_PTH).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return python


def _install_argv(install: str | list[str]) -> list[str]:
    return ["bash", "-c", install] if isinstance(install, str) else [str(a) for a in install]


def build(ws: Workspace, mono: MonoRepo, member: str, commit: str, *, base_python: str,
          task: str | None = None, sandbox: SandboxSpec | None = None,
          say: Progress | None = None) -> Deployable:
    """The deployable build of `member` at `commit` (module contract)."""
    say = say or (lambda _m: None)
    t0 = time.monotonic()
    deploy = mono.member(member).deploy
    if deploy is None:
        raise HarnessError(f"member {member} has no deploy recipe in the manifest (add "
                           "`deploy: {install: …, module: …}` to its entry in forge-repos.yaml)")
    module = module_of(member, deploy)
    spec = (sandbox or SandboxSpec()).model_copy(update={"network": deploy.network or bool(
        sandbox and sandbox.network)})
    base = base_of(base_python) if deploy.kind == "venv" else {}
    key = build_key(member, commit, deploy, base, settings_key(ws, spec))
    hexkey = key.split(":")[-1][:24]
    parent = builds_dir(ws) / member
    parent.mkdir(parents=True, exist_ok=True)
    d = parent / hexkey
    common: dict[str, Any] = dict(member=member, commit=commit, key=key, kind=deploy.kind,
                                  path=str(d), module=module, network=spec.network)
    with held_lock(parent / f"{hexkey}.lock", say, f"{member}@{commit[:12]}"):
        marker = _read_marker(d, key)
        if marker is not None:
            took = time.monotonic() - t0
            ev = E.ToolInvoked(tool="deploy-build", argv=marker["argv"], cwd=str(d / "src"),
                               env_digest=marker["env_digest"], exit_code=0,
                               duration_s=round(took, 6), stdout_digest=marker["stdout_digest"],
                               stderr_digest=marker["stderr_digest"],
                               input_digests={Digest.BUILD: key})
            return Deployable(**common, python=marker.get("python"), image=marker.get("image"),
                              version=marker.get("version"), commit_id=marker.get("commit_id"),
                              origin=marker.get("origin"), cached=True, duration_s=took,
                              event=ev, extra=dict(marker.get("extra") or {}))
        if d.exists():  # a build killed midway: ours (the lock is held), start again
            say(f"removing the unfinished build {d}")
            shutil.rmtree(d)
        d.mkdir()
        say(f"building {member}@{commit[:12]} ({deploy.kind}, key {hexkey[:12]}"
            f"{', network allowed' if spec.network else ''})")
        try:
            _source(mono, member, commit, d / "src", deploy)
            if deploy.kind == "image":
                out = _build_image(ws, member, commit, d, deploy, key, task, spec, say)
            else:
                out = _build_venv(ws, member, commit, d, deploy, key, base_python, base,
                                  module, task, spec, say)
        except HarnessError as e:
            return Deployable(**common, success=False, error=" ".join(str(e).split()),
                              duration_s=time.monotonic() - t0)
        if out.success:
            done = out.event
            assert done is not None
            write_atomic(d / MARKER, json.dumps({
                "v": MARKER_VERSION, "key": key, **out.record(), "member": member,
                "python": out.python, "origin": out.origin, "extra": out.extra,
                "argv": done.argv,
                "env_digest": done.env_digest, "stdout_digest": done.stdout_digest,
                "stderr_digest": done.stderr_digest, "when": utcnow().isoformat()},
                indent=2, sort_keys=True), mode=0o644, fsync=True)
        return replace(out, duration_s=time.monotonic() - t0)


def _build_venv(ws: Workspace, member: str, commit: str, d: Path, deploy: Deploy, key: str,
                base_python: str, base: Mapping[str, Any], module: str, task: str | None,
                spec: SandboxSpec, say: Progress) -> Deployable:
    env_dir = d / "env"
    python = _venv(base_python, base, env_dir)
    argv = _install_argv(deploy.install)
    src = d / "src"
    # The build's environment first: `python`/`pip` in the recipe are the build's.
    child = {"VIRTUAL_ENV": str(env_dir), "PATH": f"{env_dir / 'bin'}:{os.environ.get('PATH', '')}",
             "PYTHONNOUSERSITE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    spec = spec.model_copy(update={"writable": [*spec.writable, str(d)]})
    launch, env, profile = prepare(ws, argv, cwd=src, task=task, env=child, spec=spec)
    say(f"installing {member} into {env_dir}: {' '.join(argv)[-160:]}")
    run = run_tool(ws, launch, tool="deploy-build", cwd=src, own_session=True, env=env,
                   prepared=profile, event_fields={"input_digests": {Digest.BUILD: key}})
    ev = run.event.model_copy(update={"argv": argv})  # what the recipe says, not the sandbox's
    common: dict[str, Any] = dict(member=member, commit=commit, key=key, kind="venv", path=str(d),
                  module=module, network=spec.network, python=str(python), event=ev)
    if run.returncode != 0 or ev.error:
        how = ev.error or f"exited {run.returncode}"
        tail = last_line(run.stderr or run.stdout)
        return Deployable(**common, success=False,
                          error=f"install of {member}@{commit[:12]} {how}"
                          + (f": {tail}" if tail else ""))
    found = probe_modules(python, [module], d)[module]
    problem = origin_problem(found, module, member, commit, d)
    if problem is not None:
        return Deployable(**common, success=False, error=problem)
    return Deployable(**common, version=found.get("version"), commit_id=found.get("commit_id"),
                      origin=found.get("file"))


def _build_image(ws: Workspace, member: str, commit: str, d: Path, deploy: Deploy, key: str,
                 task: str | None, spec: SandboxSpec, say: Progress) -> Deployable:
    # In the function for start-up time: the image builder loads for image builds only.
    from .image_build import build_image

    built = build_image(ws, member=member, commit=commit, src=d / "src", deploy=deploy,
                        key=key, task=task, sandbox=spec, say=say)
    return Deployable(member=member, commit=commit, key=key, kind="image", path=str(d),
                      module=module_of(member, deploy), network=spec.network,
                      image=built.ref, version=built.version, commit_id=built.commit_id,
                      origin=built.origin, cached=built.cached,
                      event=built.event.model_copy(update={"tool": "deploy-build"}),
                      extra={"name": built.name, "digest": built.digest})


def check_layered(builds: Sequence[Deployable]) -> str | None:
    """In the last build's environment (each venv build is layered on the one before), each
    build's module still comes from its own build (a later install may have pulled a
    released copy over it); why not, or None."""
    venvs = [b for b in builds if b.kind == "venv" and b.success and b.python]
    if len(venvs) < 2:
        return None
    last = venvs[-1]
    assert last.python is not None
    found = probe_modules(last.python, [b.module for b in venvs], Path(last.path))
    for b in venvs:
        p = origin_problem(found[b.module], b.module, b.member, b.commit, Path(b.path))
        if p is not None:
            return f"in the environment of {last.member}: {p}"
    return None


# Which module a server of each engine reports the version of (`transformers serve` reports
# none: a build could not be told from the installed package, so hf does not deploy builds).
ENGINE_MODULES = {"sglang": "sglang"}


def engine_build(engine: str, builds: Mapping[str, Deployable]) -> Deployable | None:
    """The build of the module the engine's server reports (its version), if one is built."""
    module = ENGINE_MODULES.get(engine)
    return next((b for b in builds.values() if b.module == module), None)


def apply_builds(profile: RuntimeProfile, builds: Mapping[str, Deployable]) -> RuntimeProfile:
    """The profile whose servers run the builds: a venv build's interpreter as the engine's
    `python` (each venv build is layered on the one before, so the last has them all; its
    servers with `PYTHONSAFEPATH=1`: no working directory on sys.path), the
    engine module's build version as its pinned version; an image build as its image.
    Raises HarnessError when the profile cannot run a build (one line naming why)."""
    if not builds:
        return profile
    if profile.engine not in ENGINE_MODULES:
        raise HarnessError(f"the {profile.engine} engine cannot deploy a build of a commit "
                           "(an external endpoint is not forge's to launch; `transformers "
                           "serve` reports no version to check the build by): use the "
                           "sglang engine")
    config = dict(profile.config)
    if config.get("launcher"):
        raise HarnessError(f"profile {profile.service}: config.launcher "
                           f"{config['launcher']!r} would not run the build's environment; "
                           "remove it to deploy a build (forge sets `python`)")
    venvs = [b for b in builds.values() if b.kind == "venv"]
    images = [b for b in builds.values() if b.kind == "image"]
    if venvs and images:
        raise HarnessError("members built as a venv and as an image cannot run together "
                           f"({', '.join(b.member for b in venvs)} / "
                           f"{', '.join(b.member for b in images)})")
    own = engine_build(profile.engine, builds)
    if venvs:
        config["python"] = venvs[-1].python
        # `python -m` puts the working directory first on sys.path: a checkout there (forge
        # run from the member's `python/`) would shadow the build. Python 3.11+ skips it.
        config["env"] = {**(config.get("env") or {}), "PYTHONSAFEPATH": "1"}
        if profile.image is not None:
            raise HarnessError(f"profile {profile.service} runs in image "
                               f"{profile.image.name}; a venv build cannot run there (give "
                               "the member `deploy: {kind: image}`)")
    update: dict[str, Any] = {}
    if own is not None and own.version and profile.engine == "sglang":
        config["version"] = own.version  # the flags and the start check are for the build
        if profile.framework is not None:
            update["framework"] = profile.framework.model_copy(update={"version": own.version})
    out = profile.model_copy(update={"config": config, **update})
    for b in images:
        # In the function for start-up time: the image builder loads for image builds only.
        from .image_build import BuiltImage, apply_image

        assert b.image is not None and b.event is not None
        out = apply_image(out, BuiltImage(
            ref=b.image, name=b.extra["name"], digest=b.extra["digest"], version=b.version,
            commit_id=b.commit_id, origin=b.origin, event=b.event, cached=b.cached))
    return out
