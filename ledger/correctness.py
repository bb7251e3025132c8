"""Correctness defaults: which correctness gate a task type gets when its contract asks for
the default (`contract.correctness: default`).

Contracts:
- `CORRECTNESS_DEFAULTS` is the one table: task type -> `CorrectnessDefault` (the kind,
  `accuracy` or `token_match`, the gate as a contract writes it, and why). Types whose
  changes alter numerics (kernels, quantisation, MoE and attention backends, speculative
  decoding, collectives whose reduction order changes) default to an accuracy gate:
  non-inferiority on a real suite, paired by item (harness/bench/accuracy.py), because
  greedy token match rejects a change whose tokens drift while its answers stay right.
  Types whose changes must leave outputs identical (scheduling, routing, deployment flags,
  engine integration, an upstream sync) keep greedy token match >= 0.99. Types that change
  no serving outputs (evaluation, diagnosis, profiling) have none.
- `default_correctness(task_type)` is the one pure function that decides; a type not in the
  table is a ValueError naming it.
- `is_correctness_gate(gate)`: an accuracy gate (`task`) or a gate on `token_match`. An
  explicit one in the contract wins: the default is added only when the contract has none
  (`with_default_correctness`, applied to a task's data before it is validated, so the
  stored definition holds the gate it is judged by and its hash covers it). A new
  definition of a numerics-changing type judged by the engine evaluator gets its accuracy
  gate without asking (`correctness: default` is written into it): greedy token match, the
  gate such tasks were written with before, would reject most real wins. `correctness: none`
  opts out. Output-identical types get token match when asked (`default`) or written, as
  before: a task measured by hand or by `forge bench import` has no greedy outputs to match.
  A definition read back from the ledger is never changed (a task defined before the
  default keeps its gates and hash), nor is one judged by a command evaluator.
- `correctness_of(definition)` says, for `forge task show`, which correctness gates a stored
  definition has and where they came from (`explicit`, `default`, `none`), with the type's
  default beside it.
- `SUITES`: the named accuracy suites with a known cost (`forge eval suites`, `forge eval
  accuracy --suite`): the lm_eval task or group, the items per leaf task (`limit`; None: the
  whole test split), how many leaf tasks, the test split's size, the endpoint (chat: the
  point's chat template) and the few-shot as lm_eval defines it. The default accuracy gate
  is the `gsm8k-quick` suite.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

DEFAULT_GATE_NAME = "correctness"
TOKEN_MATCH_MIN = 0.99
# The quick accuracy suite: GSM8K as lm_eval defines it (5-shot from its train split, the
# strict `#### N` answer), the first QUICK_LIMIT test items, through the point's chat
# template (the server applies it on /v1/chat/completions). Paired by item, a candidate that
# flips up to 3 % of the answers each way passes a 0.03 margin at 300 items; one that flips
# 5 % needs 1200 to decide (docs/accuracy.md).
QUICK_TASK = "gsm8k"
QUICK_LIMIT = 300
QUICK_MARGIN = 0.03

Kind = Literal["accuracy", "token_match"]


@dataclass(frozen=True)
class Suite:
    name: str
    task: str  # an lm_eval task or group
    limit: int | None  # items per leaf task; None: the whole test split
    leaves: int  # lm_eval tasks it runs (a group's subjects)
    test_items: int  # the test split's items, all leaves together
    endpoint: Literal["completions", "chat"]
    few_shot: str

    @property
    def items(self) -> int:
        """Items evaluated per side (the requests one side sends)."""
        return self.test_items if self.limit is None else min(self.test_items,
                                                              self.limit * self.leaves)


_GSM8K_SHOTS = "5-shot from train (lm_eval's gsm8k), as multi-turn chat"
_MMLU_SHOTS = "0-shot (lm_eval's mmlu_generative), the answer letter"
SUITES: Mapping[str, Suite] = {s.name: s for s in (
    Suite("gsm8k-quick", "gsm8k", QUICK_LIMIT, 1, 1319, "chat", _GSM8K_SHOTS),
    Suite("gsm8k", "gsm8k", None, 1, 1319, "chat", _GSM8K_SHOTS),
    Suite("mmlu-quick", "mmlu_generative", 5, 57, 14042, "chat", _MMLU_SHOTS),
    Suite("mmlu", "mmlu_generative", None, 57, 14042, "chat", _MMLU_SHOTS),
)}


def suite(name: str) -> Suite:
    """The named suite; ValueError naming the known ones."""
    if name not in SUITES:
        raise ValueError(f"suite {name!r}: not one of {', '.join(SUITES)}")
    return SUITES[name]


@dataclass(frozen=True)
class CorrectnessDefault:
    kind: Kind
    why: str
    gate: Mapping[str, Any] = field(default_factory=dict)


def _accuracy(why: str) -> CorrectnessDefault:
    return CorrectnessDefault("accuracy", why, {
        "name": DEFAULT_GATE_NAME, "task": QUICK_TASK, "margin": QUICK_MARGIN,
        "limit": QUICK_LIMIT, "endpoint": "chat"})


def _token_match(why: str) -> CorrectnessDefault:
    return CorrectnessDefault("token_match", why, {
        "name": DEFAULT_GATE_NAME, "metric": "token_match", "at_least": TOKEN_MATCH_MIN})


CORRECTNESS_DEFAULTS: Mapping[str, CorrectnessDefault | None] = {
    "kernel": _accuracy("a new kernel changes floating-point order: tokens drift, answers "
                        "should not"),
    "quantization": _accuracy("lower precision changes the numbers by design"),
    "moe-backend": _accuracy("another MoE runner or GEMM changes accumulation order"),
    "attention-backend": _accuracy("another attention kernel changes accumulation order"),
    "speculative-decoding": _accuracy("batched verification changes the numerics of the "
                                      "accepted tokens"),
    "communication": _accuracy("another all-reduce changes the reduction order"),
    "scheduler": _token_match("scheduling must not change what a request generates"),
    "routing": _token_match("routing must not change what a request generates"),
    "deployment-tuning": _token_match("deployment flags are chosen to keep outputs identical"),
    "engine-integration": _token_match("an integration is expected to keep outputs identical "
                                       "(declare a numeric type otherwise)"),
    "upstream-sync": _token_match("a sync must not change outputs unnoticed"),
    "evaluation": None,
    "diagnosis": None,
    "profiling": None,
}


def default_correctness(task_type: str) -> CorrectnessDefault | None:
    """The default correctness gate of `task_type` (None: the type changes no outputs)."""
    if task_type not in CORRECTNESS_DEFAULTS:
        raise ValueError(f"task type {task_type!r} has no entry in the correctness table "
                         f"({', '.join(CORRECTNESS_DEFAULTS)})")
    return CORRECTNESS_DEFAULTS[task_type]


def is_correctness_gate(gate: Mapping[str, Any]) -> bool:
    """An accuracy gate (it names a `task`, or `kind: accuracy`) or a gate on token_match."""
    return gate.get("task") is not None or gate.get("kind") == "accuracy" \
        or gate.get("metric") == "token_match"


def with_default_correctness(data: Any, *, new: bool = False) -> Any:
    """A task's data with its type's default correctness gate appended when its contract
    has no correctness gate of its own and either says `correctness: default`, or (a `new`
    definition, not one read back from the ledger, of a type whose default is an accuracy
    gate) says nothing and is judged by the engine evaluator: then `correctness: default` is
    written in too, so the stored definition says where its gate came from. `correctness:
    none` opts out. Else unchanged. ValueError when `default` is asked of a type without one
    or the gate name is taken by another gate."""
    if not isinstance(data, Mapping):
        return data
    contract = data.get("contract")
    if not isinstance(contract, Mapping):
        return data
    asked = contract.get("correctness")
    task_type = data.get("type")
    gates = contract.get("gates") or []
    if not isinstance(gates, list):
        return data  # the contract's own validation names the problem
    if asked not in (None, "default") or \
            any(isinstance(g, Mapping) and is_correctness_gate(g) for g in gates):
        return data  # opted out, or an explicit correctness gate wins (the data unchanged)
    if asked is None:
        unasked = CORRECTNESS_DEFAULTS.get(task_type) if isinstance(task_type, str) else None
        if not (new and _engine_judged(data) and unasked is not None
                and unasked.kind == "accuracy"):
            return data
        contract = {**contract, "correctness": "default"}
        data = {**data, "contract": contract}
    if not isinstance(task_type, str) or task_type not in CORRECTNESS_DEFAULTS:
        return data  # the type's own validation names the problem
    default = CORRECTNESS_DEFAULTS[task_type]
    if default is None:
        raise ValueError(f"contract.correctness: default: task type {task_type} changes no "
                         "serving outputs and has no default correctness gate")
    if any(isinstance(g, Mapping) and g.get("name") == DEFAULT_GATE_NAME for g in gates):
        raise ValueError(f"contract.correctness: default: gate name {DEFAULT_GATE_NAME!r} is "
                         "taken by a gate that checks no correctness; rename it")
    return {**data, "contract": {**contract, "gates": [*gates, dict(default.gate)]}}


def _engine_judged(data: Mapping[str, Any]) -> bool:
    """The engine evaluator judges the task (the default): the gates' runs are the engine's,
    whose outputs an accuracy suite or token match can be taken from. A command evaluator's
    metrics are its own; nothing is added to them."""
    evaluator = data.get("evaluator")
    kind = evaluator.get("kind", "engine") if isinstance(evaluator, Mapping) else "engine"
    return kind == "engine"


def describe(default: CorrectnessDefault | None) -> str:
    """One line: `accuracy gsm8k (300 items, margin 0.03, chat)` / `token_match >= 0.99` /
    `none`."""
    if default is None:
        return "none"
    g = default.gate
    if default.kind == "accuracy":
        return (f"accuracy {g['task']} ({g['limit']} items, margin {g['margin']}, "
                f"{g['endpoint']})")
    return f"token_match >= {g['at_least']}"


def correctness_of(definition: Mapping[str, Any] | None) -> dict[str, Any]:
    """Which correctness gates a stored task definition has and where they came from:
    `{gates: [names], source: explicit|default|none, type, default: describe(...)}`."""
    definition = definition or {}
    task_type = str(definition.get("type"))
    contract = definition.get("contract") or {}
    gates = [g for g in contract.get("gates") or [] if isinstance(g, Mapping)
             and is_correctness_gate(g)]
    default = CORRECTNESS_DEFAULTS.get(task_type)
    source = "opted out" if contract.get("correctness") == "none" else "none"
    if gates:
        source = "explicit"
        if contract.get("correctness") == "default" and default is not None \
                and dict(default.gate) in [{k: v for k, v in g.items() if v is not None}
                                           for g in gates]:
            source = "default"
    return {"type": task_type, "gates": [str(g.get("name")) for g in gates],
            "source": source, "default": describe(default)}
