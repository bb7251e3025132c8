"""Asks a released SGLang's own argument parser; run inside `sglang_release.run` only.

`dump`: prints JSON `{"version", "flags": {"--flag": SPEC}}`, one SPEC per option string of
`ServerArgs.add_cli_args`: `dest`, `action` (the action class name), `nargs`, `type` (the
converter's name), `choices` (sorted strings, when fixed), `default` (when JSON-able), `deprecated`
(the release marks it so: a Deprecated* action class, argparse's `deprecated=`, or help text
opening with "Deprecated" / saying "--flag is deprecated"), `retired` (a deprecated flag that
fails when used: SGLang's `DeprecatedAction` raising, or carrying an error message).

`parse ARGVS.json`: ARGVS is a JSON list of argv lists (what follows `-m
sglang.launch_server`); prints a JSON list, one `{"ok", "error", "args"}` per argv: parsed the
way the release's `prepare_server_args` does (a `--config FILE` is merged by the release's own
config loader first), up to, not including, `ServerArgs.from_cli_args` (which needs a GPU).
`args`: the parsed namespace (values as JSON: an enum's value, else str()).

`check ARGVS.json`: both in one process, `{"version", "flags", "results"}` (what the tests
ask each release, once per test module).
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import io
import json
import re
import sys
from typing import Any

from infer_forge.harness.engines.sglang_import import is_stub

DEPRECATED_HELP = re.compile(r"^\W*(note:\s*)?deprecated\b|--[\w-]+'? is deprecated",
                             re.IGNORECASE)


def parser() -> argparse.ArgumentParser:
    # sglang is the release's, importable only inside sglang_import's child: untyped here
    import sglang.srt.server_args as sa  # type: ignore[import-not-found]

    p = argparse.ArgumentParser(prog="sglang.launch_server")
    sa.ServerArgs.add_cli_args(p)
    return p


def _jsonable(value: Any) -> bool:
    try:
        return json.loads(json.dumps(value, allow_nan=False)) == value
    except (TypeError, ValueError):
        return False


def _plain(value: Any) -> Any:
    """A parsed value as JSON: itself, an enum's value, else its str()."""
    for v in (value, getattr(value, "value", None)):
        if _jsonable(v):
            return v
    return str(value)


def _choices(action: argparse.Action) -> list[str] | None:
    if action.choices is None or is_stub(action.choices):
        return None
    try:
        values = list(action.choices)
    except TypeError:
        return None
    if any(is_stub(v) for v in values):
        return None
    return sorted(str(v) for v in values)  # some releases keep choices in a set


def _type_name(action: argparse.Action) -> str | None:
    t = action.type
    if t is None:
        return None
    return getattr(t, "__name__", None) or type(t).__name__


def spec(action: argparse.Action) -> dict[str, Any]:
    kind = type(action).__name__
    help_text = action.help if isinstance(action.help, str) else ""
    deprecated = ("Deprecated" in kind or bool(getattr(action, "deprecated", False))
                  or bool(DEPRECATED_HELP.search(help_text)))
    retired = kind == "DeprecatedAction" and getattr(action, "error_message", "") is not None
    out: dict[str, Any] = {"dest": action.dest, "action": kind,
                           "nargs": action.nargs, "type": _type_name(action),
                           "choices": _choices(action), "deprecated": deprecated,
                           "retired": retired}
    if _jsonable(action.default):
        out["default"] = action.default
    return out


def dump(version: str) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    for action in parser()._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        for opt in action.option_strings:
            if opt.startswith("--"):
                flags[opt] = spec(action)
    return {"version": version, "flags": dict(sorted(flags.items()))}


def _merge_config(p: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """What the release's prepare_server_args does with `--config` (its own loader)."""
    try:
        from sglang.srt.utils.server_args_config_parser import (  # type: ignore[import-not-found]
            ConfigArgumentMerger,
        )
    except ImportError:  # older releases (0.5.13 still) keep it beside server_args
        from sglang.srt.server_args_config_parser import (  # type: ignore[import-not-found]
            ConfigArgumentMerger,
        )
    params = inspect.signature(ConfigArgumentMerger.__init__).parameters
    if "parser" in params:
        merger = ConfigArgumentMerger(p)
    else:  # as prepare_server_args of these releases builds it
        merger = ConfigArgumentMerger(boolean_actions=[
            a.dest for a in p._actions
            if hasattr(a, "dest") and getattr(a, "action", None) in ("store_true",
                                                                     "store_false")])
    return list(merger.merge_config_with_args(argv))


def parse(argvs: list[list[str]]) -> list[dict[str, Any]]:
    p = parser()
    results = []
    for argv in argvs:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                merged = _merge_config(p, argv) if "--config" in argv else argv
                ns = p.parse_args(merged)
            results.append({"ok": True, "error": "",
                            "args": {k: _plain(v) for k, v in vars(ns).items()}})
        except SystemExit:
            lines = err.getvalue().strip().splitlines()
            results.append({"ok": False, "error": lines[-1] if lines else "exit", "args": {}})
        except Exception as e:  # a retired flag's action raises; the config loader too
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}", "args": {}})
    return results


def main(argv: list[str]) -> int:
    import sglang.version  # type: ignore[import-not-found]

    version = sglang.version.__version__
    if argv[:1] == ["dump"]:
        print(json.dumps(dump(version)))
    elif argv[:1] in (["parse"], ["check"]) and len(argv) == 2:
        with open(argv[1], encoding="utf-8") as f:
            results = parse(json.load(f))
        print(json.dumps({**dump(version), "results": results} if argv[0] == "check"
                         else results))
    else:
        print("usage: sglang_parser_probe.py dump | parse ARGVS.json | check ARGVS.json",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
