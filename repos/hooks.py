"""The push guard's git hook: a `pre-push` in the root and in every member.

`install_hooks(mono, ws_home)` writes the hook into each repository's own hooks directory
(`git rev-parse --git-path hooks`: a submodule's lives under the root's `.git/modules/…`,
and task worktrees share their member's). The hook is a small sh script that exports
FORGE_HOME and hands git's arguments and stdin to `forge repos pre-push --member NAME`
(repos/guard.py decides and records); it exits non-zero, and git aborts the push, when the
guard refuses or cannot run at all (fail closed).

A `pre-push` that forge did not write is never overwritten: it is moved aside to
`pre-push.chained` and the forge hook runs it first, with the same arguments and input (its
refusal stands). Installing again rewrites forge's own hook in place (a refresh).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from ..ledger.workspace import Workspace
from .errors import RepoError
from .git import git_path
from .root import MonoRepo

MARK = "# forge-guard-hook"
CHAINED = "pre-push.chained"


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


def install_hook(repo: Path, member: str, ws_home: Path, python: str) -> Path:
    hooks = git_path("hooks", repo)
    hooks.mkdir(parents=True, exist_ok=True)
    hook, chained = hooks / "pre-push", hooks / CHAINED
    if hook.is_file() and MARK not in hook.read_text("utf-8", "replace"):
        if chained.exists():
            raise RepoError(f"{hook}: a pre-push hook not written by forge, and {chained} "
                            "exists too: merge them by hand, then run `forge repos hooks`")
        os.replace(hook, chained)  # kept, and run first by forge's hook
    tmp = hooks / ".pre-push.forge-tmp"
    tmp.write_text(hook_script(member, ws_home.resolve(), python,
                               chained if chained.is_file() else None), encoding="utf-8")
    tmp.chmod(0o755)
    os.replace(tmp, hook)
    return hook


def install_hooks(mono: MonoRepo, ws_home: Path, python: str = sys.executable
                  ) -> list[dict[str, str]]:
    """Install (or refresh) the pre-push hook in the root and every member; where each went."""
    return [{"member": name, "path": rel,
             "hook": str(install_hook(repo, name, ws_home, python))}
            for name, rel, repo in mono.repos()]


def refresh_hooks(ws: Workspace) -> list[dict[str, str]]:
    """`forge repos hooks`: install or refresh the hooks of the workspace's MonoRepo."""
    return install_hooks(MonoRepo.open(ws.config.monorepo_root), ws.home)
