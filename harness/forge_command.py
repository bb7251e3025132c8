"""How a person's shell runs this forge: the command forge's own hints print.

`make demo` runs `.venv/bin/forge`; bare `forge` works only once the virtual environment is
activated (`source .venv/bin/activate`) or the script is linked onto PATH. A hint that
prints bare `forge` where the shell answers "command not found" is no hint.

- `forge_command()` is `forge` when PATH finds this very program; else the program's path,
  relative to the working directory when under it (`.venv/bin/forge`), shell-quoted. The
  program is `sys.argv[0]` when it is a `forge` script, else the `forge` script beside the
  interpreter (`python -m infer_forge.cli`); with neither, `forge`.
- `activate_hint()` names the `activate` script beside that program when the command is not
  bare `forge` (None otherwise): the one step that makes every later hint bare `forge`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path


def _program(argv0: str | None, executable: str | None) -> Path | None:
    first = Path(sys.argv[0] if argv0 is None else argv0)
    if first.name == "forge" and first.is_file():
        return first.absolute()
    beside = Path(sys.executable if executable is None else executable).parent / "forge"
    return beside.absolute() if beside.is_file() else None


def _shown(p: Path, cwd: str | None) -> str:
    here = Path(cwd or os.getcwd()).absolute()
    return shlex.quote(str(p.relative_to(here)) if p.is_relative_to(here) else str(p))


def forge_command(argv0: str | None = None, executable: str | None = None,
                  path: str | None = None, cwd: str | None = None) -> str:
    """The command that runs this forge from the user's shell (module contract). The
    arguments stand in for sys.argv[0], sys.executable, $PATH and the working directory."""
    prog = _program(argv0, executable)
    if prog is None:
        return "forge"
    found = shutil.which("forge", path=path)
    if found and Path(found).resolve() == prog.resolve():
        return "forge"
    return _shown(prog, cwd)


def activate_hint(argv0: str | None = None, executable: str | None = None,
                  path: str | None = None, cwd: str | None = None) -> str | None:
    """`source .venv/bin/activate` when that puts this forge on PATH and it is not there."""
    if forge_command(argv0, executable, path, cwd) == "forge":
        return None
    prog = _program(argv0, executable)
    activate = prog.parent / "activate" if prog else None
    if activate is None or not activate.is_file():
        return None
    return f"source {_shown(activate, cwd)}"
