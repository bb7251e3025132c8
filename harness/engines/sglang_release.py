"""A released SGLang, fetched from the package registry and unpacked, for reading on a CPU.

`unpacked(version)` downloads the wheel (`pip download --no-deps sglang==VERSION`, ~39 MB)
into the cache and unpacks its `sglang/` tree once (~130 MB), under a file lock so parallel
callers share one copy; `run(version, script, *args)` runs a Python file with that tree
importable (sglang_import.py: stubs for the GPU packages, in its own process) and returns
its standard output. The cache is `$FORGE_SGLANG_CACHE`, else `~/.cache/infer-forge/sglang`.

Nothing here serves: this is how the harness checks what it says to SGLang (argv, routes,
metric names, log lines, bench output) against SGLang's own code. Failures are one-line
`HarnessError`s naming the version and what failed (no network, no such release).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from ..errors import HarnessError

VERSION_RE = re.compile(r"^\d+\.\d+\.\d+(\.post\d+|rc\d+)?$")


def version_key(version: str | Sequence[int]) -> tuple[int, int, int]:
    """(major, minor, patch) of a release name ("0.5.23", "0.5.6.post2", "v0.5.0rc1") or of a
    tuple of ints (padded with zeros). The one version parser of the SGLang modules."""
    if not isinstance(version, str):
        a, b, c = (tuple(int(x) for x in version) + (0, 0, 0))[:3]
        return a, b, c
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    if not m:
        raise HarnessError(f"sglang version {version!r}: expected MAJOR.MINOR[.PATCH]")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def cache_dir() -> Path:
    env = os.environ.get("FORGE_SGLANG_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "infer-forge" / "sglang"


def _check(version: str) -> str:
    if not VERSION_RE.match(version):
        raise HarnessError(f"sglang release {version!r}: expected a release like 0.5.23")
    return version


def wheel(version: str, cache: Path | None = None) -> Path:
    """The release's wheel file, downloaded into `cache/wheels` if missing."""
    _check(version)
    wheels = (cache or cache_dir()) / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    with tempfile.TemporaryDirectory(dir=wheels, prefix=".download-") as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                            "--disable-pip-version-check", "-d", tmp, f"sglang=={version}"],
                           capture_output=True, text=True, timeout=900)
        got = sorted(Path(tmp).glob(f"sglang-{version}-*.whl"))
        if r.returncode != 0 or not got:
            last = " ".join((r.stderr or r.stdout).split())[-200:]
            raise HarnessError(f"sglang {version}: pip download failed: {last}")
        target = wheels / got[0].name
        os.replace(got[0], target)  # whole, or not there
    return target


def unpacked(version: str, cache: Path | None = None) -> Path:
    """A directory holding the release's `sglang/` package (fetched and unpacked once)."""
    _check(version)
    root = (cache or cache_dir()) / "unpacked"
    root.mkdir(parents=True, exist_ok=True)
    target = root / version
    if (target / "sglang").is_dir():
        return target
    with open(root / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetcher per version; the rest wait, then reuse
        if (target / "sglang").is_dir():
            return target
        whl = wheel(version, cache)
        tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{version}-"))
        try:
            with zipfile.ZipFile(whl) as z:
                z.extractall(tmp, [n for n in z.namelist() if n.startswith("sglang/")])
            os.replace(tmp, target)
        except (OSError, zipfile.BadZipFile) as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise HarnessError(f"sglang {version}: cannot unpack {whl.name}: {e}") from None
    return target


def run(version: str, script: str | Path, *args: str, cache: Path | None = None,
        timeout: float = 300) -> str:
    """Run `script` with SGLang `version` importable; its standard output. A non-zero exit
    is a HarnessError carrying the end of its standard error."""
    root = unpacked(version, cache)
    cmd = [sys.executable, "-m", "infer_forge.harness.engines.sglang_import", str(root),
           str(script), *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"sglang {version}: {Path(script).name} ran past {timeout:.0f} s"
                           ) from None
    if r.returncode != 0:
        tail = " | ".join(r.stderr.strip().splitlines()[-3:])[-400:]
        raise HarnessError(f"sglang {version}: {Path(script).name} exited {r.returncode}: {tail}")
    return r.stdout


def main(argv: list[str]) -> int:
    """`python -m infer_forge.harness.engines.sglang_release fetch VERSION ...`"""
    if len(argv) < 2 or argv[0] != "fetch":
        print("usage: python -m infer_forge.harness.engines.sglang_release fetch VERSION ...",
              file=sys.stderr)
        return 2
    for version in argv[1:]:
        try:
            print(unpacked(version))
        except HarnessError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
