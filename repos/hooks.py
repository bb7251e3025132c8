"""The push guard's git hooks: a `pre-push` in the root and in every member, and a
`pre-receive` in each of their `origin` remotes that forge manages.

`install_hooks(mono, ws_home)` writes the hook into each repository's own hooks directory
(`git rev-parse --git-path hooks`: a submodule's lives under the root's `.git/modules/…`,
and task worktrees share their member's). The hook is a small sh script that exports
FORGE_HOME and hands git's arguments and stdin to `forge repos pre-push --member NAME`
(repos/push_guard.py decides and records); it exits non-zero, and git aborts the push, when the
guard refuses or cannot run at all (fail closed).

A client hook is advice, not a guard: `git push --no-verify`, `git -c core.hooksPath=...`
or `git send-pack` never run it. So where the root's or a member's `origin` is a bare
repository on this machine (a local path or `file://` URL: what `forge repos init` was given),
forge manages that remote and installs a `pre-receive` hook in it: it hands git's input
(`OLD NEW REF` lines) to `forge repos pre-receive --member NAME --remote origin --url URL`,
which decides and records as the pre-push check does (repos/push.py `receive_check`), on the
receiving side, whatever the pushing client ran or skipped; it fails closed. A pre-push
whose remote has forge's pre-receive defers to it (`managed`): one decision, recorded once.
A remote forge does not manage (a server) needs its own branch protection: the pre-push
there is advice only (docs/red-team.md, README).

A hook that forge did not write is never overwritten: it is moved aside to
`<hook>.chained` and the forge hook runs it first, with the same arguments and input (its
refusal stands). Installing again rewrites forge's own hook in place (a refresh).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from ..ledger.workspace import Workspace
from .errors import RepoError
from .git import git, git_path
from .root import MonoRepo, origin_url

MARK = "# forge-guard-hook"
CHAINED = "pre-push.chained"
RECEIVE = "pre-receive"


def hook_script(member: str, ws_home: Path, python: str, chained: Path | None) -> str:
    q = shlex.quote
    feed = '{ [ -z "$input" ] || printf \'%s\\n\' "$input"; }'
    lines = ["#!/bin/sh",
             f"{MARK}: written by `forge repos hooks` (the push guard); rewritten on refresh.",
             f"FORGE_HOME={q(str(ws_home))}",
             "export FORGE_HOME",
             'input=$(cat)']
    if chained is not None:
        c = q(str(chained))  # run as git would: only when executable
        lines.append(f'if [ -x {c} ]; then {feed} | {c} "$@" || exit $?; fi')
    # -P: the member's checkout (the hook's cwd) is never put on sys.path.
    lines.append(f'{feed} | {q(python)} -P -m infer_forge.cli repos pre-push '
                 f'--member {q(member)} -- "$1" "$2"')
    return "\n".join(lines) + "\n"


def receive_script(member: str, url: str, ws_home: Path, python: str,
                   chained: Path | None) -> str:
    q = shlex.quote
    feed = '{ [ -z "$input" ] || printf \'%s\\n\' "$input"; }'
    lines = ["#!/bin/sh",
             f"{MARK}: written by `forge repos hooks` (the push guard, receiving side); "
             "rewritten on refresh.",
             f"FORGE_HOME={q(str(ws_home))}",
             "export FORGE_HOME",
             'input=$(cat)']
    if chained is not None:
        c = q(str(chained))
        lines.append(f'if [ -x {c} ]; then {feed} | {c} "$@" || exit $?; fi')
    lines.append(f'{feed} | {q(python)} -P -m infer_forge.cli repos pre-receive '
                 f'--member {q(member)} --remote origin --url {q(url)} || exit 1')
    return "\n".join(lines) + "\n"


def _write_hook(hooks: Path, name: str, text: Callable[[Path | None], str]) -> Path:
    """Write forge's hook `name` in `hooks`, chaining one forge did not write."""
    hooks.mkdir(parents=True, exist_ok=True)
    hook, chained = hooks / name, hooks / f"{name}.chained"
    if hook.is_file() and MARK not in hook.read_text("utf-8", "replace"):
        if chained.exists():
            raise RepoError(f"{hook}: a {name} hook not written by forge, and {chained} "
                            "exists too: merge them by hand, then run `forge repos hooks`")
        os.replace(hook, chained)  # kept, and run first by forge's hook
    tmp = hooks / f".{name}.forge-tmp"
    tmp.write_text(text(chained if chained.is_file() else None), encoding="utf-8")
    tmp.chmod(0o755)
    os.replace(tmp, hook)
    return hook


def install_hook(repo: Path, member: str, ws_home: Path, python: str) -> Path:
    return _write_hook(git_path("hooks", repo), "pre-push",
                       lambda ch: hook_script(member, ws_home.resolve(), python, ch))


def local_bare(url: str | None, base: Path) -> Path | None:
    """The bare repository on this machine that `url` names (a path, relative to `base`, or
    a `file://` URL), or None (a server, or no bare repository there)."""
    if not url:
        return None
    if url.startswith("file://"):
        url = url[len("file://"):]
    elif "://" in url or ":" in url.split("/", 1)[0]:
        return None  # ssh://, https://, host:path
    p = (base / url).resolve()
    if not p.is_dir():
        return None
    r = git(["rev-parse", "--is-bare-repository"], p, check=False)
    return p if r.returncode == 0 and r.stdout.decode().strip() == "true" else None


def managed(url: str, base: Path) -> bool:
    """Whether `url` is a remote forge manages: a local bare repository whose pre-receive is
    forge's (the receiving side then decides and records every push)."""
    bare = local_bare(url, base)
    if bare is None:
        return False
    hook = git_path("hooks", bare) / RECEIVE
    try:
        return hook.is_file() and MARK in hook.read_text("utf-8", "replace")
    except OSError:
        return False


def install_receive_hook(repo: Path, member: str, ws_home: Path, python: str) -> Path | None:
    """forge's pre-receive in `repo`'s origin when it is a local bare repository; its path."""
    url = origin_url(repo)
    bare = local_bare(url, repo)
    if bare is None or url is None:
        return None
    return _write_hook(git_path("hooks", bare), RECEIVE,
                       lambda ch: receive_script(member, url, ws_home.resolve(), python, ch))


def install_hooks(mono: MonoRepo, ws_home: Path, python: str = sys.executable
                  ) -> list[dict[str, str | None]]:
    """Install (or refresh) the pre-push hook in the root and every member, and the
    pre-receive in each managed origin; where each went."""
    rows: list[dict[str, str | None]] = []
    for name, rel, repo in mono.repos():
        hook = install_hook(repo, name, ws_home, python)
        recv = install_receive_hook(repo, name, ws_home, python)
        rows.append({"member": name, "path": rel, "hook": str(hook),
                     "receive_hook": str(recv) if recv else None})
    return rows


def refresh_hooks(ws: Workspace) -> list[dict[str, str | None]]:
    """`forge repos hooks`: install or refresh the hooks of the workspace's MonoRepo."""
    return install_hooks(MonoRepo.open(ws.config.monorepo_root), ws.home)
