"""Dummy weights: a runtime profile that skips loading real weights, for perf-only sweeps.

Contract (pure):
- `weights_of(profile)` is "dummy" when the profile says `weights: dummy` or its config sets
  SGLang's `load_format: dummy` directly; else "real". The sglang engine turns `weights:
  dummy` into `--load-format dummy` (`engines.base.engine_config_of`); other engines are
  refused when the profile loads (`specs.RuntimeProfile`).
- `dummy_refusal(contract, profile, where)`: a one-line reason when the contract has a gate
  that needs the engine's real outputs (an accuracy gate, or any gate on `token_match`) and
  the profile loads dummy weights, naming the gate and `where` (the profile's file); None
  otherwise. Used when a task is defined (`loop/define.py`) and again by the engine
  evaluator before it deploys anything.
"""

from __future__ import annotations

from ...ledger.specs import Contract, RuntimeProfile

REAL_OUTPUT_METRICS = ("token_match",)


def weights_of(profile: RuntimeProfile) -> str:
    if profile.weights == "dummy" or profile.config.get("load_format") == "dummy":
        return "dummy"
    return "real"


def gates_needing_real_weights(contract: Contract) -> list[str]:
    """Names of the gates judged on the engine's real outputs, with what they judge."""
    out = []
    for g in contract.gates:
        if g.kind == "accuracy":
            out.append(f"{g.name} (accuracy, lm_eval {g.task})")
        elif g.metric in REAL_OUTPUT_METRICS:
            out.append(f"{g.name} ({g.metric})")
    return out


def dummy_refusal(contract: Contract | None, profile: RuntimeProfile, where: str) -> str | None:
    if contract is None or weights_of(profile) != "dummy":
        return None
    gates = gates_needing_real_weights(contract)
    if not gates:
        return None
    how = "weights: dummy" if profile.weights == "dummy" else "config.load_format: dummy"
    drop = "say contract.correctness: none (the gate is the task type's default)" \
        if contract.correctness == "default" else "drop the gate"
    return (f"gate {', '.join(gates)} needs the model's real outputs, but runtime profile "
            f"{where} loads dummy weights ({how}): use a profile with real weights for this "
            f"task, or {drop}")
