"""The flag table and the planner against SGLang's own released parsers (the kit's releases).

Every argv below is parsed by the real `ServerArgs.add_cli_args` parser of its release (a
`--config` file through that release's own config loader), in one child process per release
for the whole module (sglang_parser_probe.py `check`): the example points at their pinned
version and re-pinned to each kit release, and a boundary matrix of renamed/gated settings.
Where the harness refuses, the refusal must be one line naming a flag that the release's
real parser indeed lacks. The committed table must say what each release's parser says.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from infer_forge.harness.engines import sglang_flags
from infer_forge.harness.engines.plan import plan_point
from infer_forge.harness.engines.point_up import point_and_profile
from infer_forge.harness.engines.sglang import HARNESS_KEYS, sglang_command
from infer_forge.harness.errors import HarnessError
from infer_forge.ledger.specs import (
    DeploymentPoint,
    RuntimeProfile,
    SpecError,
    apply_candidate,
    load_task,
)

from tests.conftest import REPO
from tests.helpers import real_sglang

KIT = real_sglang.KIT_VERSIONS
SCOPE_TASK = REPO / "examples" / "tasks" / "tune-glm-4.5-h200.yaml"
PROBE = REPO / "harness" / "engines" / "sglang_parser_probe.py"
MODEL = "m"
REFUSAL = re.compile(r"^sglang (\S+) has no (--[a-z0-9-]+) \((.+)\)$")
CHOICE_REFUSAL = re.compile(r"^sglang (\S+) (--[a-z0-9-]+): (\S+) is not one of (.+)$")
# Settings spelled per release (translate, NEEDS) or set by the plan: not asked as flags here.
RENAMED = {"cuda_graph_max_bs", "cuda_graph_max_bs_decode", "cuda_graph_max_bs_prefill",
           "disable_cuda_graph", "cuda_graph_backend_decode", "cuda_graph_backend_prefill",
           "enable_dp_attention", "attn_dp_size", "dp_size", "moe_runner_backend"}

# Setting -> the flags one of which the release must have to express it.
NEEDS = {
    "max_bs": ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"),
    "no_graph": ("--disable-cuda-graph", "--cuda-graph-backend-decode"),
    "dp_attn": ("--enable-dp-attention", "--attn-dp-size"),
    "moe": ("--moe-runner-backend",),
    "config": ("--config",),
    "pd": ("--disaggregation-mode",),
    "epd": ("--encoder-only",),
}
MATRIX = {  # name: (engine config, the settings it needs)
    "cuda_graph_max_bs": ({"cuda_graph_max_bs": 64}, ["max_bs"]),
    "cuda_graph_max_bs_decode": ({"cuda_graph_max_bs_decode": 64}, ["max_bs"]),
    "disable_cuda_graph": ({"disable_cuda_graph": True}, ["no_graph"]),
    "backends_disabled": ({"cuda_graph_backend_decode": "disabled",
                           "cuda_graph_backend_prefill": "disabled"}, ["no_graph"]),
    "enable_dp_attention": ({"tp_size": 2, "enable_dp_attention": True, "dp_size": 2},
                            ["dp_attn"]),
    "attn_dp_size": ({"tp_size": 2, "attn_dp_size": 2}, ["dp_attn"]),
    "moe_runner_backend": ({"moe_runner_backend": "auto"}, ["moe"]),
    "everything": ({"tp_size": 2, "cuda_graph_max_bs": 64, "disable_cuda_graph": True,
                    "enable_dp_attention": True, "dp_size": 2,
                    "chunked_prefill_size": 4096}, ["max_bs", "no_graph", "dp_attn"]),
}
PD_CONFIG = {"cuda_graph_max_bs": 64, "mem_fraction_static": 0.8,
             "role_config": {"decode": {"enable_dp_attention": True}}}
PD_ROLES = [{"role": "prefill", "count": 1, "parallelism": {"tp": 2}},
            {"role": "decode", "count": 1, "parallelism": {"tp": 4, "dp": 2}}]
EPD_ROLES = [{"role": "encode", "count": 1}, {"role": "prefill", "count": 1},
             {"role": "decode", "count": 1}]


@dataclass
class Case:
    version: str
    name: str
    needs: list[str]
    argvs: list[list[str]] = field(default_factory=list)  # each after `-m sglang.launch_server`
    refusal: str | None = None
    results: list[dict[str, Any]] = field(default_factory=list)
    values: bool = False  # the parsed namespace must hold the matrix's values
    wants: list[tuple[str, Any]] = field(default_factory=list)  # (flag, value) it must have


def _after_module(argv: tuple[str, ...] | list[str]) -> list[str]:
    return list(argv[list(argv).index("sglang.launch_server") + 1:])


def _planned(case: Case, point: DeploymentPoint, profile: RuntimeProfile) -> None:
    try:
        plan = plan_point(point, profile, None, sglang_version=case.version)
    except HarnessError as e:
        case.refusal = str(e)
        return
    case.argvs = [_after_module(p.argv) for p in plan.processes if p.role != "router"]


def _point(arch: str, roles: list[dict]) -> DeploymentPoint:
    return DeploymentPoint.model_validate({
        "name": f"t-{arch}", "model": {"name": "m", "source": MODEL},
        "scenario": {"traffic": {"concurrency": 8}},
        "topology": {"architecture": arch, "roles": roles},
        "runtime_profile": {"service": "s", "rev": 1},
        "accelerator": {"vendor": "nvidia", "model": "H200", "count": 8}})


def _profile(config: dict, version: str) -> RuntimeProfile:
    return RuntimeProfile.model_validate({
        "service": "s", "rev": 1, "engine": "sglang", "config": config,
        "framework": {"kind": "sglang", "version": version}})


def _settings(config: dict[str, Any]) -> list[str]:
    """Which NEEDS settings an engine config (with its role_config) asks for."""
    keys = set(config) | {k for per in (config.get("role_config") or {}).values()
                          for k in per}
    return [s for k, s in (("cuda_graph_max_bs", "max_bs"), ("disable_cuda_graph", "no_graph"),
                           ("enable_dp_attention", "dp_attn"), ("moe_runner_backend", "moe"))
            if k in keys]


def _wants(config: dict[str, Any]) -> list[tuple[str, Any]]:
    """The (flag, value) pairs an example's config asks for as they are spelled (the renamed
    settings are NEEDS'): a release must have each flag, with the value among its choices."""
    merged = dict(config)
    for per in (config.get("role_config") or {}).values():
        merged.update(per)
    return [("--" + k.replace("_", "-"), v) for k, v in sorted(merged.items())
            if k not in RENAMED and k not in HARNESS_KEYS and v is not None and v is not False]


def _examples() -> list[tuple[str, DeploymentPoint, RuntimeProfile]]:
    out = []
    for path in sorted((REPO / "examples" / "points").glob("*.yaml")):
        point, profile = point_and_profile(path)
        if profile.engine == "sglang":
            out.append((path.stem, point, profile))
    return out


def _cases(tmp: Path) -> list[Case]:
    cases: list[Case] = []
    examples = _examples()
    assert examples, "no SGLang example points"
    for name, point, profile in examples:  # at the pinned version
        assert profile.framework is not None
        case = Case(str(profile.framework.version), f"example {name} (pinned)", [])
        _planned(case, point, profile)
        assert case.refusal is None, case.refusal
        cases.append(case)
    cases += _scope_cases()
    for v in KIT:
        for name, point, profile in examples:
            arch = point.topology.architecture
            case = Case(v, f"example {name}", [*([arch] if arch in NEEDS else []),
                                                *_settings(profile.config)],
                        wants=_wants(profile.config))
            _planned(case, point, profile)
            cases.append(case)
        for name, (cfg, needs) in MATRIX.items():
            case = Case(v, name, needs, values=True)
            try:
                case.argvs = [_after_module(sglang_command(cfg, model=MODEL, port=30000,
                                                           version=v)[0])]
            except HarnessError as e:
                case.refusal = str(e)
            cases.append(case)
            if name == "everything" and case.refusal is None:
                # the same options as a --config file, read by SGLang's own loader
                path = tmp / f"{v}.yaml"
                twin = Case(v, "use_config_file", [*needs, "config"], values=True)
                try:
                    cmd, text = sglang_command({**cfg, "use_config_file": True}, model=MODEL,
                                               port=30000, version=v, config_path=path)
                    assert text is not None
                    path.write_text(text, encoding="utf-8")
                    twin.argvs = [case.argvs[0], _after_module(cmd)]
                except HarnessError as e:
                    twin.refusal = str(e)
                cases.append(twin)
        for arch, cfg, roles in (("pd", PD_CONFIG, PD_ROLES), ("epd", {}, EPD_ROLES)):
            case = Case(v, f"{arch} plan", [arch, *(["max_bs", "dp_attn"] if arch == "pd"
                                                    else [])])
            _planned(case, _point(arch, roles), _profile(cfg, v))
            cases.append(case)
    return cases


def _scope_cases() -> list[Case]:
    """Each axis value of the tuning task alone, at the point's pinned version: its argvs,
    or the plan's refusal (a combination SGLang would rewrite or refuse)."""
    task = load_task(SCOPE_TASK)
    point, profile = point_and_profile(SCOPE_TASK.parent / task.point)
    assert profile.framework is not None
    out = []
    for key, allowed in task.scope.items():
        assert isinstance(allowed, list), key
        for value in allowed:
            case = Case(str(profile.framework.version), f"scope {key}={json.dumps(value)}", [])
            try:
                case_point, case_profile = apply_candidate(point, profile, {key: value})
                assert case_point is not None and case_profile is not None
                _planned(case, case_point, case_profile)
            except SpecError as e:
                case.refusal = str(e)
            out.append(case)
    return out


def _ask(version: str, argvs: list[list[str]], tmp: Path) -> dict[str, Any]:
    path = tmp / f"argvs-{version}.json"
    path.write_text(json.dumps(argvs), encoding="utf-8")
    return json.loads(real_sglang.run(version, PROBE, "check", str(path)))


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> tuple[list[Case], dict[str, dict[str, Any]]]:
    """Every case, with each release's answers; and each release's real flags."""
    for v in KIT:
        real_sglang.release(v)  # skips (locally) or fails (CI) before any work
    tmp = tmp_path_factory.mktemp("sglang-flags")
    cases = _cases(tmp)
    by_version: dict[str, list[list[str]]] = {}
    for c in cases:
        by_version.setdefault(c.version, []).extend(c.argvs)
    with ThreadPoolExecutor(max_workers=4) as pool:  # one child per release
        answers = dict(zip(by_version, pool.map(lambda v: _ask(v, by_version[v], tmp),
                                                by_version), strict=True))
    taken = dict.fromkeys(by_version, 0)
    for c in cases:
        n = len(c.argvs)
        c.results = answers[c.version]["results"][taken[c.version]:taken[c.version] + n]
        taken[c.version] += n
    return cases, {v: a["flags"] for v, a in answers.items()}


def _verdicts(case: Case, flags: dict[str, Any]) -> list[str]:
    """What is wrong with one case, judged by the release's real parser."""
    where = f"sglang {case.version} {case.name}"
    missing = [s for s in case.needs if not any(f in flags for f in NEEDS[s])]
    missing += [f"{f} {v}" for f, v in case.wants if not _has(flags, f, v)]
    if case.refusal is not None:
        m = REFUSAL.match(case.refusal)
        c = CHOICE_REFUSAL.match(case.refusal)
        hit = m or c
        if hit is None or hit.group(1) != case.version:
            return [f"{where}: refused without the one-line form: {case.refusal}"]
        if m and m.group(2) in flags and not flags[m.group(2)].get("retired"):
            return [f"{where}: refused for {m.group(2)}, which its real parser has"]
        if c and _has(flags, c.group(2), c.group(3)):
            return [f"{where}: refused {c.group(2)} {c.group(3)}, which its real parser takes"]
        if not missing:
            return [f"{where}: refused ({case.refusal}) though it can express it"]
        return []
    bad = [f"{where}: accepted though the release has none of {NEEDS[s]}" for s in missing]
    for argv, r in zip(case.argvs, case.results, strict=True):
        if not r["ok"]:
            bad.append(f"{where}: the real parser rejects {' '.join(argv)}: {r['error']}")
            continue
        for a in argv:  # where a current spelling exists, no deprecated one is passed
            if a.startswith("--") and flags.get(a, {}).get("deprecated"):
                bad.append(f"{where}: passes deprecated {a}")
        if case.values:
            bad += [f"{where}: {e}" for e in _values(case, r["args"])]
    return bad


def _has(flags: dict[str, Any], flag: str, value: Any) -> bool:
    """The release's real parser has `flag` (not retired) and takes `value` (its choices)."""
    spec = flags.get(flag)
    if spec is None or spec.get("retired"):
        return False
    choices = spec.get("choices")
    return not choices or isinstance(value, bool) or str(value) in choices


def _values(case: Case, args: dict[str, Any]) -> list[str]:
    """The parsed namespace holds what was asked, whatever the spelling."""
    out = []
    if "max_bs" in case.needs and 64 not in (
            args.get("cuda_graph_max_bs"), args.get("cuda_graph_max_bs_decode")):
        out.append(f"cuda graph max bs not 64: {args.get('cuda_graph_max_bs')}, "
                   f"{args.get('cuda_graph_max_bs_decode')}")
    if "no_graph" in case.needs and not (args.get("disable_cuda_graph") is True or all(
            "disabled" in str(args.get(f"cuda_graph_backend_{s}")).lower()
            for s in ("decode", "prefill"))):
        out.append("cuda graphs not disabled")
    if "dp_attn" in case.needs and not (
            args.get("attn_dp_size") == 2
            or (args.get("enable_dp_attention") is True  # dest data_parallel_size to 0.5.13
                and 2 in (args.get("dp_size"), args.get("data_parallel_size")))):
        out.append(f"DP attention 2 not set: {args}")
    return out


def test_example_points_parse_with_the_pinned_release(real):
    cases, flags = real
    pinned = [c for c in cases if c.name.endswith("(pinned)")]
    assert pinned and all(c.argvs for c in pinned)
    bad = [v for c in pinned for v in _verdicts(c, flags[c.version])]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("version", KIT)
def test_boundary_matrix(real, version):
    """Each setting: argv the release's real parser accepts, or a one-line refusal where
    that release's parser indeed lacks every spelling of it (examples re-pinned too)."""
    cases, flags = real
    mine = [c for c in cases if c.version == version and not c.name.endswith("(pinned)")
            and not c.name.startswith("scope ")]
    assert len(mine) >= len(MATRIX) + 2
    bad = [v for c in mine for v in _verdicts(c, flags[version])]
    assert not bad, "\n".join(bad)


def test_config_file_reads_as_the_flags(real):
    """The YAML the harness writes, through SGLang's own config loader, parses to the same
    namespace as the same options given as flags (0.5.3+; before, a refusal)."""
    cases, flags = real
    twins = [c for c in cases if c.name == "use_config_file"]
    assert {c.version for c in twins} == set(KIT)
    for c in twins:
        if "--config" not in flags[c.version]:
            assert c.refusal == f"sglang {c.version} has no --config (0.5.3 and later)"
            continue
        assert c.refusal is None and all(r["ok"] for r in c.results), (c.version, c.results)
        plain, via_file = (dict(r["args"]) for r in c.results)
        via_file.pop("config", None)
        plain.pop("config", None)
        assert via_file == plain, c.version


def test_the_boundaries_the_issue_names(real):
    """Spot checks of the table's refusals, word for word, against the real parsers."""
    cases, flags = real
    by = {(c.version, c.name): c for c in cases}
    assert by[("0.5.6", "epd plan")].refusal == \
        "sglang 0.5.6 has no --encoder-only (0.5.7 and later)"
    assert by[("0.5.1", "use_config_file")].refusal == \
        "sglang 0.5.1 has no --config (0.5.3 and later)"
    assert by[("0.4.0", "moe_runner_backend")].refusal == \
        "sglang 0.4.0 has no --moe-runner-backend (0.5.1 and later)"
    for v, flag in (("0.5.13", "--cuda-graph-max-bs"), ("0.5.21", "--cuda-graph-max-bs-decode"),
                    ("0.5.21", "--enable-dp-attention"), ("0.5.22", "--attn-dp-size")):
        argv = by[(v, "everything")].argvs[0]
        assert flag in argv and flag in flags[v], (v, argv)


def test_table_agrees_with_the_real_parsers(real):
    """The committed table's view of each kit release is exactly its parser's dump."""
    _, flags = real
    table = sglang_flags.table()
    for v in KIT:
        assert v in table.versions
        want, have = flags[v], table.flags_at(v)
        diff = sorted(f for f in set(want) | set(have) if want.get(f) != have.get(f))
        assert not diff, f"sglang {v}: the table differs from the real parser on " \
            f"{', '.join(diff[:8])} (regenerate: python -m " \
            "infer_forge.harness.engines.sglang_flags generate)"


def test_reading_the_table():
    t = sglang_flags.table()
    assert t.release("0.5.0") == "0.4.10"  # never released as a final
    assert t.release("0.5.6.post2") == "0.5.6"
    assert t.release("9.9.9") == t.latest
    with pytest.raises(HarnessError, match=r"^sglang 0\.3\.9 is older than the oldest"):
        t.release("0.3.9")
    assert sglang_flags.since("--attn-dp-size") == "0.5.22"
    assert t.flags["--cuda-graph-max-bs"]["last"] is not None  # removed
    assert t.flags["--enable-dp-attention"]["deprecated_since"] == "0.5.22"
    assert sglang_flags.available("--enable-dp-attention", "0.5.23")  # deprecated, works
    with pytest.raises(HarnessError, match=r"^sglang 0\.5\.23 --moe-runner-backend: bogus is "
                                           r"not one of aiter, auto, "):
        t.check("--moe-runner-backend", "bogus", "0.5.23")


def test_multi_node_ranks_parse_as_planned(real):
    """The 4-node PD example (each server over two hosts): every host's argv, parsed by the
    pinned release's real parser, holds its rank, the node count, its server's rank-0
    dist-init address, and the MTP / DeepEP / EPLB / FP8-KV settings of the profile."""
    cases, _ = real
    case = next(c for c in cases if c.name == "example deepseek-r1-pd-4x8-h200 (pinned)")
    point, profile = point_and_profile(REPO / "examples/points/deepseek-r1-pd-4x8-h200.yaml")
    plan = plan_point(point, profile, None, sglang_version=case.version)
    servers = [p for p in plan.processes if p.role != "router"]
    assert len(servers) == len(case.results) == 4
    for p, r in zip(servers, case.results, strict=True):
        assert r["ok"], (p.name, r["error"])
        args = r["args"]
        assert (args["nnodes"], args["node_rank"]) == (2, p.node_rank), p.name
        rank0 = plan.process(f"{p.role}-{p.index}")
        assert args["dist_init_addr"] == p.dist_init_addr == rank0.dist_init_addr, p.name
        assert rank0.dist_init_addr.startswith(f"{rank0.host}:"), p.name
        assert args["host"] == p.host and args["port"] == p.port
        assert (args["tp_size"], args["ep_size"], args["attn_dp_size"]) == (16, 16, 16)
        assert args["speculative_algorithm"] == "EAGLE"
        assert (args["speculative_num_steps"], args["speculative_eagle_topk"],
                args["speculative_num_draft_tokens"]) == (3, 1, 4)
        assert (args["moe_a2a_backend"], args["enable_eplb"], args["kv_cache_dtype"]) == \
            ("deepep", True, "fp8_e4m3")
        assert args["disaggregation_mode"] == p.role
    prefill = [a["args"] for a, p in zip(case.results, servers, strict=True)
               if p.role == "prefill"]
    assert {a["disaggregation_bootstrap_port"] for a in prefill} == \
        {plan.process("prefill-0").bootstrap_port}


def test_new_example_points_at_old_releases(real):
    """Re-pinned to 0.4.0 (no --speculative-algorithm, no --moe-a2a-backend, no fp8_e4m3 in
    --kv-cache-dtype's choices, per its real parser), each new example is refused in one
    line naming a flag or value that parser lacks; from 0.5.1 on they parse (the boundary
    matrix's verdicts)."""
    cases, flags = real
    new = ("deepseek-v3-pd-2x8-h200", "deepseek-r1-pd-4x8-h200", "kimi-k2-h200",
           "glm-4.5-h200")
    for name in new:
        old = next(c for c in cases if c.name == f"example {name}" and c.version == "0.4.0")
        assert old.refusal is not None and old.refusal.startswith("sglang 0.4.0 "), name
        assert not _verdicts(old, flags["0.4.0"]), name
    assert "--speculative-algorithm" not in flags["0.4.0"]
    assert "--moe-a2a-backend" not in flags["0.4.0"]
    assert "fp8_e4m3" not in flags["0.4.0"]["--kv-cache-dtype"]["choices"]
    for name in new:
        later = next(c for c in cases if c.name == f"example {name}" and c.version == "0.5.1")
        assert later.refusal is None and later.argvs, (name, later.refusal)
        assert all(r["ok"] for r in later.results), (name, later.results)


def test_scope_axes_are_the_real_parsers(real):
    """The tuning task's axes (speculative decoding, DeepEP, EPLB, FP8 KV, HiCache, two-batch
    overlap, DP attention): each `engine.<flag>` is a flag of the pinned release's real
    parser taking each listed value; each value alone either plans to argvs that parser
    accepts, holding the value, or is refused in one line naming its dimension."""
    cases, flags = real
    task = load_task(SCOPE_TASK)
    mine = [c for c in cases if c.name.startswith("scope ")]
    assert len(mine) == sum(len(v) for v in task.scope.values())
    version = mine[0].version
    for key, allowed in task.scope.items():
        head, _, name = key.partition(".")
        if head == "engine":
            assert all(_has(flags[version], "--" + name.replace("_", "-"), v)
                       for v in allowed if v is not False), key
    accepted = 0
    for c in mine:
        key, value = c.name[len("scope "):].split("=", 1)
        dim = key.rpartition(".")[2]
        if c.refusal is not None:
            assert "\n" not in c.refusal and dim in c.refusal, (c.name, c.refusal)
            continue
        accepted += 1
        for r in c.results:
            assert r["ok"], (c.name, r["error"])
            v = json.loads(value)
            if key.startswith("engine.") and dim in r["args"] and v is not False \
                    and dim != "enable_dp_attention":
                assert str(r["args"][dim]) == str(v), (c.name, r["args"][dim])
    refused = {c.name for c in mine if c.refusal is not None}
    assert accepted >= 15 and {"scope engine.speculative_num_steps=1",
                               "scope engine.enable_two_batch_overlap=true",
                               "scope topology.parallelism.dp=2"} <= refused, refused
