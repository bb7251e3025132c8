"""Pinned images: a runtime profile's servers run in its image by digest, and what runs is
checked against the profile (digest, version, resolved arguments).

Contracts:
- `image_ref(profile)`: `name@sha256:…` of a profile's image, or None without one; an image
  with a tag and no digest is refused (HarnessError naming the profile, the image and
  `image.digest`): a tag can move, a digest cannot.
- `detect_runtime()`: docker, else podman (the first on PATH), or None.
  `image_use(profile)` decides: the image through that runtime, or None to run the local
  install: no image, or no container runtime and `image_fallback: local`; no runtime and
  `image_fallback: refuse` (the default) is a HarnessError saying so.
- `container_argv(...)` / plan.py's `wrap_plan(plan, use, ...)` are pure: the command line
  that runs an argv in the image (`docker run --rm --gpus "device=0,1"` / `podman run --rm
  --device nvidia.com/gpu=0`, `--network host` so every URL and bootstrap port of the plan
  holds, `--ipc host`, the model directory mounted read-only at the same path, `-e NAME`
  passing the process's environment by name, never by value); the host's python launcher
  becomes the image's `python3`. Inside the container the granted GPUs are renumbered from
  0, so CUDA_VISIBLE_DEVICES is not passed.
- `ensure_image(use)`: the image present (pulled by digest when missing), and the digest
  the runtime reports (`image inspect --format {{json .RepoDigests}}`) compared with the
  profile's: a mismatch is a HarnessError naming both.
- A forge-built local image (`forge-build/<member>:<commit12>@sha256:<ID>`, made by
  image_build.py; `local_build(ref)`) is addressed by its image ID, the digest of its
  config: it was never pushed, so it has no repo digest, and docker's classic image store
  resolves `name@sha256:…` only through repo digests (moby's gdstore GetImage), while a bare
  `sha256:<ID>` is looked up in the image store (docker, both stores; podman's libimage) and
  never pulled. So the runtime is given `use.target` (the bare ID for such an image, the
  ref otherwise), and `ensure_image` checks it present by that ID (`image inspect --format
  {{json .Id}}`) instead of pulling: one missing is a HarnessError saying to build it again
  on this host.
- `check_server(info, version=..., requested=...)`: after a server is ready, its
  `/server_info` version must equal the version the profile pins (or the one the flags were
  built for), and every requested argument must resolve to the value asked for (`auto`
  asks the server to choose and is not compared); a mismatch names both values.
- `remove_container(use, name)`: the container gone after its client stopped (a client
  killed before it could forward the stop leaves the container running otherwise).
- `clear_stale_container(use, name)`: before a start, a container of that name that forge
  started for a process now gone (killed by `kill -9`: the runtime keeps a container its
  client lost, holding the port and the GPUs) is removed and said; one whose forge process
  still runs on this host is refused naming it; one that is not forge's is left alone.
  Containers carry their owner (`owner_tag`: host, pid, the pid's start time) as a label.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ...ledger.specs import IMAGE_DIGEST, RESOLVE_DIGEST, RuntimeProfile
from ..errors import HarnessError
from ..proc import alive, start_time

RuntimeKind = Literal["docker", "podman"]
RUNTIMES: tuple[RuntimeKind, ...] = ("docker", "podman")
IMAGE_PYTHON = "python3"  # the interpreter SGLang's images put on PATH
LABEL = "org.infer-forge.managed=1"
OWNER_LABEL = "org.infer-forge.owner"  # host:pid:start of the forge process that started it
PULL_TIMEOUT_S = 3600.0  # SGLang images are tens of GB
# How the runtimes say an image is not there (docker: "No such image: REF", podman:
# "REF: image not known"); any other failure of `image inspect` is the runtime's own.
MISSING_IMAGE = re.compile(r"no such image|image not known", re.IGNORECASE)
# Device visibility is the runtime's job inside a container (devices renumbered from 0).
VISIBILITY_ENV = {"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"}
# Arguments the harness sets per process, not the profile: not compared with /server_info.
NOT_COMPARED = {"model_path", "host", "port", "config"}
# Where forge tags the images it builds from a member's commit (image_build.py): an image
# under it is local to the host that built it, addressed by its ID and never pulled.
BUILD_NAMESPACE = "forge-build"


@dataclass(frozen=True)
class ContainerRuntime:
    kind: RuntimeKind
    exe: str  # the executable's path


@dataclass(frozen=True)
class ImageUse:
    """A profile's image and the runtime that runs it."""

    runtime: ContainerRuntime
    ref: str  # name@sha256:…
    digest: str  # sha256:…
    profile: str  # "service rev N", for messages

    @property
    def local(self) -> bool:
        """A forge-built local image (module contract): run and checked by its ID."""
        return local_build(self.ref)

    @property
    def target(self) -> str:
        """What the runtime is given: the image ID for a local build, else the ref."""
        return self.digest if self.local else self.ref


def local_build(ref: str) -> bool:
    """Whether `ref` names an image forge built here (its repository under BUILD_NAMESPACE,
    no registry host)."""
    return ref.partition("@")[0].startswith(BUILD_NAMESPACE + "/")


def profile_label(profile: RuntimeProfile) -> str:
    return f"{profile.service} rev {profile.rev}"


def image_ref(profile: RuntimeProfile) -> str | None:
    """`name@sha256:…` of the profile's image (None: no image); a tag alone is refused."""
    img = profile.image
    if img is None:
        return None
    name, _, embedded = img.name.partition("@")
    digest = img.digest
    if embedded:
        if not IMAGE_DIGEST.fullmatch(embedded) or (digest and digest != embedded):
            raise HarnessError(f"runtime profile {profile_label(profile)}: image {img.name} "
                               f"names a digest that is not image.digest ({digest}); give "
                               "the name in image.name and the digest in image.digest")
        digest = embedded
    if not digest:
        raise HarnessError(f"runtime profile {profile_label(profile)}: image {img.name} has "
                           "no digest (image.digest: give sha256:… as `docker image inspect` "
                           "shows it; a tag can move, a digest cannot)")
    return f"{name}@{digest}"


def detect_runtime(which: Callable[[str], str | None] = shutil.which
                   ) -> ContainerRuntime | None:
    for kind in RUNTIMES:
        exe = which(kind)
        if exe:
            return ContainerRuntime(kind, exe)
    return None


def image_use(profile: RuntimeProfile, *, which: Callable[[str], str | None] = shutil.which,
              say: Callable[[str], None] | None = None) -> ImageUse | None:
    """How the profile's servers run: in its image (an ImageUse) or the local install (None)."""
    ref = image_ref(profile)
    if ref is None:
        return None
    return _use(ref, profile.image_fallback, profile_label(profile), which, say)


def image_use_of(config: Mapping[str, Any], *,
                 which: Callable[[str], str | None] = shutil.which,
                 say: Callable[[str], None] | None = None) -> ImageUse | None:
    """`image_use` for an engine configuration (`image`, `image_fallback`, as
    `base.engine_config_of` puts them)."""
    ref = config.get("image")
    if not ref:
        return None
    if not isinstance(ref, str) or not (IMAGE_DIGEST.fullmatch(ref.rpartition("@")[2])
                                        or ref.rpartition("@")[2] == RESOLVE_DIGEST):
        raise HarnessError(f"engine config image {ref!r}: expected name@sha256:<64 hex> "
                           f"or name@{RESOLVE_DIGEST} (a tag without a digest is refused)")
    fallback = config.get("image_fallback", "refuse")
    if fallback not in ("local", "refuse"):
        raise HarnessError(f"engine config image_fallback {fallback!r}: local or refuse")
    return _use(ref, fallback, None, which, say)


def _use(ref: str, fallback: str, label: str | None, which: Callable[[str], str | None],
         say: Callable[[str], None] | None) -> ImageUse | None:
    runtime = detect_runtime(which)
    whose = f"runtime profile {label}: " if label else ""
    if runtime is None:
        if fallback == "local":
            if say is not None:
                say(f"{whose}no container runtime (docker, podman) on this host; running the "
                    f"local install instead of image {ref} (image_fallback: local)")
            return None
        raise HarnessError(f"{whose}image {ref} needs docker or podman and neither is on PATH "
                           "(install one, or set the profile's image_fallback: local to run "
                           "the local install)")
    return ImageUse(runtime, ref, ref.rpartition("@")[2], label or "")


# --- the command line (pure) ------------------------------------------------------------


def gpu_args(kind: RuntimeKind, vendor: str, devices: Sequence[int] | None) -> list[str]:
    """The runtime's GPU pass-through: `devices` None gives every GPU, () none."""
    if vendor == "amd":
        return [] if devices == () else ["--device", "/dev/kfd", "--device", "/dev/dri",
                                          "--group-add", "video"]
    if vendor != "nvidia" or devices == ():
        return []
    if kind == "docker":  # the quotes keep the comma from splitting docker's CSV value
        return ["--gpus", "all" if devices is None
                else '"device=' + ",".join(str(d) for d in devices) + '"']
    if devices is None:
        return ["--device", "nvidia.com/gpu=all"]
    return [a for d in devices for a in ("--device", f"nvidia.com/gpu={d}")]


# What a server moving KV caches over InfiniBand (PD's transfer engine, named devices) needs
# in a container: the verbs devices, and locked memory without a limit for its registered
# buffers (IPC_LOCK and memlock=-1, as RDMA containers are run). Both docker and podman flags.
RDMA_ARGS = ("--device", "/dev/infiniband", "--cap-add", "IPC_LOCK", "--ulimit", "memlock=-1")


def uses_rdma(argv: Sequence[str]) -> bool:
    """A server told which InfiniBand devices to use (`--disaggregation-ib-device`): they
    exist on its host, so the container gets them (a host without them would refuse it)."""
    return "--disaggregation-ib-device" in argv


def image_launcher(argv: Sequence[str], host_python: str) -> list[str]:
    """`argv` with the host's python (`python -m sglang…`) replaced by the image's."""
    out = list(argv)
    if len(out) > 1 and out[0] == host_python and out[1] == "-m":
        out[0] = IMAGE_PYTHON
    return out


def container_argv(use: ImageUse, argv: Sequence[str], *, name: str, vendor: str = "nvidia",
                   devices: Sequence[int] | None = None, env_names: Iterable[str] = (),
                   mounts: Iterable[str | Path] = (), host_python: str = sys.executable,
                   rw_mounts: Iterable[str | Path] = (), rdma: bool = False) -> list[str]:
    """The command that runs `argv` in the image, as container `name`. `mounts` read-only,
    `rw_mounts` read-write (the profiler's trace root), each at its own path. `rdma`: the
    host's InfiniBand devices and the right to pin memory for them (RDMA_ARGS)."""
    kind = use.runtime.kind
    out = [use.runtime.exe, "run", "--rm", "--name", name, "--label", LABEL,
           "--network", "host", "--ipc", "host", *gpu_args(kind, vendor, devices),
           *(RDMA_ARGS if rdma else ())]
    for m in sorted({str(Path(m)) for m in mounts}):
        out += ["-v", f"{m}:{m}:ro"]
    for m in sorted({str(Path(m)) for m in rw_mounts}):
        out += ["-v", f"{m}:{m}:rw"]
    for k in sorted(set(env_names) - VISIBILITY_ENV):
        out += ["-e", k]
    return out + [use.target, *image_launcher(argv, host_python)]


def container_name(process: str, port: int) -> str:
    return f"forge-{process}-{port}"


def model_mounts(model: str | Path) -> list[str]:
    """A local model directory is mounted (read-only, same path); a snapshot of the Hugging
    Face cache with its repo folder, whose blobs its files link to; a hub id is not a path."""
    p = Path(model)
    if not p.is_dir():
        return []
    p = p.resolve()
    if p.parent.name == "snapshots" and (p.parent.parent / "blobs").is_dir():
        return [str(p.parent.parent)]  # models--org--name/{blobs,snapshots/<commit>}
    return [str(p)]


def name_of(argv: Sequence[str]) -> str | None:
    """The container name a wrapped argv runs (None: not a container command)."""
    if len(argv) > 3 and argv[1] == "run" and "--name" in argv:
        return argv[argv.index("--name") + 1]
    return None


# --- talking to the runtime -------------------------------------------------------------

Runner = Callable[..., subprocess.CompletedProcess]


def _run(use: ImageUse, args: list[str], timeout: float, run: Runner
         ) -> subprocess.CompletedProcess:
    cmd = [use.runtime.exe, *args]
    try:
        return run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HarnessError(f"{use.runtime.kind} {' '.join(args[:2])}: {e}") from None


def _last(text: str) -> str:
    return " ".join((text or "").split())[-300:]


class _Absent(Exception):
    """The runtime has no such image."""


def _inspect(runtime: ContainerRuntime, ref: str, field: str, run: Runner) -> Any:
    """`image inspect --format {{json .<field>}} ref`, decoded; `_Absent` when the runtime
    has no such image, a HarnessError when it cannot answer or answers something else."""
    try:
        r = run([runtime.exe, "image", "inspect", "--format", f"{{{{json .{field}}}}}", ref],
                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HarnessError(f"{runtime.kind} image inspect {ref}: {e}") from None
    if r.returncode != 0:
        if MISSING_IMAGE.search(r.stderr or ""):
            raise _Absent
        # Not "no such image": the runtime itself cannot answer (a daemon not running, …).
        raise HarnessError(f"{runtime.kind} image inspect {ref} exited {r.returncode}: "
                           f"{_last(r.stderr or r.stdout)}")
    try:
        return json.loads(r.stdout.strip().splitlines()[0]) if r.stdout.strip() else None
    except ValueError:
        raise HarnessError(f"{runtime.kind} image inspect {ref}: {field} is not JSON: "
                           f"{_last(r.stdout)}") from None


def repo_digests(use: ImageUse, run: Runner = subprocess.run) -> list[str] | None:
    """The digests the runtime knows the image by (None: the image is not present)."""
    try:
        data = _inspect(use.runtime, use.ref, "RepoDigests", run)
    except _Absent:
        return None
    if data is None:
        data = []
    if not isinstance(data, list):
        raise HarnessError(f"{use.runtime.kind} image inspect {use.ref}: RepoDigests is not "
                           "a list")
    return [str(d).rpartition("@")[2] for d in data]


def ensure_image(use: ImageUse, run: Runner = subprocess.run,
                 say: Callable[[str], None] | None = None) -> str:
    """Pull the image by digest when missing; the digest it has, checked against the pin.
    A local build is checked present by its ID, never pulled (module contract)."""
    if use.local:
        return _local_image(use, run)
    if use.digest == RESOLVE_DIGEST:  # image_resolve.resolve_use comes first
        raise HarnessError(f"image {use.ref}: its digest is not resolved yet")
    digests = repo_digests(use, run)
    if digests is None:
        if say is not None:
            say(f"pulling {use.ref} with {use.runtime.kind}")
        r = _run(use, ["pull", use.ref], PULL_TIMEOUT_S, run)
        if r.returncode != 0:
            raise HarnessError(f"{use.runtime.kind} pull {use.ref} exited {r.returncode}: "
                               f"{_last(r.stderr or r.stdout)}")
        digests = repo_digests(use, run)
        if digests is None:
            raise HarnessError(f"{use.runtime.kind}: {use.ref} is not present after its pull")
    if use.digest not in digests:
        have = ", ".join(digests) or "no repo digest (a locally built image)"
        whose = f"runtime profile {use.profile}: " if use.profile else ""
        raise HarnessError(f"{whose}image.digest pins {use.digest}, {use.runtime.kind} reports "
                           f"{have} for {use.ref}")
    return use.digest


def pull_digest(use: ImageUse, name: str, *, run: Runner = subprocess.run,
                say: Callable[[str], None] | None = None) -> str:
    """`pull name` (a tag), then the image's RepoDigests: the digest of the name's own
    repository (the first, when none matches). One-line HarnessErrors naming the runtime,
    its exit code and its last line."""
    if say is not None:
        say(f"pulling {name} with {use.runtime.kind} to pin its digest (digest: resolve)")
    r = _run(use, ["pull", name], PULL_TIMEOUT_S, run)
    if r.returncode != 0:
        raise HarnessError(f"{use.runtime.kind} pull {name} exited {r.returncode}: "
                           f"{_last(r.stderr or r.stdout)}")
    data = _inspect(use.runtime, name, "RepoDigests", run) or []
    if not isinstance(data, list):
        raise HarnessError(f"{use.runtime.kind} image inspect {name}: RepoDigests is not a list")
    repo = name.rsplit(":", 1)[0] if "/" not in name.rsplit(":", 1)[-1] else name
    found = [str(d).rpartition("@") for d in data]
    digests = [d for r_, _, d in found if r_ == repo] or [d for _, _, d in found]
    if not digests or not IMAGE_DIGEST.fullmatch(digests[0]):
        raise HarnessError(f"{use.runtime.kind}: {name} has no repo digest after its pull "
                           f"(RepoDigests {data}): pin image.digest by hand")
    return digests[0]


def image_id(runtime: ContainerRuntime, ref: str, run: Runner = subprocess.run
             ) -> str | None:
    """The ID (`sha256:…`) the runtime has for `ref`, None when it has no such image. Podman
    prints the ID without its `sha256:` prefix, docker with it."""
    try:
        got = _inspect(runtime, ref, "Id", run)
    except _Absent:
        return None
    if not isinstance(got, str) or not got:
        raise HarnessError(f"{runtime.kind} image inspect {ref}: Id is not a string: "
                           f"{str(got)[-300:]}")
    return got if got.startswith("sha256:") else f"sha256:{got}"


def _local_image(use: ImageUse, run: Runner) -> str:
    whose = f"runtime profile {use.profile}: " if use.profile else ""
    have = image_id(use.runtime, use.digest, run)
    if have is None:
        raise HarnessError(f"{whose}image {use.ref} is a local build and {use.runtime.kind} "
                           f"has no image {use.digest} on this host (a local build is never "
                           "pulled: build the commit again here)")
    if have != use.digest:
        raise HarnessError(f"{whose}image.digest pins {use.digest}, {use.runtime.kind} "
                           f"reports {have} for {use.ref}")
    return use.digest


def remove_container(use: ImageUse, name: str, run: Runner = subprocess.run) -> None:
    """Best effort: `rm -f` the container (gone already is fine)."""
    try:
        run([use.runtime.exe, "rm", "-f", name], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        pass


def owned(argv: Sequence[str]) -> list[str]:
    """A container command (`container_argv`) labelled with its owner, this process
    (`owner_tag`), as it is started: not part of a plan, whose digest names what runs, not
    who ran it."""
    i = list(argv).index(LABEL) + 1
    return [*argv[:i], "--label", f"{OWNER_LABEL}={owner_tag()}", *argv[i:]]


def with_trace_mount(argv: Sequence[str], target: str, root: str | Path) -> list[str]:
    """A container command with the profiler's trace root mounted read-write at its own path
    (trace_dir.py), added as it is started, like the owner label: the plan names
    what runs, not this host's FORGE_HOME."""
    i = list(argv).index(target)
    return [*argv[:i], "-v", f"{root}:{root}:rw", *argv[i:]]


def owner_tag() -> str:
    """This process as a container's owner: host, pid and the pid's start time (so a reused
    pid is not taken for the owner)."""
    return f"{socket.gethostname()}:{os.getpid()}:{start_time(os.getpid())}"


def clear_stale_container(use: ImageUse, name: str, *, say: Callable[[str], None] | None = None,
                          run: Runner = subprocess.run) -> None:
    """Before starting container `name` (module contract): remove one of that name whose
    forge owner is gone; refuse (HarnessError) while its owner still runs here. Anything the
    runtime cannot answer, or a container that is not forge's, is left to the start."""
    fmt = "{{index .Config.Labels " + f'"{OWNER_LABEL}"' + "}}"
    try:
        p = run([use.runtime.exe, "container", "inspect", "--format", fmt, name],
                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return
    if p.returncode != 0:  # none of that name (or the runtime's own trouble: the start says)
        return
    host, _, rest = p.stdout.strip().partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return  # another host's, or not started by forge: not ours to remove
    if alive(int(pid), started):
        raise HarnessError(f"container {name} is running for forge process {pid} on this "
                           "host: stop that deployment first, or use another port")
    remove_container(use, name, run=run)
    if say is not None:
        say(f"removed container {name}: forge process {pid}, which started it, is gone")


# --- what runs, against the profile (pure) ----------------------------------------------


def argv_options(argv: Sequence[str]) -> dict[str, Any]:
    """The `--flag value…` options of a server command line, as options_to_args wrote them
    (a bare flag: True; several values: a list)."""
    opts: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if not a.startswith("--"):
            i += 1
            continue
        vals = []
        while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            vals.append(argv[i + 1])
            i += 1
        opts[a[2:].replace("-", "_")] = True if not vals else vals[0] if len(vals) == 1 \
            else vals
        i += 1
    return opts


def _norm(v: Any) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, Mapping):
        return json.dumps(v, sort_keys=True)
    if isinstance(v, list | tuple):
        return [_norm(x) for x in v]
    s = str(v)
    if s[:1] in "{[":
        try:
            return _norm(json.loads(s))
        except ValueError:
            pass
    if s.lower() in ("true", "false"):
        return s.lower() == "true"
    try:
        return float(s)
    except ValueError:
        return s


def same_version(pinned: str, reported: str) -> bool:
    return str(pinned).strip().removeprefix("v") == str(reported).strip().removeprefix("v")


def check_server(info: Mapping[str, Any], *, version: str | None,
                 requested: Mapping[str, Any], where: str, pinned_by: str = "the profile",
                 args: bool = True) -> list[str]:
    """Raise HarnessError when the server is not what was asked for; returns the requested
    arguments the server did not report (recorded, not failed: older servers list fewer).
    `args` False (the engine config's `check_args: false`) checks the version only."""
    reported = str(info.get("version", ""))
    if version and not same_version(version, reported):
        raise HarnessError(f"{where}: {pinned_by} pins sglang {version}, the server reports "
                           f"{reported or 'no version'} (/server_info version)")
    unreported: list[str] = []
    wrong: list[str] = []
    for key, want in sorted(requested.items() if args else ()):
        if key in NOT_COMPARED or want is None or want is False \
                or (isinstance(want, str) and want.lower() == "auto"):
            continue
        if key not in info:
            unreported.append(key)
            continue
        if _norm(want) != _norm(info[key]):
            wrong.append(f"{key} {json.dumps(want, default=str)} requested, "
                         f"{json.dumps(info[key], default=str)} resolved")
    if wrong:
        raise HarnessError(f"{where}: the server resolved its arguments differently from "
                           f"{pinned_by}: {'; '.join(wrong)} (/server_info)")
    return unreported
