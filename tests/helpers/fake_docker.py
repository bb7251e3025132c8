"""A stand-in `docker` / `podman` CLI (neither runs here): the subcommands forge uses, with the
output shapes the real CLIs print, and `run` executing the stand-in SGLang server (or router)
as the image would.

State lives in the directory `FAKE_DOCKER_STATE` names:
- `registry.json`: {"name@sha256:…" or "name:tag": ["sha256:…", …]}: what a pull of that
  reference gets (a tag pulled is then present by `name@<digest>` too, as with the real one)
  (the repo digests the runtime then reports; a different digest is a registry serving other
  bytes than the pin, which the harness must catch);
- `images.json`: the same shape, what is present locally (pulls add to it);
- `calls.jsonl`: every invocation's argv, in order (tests read the command lines back).
`FAKE_DOCKER_KIND` (docker | podman) picks the error texts.

Shapes, as the real CLIs print them. Docker's are held to a recording of the real docker
CLI 28.2.2, daemon 20.10.24 and registry 2.8.2 (tests/data/docker/golden.json, made by
tests/data/docker/record.py; tests/harness/engines/test_fake_docker_golden.py); podman's
(podman 5) are from its documentation only:
  image inspect --format '{{json .RepoDigests}}' REF  ->  ["lmsysorg/sglang@sha256:…"]
  (missing, docker)  an empty stdout line; stderr "Error response from daemon: no such
                image: REF: No such image: REF", exit 1
  (missing, podman)  stderr "Error: REF: image not known", exit 125
  pull REF  ->  "TAG: Pulling from lmsysorg/sglang" … "Digest: sha256:…",
                "Status: Downloaded newer image for REF", then REF (Docker Hub's in full:
                "docker.io/REF"); `repo:tag@sha256:…` is pulled by its digest alone
  rm -f NAME  ->  NAME; one already gone: nothing on stdout, stderr "Error response from
                daemon: No such container: NAME", exit 0
  container inspect --format '{{index .Config.Labels "KEY"}}' NAME  ->  the label's value,
                an empty line without it
  (missing, docker)  an empty stdout line; stderr "Error response from daemon: No such
                container: NAME", exit 1
  (missing, podman)  stderr "Error: no such container NAME", exit 125
- `containers.json`: {"NAME": {"labels": {…}}}: containers the runtime holds. `run` adds its
  `--name` (with its `--label`s) and `rm -f` removes it; a client killed before `rm -f`
  leaves it, as the real daemon keeps a container whose client died.
`run … REF python3 -m sglang.launch_server ARGS` execs the stand-in SGLang server with ARGS
(`python3 -m sglang_router.launch_router` the stand-in router); `-e NAME` options must name
variables the client has, as the real CLI passes them on. Its `-v SRC:DST[:MODE]` volumes go
to the server as `FAKE_DOCKER_MOUNTS` (JSON [[src, dst, mode]]) with `FAKE_DOCKER_CONTAINER`
(the name): a file the stand-in writes outside a read-write volume lands in
`state/container-fs/NAME/` instead (the container's own filesystem), as with the real one.

Images built here (`build`), as docker 28's legacy builder (the real binary here has no
buildx) and its classic image store do it:
  build -f FILE [--label K=V]… [--build-arg K=V]… [--network MODE] -t NAME:TAG CONTEXT
    interprets the Dockerfile's FROM (no base image: nothing inherited), ARG, ENV, WORKDIR,
    COPY (from the context into the image's root, `state/roots/<id>`), LABEL and RUN (`sh
    -c` in the image's root: use relative paths); prints "Step i/n : …",
    "Successfully built <id12>", "Successfully tagged NAME:TAG"; a RUN that fails prints
    "The command '/bin/sh -c …' returned a non-zero code: N" on stderr and exits N. The ID
    is the digest of the image's config (labels, env, workdir, files), so the same inputs
    give the same ID. `--network` is recorded in `built.json`, not enforced.
  image inspect --format '{{json .Id}}' REF  ->  "sha256:…" (podman: the hex alone)
  image inspect --format '{{json .Config.Labels}}' REF  ->  {"k": "v"} (null: none)
  image inspect --format '{{json .RepoDigests}}' REF  ->  [] (a local build: never pushed)
  image ls --filter label=K=V --no-trunc --format '{{.ID}}'  ->  "sha256:…", one row per
    tag (an image with two tags shows twice; one without any once), as `docker images`.
  REF is `sha256:<64 hex>` (the ID) or `NAME:TAG`; `NAME@sha256:<ID>` finds no local build
  (the classic store resolves a digest reference only through repo digests, which a local
  build has none of). State: `built.json` {"<hex>": {tags, labels, env, workdir, root,
  network}}. `run … [--entrypoint E] sha256:<ID> ARGS` runs E (or ARGS) with the image's
  ENV, its absolute paths mapped into the image's root (`python3` is this interpreter), so
  `python3 -m sglang.launch_server` runs the image's own code.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FAKE_SGLANG = REPO / "tests" / "data" / "sglang" / "fake_server.py"
FAKE_ROUTER = REPO / "harness" / "testing" / "fake_router.py"
STATE = Path(os.environ.get("FAKE_DOCKER_STATE", "."))
KIND = os.environ.get("FAKE_DOCKER_KIND", "docker")


def _load(name: str) -> dict:
    p = STATE / name
    return json.loads(p.read_text()) if p.exists() else {}


def _save(name: str, data: dict) -> None:
    # Whole or not at all: a concurrent client reading mid-write would see half a file (the
    # real daemon's store is never seen half-written).
    tmp = STATE / f".{name}.{os.getpid()}"
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, STATE / name)


@contextlib.contextmanager
def _locked():
    """The state's lock: the runtime serves concurrent clients (a deploy starts its servers
    together), and a read-modify-write of a state file must not lose one of them."""
    with open(STATE / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _no_image(ref: str) -> int:
    if KIND == "podman":
        print(f"Error: {ref}: image not known", file=sys.stderr)
        return 125
    print()  # the real CLI prints the (empty) format's line even then
    print(f"Error response from daemon: no such image: {ref}: No such image: {ref}",
          file=sys.stderr)
    return 1


def inspect(args: list[str]) -> int:
    ref = args[-1]
    fmt = args[args.index("--format") + 1] if "--format" in args else ""
    images = _load("images.json")
    hexid = built_id(ref)
    if ref not in images and hexid is None:
        return _no_image(ref)
    if hexid is not None:
        img = _load("built.json")[hexid]
        shown = {"{{json .RepoDigests}}": [],
                 "{{json .Id}}": hexid if KIND == "podman" else f"sha256:{hexid}",
                 "{{json .Config.Labels}}": img["labels"] or None}
        if fmt not in shown:
            print(f"fake {KIND}: unsupported --format {fmt!r}", file=sys.stderr)
            return 2
        print(json.dumps(shown[fmt], separators=(",", ":")))  # Go's compact JSON
        return 0
    if fmt != "{{json .RepoDigests}}":
        print(f"fake {KIND}: unsupported --format {fmt!r}", file=sys.stderr)
        return 2
    print(json.dumps([f"{repository(ref)}@{d}" for d in images[ref]], separators=(",", ":")))
    return 0


def built_id(ref: str) -> str | None:
    """The hex ID of the built image `ref` names (`sha256:<ID>` or `NAME:TAG`), else None."""
    built = _load("built.json")
    if ref.startswith("sha256:"):
        return ref[7:] if ref[7:] in built else None
    if "@" in ref:  # a digest reference: the classic store resolves it by repo digests only
        return None
    tag = ref if ":" in ref.rsplit("/", 1)[-1] else f"{ref}:latest"
    return next((h for h, img in built.items() if tag in img["tags"]), None)


def image_ls(args: list[str]) -> int:
    """`image ls --filter label=K=V --no-trunc --format {{.ID}}` over the built images."""
    want: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--filter":
            kind, _, cond = args[i + 1].partition("=")
            if kind != "label":
                print(f"fake {KIND}: unsupported filter {args[i + 1]!r}", file=sys.stderr)
                return 2
            k, _, v = cond.partition("=")
            want[k] = v
            i += 2
        elif a == "--format":
            if args[i + 1] != "{{.ID}}":
                print(f"fake {KIND}: unsupported --format {args[i + 1]!r}", file=sys.stderr)
                return 2
            i += 2
        elif a == "--no-trunc":
            i += 1
        else:
            print(f"fake {KIND}: image ls: unsupported argument {a!r}", file=sys.stderr)
            return 2
    for h, img in sorted(_load("built.json").items()):
        if all(img["labels"].get(k) == v for k, v in want.items()):
            for _ in img["tags"] or [None]:
                print(f"sha256:{h}")
    return 0


_BUILD_VALUED = {"-f": "file", "--file": "file", "--label": "label", "--build-arg": "arg",
                 "--network": "network", "-t": "tag", "--tag": "tag"}


def _subst(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)",
                  lambda m: values.get(m.group(1) or m.group(2), ""), text)


def build(args: list[str]) -> int:
    """Build an image from a Dockerfile the way the legacy builder prints it (docstring)."""
    opts: dict[str, list[str]] = {"file": [], "label": [], "arg": [], "network": [], "tag": []}
    positional: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in _BUILD_VALUED:
            opts[_BUILD_VALUED[a]].append(args[i + 1])
            i += 2
        elif a.startswith("-"):
            print(f"unknown flag: {a}\nSee 'docker build --help'.", file=sys.stderr)
            return 125
        else:
            positional.append(a)
            i += 1
    if len(positional) != 1:
        print('"docker build" requires exactly 1 argument.', file=sys.stderr)
        return 1
    context = Path(positional[0]).resolve()
    dockerfile = Path(opts["file"][0]) if opts["file"] else context / "Dockerfile"
    if not dockerfile.is_absolute():
        dockerfile = Path.cwd() / dockerfile
    if not dockerfile.is_file():
        print(f"unable to prepare context: unable to evaluate symlinks in Dockerfile path: "
              f"lstat {dockerfile}: no such file or directory", file=sys.stderr)
        return 1
    build_args = dict(x.partition("=")[::2] for x in opts["arg"])
    labels = dict(x.partition("=")[::2] for x in opts["label"])
    lines, cur = [], ""
    for raw in dockerfile.read_text().splitlines():
        if not cur and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if raw.rstrip().endswith("\\"):
            cur += raw.rstrip()[:-1] + " "
            continue
        lines.append(cur + raw)
        cur = ""
    root = STATE / "roots" / f".building-{os.getpid()}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    args_seen: dict[str, str] = {}
    env: dict[str, str] = {}
    workdir = "/"
    print(f"Sending build context to Docker daemon  {sum(1 for _ in context.rglob('*'))}B")
    for n, line in enumerate(lines, 1):
        instr, _, rest = line.strip().partition(" ")
        instr = instr.upper()
        print(f"Step {n}/{len(lines)} : {line.strip()}")
        values = {**args_seen, **env}
        if instr == "FROM":
            pass
        elif instr == "ARG":
            k, _, default = rest.strip().partition("=")
            args_seen[k] = build_args.get(k, default.strip('"'))
        elif instr in ("ENV", "LABEL"):
            into = env if instr == "ENV" else labels
            for item in shlex.split(rest):
                k, _, v = item.partition("=")
                into[k] = _subst(v, values)
        elif instr == "WORKDIR":
            workdir = str(Path(workdir) / _subst(rest.strip(), values))
            (root / workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        elif instr == "COPY":
            parts = [x for x in shlex.split(_subst(rest, values)) if not x.startswith("--")]
            *srcs, dst = parts
            dest = root / (Path(workdir) / dst).as_posix().lstrip("/")
            for src in srcs:
                s = context / src
                target = dest / s.name if dst.endswith("/") else dest
                if s.is_dir():  # a directory's contents, as docker copies one
                    shutil.copytree(s, dest, dirs_exist_ok=True)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(s, target)
        elif instr == "RUN":
            cwd = root / workdir.lstrip("/")
            cwd.mkdir(parents=True, exist_ok=True)
            r = subprocess.run(["sh", "-c", rest], cwd=cwd,
                               env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                    **args_seen, **env})
            if r.returncode != 0:
                shutil.rmtree(root, ignore_errors=True)
                print(f"The command '/bin/sh -c {rest}' returned a non-zero code: "
                      f"{r.returncode}", file=sys.stderr)
                return r.returncode
        else:
            shutil.rmtree(root, ignore_errors=True)
            print(f"fake {KIND}: build: unsupported instruction {instr}", file=sys.stderr)
            return 2
    files = sorted((str(f.relative_to(root)), hashlib.sha256(f.read_bytes()).hexdigest())
                   for f in root.rglob("*") if f.is_file())
    config = {"labels": labels, "env": env, "workdir": workdir, "files": files}
    hexid = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    final = STATE / "roots" / hexid
    with _locked():
        shutil.rmtree(final, ignore_errors=True)
        root.rename(final)
        built = _load("built.json")
        for img in built.values():  # a tag moves to the new image
            img["tags"] = [t for t in img["tags"] if t not in opts["tag"]]
        old = built.get(hexid, {}).get("tags", [])
        built[hexid] = {"tags": sorted({*old, *opts["tag"]}), "labels": labels, "env": env,
                        "workdir": workdir, "root": str(final),
                        "network": opts["network"][-1] if opts["network"] else "default"}
        _save("built.json", built)
    print(f"Successfully built {hexid[:12]}")
    for t in opts["tag"]:
        print(f"Successfully tagged {t}")
    return 0


def container_inspect(args: list[str]) -> int:
    name = args[-1]
    fmt = args[args.index("--format") + 1] if "--format" in args else ""
    containers = _load("containers.json")
    if name not in containers:
        if KIND == "podman":
            print(f"Error: no such container {name}", file=sys.stderr)
            return 125
        print()  # the format's (empty) line, as the real CLI prints it
        print(f"Error response from daemon: No such container: {name}", file=sys.stderr)
        return 1
    m = re.fullmatch(r'\{\{index \.Config\.Labels "([^"]+)"\}\}', fmt)
    if m is None:
        print(f"fake {KIND}: unsupported --format {fmt!r}", file=sys.stderr)
        return 2
    print(containers[name]["labels"].get(m.group(1), ""))  # `index` of a missing key: ""
    return 0


def repository(ref: str) -> str:
    """The repository of a reference, without tag or digest (as RepoDigests name it)."""
    name = ref.partition("@")[0]
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":")[0]


def pull(ref: str) -> int:
    with _locked():  # two hosts' pulls at once must not lose one's images
        return _pull(ref)


def _pull(ref: str) -> int:
    registry = _load("registry.json")
    name = repository(ref)
    if "@" in ref and ref not in registry:
        # `repo:tag@digest` is pulled by its digest alone (the tag is not asked for)
        registry[ref] = registry.get(f"{name}@{ref.partition('@')[2]}", [])
        if not registry[ref]:
            del registry[ref]
    if ref not in registry:
        print(f"Error response from daemon: manifest for {ref} not found: manifest unknown",
              file=sys.stderr)
        return 1
    digests = registry[ref]
    images = _load("images.json")
    images[ref] = digests
    if "@" in ref:
        images.setdefault(f"{name}@{ref.partition('@')[2]}", digests)
    for d in digests if "@" not in ref else ():
        # a tag pulled: present by its repo digest too, with or without the tag (docker
        # resolves `repo:tag@digest` by the digest)
        images.setdefault(f"{name}@{d}", [d])
        images.setdefault(f"{ref}@{d}", [d])
    _save("images.json", images)
    # by digest: "sha256:…: Pulling from repo"; by tag: "tag: Pulling from repo"
    what = ref.partition("@")[2] if "@" in ref else ref.rsplit(":", 1)[-1]
    print(f"{what}: Pulling from {name}")
    print("Digest: " + digests[0])
    print(f"Status: Downloaded newer image for {ref}")
    # The reference pulled, Docker Hub's named in full (`lmsysorg/sglang:…` is
    # `docker.io/lmsysorg/sglang:…`); another registry's as given.
    first = ref.split("/", 1)[0]
    if "/" not in ref:
        print(f"docker.io/library/{ref}")  # an official image
    elif "." not in first and ":" not in first and first != "localhost":
        print(f"docker.io/{ref}")
    else:
        print(ref)
    return 0


_RUN_VALUED = ("--name", "--label", "--network", "--ipc", "--gpus", "--device", "-v", "-e",
               "--group-add", "--entrypoint", "--cap-add", "--ulimit")


def run(args: list[str]) -> int:
    images = _load("images.json")
    name, labels, entrypoint, passed, volumes = None, {}, None, [], []
    i = 0
    while i < len(args) and args[i].startswith("-"):
        a = args[i]
        if a == "-v":  # SRC:DST[:ro|rw], as docker reads it
            src, dst, *mode = args[i + 1].split(":")
            volumes.append([src, dst, (mode or ["rw"])[0]])
        if a == "-e":
            if args[i + 1] not in os.environ:  # passes the client's variable on
                print(f"fake {KIND}: -e {args[i + 1]}: not set in the client",
                      file=sys.stderr)
                return 125
            passed.append(args[i + 1])
        if a == "--name":
            name = args[i + 1]
        elif a == "--label":
            k, _, v = args[i + 1].partition("=")
            labels[k] = v
        elif a == "--entrypoint":
            entrypoint = args[i + 1]
        i += 2 if a in _RUN_VALUED else 1
    if i >= len(args):
        print(f"fake {KIND}: run: no image given", file=sys.stderr)
        return 125
    ref, inner = args[i], args[i + 1:]
    hexid = built_id(ref)
    if ref not in images and hexid is None:
        print(f"Unable to find image '{ref}' locally", file=sys.stderr)
        return 125
    if hexid is not None:
        return _run_built(_load("built.json")[hexid], name, labels, entrypoint, passed, inner)
    if inner[:3] == ["python3", "-m", "sglang.launch_server"]:
        argv = [sys.executable, str(FAKE_SGLANG), *inner[3:]]
    elif inner[:3] == ["python3", "-m", "sglang_router.launch_router"]:
        argv = [sys.executable, str(FAKE_ROUTER), *inner[3:]]
    else:
        argv = inner
    if not _hold(name, labels):
        return 125
    # What the container sees of the host: its volumes (the stand-in server writes
    # anywhere else into the container's own filesystem, gone with it).
    os.environ["FAKE_DOCKER_MOUNTS"] = json.dumps(volumes)
    os.environ["FAKE_DOCKER_CONTAINER"] = name or "anonymous"
    sys.stdout.flush()
    os.execv(argv[0], argv)
    return 127  # not reached


def _hold(name: str | None, labels: dict) -> bool:
    """The runtime holds container `name` (False: the name is taken, said as docker says)."""
    if name is None:
        return True
    with _locked():
        containers = _load("containers.json")
        if name in containers:
            print(f"docker: Error response from daemon: Conflict. The container name "
                  f'"/{name}" is already in use.', file=sys.stderr)
            return False
        containers[name] = {"labels": labels}
        _save("containers.json", containers)
    return True


def _run_built(img: dict, name: str | None, labels: dict, entrypoint: str | None,
               passed: list[str], inner: list[str]) -> int:
    """Run a built image's command: its ENV with absolute paths that exist in its root
    mapped into it, `python3` this interpreter, cwd its WORKDIR (in the root)."""
    root = Path(img["root"])

    def mapped(value: str) -> str:
        parts = value.split(":")
        return ":".join(str(root / p.lstrip("/")) if p.startswith("/")
                        and (root / p.lstrip("/")).exists() else p for p in parts)

    argv = ([entrypoint] if entrypoint else []) + inner
    if not argv:
        print(f"fake {KIND}: run: no command", file=sys.stderr)
        return 125
    if argv[0] == "python3":
        argv[0] = sys.executable
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           **{k: mapped(v) for k, v in img["env"].items()},
           **{k: os.environ[k] for k in passed}}
    if not _hold(name, labels):
        return 125
    sys.stdout.flush()
    os.chdir(root / img["workdir"].lstrip("/"))
    os.execve(argv[0] if "/" in argv[0] else shutil.which(argv[0]) or argv[0], argv, env)
    return 127  # not reached


def main() -> int:
    argv = sys.argv[1:]
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "calls.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(argv) + "\n")
    if argv[:2] == ["image", "inspect"]:
        return inspect(argv[2:])
    if argv[:2] in (["image", "ls"], ["image", "list"]) or argv[:1] == ["images"]:
        return image_ls(argv[2:] if argv[0] == "image" else argv[1:])
    if argv[:1] == ["build"] or argv[:2] == ["image", "build"]:
        return build(argv[1:] if argv[0] == "build" else argv[2:])
    if argv[:1] == ["pull"]:
        return pull(argv[1])
    if argv[:1] == ["run"]:
        return run(argv[1:])
    if argv[:2] == ["rm", "-f"]:
        with _locked():
            containers = _load("containers.json")
            gone = containers.pop(argv[2], None) is None
            _save("containers.json", containers)
        if gone:  # the real CLI says so on stderr, and exits 0
            print(f"Error response from daemon: No such container: {argv[2]}",
                  file=sys.stderr)
        else:
            print(argv[2])
        return 0
    if argv[:2] == ["container", "inspect"]:
        return container_inspect(argv[2:])
    print(f"fake {KIND}: unsupported command {' '.join(argv[:2])}", file=sys.stderr)
    return 2


def on_path(tmp_path: Path, monkeypatch: Any, registry: dict[str, list[str]],
            kind: str = "docker") -> Path:
    """A stand-in `kind` first on PATH (monkeypatched), its registry serving `registry`;
    returns its state directory (the tests' `docker` fixtures)."""
    state = tmp_path / f"{kind}-state"
    state.mkdir()
    install(tmp_path / "bin", state, kind=kind)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    (state / "registry.json").write_text(json.dumps(registry))
    return state


def install(bin_dir: Path, state: Path, kind: str = "docker") -> Path:
    """Write an executable `kind` into `bin_dir` that runs this stand-in (put `bin_dir` first
    on PATH). Returns its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / kind
    exe.write_text(f"#!/bin/sh\nFAKE_DOCKER_STATE='{state}' FAKE_DOCKER_KIND={kind} "
                   f"exec '{sys.executable}' '{Path(__file__).resolve()}' \"$@\"\n")
    exe.chmod(0o755)
    return exe


if __name__ == "__main__":
    sys.exit(main())
