"""SGLang's own released code for the tests (the conformance kit's one door).

`release(version)` is the unpacked wheel of that release (fetched from the package registry
on first use into `.cache/sglang/` of this checkout, which git ignores; `.ci/run` fetches
KIT_VERSIONS before the suite). Where it cannot be fetched the test skips with the reason,
and under CI=true fails. `run(version, script, *args)` runs a script with that release
importable (harness/engines/sglang_release.py).

`python tests/helpers/real_sglang.py fetch` fetches every release in KIT_VERSIONS.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("FORGE_SGLANG_CACHE") or REPO / ".cache" / "sglang")

# The releases the kit checks against: the boundaries of the flag table and the endpoints
# (0.5.6: /server_info arrives; 0.5.13: --encoder-bootstrap-port; 0.5.21: the last before
# --attn-dp-size), the oldest 0.4 and 0.5 finals, and the latest.
LATEST = "0.5.23"
KIT_VERSIONS = ("0.4.0", "0.5.1", "0.5.6", "0.5.13", "0.5.21", "0.5.22", LATEST)


def release(version: str) -> Path:
    """The unpacked release (skips locally / fails under CI=true when it cannot be had)."""
    from infer_forge.harness.engines import sglang_release
    from infer_forge.harness.errors import HarnessError

    from ..conftest import need

    try:
        return sglang_release.unpacked(version, CACHE)
    except HarnessError as e:
        need(False, f"real SGLang {version} is not available here: {e}")
        raise  # need() skipped or failed; unreachable


def run(version: str, script: str | Path, *args: str, timeout: float = 300) -> str:
    """`script`'s standard output, run with SGLang `version` importable."""
    from infer_forge.harness.engines import sglang_release

    release(version)
    return sglang_release.run(version, script, *args, cache=CACHE, timeout=timeout)


if __name__ == "__main__":
    if sys.argv[1:] != ["fetch"]:
        sys.exit("usage: python tests/helpers/real_sglang.py fetch")
    from infer_forge.harness.engines import sglang_release

    os.environ["FORGE_SGLANG_CACHE"] = str(CACHE)
    sys.exit(sglang_release.main(["fetch", *KIT_VERSIONS]))
