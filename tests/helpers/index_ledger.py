"""A hand-built ledger for the index, query, wiki and notebook tests.

Real events appended through `Ledger.save`; every number is written here so tests can check
compare/filter answers by hand. Four tasks on four deployment points:

| task              | type              | model          | accelerator | engine | profile       |
|-------------------|-------------------|----------------|-------------|--------|---------------|
| tune-qwen-h200    | deployment-tuning | Qwen3-30B-A3B  | H200        | sglang | qwen-h200@1   |
| qwen-h200-rev2    | deployment-tuning | Qwen3-30B-A3B  | H200        | sglang | qwen-h200@2   |
| deepgemm-moe-h20  | kernel            | Qwen3-30B-A3B  | H20         | sglang | qwen-h20@1    |
| tune-tiny-cpu     | deployment-tuning | tiny-llama     | x86_64      | hf     | tiny-cpu@1    |
"""

from __future__ import annotations

from typing import Any

from infer_forge.ledger import events as E
from infer_forge.ledger.clock import digest
from infer_forge.ledger.payloads import Digest, GateResult
from infer_forge.ledger.specs import RuntimeProfile, canonical
from infer_forge.ledger.store import Append
from infer_forge.ledger.streams import task_stream

QWEN = {"name": "Qwen3-30B-A3B", "source": "Qwen/Qwen3-30B-A3B", "revision": "main"}
TINY = {"name": "tiny-llama", "source": "forge:tiny-llama", "revision": "1"}


def _point(model, service, rev, acc, tp=1, ep=1, conc=32, arch="colocated") -> dict:
    return {
        "model": model,
        "scenario": {"modality": "text",
                     "traffic": {"input_len": 1024, "output_len": 256, "concurrency": conc},
                     "slo": {"ttft_ms": {"p99": 2000}}},
        "topology": {"architecture": arch,
                     "parallelism": {"tp": tp, "pp": 1, "dp": 1, "ep": ep}},
        "runtime_profile": {"service": service, "rev": rev},
        "accelerator": {"vendor": "nvidia" if acc != "x86_64" else "cpu", "model": acc,
                        "count": tp},
    }


TINY_POINT = _point(TINY, "tiny-cpu", 1, "x86_64", conc=8)
POINTS = {
    "qwen-h200": _point(QWEN, "qwen-h200", 1, "H200"),
    "qwen-h200-r2": _point(QWEN, "qwen-h200", 2, "H200"),
    "qwen-h20": _point(QWEN, "qwen-h20", 1, "H20", tp=8, ep=8, arch="pd"),
    "tiny-cpu": TINY_POINT,
}


def _profile(service: str, rev: int, engine: str, config: dict) -> dict:
    """A runtime profile in its stored shape (`specs.canonical`)."""
    return canonical(RuntimeProfile(service=service, rev=rev, engine=engine, config=config))


PROFILES = [
    ("qwen-h200", 1, _profile("qwen-h200", 1, "sglang", {"chunked_prefill_size": 8192})),
    ("qwen-h200", 2, _profile("qwen-h200", 2, "sglang", {"chunked_prefill_size": 16384})),
    ("qwen-h20", 1, _profile("qwen-h20", 1, "sglang", {"moe_runner_backend": "auto"})),
    ("tiny-cpu", 1, _profile("tiny-cpu", 1, "hf", {"continuous_batching": False})),
]

# task -> (type, point name or inline, goal, blocks)
# block: (candidate, [(output_throughput, median_ttft_ms, token_match) per repeat], verdict)
TASKS: dict[str, dict[str, Any]] = {
    "tune-qwen-h200": {
        "type": "deployment-tuning", "point": "qwen-h200",
        "goal": "Raise Qwen output throughput at concurrency 32 on H200 within the TTFT SLO",
        "blocks": [
            ({}, [(2000.0, 400.0, 1.0), (2010.0, 410.0, 1.0), (1990.0, 390.0, 1.0)], None),
            ({"engine.chunked_prefill_size": 16384},
             [(2200.0, 420.0, 1.0), (2210.0, 430.0, 1.0), (2190.0, 410.0, 1.0)], "pass"),
        ],
        "decision": ("accepted", "chunked prefill 16384 raised throughput 10% within SLO"),
        "exit": ("delivered", "all gates pass"),
    },
    "qwen-h200-rev2": {
        "type": "deployment-tuning", "point": "qwen-h200-r2",
        "goal": "Confirm the revised H200 runtime profile keeps its throughput gain",
        "blocks": [
            ({}, [(2205.0, 425.0, 1.0), (2195.0, 415.0, 1.0), (2200.0, 420.0, 1.0)], "pass"),
        ],
        "decision": None,
        "exit": ("delivered", "profile rev 2 confirmed"),
    },
    "deepgemm-moe-h20": {
        "type": "kernel", "point": "qwen-h20",
        "goal": "Try the DeepGEMM MoE runner on H20 for decode throughput",
        "blocks": [
            ({}, [(900.0, 800.0, 1.0), (910.0, 790.0, 1.0), (890.0, 810.0, 1.0)], None),
            ({"engine.moe_runner_backend": "deep_gemm"},
             [(1100.0, 700.0, 0.61), (1090.0, 710.0, 0.60), (1110.0, 690.0, 0.62)], "fail"),
        ],
        "decision": ("rejected",
                     "DeepGEMM MoE path broke the outputs on H20: token match 0.61 < 0.99"),
        "exit": ("failed-no-progress", "the only faster direction failed correctness"),
        "handoff": "investigate FP8 scaling in the DeepGEMM grouped GEMM on H20",
    },
    "tune-tiny-cpu": {
        "type": "deployment-tuning", "point": "tiny-cpu",
        "goal": "Raise tiny-llama output throughput on CPU without breaking TTFT",
        "blocks": [
            ({}, [(460.0, 900.0, 1.0), (455.0, 910.0, 1.0), (465.0, 890.0, 1.0)], None),
            ({"engine.continuous_batching": True},
             [(170.0, 47.0, 1.0), (175.0, 45.0, 1.0), (165.0, 49.0, 1.0)], "fail"),
        ],
        "decision": ("rejected", "continuous batching cut TTFT but lost 63% of throughput"),
        "exit": ("follow-up-handoff", "no candidate passed the throughput gate"),
        "handoff": "try bfloat16 with continuous batching off",
    },
}

METRICS = ("output_throughput", "median_ttft_ms", "token_match")


def build(ws) -> dict[str, Any]:
    """Append the whole history. Returns ids the tests need (decision event ids, …)."""
    led = ws.ledger
    tool = E.Actor.tool("forge-test")
    hashes: dict[str, str] = {}
    pins = []
    for name, p in POINTS.items():
        hashes[name] = digest(p)
        pins.append(E.DeploymentPointPinned(name=name, point_hash=hashes[name], point=p,
                                            actor=tool))
    for service, rev, prof in PROFILES:
        pins.append(E.RuntimeProfileRevised(service=service, rev=rev, profile=prof,
                                            profile_hash=digest(prof), actor=tool))
    led.append("workspace", pins, command_id="test-pins")
    out: dict[str, Any] = {"points": hashes, "decisions": {}, "tasks": list(TASKS)}
    for tid, t in TASKS.items():
        stream = task_stream(tid)
        point = t["point"]
        ph = hashes[point]
        definition = {"type": t["type"], "goal": t["goal"], "point": point,
                      "contract": {"gates": [
                          {"name": "throughput", "metric": "output_throughput",
                           "vs_baseline": "ratio", "at_least": 1.05},
                          {"name": "correctness", "metric": "token_match", "at_least": 0.99}]}}
        common = {"task_id": tid, "actor": tool, "input_digests": {"point": ph}}
        led.append(stream, [E.TaskDefined(title=tid, task_type=t["type"], goal=t["goal"],
                                          definition=definition,
                                          definition_hash=digest(definition),
                                          point_hash=ph, **common)],
                   command_id=f"{tid}:define")
        base = None
        last_verif = None
        for i, (cand, reps, verdict) in enumerate(t["blocks"], start=1):
            bid = f"b{i}"
            evs: list[E.Event] = [
                E.LoopBlockStarted(index=i, sub_goal=f"measure {cand or 'baseline'}",
                                   routing={"model_tier": "none", "agent_topology": "single",
                                            "executor": "sweep"},
                                   candidate=cand, block_id=bid, **common),
                E.ToolInvoked(tool="bench", argv=["forge", "bench", tid], exit_code=0,
                              duration_s=1.5, block_id=bid, **common),
            ]
            for r, (tput, ttft, tm) in enumerate(reps):
                evs.append(E.MeasurementRecorded(
                    run_id=f"{tid}-{bid}-r{r}", source="forge-bench", repeat=r,
                    metrics={"output_throughput": tput, "median_ttft_ms": ttft,
                             "token_match": tm},
                    candidate=cand, block_id=bid, task_id=tid, actor=tool,
                    input_digests={Digest.POINT: ph,
                                   Digest.REPO_SNAPSHOT: "sha256:repo-snapshot-1"}))
            tputs = sorted(x[0] for x in reps)
            if base is None:
                base = tputs[1]
            if verdict is not None:
                ratio = tputs[1] / base
                tm = sorted(x[2] for x in reps)[1]
                gates = [
                    GateResult.judged("pass" if ratio >= 1.05 or not cand else "fail",
                                      name="throughput", kind="relative",
                                      metric="output_throughput", median=tputs[1],
                                      baseline_median=base, ratio=ratio, threshold=1.05,
                                      direction="at_least", reason=f"ratio {ratio:.3f}"),
                    GateResult.judged("pass" if tm >= 0.99 else "fail", name="correctness",
                                      kind="absolute", metric="token_match", median=tm,
                                      threshold=0.99, direction="at_least",
                                      reason=f"token match {tm}"),
                ]
                v = E.VerificationRecorded(contract_hash="sha256:contract", point_hash=ph,
                                           candidate=cand, passed=verdict == "pass",
                                           verdict=verdict, gates=gates, block_id=bid,
                                           **common)
                evs.append(v)
                last_verif = v
            evs.append(E.LoopBlockHandedOff(
                outcome="progress" if verdict != "fail" else "no-progress",
                state_reached=f"median throughput {tputs[1]}",
                findings=[f"block {bid} measured {len(reps)} repeats"],
                next_sub_goal=None, block_id=bid, **common))
            led.save(Append(stream, evs), command_id=f"{tid}:{bid}")
        tail: list[E.Event] = []
        dec = t.get("decision")
        if dec is not None:
            kind, why = dec
            cand = t["blocks"][-1][0]
            evidence = [str(last_verif.event_id)] if last_verif else []
            if kind == "accepted":
                d = E.DeliverableAccepted(candidate=cand, summary=why, evidence=evidence,
                                          verification_event_id=last_verif.event_id,
                                          block_id=f"b{len(t['blocks'])}", **common)
            else:
                d = E.DirectionRejected(candidate=cand, reason=why, evidence=evidence,
                                        block_id=f"b{len(t['blocks'])}", **common)
            tail.append(d)
            out["decisions"][tid] = str(d.event_id)
        state, reason = t["exit"]
        tail.append(E.TaskExited(state=state, reason=reason, handoff=t.get("handoff"),
                                 **common))
        led.save(Append(stream, tail), command_id=f"{tid}:exit")
    return out
