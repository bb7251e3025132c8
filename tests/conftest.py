"""Shared fixtures. FORGE_HOME always points into the test's tmp_path (autouse)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
REPO = Path(__file__).resolve().parent.parent
FORGE = [sys.executable, "-m", "infer_forge.cli"]


def need(condition: bool, reason: str) -> None:
    """Skip locally when a real part is missing; under CI=true that is a failure."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def which(name: str) -> str | None:
    return shutil.which(name)


@pytest.fixture(autouse=True)
def forge_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "forge-home"
    monkeypatch.setenv("FORGE_HOME", str(home))
    return home


@pytest.fixture
def workspace(forge_home):
    from infer_forge.ledger.workspace import init_workspace

    ws, _ = init_workspace(forge_home)
    yield ws
    ws.close()


def run_forge(*args: str, home: Path | None = None, input: str | None = None,
              env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess."""
    e = dict(os.environ)
    if home is not None:
        e["FORGE_HOME"] = str(home)
    if env:
        e.update(env)
    return subprocess.run([*FORGE, *args], capture_output=True, text=True, input=input,
                          env=e, timeout=timeout, cwd=str(REPO))
