"""The MonoRepo manifest: which repositories are members, from where, on which branch.

```yaml
name: infer-stack            # optional
members:
  - name: sglang             # an id (ledger/ids.py)
    url: https://github.com/sgl-project/sglang.git   # or a path, relative to this file
    branch: main
    group: stack             # stack | harness
    path: stack/sglang       # inside the root; default <group>/<name>
    build: "pip install -e python"   # optional: bash -c text, or an argv list
    deploy:                  # optional: how a commit becomes something an engine runs
      kind: venv             # venv (default) | image
      install: 'python -m pip install -e "python[all]"'   # venv: run in the commit's source
      module: sglang         # the module the engine imports: the build's identity
      network: true          # the install may use the network (recorded)
```

`deploy` makes a build of a commit deployable (harness/engines/commit_build.py): a source
tree of that commit (nested submodules initialised) and, for `venv`, an environment layered
on the profile's base Python with the member installed from that source by `install`; for
`image`, an image built from `dockerfile` in that source, addressed by digest.

A member keeps its own history, branches and remotes: it is a git submodule of the root. The
root itself is the built-in workspace (what must work across repos).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..ledger.errors import SpecError
from ..ledger.ids import InvalidIdError, check_id
from ..ledger.yamlio import dotted_path, line_of, load_yaml
from .errors import RepoError

MANIFEST_NAME = "forge-repos.yaml"  # the manifest's copy inside the root


DEFAULT_INSTALL = "python -m pip install --no-deps --no-build-isolation -e ."


class Deploy(BaseModel):
    """How a commit of a member becomes deployable (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["venv", "image"] = "venv"
    # venv: run in the source tree of the commit with the build's environment first on PATH
    install: str | list[str] = DEFAULT_INSTALL
    module: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
    network: bool = False  # the install (or image build) may reach the network
    submodules: bool = True  # initialise nested submodules of the commit
    dockerfile: str = "Dockerfile"  # image: relative to the source root
    context: str = "."  # image: the build context, relative to the source root
    build_args: dict[str, str] = Field(default_factory=dict)  # image: --build-arg K=V

    @field_validator("install")
    @classmethod
    def _install(cls, v: str | list[str]) -> str | list[str]:
        if (isinstance(v, list) and not v) or (isinstance(v, str) and not v.strip()):
            raise ValueError("deploy.install: empty command")
        return v

    @field_validator("dockerfile", "context")
    @classmethod
    def _inside(cls, v: str) -> str:
        p = PurePosixPath(v)
        if p.is_absolute() or ".." in p.parts or "\\" in v:
            raise ValueError(f"{v!r} must be a relative path inside the source (no '..')")
        return str(p)


class Member(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    url: str = Field(min_length=1)
    branch: str = Field("main", min_length=1, pattern=r"^[A-Za-z0-9._/-]+$")
    group: Literal["stack", "harness"] = "stack"
    path: str | None = None
    build: str | list[str] | None = None
    deploy: Deploy | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        try:
            return check_id(v, "member name")
        except InvalidIdError as e:
            raise ValueError(str(e)) from None

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is None:
            return v
        p = PurePosixPath(v)
        if p.is_absolute() or ".." in p.parts or not p.parts or str(p) in (".", ".git") \
                or p.parts[0] == ".git" or "\\" in v:
            raise ValueError(f"path {v!r} must be a relative path inside the root "
                             "(no '..', not .git)")
        return str(p)

    @field_validator("build")
    @classmethod
    def _build(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and not v:
            raise ValueError("build: empty argv")
        if isinstance(v, str) and not v.strip():
            raise ValueError("build: empty command")
        return v

    @property
    def rel_path(self) -> str:
        return self.path or f"{self.group}/{self.name}"


class _Clash(ValueError):
    """Two members that clash; `loc` is the later one's field (a pydantic error location)."""

    def __init__(self, loc: tuple[str | int, ...], msg: str):
        super().__init__(msg)
        self.loc = loc


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "monorepo"
    members: list[Member] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Manifest:
        # The error carries the clashing member's location, so load_manifest can name its
        # file:line and field (a model-level error alone would point at line 1).
        for attr in ("name", "rel_path"):
            field = attr.replace("rel_", "")
            seen: dict[str, int] = {}
            for i, m in enumerate(self.members):
                v = getattr(m, attr)
                if v in seen:
                    raise _Clash(("members", i, field),
                                 f"{field} {v!r} is also the {field} of members[{seen[v]}]")
                seen[v] = i
        for i, m in enumerate(self.members):
            for j, o in enumerate(self.members):
                if m.rel_path.startswith(o.rel_path + "/"):
                    raise _Clash(("members", i, "path"), f"path {m.rel_path!r} is inside "
                                 f"members[{j}] ({o.name}) at {o.rel_path!r}")
        return self

    def member(self, name: str) -> Member:
        for m in self.members:
            if m.name == name:
                return m
        raise RepoError(f"no member {name!r} in the manifest "
                        f"(members: {', '.join(m.name for m in self.members)})")


def load_manifest(path: str | Path, *, resolve_urls: bool = True) -> Manifest:
    """Read and check a manifest (SpecError with file:line). A URL that is a relative path is
    made absolute against the manifest's directory when `resolve_urls`."""
    p = Path(path)
    if not p.is_file():
        raise RepoError(f"manifest {p}: no such file")
    data, node = load_yaml(p)
    if not isinstance(data, dict):
        raise SpecError([f"{p}:1: the manifest must be a mapping with `members`"])
    try:
        man = Manifest.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = getattr(err.get("ctx", {}).get("error"), "loc", None) or tuple(err["loc"])
            problems.append(f"{p}:{line_of(node, loc)}: {dotted_path(loc)}: {err['msg']}")
        raise SpecError(problems) from None
    if not resolve_urls:
        return man
    members = []
    for m in man.members:
        url = m.url
        if "://" not in url and not url.startswith(("git@", "/")) and ":" not in url.split("/")[0]:
            url = str((p.parent / url).resolve())
        members.append(m.model_copy(update={"url": url}))
    return man.model_copy(update={"members": members})
