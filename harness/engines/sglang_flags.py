"""Which `sglang.launch_server` flags each released SGLang accepts: data from its own parsers.

The table (`harness/data/sglang_flags.json`, committed) is generated, never hand-written:
`python -m infer_forge.harness.engines.sglang_flags generate [--versions V ...] [--out PATH]`
fetches each release (sglang_release.py) and runs sglang_parser_probe.py's `dump` against
its real `ServerArgs.add_cli_args` parser, then folds the dumps. Per flag: `first` and `last`
version (`last` null: still in the newest release swept), `deprecated_since` (null: not
deprecated in the newest release that has it), and `eras`: consecutive swept releases where
the flag's spec (dest, action, nargs, type, choices, default, deprecated, retired) is the
same, each `{"from", "to", ...spec}`. So a release's whole parser is recoverable
(`flags_at`), which is what the test comparing the table with the real parsers checks.

Reading: a version is read as the newest swept release at or below it (a post release
reads as its final; 0.5.0, never released, as 0.4.10); newer than the newest swept reads as
the newest; older than the oldest is a HarnessError. `available(flag, v)`: the flag exists
there and is not retired (a deprecated one still works). `check_options(opts, v)`: every
option's flag exists in that release and its value is one of that release's choices, else a
one-line HarnessError such as `sglang 0.5.6 has no --encoder-only (0.5.7 and later)`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..errors import HarnessError
from . import sglang_release

TABLE = Path(__file__).resolve().parents[1] / "data" / "sglang_flags.json"
PROBE = Path(__file__).resolve().with_name("sglang_parser_probe.py")
# The final releases on PyPI swept by default (there is no final 0.5.0).
DEFAULT_VERSIONS = (*(f"0.4.{i}" for i in range(11)), *(f"0.5.{i}" for i in range(1, 24)))
SPEC_KEYS = ("dest", "action", "nargs", "type", "choices", "default", "deprecated", "retired")

Version = tuple[int, int, int]


vkey = sglang_release.version_key


def _vstr(version: str | Sequence[int]) -> str:
    return version if isinstance(version, str) else ".".join(map(str, version))


class FlagTable:
    """The folded table (see the module docstring)."""

    def __init__(self, data: Mapping[str, Any], source: str = "sglang flag table"):
        try:
            self.versions: list[str] = list(data["versions"])
            self.flags: dict[str, Any] = dict(data["flags"])
        except (KeyError, TypeError):
            raise HarnessError(f"{source}: expected an object with versions and flags"
                               ) from None
        if not self.versions:
            raise HarnessError(f"{source}: no versions")
        self._keys = [vkey(v) for v in self.versions]
        self._index = {v: i for i, v in enumerate(self.versions)}

    @property
    def latest(self) -> str:
        return self.versions[-1]

    def release(self, version: str | Sequence[int]) -> str:
        """The swept release `version` reads as (see the module docstring)."""
        k = vkey(version)
        if k < self._keys[0]:
            raise HarnessError(f"sglang {_vstr(version)} is older than the oldest release the "
                               f"flag table knows ({self.versions[0]})")
        return self.versions[max(i for i, vk in enumerate(self._keys) if vk <= k)]

    def spec(self, flag: str, version: str | Sequence[int]) -> dict[str, Any] | None:
        """The flag's spec in that release, or None where it has no such flag."""
        entry = self.flags.get(flag)
        if entry is None:
            return None
        i = self._index[self.release(version)]
        for era in entry["eras"]:
            if self._index[era["from"]] <= i <= self._index[era["to"]]:
                return {k: era.get(k) for k in SPEC_KEYS if k in era}
        return None

    def available(self, flag: str, version: str | Sequence[int]) -> bool:
        s = self.spec(flag, version)
        return s is not None and not s.get("retired")

    def deprecated(self, flag: str, version: str | Sequence[int]) -> bool:
        s = self.spec(flag, version)
        return bool(s and s.get("deprecated"))

    def since(self, flag: str) -> str | None:
        entry = self.flags.get(flag)
        return entry["first"] if entry else None

    def span(self, flag: str) -> str:
        """Where the flag can be used, in words: `0.5.7 and later`, `0.4.0 to 0.5.19`."""
        entry = self.flags.get(flag)
        usable = sorted(i for e in (entry or {}).get("eras", []) if not e.get("retired")
                        for i in range(self._index[e["from"]], self._index[e["to"]] + 1))
        if not usable:
            return f"in no release {self.versions[0]} to {self.latest}"
        runs: list[list[int]] = []
        for i in usable:
            if runs and runs[-1][1] + 1 == i:
                runs[-1][1] = i
            else:
                runs.append([i, i])
        parts = []
        for a, b in runs:
            first, last = self.versions[a], self.versions[b]
            parts.append(f"{first} and later" if last == self.latest
                         else first if a == b else f"{first} to {last}")
        return ", ".join(parts)

    def flags_at(self, version: str | Sequence[int]) -> dict[str, dict[str, Any]]:
        """Every flag of that release with its spec (what its parser dump says)."""
        out = {}
        for flag in self.flags:
            s = self.spec(flag, version)
            if s is not None:
                out[flag] = s
        return out

    def check(self, flag: str, value: Any, version: str) -> None:
        """A HarnessError unless `flag` (with `value`) is usable in that release."""
        s = self.spec(flag, version)
        if s is None or s.get("retired"):
            raise HarnessError(f"sglang {version} has no {flag} ({self.span(flag)})")
        choices = s.get("choices")
        if not choices or isinstance(value, bool) or value is None:
            return
        values = value if isinstance(value, (list, tuple)) else [value]
        bad = [str(v) for v in values if str(v) not in choices]
        if bad:
            raise HarnessError(f"sglang {version} {flag}: {', '.join(bad)} is not one of "
                               f"{', '.join(choices)}")


@lru_cache(maxsize=4)
def _load(path: str) -> FlagTable:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise HarnessError(f"sglang flag table {path}: {e}") from None
    return FlagTable(data, path)


def table(path: Path | None = None) -> FlagTable:
    return _load(str(path or TABLE))


def available(flag: str, version: str | Sequence[int]) -> bool:
    return table().available(flag, version)


def since(flag: str) -> str | None:
    return table().since(flag)


def check_options(flags: Mapping[str, Any], version: str) -> None:
    """Every `--flag: value` usable in that release (see FlagTable.check)."""
    t = table()
    for flag, value in flags.items():
        t.check(flag, value, version)


def parse_with_release(version: str, argvs: Sequence[Sequence[str]],
                       cache: Path | None = None) -> list[dict[str, Any]]:
    """Each argv (what follows `-m sglang.launch_server`) parsed by the release's own parser
    (sglang_parser_probe.py `parse`; the wheel is fetched once into the cache): one
    `{"ok", "error", "args"}` per argv, in order."""
    with tempfile.TemporaryDirectory(prefix="forge-argv-") as tmp:
        path = Path(tmp) / "argvs.json"
        path.write_text(json.dumps([list(a) for a in argvs]), encoding="utf-8")
        out = sglang_release.run(version, PROBE, "parse", str(path), cache=cache)
    try:
        return list(json.loads(out))
    except ValueError:
        raise HarnessError(f"sglang {version}: the parser's answer is not JSON") from None


# --- generating the table ---------------------------------------------------------------


def dump(version: str, cache: Path | None = None) -> dict[str, Any]:
    """What the release's own parser says (sglang_parser_probe.py `dump`)."""
    out = sglang_release.run(version, PROBE, "dump", cache=cache)
    try:
        data = json.loads(out)
    except ValueError:
        raise HarnessError(f"sglang {version}: the parser dump is not JSON") from None
    return dict(data["flags"])


def fold(dumps: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The table from {version: flags}; versions are put in release order."""
    versions = sorted(dumps, key=vkey)
    names = sorted({f for d in dumps.values() for f in d})
    flags: dict[str, Any] = {}
    for name in names:
        eras: list[dict[str, Any]] = []
        prev_in = False
        for v in versions:
            s = dumps[v].get(name)
            if s is None:
                prev_in = False
                continue
            s = {k: s[k] for k in SPEC_KEYS if k in s}
            if prev_in and {k: eras[-1][k] for k in eras[-1] if k not in ("from", "to")} == s:
                eras[-1]["to"] = v
            else:
                eras.append({"from": v, "to": v, **s})
            prev_in = True
        dep = [e for e in eras if e.get("deprecated")]
        deprecated_since = None
        if dep and eras[-1].get("deprecated"):
            i = len(eras) - 1  # the start of the final run of deprecated eras
            while i > 0 and eras[i - 1].get("deprecated") and \
                    versions.index(eras[i - 1]["to"]) + 1 == versions.index(eras[i]["from"]):
                i -= 1
            deprecated_since = eras[i]["from"]
        flags[name] = {"first": eras[0]["from"],
                       "last": None if eras[-1]["to"] == versions[-1] else eras[-1]["to"],
                       "deprecated_since": deprecated_since, "eras": eras}
    return {"generated_by": "python -m infer_forge.harness.engines.sglang_flags generate",
            "versions": versions, "flags": flags}


def generate(versions: Sequence[str], out: Path, cache: Path | None = None,
             prune: bool = False) -> dict[str, Any]:
    dumps = {}
    for v in versions:
        t0 = time.monotonic()
        dumps[v] = dump(v, cache)
        print(f"sglang {v}: {len(dumps[v])} flags ({time.monotonic() - t0:.1f} s)",
              file=sys.stderr)
        if prune:  # the unpacked tree is ~130 MB; the wheel stays for a rerun
            shutil.rmtree((cache or sglang_release.cache_dir()) / "unpacked" / v)
    data = fold(dumps)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    return data


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m infer_forge.harness.engines.sglang_flags")
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="dump each release's parser and fold the table")
    g.add_argument("--versions", nargs="+", default=list(DEFAULT_VERSIONS))
    g.add_argument("--out", type=Path, default=TABLE)
    g.add_argument("--cache", type=Path, default=None,
                   help="release cache (default $FORGE_SGLANG_CACHE or ~/.cache/...)")
    g.add_argument("--prune", action="store_true",
                   help="delete each unpacked release after its dump")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        data = generate(args.versions, args.out, args.cache, args.prune)
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.out}: {len(data['flags'])} flags over {len(data['versions'])} releases "
          f"in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
