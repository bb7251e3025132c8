"""What each SGLang release's `/start_profile` reads from its request body, as data.

The table (`harness/data/sglang_profile_req.json`) is generated from the released wheels'
own source (`python -m infer_forge.harness.engines.sglang_profile_req generate`): the route
function of `/start_profile` (`sglang/srt/entrypoints/http_server.py`, `sglang/srt/server.py`
in 0.4) names its body's type (`ProfileReqInput` until 0.5.20, `ProfileReq` from 0.5.21;
none in 0.4.x, whose profiler writes to `$SGLANG_TORCH_PROFILER_DIR`), and that class's
annotated fields in `sglang/srt/managers/io_struct.py` are what the server reads (less
`req_type`, which the route sets itself). A field the release does not have is silently
dropped by the server (FastAPI ignores unknown body keys), so `check` refuses it here instead:
a capture that asked for `merge_profiles` on 0.5.1 must not pass as merged.

`check(options, version)` raises a one-line HarnessError naming the field, the release and
the first release that reads it.
"""

from __future__ import annotations

import ast
import json
import sys
import zipfile
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import HarnessError
from .sglang_release import version_key

TABLE = Path(__file__).resolve().parent.parent / "data" / "sglang_profile_req.json"
HIDDEN = {"req_type", "type"}  # set by the route, not by a caller


def fields_of(http_source: str, io_source: str | None) -> list[str]:
    """The body fields `/start_profile` reads, from one release's route and io_struct source
    (empty: the route takes no body)."""
    body_type = None
    for node in ast.walk(ast.parse(http_source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        routes = [d for d in node.decorator_list if isinstance(d, ast.Call) and d.args
                  and isinstance(d.args[0], ast.Constant) and d.args[0].value == "/start_profile"]
        if not routes:
            continue
        for arg in node.args.args:
            if arg.annotation is not None:
                names = [n.id for n in ast.walk(arg.annotation) if isinstance(n, ast.Name)]
                body_type = next((n for n in names if n.startswith("ProfileReq")), body_type)
        break
    if body_type is None or io_source is None:
        return []
    for node in ast.parse(io_source).body:
        if isinstance(node, ast.ClassDef) and node.name == body_type:
            return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign)
                    and isinstance(n.target, ast.Name) and n.target.id not in HIDDEN]
    raise HarnessError(f"io_struct.py has no class {body_type} (the /start_profile body)")


def fields_in_wheel(whl: Path) -> list[str]:
    """`fields_of` read straight out of a wheel file (nothing unpacked)."""
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())

        def read(name: str) -> str | None:
            return z.read(name).decode("utf-8") if name in names else None

        http = (read("sglang/srt/entrypoints/http_server.py")
                or read("sglang/srt/server.py") or "")
        return fields_of(http, read("sglang/srt/managers/io_struct.py"))


def fold(per_version: Mapping[str, Iterable[str]]) -> dict[str, Any]:
    """{"versions": [...], "fields": {field: first release}} from each release's fields.
    A field that disappears again is an error (not seen in SGLang so far)."""
    order = sorted(per_version, key=version_key)
    first: dict[str, str] = {}
    for v in order:
        have = set(per_version[v])
        for f in sorted(have):
            first.setdefault(f, v)
        gone = [f for f in first if f not in have]
        if gone:
            raise HarnessError(f"sglang {v}: /start_profile lost {', '.join(gone)}")
    return {"versions": order, "fields": dict(sorted(first.items()))}


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    return json.loads(TABLE.read_text(encoding="utf-8"))


def fields_for(version: str, data: Mapping[str, Any] | None = None) -> set[str]:
    t = data or table()
    v = version_key(version)
    return {f for f, since in t["fields"].items() if version_key(since) <= v}


def check(options: Mapping[str, Any], version: str, data: Mapping[str, Any] | None = None
          ) -> None:
    """Refuse a `/start_profile` option the release at `version` does not read."""
    t = data or table()
    have = fields_for(version, t)
    for name in sorted(options):
        if name in have:
            continue
        since = t["fields"].get(name)
        if since is None:
            raise HarnessError(f"sglang start_profile: unknown option {name} (SGLang reads "
                               f"{', '.join(sorted(t['fields']))})")
        hint = (" (0.4.x takes no options: it writes to $SGLANG_TORCH_PROFILER_DIR)"
                if not have else "")
        raise HarnessError(f"sglang {version}'s /start_profile does not read {name} "
                           f"({since} and later){hint}")


def main(argv: list[str]) -> int:
    """`generate [--out PATH] VERSION ...`: fetch each release's wheel, write the table."""
    from . import sglang_release  # start-up time: pip and zipfile only for the generator

    if not argv or argv[0] != "generate":
        print("usage: python -m infer_forge.harness.engines.sglang_profile_req generate "
              "[--out PATH] VERSION ...", file=sys.stderr)
        return 2
    args = argv[1:]
    out = TABLE
    if args[:1] == ["--out"]:
        out, args = Path(args[1]), args[2:]
    per_version = {}
    for v in args:
        per_version[v] = fields_in_wheel(sglang_release.wheel(v))
        print(f"{v}: {len(per_version[v])} fields", file=sys.stderr)
    data = fold(per_version)
    out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
