"""The evaluators and the choice of one for a task (the interface: evaluator_protocol.py).

`CommandEvaluator` is the generic path: it runs a configured argv once per repeat with the
candidate as JSON on stdin and in `$FORGE_CANDIDATE`, and reads a JSON object of metrics from
the last non-empty line of stdout; after the repeats, up to the contract's `more_runs` more while
one could decide a gate (more_runs.py). Its stdout/stderr are read and kept as a tool call's
(tool_calls/calls.py: streamed, capped with the size and digest of the whole). The engine
evaluator (engine_evaluator.py) launches the runtime profile's engine and benchmarks it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...ledger.numbers import metric_value
from ...ledger.specs import Contract, RuntimeProfile, SandboxSpec, TaskDefinition
from ...ledger.workspace import Workspace
from ..engines import ENGINES
from ..errors import HarnessError
from ..guard.sandbox import missing_program, prepare
from ..jsonl import last_json_line
from ..proc import last_line
from ..tool_calls.calls import (
    capture_redactor,
    env_digest,
    repo_digest,
    run_captured,
    store_capture,
)
from .engine_evaluator import EngineEvaluator
from .evaluator_protocol import EvalContext, Evaluator, RunResult
from .more_runs import with_more_runs

# Keys of the JSON line that are not metrics.
_RESERVED = {"success", "error", "meta", "outputs"}


def parse_metrics_line(stdout: str) -> tuple[dict[str, float], dict[str, Any]]:
    """Metrics (finite numbers and bools as floats) and the rest from stdout's last JSON line.

    Raises ValueError with a one-line reason when there is no JSON object there."""
    obj = last_json_line(stdout)
    if not isinstance(obj, dict):
        raise ValueError(f"last stdout line is a JSON {type(obj).__name__}, not an object")
    metrics: dict[str, float] = {}
    rest: dict[str, Any] = {}
    omitted: dict[str, str] = {}
    for k, v in obj.items():
        if k in _RESERVED:
            rest[k] = v
        elif isinstance(v, bool) or isinstance(v, int | float):
            # NaN, Infinity (Python's json reads them) and integers too large for a float
            # are not measurements: left out, with the reason in `rest["omitted_metrics"]`.
            f, why = metric_value(v)
            if f is not None:
                metrics[k] = f
            else:
                omitted[k] = str(why)
        elif isinstance(v, dict) and k == "metrics":
            for sk, sv in v.items():
                f, why = metric_value(sv) if isinstance(sv, int | float) else (None, None)
                if f is not None:
                    metrics[sk] = f
                elif why is not None:
                    omitted[sk] = why
    if omitted:
        rest["omitted_metrics"] = omitted
    return metrics, rest


class CommandEvaluator:
    """Runs `argv` once per repeat; see the module contract.

    Environment given to the command: FORGE_CANDIDATE (JSON), FORGE_REPEAT (0-based),
    FORGE_TASK_ID, FORGE_BLOCK_ID, FORGE_BASELINE (JSON, when a baseline is known), and the
    context's own (`EvalContext.env`: the task's worktrees), on top of the Safety Guard's
    allowlist; it runs in the task's sandbox (`sandbox`: the task's `SandboxSpec`), its
    profile in `meta["sandbox"]`."""

    def __init__(self, argv: Sequence[str], *, cwd: str | Path | None = None,
                 timeout_s: float = 600.0, env: dict[str, str] | None = None,
                 sandbox: SandboxSpec | None = None, contract: Contract | None = None):
        if not argv:
            raise HarnessError("evaluator.argv: empty command")
        self.argv = [str(a) for a in argv]
        self.cwd = str(cwd) if cwd is not None else None
        self.timeout_s = timeout_s
        self.env = dict(env or {})
        self.sandbox = sandbox
        self.contract = contract  # its `more_runs`: extra runs while one could decide a gate

    def evaluate(
        self, candidate: dict[str, Any], *, repeats: int, ctx: EvalContext
    ) -> list[RunResult]:
        return with_more_runs(lambda i: self._run_once(candidate, i, ctx), repeats,
                              self.contract, ctx.baseline, ctx.progress)

    def _run_once(self, candidate: dict[str, Any], repeat: int, ctx: EvalContext) -> RunResult:
        payload = json.dumps(candidate, sort_keys=True)
        forge_env = {**self.env, **ctx.env, "FORGE_CANDIDATE": payload,
                     "FORGE_REPEAT": str(repeat), "FORGE_TASK_ID": ctx.task_id,
                     "FORGE_BLOCK_ID": ctx.block_id}
        if ctx.baseline is not None:
            forge_env["FORGE_BASELINE"] = json.dumps(ctx.baseline.to_json(), sort_keys=True,
                                                   default=str)
        cwd = Path(self.cwd or os.getcwd()).resolve()
        launch, env, profile = prepare(ctx.workspace, self.argv, cwd=cwd, task=ctx.task_id,
                                       env=forge_env, spec=self.sandbox)
        t0 = time.monotonic()
        try:
            if profile.kind == "bwrap" and missing_program(self.argv, env, cwd):
                raise FileNotFoundError(self.argv[0])
            # Its output is read as run_tool reads a call's: bounded (tool_calls/calls.py).
            proc = run_captured(launch, input=payload, cwd=cwd, env=env,
                                timeout=self.timeout_s)
        except FileNotFoundError:
            raise HarnessError(f"evaluator.argv: executable not found: {self.argv[0]}") from None
        if proc.timed_out:
            proc.close()
            return RunResult({}, success=False,
                             error=f"evaluator timed out after {self.timeout_s}s",
                             meta={"argv": self.argv, "repeat": repeat,
                                   "sandbox": profile.record()})
        duration = time.monotonic() - t0
        red = capture_redactor(ctx.workspace, env)  # before any of the output is kept
        stdout, stderr = red.text(proc.stdout.text()), red.text(proc.stderr.text())
        ws = ctx.workspace
        secret = tuple(ws.config.secret_env) if ws is not None else ()
        meta: dict[str, Any] = {"argv": self.argv, "repeat": repeat, "exit_code": proc.returncode,
                                "duration_s": round(duration, 6), "cwd": str(cwd),
                                "env_digest": env_digest(env, secret),
                                "sandbox": profile.record()}
        if repeat == 0:  # the tree does not change between repeats of one candidate
            meta["repo_digest"] = repo_digest(cwd)
        store = ws.artifacts if ws is not None else None
        try:
            if store is not None:
                meta["stdout_digest"] = store_capture(store, proc.stdout, red)
                if proc.stderr.size:
                    meta["stderr_digest"] = store_capture(store, proc.stderr, red)
        finally:
            proc.close()
        if proc.returncode != 0:
            tail = last_line(stderr)
            return RunResult({}, success=False,
                             error=f"evaluator exited {proc.returncode}: {tail}".rstrip(": "),
                             meta=meta)
        try:
            metrics, rest = parse_metrics_line(stdout)
        except ValueError as e:
            return RunResult({}, success=False, error=str(e), meta=meta)
        if isinstance(rest.get("meta"), dict):  # forge's own keys win: an evaluator's line
            meta = {**rest["meta"], **meta}   # cannot name another artifact as its output
        if rest.get("omitted_metrics"):
            meta["omitted_metrics"] = rest["omitted_metrics"]
        if "outputs" in rest:
            meta["outputs"] = rest["outputs"]
        ok = bool(rest.get("success", True)) and not rest.get("error")
        return RunResult(metrics, success=ok, error=rest.get("error") or None,
                         artifact_digest=meta.get("stdout_digest"), meta=meta)


# --- choosing an evaluator for a task ---------------------------------------------------


def make_evaluator(ws: Workspace, task: TaskDefinition, profile: RuntimeProfile | None, *,
                   base_dir: str | Path | None = None) -> Evaluator:
    """The evaluator a task's loop uses: `evaluator: {kind: command, argv}` in the task YAML
    gives a CommandEvaluator (argv run in the task file's directory); otherwise the engine
    evaluator, for a runtime profile on any engine (hf, sglang, external)."""
    spec = task.evaluator
    if spec.kind == "command":
        return CommandEvaluator(spec.argv, cwd=base_dir, timeout_s=spec.timeout_s,
                                sandbox=getattr(task, "sandbox", None),
                                contract=getattr(task, "contract", None))
    engine = getattr(profile, "engine", None)
    if engine in ENGINES:
        return EngineEvaluator(ws, task, base_dir=base_dir)
    raise HarnessError(f"no evaluator for engine {engine!r}: give the task "
                       "`evaluator: {kind: command, argv: [...]}`")
