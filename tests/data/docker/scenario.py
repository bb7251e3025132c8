"""The docker commands forge issues (harness/engines/image.py, image_build.py), as one
scenario run against the real docker (`record.py`, which writes golden.json) and against the
stand-in (tests/helpers/fake_docker.py; tests/harness/engines/test_fake_docker_golden.py).

Placeholders in a step's argv and in what it printed: `{REG}` the registry's host:port,
`{ID}` the local build's image ID (hex), `{D1}` / `{D2}` the digests the registry serves
for the tag before and after it moved. A step is (name, argv, what is compared): "all"
stdout, stderr and exit code; "last" the last stdout line and the exit code (a build's or a
pull's progress above it is the runtime's own); "code+match" the exit code and whether stderr
says no such image/container (forge's patterns, not the wording).
"""

from __future__ import annotations

import re

DOCKERFILE = "FROM scratch\nCOPY a.txt /a.txt\nLABEL k=v\n"
REPO = "{REG}/demo/img"

# Run after the registry serves `REPO:v1` at D2 (moved from D1) and nothing is local but
# the build of step 1.
STEPS: list[tuple[str, list[str], str]] = [
    ("build", ["build", "-f", "{CTX}/Dockerfile", "--label", "forge.x=y", "-t",
               "{REG}/demo/built:v1", "{CTX}"], "last"),
    ("built repo digests", ["image", "inspect", "--format", "{{json .RepoDigests}}",
                            "{REG}/demo/built:v1"], "all"),
    ("built id", ["image", "inspect", "--format", "{{json .Id}}", "{REG}/demo/built:v1"],
     "all"),
    ("built labels", ["image", "inspect", "--format", "{{json .Config.Labels}}",
                      "{REG}/demo/built:v1"], "all"),
    ("built by label", ["image", "ls", "--filter", "label=forge.x=y", "--no-trunc",
                        "--format", "{{.ID}}"], "all"),
    ("built by id", ["image", "inspect", "--format", "{{json .Id}}", "sha256:{ID}"], "all"),
    ("built by digest reference", ["image", "inspect", "--format", "{{json .Id}}",
                                   "{REG}/demo/built@sha256:{ID}"], "code+match"),
    ("missing image", ["image", "inspect", "--format", "{{json .RepoDigests}}",
                       REPO + ":v1"], "code+match"),
    ("pull tag", ["pull", REPO + ":v1"], "last"),
    ("tag repo digests", ["image", "inspect", "--format", "{{json .RepoDigests}}",
                          REPO + ":v1"], "all"),
    ("pull tag@old digest", ["pull", REPO + ":v1@{D1}"], "last"),
    ("old digest repo digests", ["image", "inspect", "--format", "{{json .RepoDigests}}",
                                 REPO + ":v1@{D1}"], "all"),
    ("repo@old digest repo digests", ["image", "inspect", "--format",
                                      "{{json .RepoDigests}}", REPO + "@{D1}"], "all"),
    ("pull unknown tag", ["pull", REPO + ":nope"], "code"),
    ("missing container label", ["container", "inspect", "--format",
                                 '{{index .Config.Labels "forge.owner"}}', "nosuch"],
     "code+match"),
    ("remove missing container", ["rm", "-f", "nosuch"], "code+stdout"),
    ("container label", ["container", "inspect", "--format",
                         '{{index .Config.Labels "forge.owner"}}', "c1"], "all"),
    ("container without the label", ["container", "inspect", "--format",
                                      '{{index .Config.Labels "other"}}', "c1"], "all"),
    ("remove container", ["rm", "-f", "c1"], "all"),
]
# Before "container label": a container `c1` labelled forge.owner=me exists (the recorder
# creates it; the stand-in's state holds it).
CONTAINER = ("c1", {"forge.owner": "me"})
MISSING = re.compile(r"no such image|image not known|no such container", re.IGNORECASE)


def compared(how: str, code: int, out: str, err: str) -> dict[str, object]:
    """What of a step's result is compared, as `STEPS` says."""
    if how == "all":
        return {"code": code, "out": out, "err": err}
    if how == "last":
        return {"code": code, "last": (out.strip().splitlines() or [""])[-1]}
    if how == "code+match":
        return {"code": code, "says missing": bool(MISSING.search(err)), "out": out}
    if how == "code+stdout":
        return {"code": code, "out": out}
    return {"code": code}


def fill(text: str, values: dict[str, str]) -> str:
    for k, v in values.items():
        text = text.replace("{" + k + "}", v)
    return text


def normalize(text: str, values: dict[str, str]) -> str:
    """`text` with the run's own values put back as their placeholders (longest first)."""
    for k, v in sorted(values.items(), key=lambda kv: -len(kv[1])):
        text = text.replace(v, "{" + k + "}")
    return text
