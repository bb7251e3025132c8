"""The options of SGLang's `/start_profile` that `forge perf capture` asks for, checked.

The fields are those of `ProfileReq` in SGLang 0.5.23 (`sglang/srt/managers/io_struct.py`);
which release reads which field is the generated table that `harness/engines/sglang_profile_req`
checks against the server's own version when the request is sent (a field the release does
not read is refused there, never dropped). Only fields set away from SGLang's defaults are
sent, so an older release is asked only for what it reads.

What the scheduler does with them (`sglang/srt/managers/scheduler_components/
profiler_manager.py`, `sglang/srt/utils/profile_utils.py` under `SGLANG_PROFILE_V2`):
- `num_steps`: the profiler stops by itself after that many forward steps (the caller does not
  call /stop_profile); `start_step`: it starts at that forward step instead of at once.
- `profile_by_stage`: prefill and decode are captured apart, `num_steps` steps each, one
  file per stage and rank (`-EXTEND` / `-DECODE` suffixes; `-prefill` / `-decode` under
  V2). It needs `num_steps` (the stage counters start from it). `profile_stages` picks the
  stages (`prefill`, `decode`); only the V2 profiler reads it, and V2 needs
  `profile_by_stage`.
- `activities`: CPU and GPU are the torch profiler's; MEM records the CUDA allocator's
  history (a `-memory.pickle` per rank); CUDA_PROFILER calls cudaProfilerStart/Stop on the
  first GPU (opens an Nsight Systems `--capture-range=cudaProfilerApi` range); RPD is ROCm's.
- `with_stack`, `record_shapes` (the tokenizer manager turns them on unless set false, or the
  env `SGLANG_PROFILE_WITH_STACK` / `SGLANG_PROFILE_RECORD_SHAPES` is false),
  `merge_profiles` (rank 0 also writes `merged-<id>.trace.json.gz`), `profile_prefix` (file
  name prefix), `detailed_annotations` (step spans carry per-step aggregates).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import HarnessError

ACTIVITIES = ("CPU", "GPU", "MEM", "CUDA_PROFILER", "RPD")
TORCH_ACTIVITIES = frozenset({"CPU", "GPU", "RPD"})  # those that write a chrome trace
STAGES = ("prefill", "decode")
PREFIX = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
BOOL_FIELDS = ("profile_by_stage", "with_stack", "record_shapes", "merge_profiles",
               "detailed_annotations")
INT_FIELDS = ("num_steps", "start_step")
TRI_STATE = frozenset({"with_stack", "record_shapes"})
KEYS = (*INT_FIELDS, *BOOL_FIELDS, "profile_prefix", "profile_stages")


@dataclass(frozen=True)
class ProfileOptions:
    """A `/start_profile` request less its `output_dir`. None, () and False are SGLang's
    defaults and are not sent, but for with_stack/record_shapes, whose False is a choice
    (None leaves them on)."""

    activities: tuple[str, ...] = ("CPU", "GPU")
    num_steps: int | None = None
    start_step: int | None = None
    profile_by_stage: bool = False
    with_stack: bool | None = None
    record_shapes: bool | None = None
    merge_profiles: bool = False
    profile_prefix: str | None = None
    profile_stages: tuple[str, ...] = ()
    detailed_annotations: bool = False

    def __post_init__(self) -> None:
        bad = [a for a in self.activities if a not in ACTIVITIES]
        if bad or not self.activities:
            raise HarnessError(f"activities {', '.join(bad) or '(none)'}: expected some of "
                               f"{', '.join(ACTIVITIES)}")
        if not TORCH_ACTIVITIES & set(self.activities):
            raise HarnessError(f"activities {','.join(self.activities)} write no trace: add "
                               "CPU or GPU (CUDA_PROFILER only opens an Nsight range, MEM only "
                               "records allocations)")
        for name in INT_FIELDS:
            v = getattr(self, name)
            low = 1 if name == "num_steps" else 0
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < low):
                raise HarnessError(f"{name} {v!r}: expected an integer >= {low}")
        if self.profile_by_stage and self.num_steps is None:
            raise HarnessError("profile_by_stage needs num_steps (SGLang counts each stage's "
                               "steps from it)")
        bad = [s for s in self.profile_stages if s not in STAGES]
        if bad:
            raise HarnessError(f"profile_stages {', '.join(bad)}: expected some of "
                               f"{', '.join(STAGES)}")
        if self.profile_stages and not self.profile_by_stage:
            raise HarnessError("profile_stages needs profile_by_stage")
        if self.profile_prefix is not None and not PREFIX.match(self.profile_prefix):
            raise HarnessError(f"profile_prefix {self.profile_prefix!r}: expected 1-64 of "
                               "A-Z a-z 0-9 . _ - (it starts each trace's file name)")

    @property
    def self_stopping(self) -> bool:
        """SGLang stops the profiler by itself (after num_steps)."""
        return self.num_steps is not None

    def stages(self) -> tuple[str, ...]:
        """The stage files a by-stage capture writes per rank (empty: not by stage)."""
        if not self.profile_by_stage:
            return ()
        return self.profile_stages or STAGES

    def body(self) -> dict[str, Any]:
        """The fields to send: activities, and each field set away from its default."""
        out: dict[str, Any] = {"activities": list(self.activities)}
        for name in (*INT_FIELDS, *BOOL_FIELDS, "profile_prefix"):
            v = getattr(self, name)
            # with_stack/record_shapes: None is SGLang's default (on), False is asked for
            if v is not None and (v is not False or name in TRI_STATE):
                out[name] = v
        if self.profile_stages:
            out["profile_stages"] = list(self.profile_stages)
        return out


def parse_options(text: str | None, activities: str | None = None) -> ProfileOptions:
    """`num_steps=5,profile_by_stage=true,profile_stages=prefill+decode,with_stack=false`
    (any subset; `+` separates list items) and `--activities CPU,GPU` -> ProfileOptions; a
    bad key or value is a one-line HarnessError naming it."""
    values: dict[str, Any] = {}
    if activities is not None:
        values["activities"] = tuple(a.strip().upper() for a in activities.split(",")
                                     if a.strip())
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, eq, raw = part.partition("=")
        key, raw = key.strip().replace("-", "_"), raw.strip()
        if not eq or key not in KEYS:
            raise HarnessError(f"--profile {part.strip()!r}: expected KEY=VALUE with KEY one "
                               f"of {', '.join(KEYS)}")
        if key in INT_FIELDS:
            try:
                values[key] = int(raw)
            except ValueError:
                raise HarnessError(f"--profile {key}={raw!r}: expected an integer") from None
        elif key in BOOL_FIELDS:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise HarnessError(f"--profile {key}={raw!r}: expected true or false")
            values[key] = raw.lower() in ("true", "1")
        elif key == "profile_stages":
            values[key] = tuple(s.strip() for s in raw.split("+") if s.strip())
        else:
            values[key] = raw
    return ProfileOptions(**values)

