"""An image built from a member's commit, addressed by digest (issue 30, the `image` kind of
a member's `deploy:`; the venv kind and the dispatcher live in commit_build.py).

Contracts:
- `build_image(ws, member=, commit=, src=, deploy=, key=, task=, sandbox=, say=)` gives a
  `BuiltImage` or raises HarnessError (one line naming the member and the commit):
  1. Cache: an image labelled `infer-forge.build=<key>` present in the runtime
     (`image ls --filter label=… --no-trunc --format {{.ID}}`) is reused (`cached=True`),
     nothing is built.
  2. Build: `<runtime> build -f <src>/<dockerfile> --label infer-forge.member=<member>
     --label infer-forge.commit=<sha> --label infer-forge.build=<key> [--build-arg K=V]…
     [--network none unless deploy.network] -t forge-build/<member>:<commit12>
     <src>/<context>`, a recorded tool call (`calls.run_tool`: its own session, dying with
     forge; output redacted and stored as artifacts; `ToolInvoked(tool="build",
     input_digests={build: key})`, returned unsaved). The runtime's client runs outside
     bubblewrap: the build's isolation is the runtime's own (its RUN steps run in the
     runtime's containers, without network unless `deploy.network`), and bubblewrap would
     hide the runtime's socket, storage and configuration (buildx, registry logins) the
     client needs. It gets the sandbox's allowlisted environment, its real `HOME` and the
     runtime's own variables (`DOCKER_*`, `CONTAINER*`, `BUILDKIT_*`, `XDG_*`, secret-named
     ones excepted); the event's `sandbox` profile says so (`kind: none` and why, `network`:
     the build's).
  3. Identity: the image (by ID) must carry the labels of the member, the commit asked and
     the key (`image inspect --format {{json .Config.Labels}}`), else HarnessError.
  4. Probe (`deploy.module`): `<runtime> run --rm --network none --entrypoint python3 <ID>
     -c <probe> <module>` reads, inside the image, the module's `__version__`, its
     `_version.__commit_id__` (setuptools-scm / vcs-versioning write `_version.py`; the
     commit id is `g` and the first 9 hex digits of the commit) and its `__file__`, loading
     the package's `_version.py` (SGLang from 0.5.13), else its `version.py` (SGLang before),
     by path, so the package's own `__init__` (SGLang's imports torch) runs only when it has
     neither. A module that is not in the image, or a commit id
     that is not the commit asked (`commit_matches`: e.g. a Dockerfile that cloned upstream
     instead of copying the context), is a HarnessError.
- Addressing: a local build has no repo digest (only a push gives one); its image ID
  (`sha256:…`, the digest of its config) is its content address. `BuiltImage.ref` is
  `forge-build/<member>:<commit12>@sha256:<ID>`, which image.py recognises as a local build
  and runs by the bare ID (see image.py's contract: `docker run name@sha256:<ID>` does not
  resolve a local build in docker's classic store).
- `apply_image(profile, built)`: the profile whose servers run in that image (`image`
  replaced, `image_fallback: refuse`, so a host without a runtime never measures its local
  install instead; `framework.version` set to the version probed, when known, so the start
  check holds the server's `/server_info` version to it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...ledger import events as E
from ...ledger.payloads import Digest
from ...ledger.secrets.names import is_secret_name
from ...ledger.specs import IMAGE_DIGEST, RuntimeProfile, SandboxSpec
from ...ledger.workspace import Workspace
from ...repos.manifest import Deploy
from ..errors import HarnessError
from ..guard.sandbox import SandboxProfile, child_env, scratch_of
from ..proc import last_line
from ..tool_calls.calls import capture_redactor, env_digest, run_tool
from .image import BUILD_NAMESPACE, ContainerRuntime, detect_runtime, image_id

LABEL_MEMBER = "infer-forge.member"
LABEL_COMMIT = "infer-forge.commit"
LABEL_BUILD = "infer-forge.build"
BUILD_TIMEOUT_S = 6 * 3600.0  # SGLang's image compiles DeepEP and more: hours, not minutes
PROBE_TIMEOUT_S = 600.0
QUERY_TIMEOUT_S = 120.0
PROBE_MARK = "FORGE-IMAGE-PROBE "
# The runtime client's own configuration, passed by name (secret-named ones are not).
RUNTIME_ENV = re.compile(r"(DOCKER|CONTAINER|CONTAINERS|BUILDKIT|BUILDX|XDG)_[A-Z0-9_]*"
                         r"|CONTAINER_HOST|REGISTRY_AUTH_FILE")
Say = Callable[[str], None]

# Runs inside the image: python3 -c PROBE <module>. Prints one marked JSON line.
PROBE = """\
import importlib, importlib.util, json, os, sys
name = sys.argv[1]
out = {"version": None, "commit_id": None, "origin": None, "error": None}
try:
    spec = importlib.util.find_spec(name)
except Exception as e:
    spec, out["error"] = None, f"{type(e).__name__}: {e}"
if spec is None:
    out["error"] = out["error"] or "no module named " + repr(name)
else:
    out["origin"] = spec.origin
    locs = list(spec.submodule_search_locations or [])
    try:
        for leaf in ("_version", "version"):
            vfile = os.path.join(locs[0], leaf + ".py") if locs else ""
            if not os.path.isfile(vfile):
                continue
            vs = importlib.util.spec_from_file_location(name + "." + leaf, vfile)
            vm = importlib.util.module_from_spec(vs)
            vs.loader.exec_module(vm)
            out["version"] = getattr(vm, "__version__", None)
            out["commit_id"] = getattr(vm, "__commit_id__", None)
            break
        if out["version"] is None:
            mod = importlib.import_module(name)
            out["version"] = getattr(mod, "__version__", None)
            out["origin"] = getattr(mod, "__file__", None) or out["origin"]
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
for k in ("version", "commit_id", "origin"):
    out[k] = None if out[k] is None else str(out[k])
print(__MARK__ + json.dumps(out))
""".replace("__MARK__", repr(PROBE_MARK))


@dataclass(frozen=True)
class BuiltImage:
    ref: str  # forge-build/<member>:<commit12>@sha256:<ID> (image.py: a local build)
    name: str  # forge-build/<member>:<commit12>
    digest: str  # sha256:<ID>
    version: str | None  # deploy.module's __version__ inside the image (None: no module)
    commit_id: str | None  # its _version.__commit_id__ (setuptools-scm builds), else None
    origin: str | None  # the module's file inside the image
    event: E.ToolInvoked  # the build as a recorded tool call (unsaved)
    cached: bool  # the image for this key existed already (nothing built)


def image_name(member: str, commit: str) -> str:
    """`forge-build/<member>:<commit12>`: the member as a docker path component (lowercase
    alphanumerics joined by `-`), the commit's first 12 hex digits as the tag."""
    part = re.sub(r"[^a-z0-9]+", "-", member.lower()).strip("-") or "member"
    return f"{BUILD_NAMESPACE}/{part}:{commit[:12]}"


def labels_of(member: str, commit: str, key: str) -> dict[str, str]:
    return {LABEL_MEMBER: member, LABEL_COMMIT: commit, LABEL_BUILD: key}


def build_argv(rt: ContainerRuntime, *, member: str, commit: str, src: Path, deploy: Deploy,
               key: str) -> list[str]:
    """The build's command line (module contract, step 2)."""
    argv = [rt.exe, "build", "-f", str(src / deploy.dockerfile)]
    for k, v in labels_of(member, commit, key).items():
        argv += ["--label", f"{k}={v}"]
    for k, v in sorted(deploy.build_args.items()):
        argv += ["--build-arg", f"{k}={v}"]
    if not deploy.network:
        argv += ["--network", "none"]
    return argv + ["-t", image_name(member, commit), str(src / deploy.context)]


def find_argv(rt: ContainerRuntime, key: str) -> list[str]:
    return [rt.exe, "image", "ls", "--filter", f"label={LABEL_BUILD}={key}", "--no-trunc",
            "--format", "{{.ID}}"]


def labels_argv(rt: ContainerRuntime, ref: str) -> list[str]:
    return [rt.exe, "image", "inspect", "--format", "{{json .Config.Labels}}", ref]


def probe_argv(rt: ContainerRuntime, image: str, module: str) -> list[str]:
    return [rt.exe, "run", "--rm", "--network", "none", "--entrypoint", "python3", image,
            "-c", PROBE, module]


def commit_matches(commit_id: str, commit: str) -> bool:
    """Whether a module's `__commit_id__` (`g` + an abbreviated hash, as setuptools-scm
    writes it, or a bare hash) names `commit`."""
    short = commit_id.strip().lower()
    if short.startswith("g") and re.fullmatch(r"g[0-9a-f]+", short):
        short = short[1:]
    return re.fullmatch(r"[0-9a-f]{7,40}", short) is not None \
        and commit.lower().startswith(short)


def _query(rt: ContainerRuntime, argv: Sequence[str], timeout: float, what: str
           ) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HarnessError(f"{what}: {rt.kind} {' '.join(argv[1:3])}: {e}") from None


def _one_line(text: str) -> str:
    return " ".join((last_line(text) or "").split())[:300]


def _as_id(text: str) -> str | None:
    v = text.strip()
    v = v if v.startswith("sha256:") else f"sha256:{v}"
    return v if IMAGE_DIGEST.fullmatch(v) else None


def find_cached(rt: ContainerRuntime, key: str, what: str) -> str | None:
    """The ID of an image labelled with build `key` (None: none)."""
    r = _query(rt, find_argv(rt, key), QUERY_TIMEOUT_S, what)
    if r.returncode != 0:
        raise HarnessError(f"{what}: {rt.kind} image ls exited {r.returncode}: "
                           f"{_one_line(r.stderr or r.stdout)}")
    ids = [i for i in (_as_id(x) for x in r.stdout.splitlines() if x.strip()) if i]
    return ids[0] if ids else None


def image_labels(rt: ContainerRuntime, ref: str, what: str) -> dict[str, str]:
    r = _query(rt, labels_argv(rt, ref), QUERY_TIMEOUT_S, what)
    if r.returncode != 0:
        raise HarnessError(f"{what}: {rt.kind} image inspect {ref} exited {r.returncode}: "
                           f"{_one_line(r.stderr or r.stdout)}")
    try:
        got = json.loads(r.stdout.strip() or "null")
    except ValueError:
        raise HarnessError(f"{what}: {rt.kind} image inspect {ref}: labels are not JSON: "
                           f"{_one_line(r.stdout)}") from None
    return {str(k): str(v) for k, v in (got or {}).items()} if isinstance(got, dict) else {}


def check_identity(labels: Mapping[str, str], *, member: str, commit: str, key: str,
                   image: str, what: str) -> None:
    """The identity check (module contract, step 3)."""
    want = labels_of(member, commit, key)
    wrong = [f"{k}={labels.get(k, '<none>')} (wanted {v})" for k, v in want.items()
             if labels.get(k) != v]
    if wrong:
        raise HarnessError(f"{what}: image {image} is not this build: its labels say "
                           + "; ".join(wrong))


def probe(rt: ContainerRuntime, image: str, module: str, what: str) -> dict[str, str | None]:
    """version, commit_id and origin of `module` inside `image` (module contract, step 4)."""
    r = _query(rt, probe_argv(rt, image, module), PROBE_TIMEOUT_S, what)
    line = next((x for x in reversed(r.stdout.splitlines()) if x.startswith(PROBE_MARK)),
                None)
    if line is None:
        raise HarnessError(f"{what}: probing module {module} in image {image} exited "
                           f"{r.returncode}: {_one_line(r.stderr or r.stdout) or 'no output'}")
    try:
        out = json.loads(line[len(PROBE_MARK):])
    except ValueError:
        raise HarnessError(f"{what}: probing module {module} in image {image}: "
                           f"unreadable answer {line[:200]!r}") from None
    if out.get("error"):
        raise HarnessError(f"{what}: module {module} in image {image}: {out['error']}")
    return {k: out.get(k) for k in ("version", "commit_id", "origin")}


def _client(ws: Workspace, task: str | None, sandbox: SandboxSpec | None, network: bool
            ) -> tuple[dict[str, str], SandboxProfile]:
    """The runtime client's environment and the profile recorded for it (module contract)."""
    mode = ws.config.settings.guard.sandbox
    if mode == "off":
        env = dict(os.environ)
        names: list[str] = []
        how = "inherited"
    else:
        env, _ = child_env(ws, forge_env=None, passthrough=list(sandbox.env) if sandbox
                           else [], secrets=list(sandbox.secret_env) if sandbox else [],
                           scratch=scratch_of(ws, task), gpus=[])
        for k, v in os.environ.items():
            if (RUNTIME_ENV.fullmatch(k) or k == "HOME") and not is_secret_name(k):
                env[k] = v
        names = sorted(env)
        how = "allowlist"
    profile = SandboxProfile(
        kind="none", mode=mode, read_only_root=False, writable=["/"], network=network,
        gpus=[], env=how, env_names=names, secret_names=[],
        reason="an image build runs in the container runtime: its RUN steps in the "
               "runtime's containers (network " + ("allowed by deploy.network" if network
                                                   else "none") + "), its client outside "
               "bubblewrap, which would hide the runtime's socket, storage and configuration")
    return env, profile


def build_image(ws: Workspace, *, member: str, commit: str, src: Path, deploy: Deploy,
                key: str, task: str | None, sandbox: SandboxSpec | None, say: Say
                ) -> BuiltImage:
    """Build (or find) the image of `member` at `commit` from `src` (module contract)."""
    what = f"image build of member {member} at commit {commit[:12]}"
    rt = detect_runtime()
    if rt is None:
        raise HarnessError(f"{what}: deploy.kind image needs docker or podman and neither is "
                           "on PATH")
    src = Path(src).resolve()
    argv = build_argv(rt, member=member, commit=commit, src=src, deploy=deploy, key=key)
    env, profile = _client(ws, task, sandbox, deploy.network)
    shown = capture_redactor(ws, env).value(argv)
    inputs = {Digest.BUILD: key}
    t0 = time.monotonic()
    found = find_cached(rt, key, what)
    cached = found is not None
    if found is not None:
        say(f"{what}: image {found} for build {key.split(':')[-1][:12]} is present; "
            "not rebuilt")
        event = E.ToolInvoked(tool="build", argv=shown, cwd=str(src),
                              env_digest=env_digest(env, tuple(ws.config.secret_env)),
                              exit_code=0, duration_s=round(time.monotonic() - t0, 6),
                              input_digests=inputs)  # nothing ran: no sandbox to record
        image = found
    else:
        if not (src / deploy.dockerfile).is_file():
            raise HarnessError(f"{what}: deploy.dockerfile {deploy.dockerfile} is not a file "
                               f"in the commit's source ({src})")
        say(f"{what}: {rt.kind} build -t {image_name(member, commit)}"
            + ("" if deploy.network else " (network none)"))
        run = run_tool(ws, argv, tool="build", cwd=src, env=env, prepared=profile,
                       own_session=True, timeout=BUILD_TIMEOUT_S,
                       event_fields={"input_digests": inputs})
        event = run.event.model_copy(update={"argv": shown})
        if run.returncode != 0 or event.error:
            how = event.error or f"exited {run.returncode}"
            tail = _one_line(run.stderr or run.stdout)
            raise HarnessError(f"{what}: {rt.kind} build {how}" + (f": {tail}" if tail else ""))
        built = image_id(rt, image_name(member, commit))
        if built is None:
            raise HarnessError(f"{what}: {rt.kind} build exited 0 but has no image "
                               f"{image_name(member, commit)}")
        image = built
    check_identity(image_labels(rt, image, what), member=member, commit=commit, key=key,
                   image=image, what=what)
    version = commit_id = origin = None
    if deploy.module:
        got = probe(rt, image, deploy.module, what)
        version, commit_id, origin = got["version"], got["commit_id"], got["origin"]
        if commit_id and not commit_matches(commit_id, commit):
            raise HarnessError(f"{what}: {deploy.module} in image {image} was built from "
                               f"commit {commit_id} ({deploy.module}._version.__commit_id__), "
                               f"not {commit[:12]}")
    name = image_name(member, commit)
    return BuiltImage(ref=f"{name}@{image}", name=name, digest=image, version=version,
                      commit_id=commit_id, origin=origin, event=event, cached=cached)


def apply_image(profile: RuntimeProfile, built: BuiltImage) -> RuntimeProfile:
    """The profile whose servers run in `built` (module contract)."""
    data = profile.model_dump(mode="json")
    data["image"] = {"name": built.name, "digest": built.digest}
    data["image_fallback"] = "refuse"
    if built.version is not None:
        kind = profile.framework.kind if profile.framework is not None else profile.engine
        data["framework"] = {**(data.get("framework") or {}), "kind": kind,
                             "version": built.version}
    return RuntimeProfile.model_validate(data)
