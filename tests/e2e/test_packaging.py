"""The installed package holds every subpackage: pyproject's explicit `packages` list must name
each directory with an `__init__.py`, or a non-editable install breaks on import."""

from __future__ import annotations

import tomllib

from tests.conftest import REPO

NOT_PACKAGED = {".venv", ".git", "tests", "bench", "examples", "notebooks", "build", "dist"}


def _config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_subpackage_is_listed_in_pyproject():
    on_disk = {"infer_forge"}
    for init in REPO.rglob("__init__.py"):
        rel = init.parent.relative_to(REPO)
        if not rel.parts or rel.parts[0] in NOT_PACKAGED or rel.parts[0].startswith("."):
            continue
        if any(p.endswith(".egg-info") or p == "__pycache__" for p in rel.parts):
            continue
        on_disk.add(".".join(("infer_forge", *rel.parts)))
    packages = _config()["packages"]
    listed = set(packages)
    assert len(listed) == len(packages), "a package is listed twice"
    assert on_disk - listed == set(), "subpackages missing from pyproject's packages"
    assert listed - on_disk == set(), "pyproject lists packages that do not exist"


def test_package_data_globs_match_files():
    cfg = _config()
    for pkg, globs in cfg["package-data"].items():
        base = REPO.joinpath(*pkg.split(".")[1:])
        for g in globs:
            assert list(base.glob(g)), f"{pkg}: package-data {g!r} matches no file"
