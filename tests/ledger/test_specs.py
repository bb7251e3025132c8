"""Specs: examples load, hashes are content hashes, errors name file, line and field."""

from __future__ import annotations

import json

import pytest
import yaml
from infer_forge.ledger.ids import LEDGER_CONTEXT
from infer_forge.ledger.specs import (
    DeploymentPoint,
    Role,
    RuntimeProfile,
    SpecError,
    apply_candidate,
    diff_specs,
    effective_digest,
    load_point,
    load_profile,
    load_spec,
    load_task,
    spec_hash,
)

from tests.conftest import REPO, run_forge

EX = REPO / "examples"


@pytest.mark.parametrize("rel", ["points/tiny-cpu.yaml", "points/qwen-h200.yaml",
                                 "profiles/tiny-cpu.yaml", "profiles/qwen-h200-sglang.yaml",
                                 "tasks/tune-tiny-cpu.yaml", "tasks/tune-qwen-h200.yaml"])
def test_examples_are_valid(rel):
    spec = load_spec(EX / rel)
    assert spec_hash(spec).startswith("sha256:")


def test_example_task_shapes():
    t = load_task(EX / "tasks/tune-tiny-cpu.yaml")
    assert t.type == "deployment-tuning" and t.contract.repeats == 3
    assert [g.kind for g in t.contract.gates] == ["relative", "absolute", "absolute",
                                                  "stability"]
    assert t.contract.primary.metric == "output_throughput"
    assert load_profile(EX / "profiles/tiny-cpu.yaml").engine == "hf"
    assert load_profile(EX / "profiles/qwen-h200-sglang.yaml").engine == "sglang"


def test_hash_is_stable_across_key_order_and_formatting(tmp_path):
    src = EX / "points/tiny-cpu.yaml"
    data = yaml.safe_load(src.read_text())

    def reorder(v):
        if isinstance(v, dict):
            return {k: reorder(v[k]) for k in reversed(list(v))}
        return v

    other = tmp_path / "p.yaml"
    other.write_text("# reformatted, keys reversed\n" + yaml.safe_dump(reorder(data),
                                                                       sort_keys=False,
                                                                       default_flow_style=False,
                                                                       indent=4))
    flow = tmp_path / "q.yaml"
    flow.write_text(json.dumps(data))  # JSON is YAML too
    h = spec_hash(load_point(src))
    assert spec_hash(load_point(other)) == h == spec_hash(load_point(flow))
    data["topology"]["parallelism"]["tp"] = 2
    flow.write_text(json.dumps(data))
    assert spec_hash(load_point(flow)) != h
    # Where the profile file lives is not part of what the point is.
    data["topology"]["parallelism"]["tp"] = 1
    data["runtime_profile"]["file"] = "elsewhere.yaml"
    flow.write_text(json.dumps(data))
    assert spec_hash(load_point(flow)) == h


def test_diff_names_changed_dimensions(tmp_path):
    a = load_point(EX / "points/tiny-cpu.yaml")
    data = a.model_dump(mode="json")
    data["topology"]["parallelism"]["tp"] = 2
    data["scenario"]["traffic"]["concurrency"] = 16
    b = type(a).model_validate(data)
    changes = diff_specs(a, b)
    assert [c["path"] for c in changes] == ["scenario.traffic.concurrency",
                                            "topology.parallelism.tp"]
    assert {c["dimension"] for c in changes} == {"scenario", "topology"}
    assert diff_specs(a, a) == []
    p = tmp_path / "b.yaml"
    p.write_text(json.dumps(data))
    out = run_forge("point", "diff", str(EX / "points/tiny-cpu.yaml"), str(p), "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["dimensions"] == ["scenario",
                                                                             "topology"]


BAD = """\
type: deployment-tuning
goal: x
point: p.yaml
scope:
  engine.b: {min: 3, max: 1}
contract:
  gates:
    - {name: t, metric: m}
    - {name: s, repeats: 0}
exit: {max_blocks: -1}
bogus: 1
"""


def test_spec_errors_name_file_line_and_field(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD)
    with pytest.raises(SpecError) as ei:
        load_task(f)
    assert ei.value.problems == [
        f"{f}:5: scope.engine.b: max 1.0 is below min 3.0",
        f"{f}:8: contract.gates[0]: gate t: give exactly one of at_least, at_most",
        f"{f}:9: contract.gates[1].repeats: Input should be greater than or equal to 1",
        f"{f}:10: exit.max_blocks: Input should be greater than or equal to 1",
        f"{f}:11: bogus: Extra inputs are not permitted",
    ]
    f.write_text("a: [1,\nb: 2\n")
    with pytest.raises(SpecError, match=r"bad.yaml:3: \(yaml\)"):
        load_task(f)
    f.write_text("model: {name: a}\nmodel: {name: b}\n")
    with pytest.raises(SpecError, match=r"bad.yaml:2: model: duplicate key"):
        load_point(f)


def test_cli_validate_and_task_new_record_nothing_on_error(forge_home, tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD)
    p = run_forge("point", "validate", str(EX / "points/tiny-cpu.yaml"), str(f))
    assert p.returncode == 1
    assert p.stdout.startswith("ok ") and p.stderr.count("\n") == 5
    assert all(line.startswith(f"error: {f}:") for line in p.stderr.splitlines())
    assert run_forge("init").returncode == 0
    from infer_forge.ledger.workspace import open_workspace

    with open_workspace(forge_home) as ws:
        before = ws.ledger.max_position()
    p = run_forge("task", "new", str(f))
    assert p.returncode == 1 and f"{f}:5: scope.engine.b" in p.stderr
    with open_workspace(forge_home) as ws:
        assert ws.ledger.max_position() == before


def test_profiles_are_versioned(workspace, tmp_path):
    from infer_forge.harness.errors import HarnessError
    from infer_forge.harness.loop.define import record_profile

    src = (EX / "profiles/tiny-cpu.yaml").read_text()
    f = tmp_path / "prof.yaml"
    f.write_text(src)
    assert record_profile(workspace, f)["recorded"]
    assert not record_profile(workspace, f)["recorded"]  # idempotent
    f.write_text(src.replace("dtype: float32", "dtype: bfloat16"))
    with pytest.raises(HarnessError, match="rev 1 is already recorded.*config.dtype.*rev 2"):
        record_profile(workspace, f)
    f.write_text(src.replace("dtype: float32", "dtype: bfloat16").replace("rev: 1", "rev: 2"))
    info = record_profile(workspace, f)
    assert info["changes"]["from_rev"] == 1
    assert info["changes"]["diff"] == [{"path": "config.dtype", "dimension": "config",
                                        "a": "float32", "b": "bfloat16"},
                                       {"path": "rev", "dimension": "rev", "a": 1, "b": 2}]


def test_candidates_apply_to_profile_and_point():
    pt = load_point(EX / "points/tiny-cpu.yaml")
    pr = load_profile(EX / "profiles/tiny-cpu.yaml")
    p2, r2 = apply_candidate(pt, pr, {"engine.dtype": "bfloat16",
                                      "topology.parallelism.tp": 2})
    assert r2.config["dtype"] == "bfloat16" and p2.topology.parallelism.tp == 2
    assert pr.config["dtype"] == "float32"  # pure
    # A candidate equal to the profile's own value is the baseline experiment.
    assert effective_digest(pt, pr, {"engine.dtype": "float32"}) == effective_digest(pt, pr, {})
    with pytest.raises(SpecError, match="topology.parallelism.tp"):
        apply_candidate(pt, pr, {"topology.parallelism.tp": 0})


def test_cli_point_show_json_matches_spec_hash():
    p = run_forge("point", "show", str(EX / "tasks/tune-tiny-cpu.yaml"), "--json")
    assert p.returncode == 0
    data = json.loads(p.stdout)
    assert data["kind"] == "task"
    assert data["hash"] == spec_hash(load_task(EX / "tasks/tune-tiny-cpu.yaml"))
    assert data["spec"]["scope"]["engine.dtype"] == ["float32", "bfloat16"]


def test_both_example_tasks_can_be_defined(workspace):
    from infer_forge.harness.loop.define import define_task
    from infer_forge.projections.memory import list_tasks

    a = define_task(workspace, EX / "tasks/tune-tiny-cpu.yaml")
    b = define_task(workspace, EX / "tasks/tune-qwen-h200.yaml")
    assert a["point_hash"] != b["point_hash"] and a["profile_hash"] != b["profile_hash"]
    assert {t["task_id"] for t in list_tasks(workspace.ledger)} == {"tune-tiny-cpu",
                                                                     "tune-qwen-h200"}


# --- topology roles and image digests -----------------------------------------------------

ROLE_CASES = [  # (architecture, roles, the problem, or None when valid)
    ("pd", None, "architecture pd needs roles prefill, decode (missing: prefill, decode)"),
    ("pd", [], "architecture pd needs roles prefill, decode (missing: prefill, decode)"),
    ("pd", ["prefill"], "architecture pd needs roles prefill, decode (missing: decode)"),
    ("pd", ["decode", "decode"], "(missing: prefill)"),
    ("pd", ["prefill", "decode", "encode"], "architecture pd has no encode role "
                                            "(its roles: prefill, decode)"),
    ("pd", ["prefill", "decode", "colocated"], "architecture pd has no colocated role"),
    ("epd", None, "architecture epd needs roles encode, prefill, decode (missing: encode, "
                  "prefill, decode)"),
    ("epd", ["prefill", "decode"], "architecture epd needs roles encode, prefill, decode "
                                   "(missing: encode)"),
    ("epd", ["encode", "decode"], "(missing: prefill)"),
    ("colocated", ["prefill", "decode"], "architecture colocated has no prefill, decode role "
                                         "(its roles: colocated)"),
    ("pd", ["prefill", "decode"], None),
    ("pd", ["decode", "prefill", "prefill"], None),  # order free, a role may repeat
    ("epd", ["encode", "prefill", "decode"], None),
    ("colocated", None, None),
    ("colocated", ["colocated"], None),
]


def _point_file(tmp_path, arch: str, roles: list[str] | None):
    data = yaml.safe_load((EX / "points/qwen-h200.yaml").read_text())
    data["runtime_profile"].pop("file")
    data["topology"] = {"architecture": arch, "parallelism": {"tp": 1}}
    if roles is not None:
        data["topology"]["roles"] = [{"role": r, "count": 1 + i, "parallelism": {"tp": 2}}
                                     for i, r in enumerate(roles)]
    f = tmp_path / "point.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return f, data


@pytest.mark.parametrize(("arch", "roles", "problem"), ROLE_CASES)
def test_topology_roles_fit_the_architecture(tmp_path, arch, roles, problem):
    f, data = _point_file(tmp_path, arch, roles)
    if problem is None:
        assert load_point(f).topology.architecture == arch
        return
    with pytest.raises(SpecError) as ei:
        load_point(f)
    (line,) = ei.value.problems
    assert line.startswith(f"{f}:") and ": topology: " in line and problem in line, line
    # A point read back from the ledger was checked when it entered it: an older ledger's
    # point still loads (the rule holds for what is recorded from now on).
    assert DeploymentPoint.model_validate(data, context=LEDGER_CONTEXT).topology.roles == [
        Role(role=r, count=1 + i, parallelism={"tp": 2}) for i, r in enumerate(roles or [])]


BAD_DIGESTS = ["sha256:not-hex", "sha256:" + "0" * 63, "sha256:" + "0" * 65,
               "sha256:" + "AB" * 32, "sha512:" + "0" * 64, "md5:" + "0" * 32, "0" * 64,
               "sha256:" + "0" * 64 + "\n", " sha256:" + "0" * 64, "sha256:" + "g" * 64,
               "sha256:", ""]


@pytest.mark.parametrize("bad", BAD_DIGESTS)
def test_image_digest_is_sha256_and_64_lowercase_hex(tmp_path, bad):
    src = (EX / "profiles/qwen-h200-sglang.yaml").read_text()
    good = ", digest: resolve}"  # the example's: pinned at first use
    assert good in src and load_profile(EX / "profiles/qwen-h200-sglang.yaml").image.digest \
        == "resolve"
    f = tmp_path / "profile.yaml"
    f.write_text(src.replace(good, f", digest: {json.dumps(bad)}}}"))
    with pytest.raises(SpecError) as ei:
        load_profile(f)
    (line,) = ei.value.problems
    assert line == (f"{f}:10: image.digest: must be sha256: and 64 lowercase hex digits (as "
                    f"`docker inspect` shows it), or `resolve` (pinned at first use), got "
                    f"{bad!r}"), line
    fine = "sha256:" + "0123456789abcdef" * 4
    f.write_text(src.replace(good, f", digest: {json.dumps(fine)}}}"))
    assert load_profile(f).image.digest == fine
    data = yaml.safe_load(src.replace(good, f", digest: {json.dumps(bad)}}}"))
    assert RuntimeProfile.model_validate(data, context=LEDGER_CONTEXT).image.digest == bad


def test_cli_refuses_roleless_pd_and_bad_digest_and_records_nothing(forge_home, tmp_path):
    point, _ = _point_file(tmp_path, "pd", None)
    prof = tmp_path / "profile.yaml"
    prof.write_text((EX / "profiles/qwen-h200-sglang.yaml").read_text().replace(
        ", digest: resolve}", ', digest: "sha256:not-hex"}'))
    p = run_forge("point", "validate", str(point), str(prof))
    assert p.returncode == 1 and p.stdout == "" and "Traceback" not in p.stderr
    at = point.read_text().splitlines().index("topology:") + 1
    assert p.stderr.splitlines() == [
        f"error: {point}:{at}: topology: architecture pd needs roles prefill, decode "
        "(missing: prefill, decode)",
        f"error: {prof}:10: image.digest: must be sha256: and 64 lowercase hex digits (as "
        "`docker inspect` shows it), or `resolve` (pinned at first use), got 'sha256:not-hex'"]
    assert run_forge("init").returncode == 0
    from infer_forge.ledger.workspace import open_workspace

    with open_workspace(forge_home) as ws:
        before = ws.ledger.max_position()
    p = run_forge("profile", "record", str(prof))
    assert p.returncode == 1 and "image.digest: must be sha256:" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    with open_workspace(forge_home) as ws:
        assert ws.ledger.max_position() == before


def test_a_point_and_profile_pinned_before_these_rules_still_load(workspace):
    """An older ledger may hold a pd point without roles and a placeholder digest: they were
    checked when they entered it, so a task on them still loads (no ValidationError)."""
    from infer_forge.harness.loop.define import define_task
    from infer_forge.harness.task import load_task_from_ledger
    from infer_forge.ledger import events as E
    from infer_forge.ledger.clock import digest
    from infer_forge.ledger.streams import task_stream

    define_task(workspace, EX / "tasks/tune-qwen-h200.yaml")
    evs = [r.event for r in workspace.ledger.stream("workspace")]
    (pin,) = [e for e in evs if isinstance(e, E.DeploymentPointPinned)]
    (rev1,) = [e for e in evs if isinstance(e, E.RuntimeProfileRevised)
               and e.service == "qwen-h200"]
    (defined,) = [r.event for r in workspace.ledger.stream(task_stream("tune-qwen-h200"))
                  if isinstance(r.event, E.TaskDefined)]
    point = {**pin.point, "topology": {"architecture": "pd", "parallelism": {"tp": 1}},
             "runtime_profile": {"service": "qwen-h200", "rev": 2}}
    prof = {**rev1.profile, "rev": 2, "image": {"name": "sglang", "digest": "sha256:placeholder"}}
    tool = E.Actor.tool("older-forge")
    workspace.ledger.append("workspace", [
        E.DeploymentPointPinned(name="old-pd", point_hash=digest(point), point=point, actor=tool),
        E.RuntimeProfileRevised(service="qwen-h200", rev=2, profile=prof,
                                profile_hash=digest(prof), actor=tool)], command_id="old-pins")
    workspace.ledger.append(task_stream("old-pd"), [E.TaskDefined(
        task_id="old-pd", title="old-pd", task_type=defined.task_type, goal=defined.goal,
        definition=defined.definition, definition_hash=defined.definition_hash,
        point_hash=digest(point), actor=tool)], command_id="old-pd:define")
    lt = load_task_from_ledger(workspace, "old-pd")
    assert lt.point.topology.architecture == "pd" and lt.point.topology.roles == []
    assert lt.profile is not None and lt.profile.image.digest == "sha256:placeholder"
