"""Record golden.json: the scenario of scenario.py run against the real docker CLI, a real
docker daemon and a real registry (tests/harness/engines/test_fake_docker_golden.py holds the
stand-in to it).

    DOCKER_HOST=unix:///PATH/docker.sock python tests/data/docker/record.py HOST:PORT

HOST:PORT: a registry (`docker-registry serve CONFIG` from Debian's docker-registry, `addr:
127.0.0.1:PORT`; docker treats 127.0.0.0/8 as insecure, no TLS needed). DOCKER_HOST: a daemon
of its own, e.g. `dockerd -H unix:///PATH/docker.sock --data-root PATH/root --exec-root
PATH/exec --storage-driver vfs --iptables=false --bridge=none` (Debian's docker.io; pulling,
building FROM scratch and creating containers need no cgroups or network). The repository
`demo/img` is pushed twice (the tag moves from D1 to D2), then removed locally.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scenario import CONTAINER, DOCKERFILE, REPO, STEPS, compared, fill, normalize  # noqa: E402

OUT = Path(__file__).resolve().parent / "golden.json"
ENV = {**os.environ, "DOCKER_BUILDKIT": "0"}  # the legacy builder, as forge's builds here


def docker(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, env=ENV,
                          timeout=300)


def push_version(reg: str, ctx: Path, content: str) -> str:
    """Build `REPO:v1` with `content`, push it; the digest the registry now serves."""
    (ctx / "a.txt").write_text(content)
    ref = fill(REPO, {"REG": reg}) + ":v1"
    for argv in (["build", "-q", "-t", ref, str(ctx)], ["push", ref]):
        p = docker(*argv)
        if p.returncode != 0:
            sys.exit(f"docker {' '.join(argv)}: {p.stderr}")
    digest = json.loads(docker("image", "inspect", "--format", "{{json .RepoDigests}}",
                               ref).stdout)[0].partition("@")[2]
    docker("rmi", "-f", ref, f"{fill(REPO, {'REG': reg})}@{digest}")
    return digest


def main() -> None:
    reg = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="forge-docker-golden-") as tmp:
        ctx = Path(tmp)
        (ctx / "Dockerfile").write_text(DOCKERFILE)
        values = {"REG": reg, "CTX": str(ctx),
                  "D1": push_version(reg, ctx, "one\n"), "D2": push_version(reg, ctx, "two\n")}
        (ctx / "a.txt").write_text("built\n")
        results = {}
        for name, argv, how in STEPS:
            if name == "container label":
                cname, labels = CONTAINER
                docker("create", "--name", cname,
                       *[x for k, v in labels.items() for x in ("--label", f"{k}={v}")],
                       fill("{REG}/demo/built:v1", values), "/none")
            p = docker(*[fill(a, values) for a in argv])
            if name == "built id":  # the build's own ID, for the steps after
                values["ID"] = json.loads(p.stdout).partition(":")[2]
            results[name] = {k: normalize(v, values) if isinstance(v, str) else v
                             for k, v in compared(how, p.returncode, p.stdout,
                                                  p.stderr).items()}
        version = docker("version", "--format", "{{.Client.Version}} / {{.Server.Version}}")
        for ref in (fill("{REG}/demo/built:v1", values), fill(REPO + ":v1", values)):
            docker("rmi", "-f", ref)
    OUT.write_text(json.dumps({"docker (client / daemon)": version.stdout.strip(),
                               "steps": results}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
