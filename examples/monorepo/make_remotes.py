"""Make the local manifest's remotes: a bare git repository per folder of ./seeds.

Usage: python make_remotes.py [DIR]   (DIR defaults to this folder; remotes go to DIR/remotes)
Existing remotes are left as they are. Uses the git CLI only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV = {**os.environ, "GIT_AUTHOR_NAME": "seed", "GIT_AUTHOR_EMAIL": "seed@localhost",
       "GIT_COMMITTER_NAME": "seed", "GIT_COMMITTER_EMAIL": "seed@localhost",
       # fixed dates: the same seeds make the same commits everywhere
       "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}


def git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", "-c", "init.defaultBranch=main", *args], cwd=cwd, env=ENV,
                   check=True, capture_output=True)


def main(target: Path) -> None:
    for seed in sorted((HERE / "seeds").iterdir()):
        bare = target / "remotes" / f"{seed.name}.git"
        if bare.exists():
            continue
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp) / seed.name
            shutil.copytree(seed, work, ignore=shutil.ignore_patterns("__pycache__", "build"))
            git("init", "-q", cwd=work)
            git("add", "-A", cwd=work)
            git("commit", "-q", "-m", f"{seed.name}: initial", cwd=work)
            bare.parent.mkdir(parents=True, exist_ok=True)
            git("clone", "-q", "--bare", str(work), str(bare), cwd=Path(tmp))
        print(f"made {bare}")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else HERE)
