"""`forge_command()`: the command forge's hints print is one the user's shell runs (issue 33:
`make demo` ran `.venv/bin/forge`, the hints said bare `forge`, which was not on PATH)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from infer_forge.harness.forge_command import activate_hint, forge_command


def checkout(tmp_path: Path) -> Path:
    """A checkout with a venv's `bin/` holding a `forge` script and `activate`."""
    bin_ = tmp_path / "checkout" / ".venv" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "forge").write_text("#!/bin/sh\necho forge-ran \"$@\"\n")
    (bin_ / "forge").chmod(0o755)
    (bin_ / "activate").write_text(f'export PATH="{bin_}:$PATH"\n')
    (bin_ / "python").symlink_to(sys.executable)
    return tmp_path / "checkout"


def test_a_forge_off_path_is_named_by_its_path_and_the_activate_step(tmp_path):
    co = checkout(tmp_path)
    prog = str(co / ".venv" / "bin" / "forge")
    kw = {"argv0": prog, "path": "/usr/bin:/bin"}
    # Under the working directory: relative, as the user typed it; elsewhere: absolute.
    assert forge_command(**kw, cwd=str(co)) == ".venv/bin/forge"
    assert forge_command(**kw, cwd=str(tmp_path / "elsewhere")) == prog
    assert activate_hint(**kw, cwd=str(co)) == "source .venv/bin/activate"
    # Both run in a shell whose PATH lacks forge: the hint works as printed.
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    for cwd in (co, tmp_path):
        cmd = forge_command(**kw, cwd=str(cwd))
        r = subprocess.run(["sh", "-c", f"{cmd} --home H check"], capture_output=True,
                           text=True, cwd=cwd, env=env)
        assert r.stdout == "forge-ran --home H check\n", (cmd, r.stderr)
    # After the activate step, the same shell finds it bare.
    r = subprocess.run(["bash", "-c", f"{activate_hint(**kw, cwd=str(co))} && forge x"],
                       capture_output=True, text=True, cwd=co, env=env)
    assert r.stdout == "forge-ran x\n", r.stderr


def test_bare_forge_only_when_path_finds_this_very_program(tmp_path):
    co = checkout(tmp_path)
    bin_ = co / ".venv" / "bin"
    prog = str(bin_ / "forge")
    assert forge_command(argv0=prog, path=str(bin_), cwd=str(co)) == "forge"
    assert activate_hint(argv0=prog, path=str(bin_), cwd=str(co)) is None
    # Another forge first on PATH (another checkout's): not this one, so the path.
    other = checkout(tmp_path / "other") / ".venv" / "bin"
    assert forge_command(argv0=prog, path=f"{other}:{bin_}", cwd=str(co)) == ".venv/bin/forge"


def test_python_dash_m_names_the_script_beside_the_interpreter(tmp_path):
    co = checkout(tmp_path)
    py = str(co / ".venv" / "bin" / "python")
    # `python -m infer_forge.cli`: argv[0] is cli.py; the venv's forge script is the command.
    assert forge_command(argv0="/x/cli.py", executable=py, path="/bin",
                         cwd=str(co)) == ".venv/bin/forge"
    # No forge script anywhere: bare `forge`, the one name left to print.
    assert forge_command(argv0="/x/cli.py", executable=str(tmp_path / "python"),
                         path="/bin", cwd=str(co)) == "forge"
    assert activate_hint(argv0="/x/cli.py", executable=str(tmp_path / "python"),
                         path="/bin", cwd=str(co)) is None


def test_a_path_with_spaces_is_quoted(tmp_path):
    co = checkout(tmp_path / "my checkout")
    prog = str(co / ".venv" / "bin" / "forge")
    cmd = forge_command(argv0=prog, path="/bin", cwd=str(tmp_path / "elsewhere"))
    assert cmd == f"'{prog}'"
    r = subprocess.run(["sh", "-c", f"{cmd} ok"], capture_output=True, text=True,
                       env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert r.stdout == "forge-ran ok\n", r.stderr
