"""A stand-in `docker` / `podman` CLI (neither runs here): the subcommands forge uses, with the
output shapes the real CLIs print, and `run` executing the stand-in SGLang server (or router)
as the image would.

State lives in the directory `FAKE_DOCKER_STATE` names:
- `registry.json`: {"name@sha256:…": ["sha256:…", …]}: what a pull of that reference gets
  (the repo digests the runtime then reports; a different digest is a registry serving other
  bytes than the pin, which the harness must catch);
- `images.json`: the same shape, what is present locally (pulls add to it);
- `calls.jsonl`: every invocation's argv, in order (tests read the command lines back).
`FAKE_DOCKER_KIND` (docker | podman) picks the error texts.

Shapes, as the real CLIs print them (docker 27, podman 5):
  image inspect --format '{{json .RepoDigests}}' REF  ->  ["lmsysorg/sglang@sha256:…"]
  (missing, docker)  stderr "Error response from daemon: No such image: REF", exit 1
  (missing, podman)  stderr "Error: REF: image not known", exit 125
  pull REF  ->  "REF: Pulling from lmsysorg/sglang" … "Digest: sha256:…",
                "Status: Downloaded newer image for REF", "docker.io/REF"
  rm -f NAME  ->  NAME (docker prints the name even when it was already gone)
  container inspect --format '{{index .Config.Labels "KEY"}}' NAME  ->  the label's value,
                "<no value>" without it
  (missing, docker)  stderr "Error response from daemon: No such container: NAME", exit 1
  (missing, podman)  stderr "Error: no such container NAME", exit 125
- `containers.json`: {"NAME": {"labels": {…}}}: containers the runtime holds. `run` adds its
  `--name` (with its `--label`s) and `rm -f` removes it; a client killed before `rm -f`
  leaves it, as the real daemon keeps a container whose client died.
`run … REF python3 -m sglang.launch_server ARGS` execs the stand-in SGLang server with ARGS
(`python3 -m sglang_router.launch_router` the stand-in router); `-e NAME` options must name
variables the client has, as the real CLI passes them on.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAKE_SGLANG = REPO / "tests" / "data" / "sglang" / "fake_server.py"
FAKE_ROUTER = REPO / "harness" / "testing" / "fake_router.py"
STATE = Path(os.environ.get("FAKE_DOCKER_STATE", "."))
KIND = os.environ.get("FAKE_DOCKER_KIND", "docker")


def _load(name: str) -> dict:
    p = STATE / name
    return json.loads(p.read_text()) if p.exists() else {}


def _save(name: str, data: dict) -> None:
    (STATE / name).write_text(json.dumps(data, sort_keys=True))


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
    print(f"Error response from daemon: No such image: {ref}", file=sys.stderr)
    return 1


def inspect(args: list[str]) -> int:
    ref = args[-1]
    fmt = args[args.index("--format") + 1] if "--format" in args else ""
    images = _load("images.json")
    if ref not in images:
        return _no_image(ref)
    if fmt != "{{json .RepoDigests}}":
        print(f"fake {KIND}: unsupported --format {fmt!r}", file=sys.stderr)
        return 2
    print(json.dumps([f"{repository(ref)}@{d}" for d in images[ref]]))
    return 0


def container_inspect(args: list[str]) -> int:
    name = args[-1]
    fmt = args[args.index("--format") + 1] if "--format" in args else ""
    containers = _load("containers.json")
    if name not in containers:
        if KIND == "podman":
            print(f"Error: no such container {name}", file=sys.stderr)
            return 125
        print(f"Error response from daemon: No such container: {name}", file=sys.stderr)
        return 1
    m = re.fullmatch(r'\{\{index \.Config\.Labels "([^"]+)"\}\}', fmt)
    if m is None:
        print(f"fake {KIND}: unsupported --format {fmt!r}", file=sys.stderr)
        return 2
    print(containers[name]["labels"].get(m.group(1), "<no value>"))
    return 0


def repository(ref: str) -> str:
    """The repository of a reference, without tag or digest (as RepoDigests name it)."""
    name = ref.partition("@")[0]
    last = name.rsplit("/", 1)[-1]
    return name[: len(name) - len(last)] + last.split(":")[0]


def pull(ref: str) -> int:
    registry = _load("registry.json")
    name = repository(ref)
    if ref not in registry:
        print(f"Error response from daemon: manifest for {ref} not found: manifest unknown",
              file=sys.stderr)
        return 1
    digests = registry[ref]
    images = _load("images.json")
    images[ref] = digests
    _save("images.json", images)
    print(f"{ref.partition('@')[2]}: Pulling from {name}")
    print("Digest: " + digests[0])
    print(f"Status: Downloaded newer image for {ref}")
    print(f"docker.io/{ref}")
    return 0


def run(args: list[str]) -> int:
    images = _load("images.json")
    name, labels = None, {}
    i = 0
    while i < len(args) and "@sha256:" not in args[i]:
        a = args[i]
        if a == "-e" and args[i + 1] not in os.environ:  # passes the client's variable on
            print(f"fake {KIND}: -e {args[i + 1]}: not set in the client", file=sys.stderr)
            return 125
        if a == "--name":
            name = args[i + 1]
        elif a == "--label":
            k, _, v = args[i + 1].partition("=")
            labels[k] = v
        i += 2 if a in ("--name", "--label", "--network", "--ipc", "--gpus", "--device",
                        "-v", "-e", "--group-add") else 1
    if i >= len(args):
        print(f"fake {KIND}: run: no image reference (name@sha256:…) given", file=sys.stderr)
        return 125
    ref, inner = args[i], args[i + 1:]
    if ref not in images:
        print(f"Unable to find image '{ref}' locally", file=sys.stderr)
        return 125
    if inner[:3] == ["python3", "-m", "sglang.launch_server"]:
        argv = [sys.executable, str(FAKE_SGLANG), *inner[3:]]
    elif inner[:3] == ["python3", "-m", "sglang_router.launch_router"]:
        argv = [sys.executable, str(FAKE_ROUTER), *inner[3:]]
    else:
        argv = inner
    if name is not None:
        with _locked():
            containers = _load("containers.json")
            if name in containers:
                print(f"docker: Error response from daemon: Conflict. The container name "
                      f'"/{name}" is already in use.', file=sys.stderr)
                return 125
            containers[name] = {"labels": labels}
            _save("containers.json", containers)
    sys.stdout.flush()
    os.execv(argv[0], argv)
    return 127  # not reached


def main() -> int:
    argv = sys.argv[1:]
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "calls.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(argv) + "\n")
    if argv[:2] == ["image", "inspect"]:
        return inspect(argv[2:])
    if argv[:1] == ["pull"]:
        return pull(argv[1])
    if argv[:1] == ["run"]:
        return run(argv[1:])
    if argv[:2] == ["rm", "-f"]:
        with _locked():
            containers = _load("containers.json")
            containers.pop(argv[2], None)
            _save("containers.json", containers)
        print(argv[2])
        return 0
    if argv[:2] == ["container", "inspect"]:
        return container_inspect(argv[2:])
    print(f"fake {KIND}: unsupported command {' '.join(argv[:2])}", file=sys.stderr)
    return 2


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
