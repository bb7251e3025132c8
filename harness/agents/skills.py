"""Skills: short markdown guides an agent reads for a block (and a person with `forge skills`).

A skill is a markdown file whose YAML frontmatter holds `name` (an id: a-z 0-9 _ -, at most
63 characters, equal to the file's name), `category` (`CATEGORIES`), `task_types` (task types
of `ledger.graphspec.TASK_TYPES`, or `[any]`) and `summary` (one line), and may hold `needs`:
the sandbox allowances its recipes need (`NEEDS`: `endpoint`, a server on this host granted
by the task's `sandbox.endpoints`; `network`, `sandbox.network: true`).

- Where: the shipped set in `harness/data/skills/<category>/<name>.md`, then every folder of
  `[skills] dirs` in forge.toml (relative to FORGE_HOME unless absolute), searched for `*.md`
  (README.md excepted), in order. A user skill with a shipped skill's name **replaces** it
  (that is how a team adapts a shipped skill); two user skills with one name are a lint
  problem, and the later folder's wins. A file that does not parse is left out of
  `load_skills` and reported by `lint`.
- `lint` (one line per problem, naming the file): frontmatter missing, not YAML, missing or
  unknown keys, a bad name, category or task type, an empty body, a relative link that
  leads nowhere (a link to `<skill>.md` counts when that skill is loaded, so a user skill may
  link to a shipped one), a duplicate name (within the shipped set or the user folders), a
  duplicate body (two names, the same text), a configured folder that does not exist; a
  recipe (a `forge run … -- CMD` line in a fenced block, backslash continuations joined, or in a
  one-line code span) that reaches a server (`guard.reach`: a URL, SGLang's bench client's
  target, a benchmark client) while the skill's `needs` does not cover it (`endpoint` for a
  server on this host's loopback, `network` for any other), and a `needs` whose grant the
  text does not show (`sandbox:` with `endpoints:`, or `network: true`): a task cannot grant
  what the skill never says.
- `select(ws, task_type, query, k)`: the skills for a block. Every skill listed for the
  task type (`task_types` naming it, or `[any]`) with score 1.0, plus up to `k` others
  retrieved by cosine similarity between the query (the block's sub-goal) and each skill's
  text (at least `MIN_SIMILARITY`), with the journal's MiniLM model
  (`projections/embed.py`; `[wiki] embedding_model`). The list is ordered by similarity to
  the query (type matches included), so the most relevant skill comes first. Skill vectors
  are cached in `FORGE_HOME/skills-embeddings.npz` by text digest: a selection embeds only
  the query. With embeddings off (`[wiki] embeddings = false`) or a model that cannot load,
  the choice is by task type alone and the event's `fallback` says why (the query is kept).
  Returns the skills and an unsaved `SkillsProvided`; `provide` fills in the task and block
  (the agent executor saves it with its block).
- Agent tools `skills_list` and `skills_get` are defined here (`TOOLS`, for a registry's user
  to assemble: harness/mcp/loop_tools.py, harness/loop/agent_executor.py).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from ...ledger import events as E
from ...ledger.graphspec import TASK_TYPES
from ...ledger.ids import MAX_PART_ID, is_id
from ...ledger.workspace import Workspace
from ...projections.embed import EmbeddingCache, EmbeddingError, encode_query, text_key
from ..errors import HarnessError
from ..guard import reach
from .tool_registry import AgentTool, Args, ToolContext

CATEGORIES = ("sglang-upstream", "cross-library", "task", "ops")
KEYS = ("name", "category", "task_types", "summary")
OPTIONAL = ("needs",)
# The sandbox allowances a skill may need, and the text that shows a task how to grant each.
NEEDS = {"endpoint": re.compile(r"sandbox:.*endpoints:", re.S),
         "network": re.compile(r"sandbox:.*network:\s*true", re.S)}
ANY = "any"
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "skills"
CACHE_NAME = "skills-embeddings.npz"
# Below this cosine similarity a skill is not worth an agent's context. Calibrated on the
# shipped set with sub-goals written for it: the intended skill scored 0.31-0.66, unrelated
# ones -0.03-0.28 (MiniLM has no universal threshold).
MIN_SIMILARITY = 0.3
MAX_BYTES = 256 * 1024
SUMMARY_MAX = 300
Source = Literal["shipped", "user"]

_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", re.M | re.S)  # a list item's too
_CODE = re.compile(r"`[^`\n]*`")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


@dataclass(frozen=True)
class Skill:
    name: str
    category: str
    task_types: tuple[str, ...]
    summary: str
    body: str
    path: Path
    source: Source
    needs: tuple[str, ...] = ()

    def listed_for(self, task_type: str | None) -> bool:
        """Whether the skill names `task_type` (or any type); None: every skill."""
        return task_type is None or ANY in self.task_types or task_type in self.task_types

    def embed_text(self) -> str:
        """What retrieval compares the query with: name, summary, headings, then the body
        (the model reads the first 256 word pieces, so the summary weighs most)."""
        heads = " ".join(h.strip("# ").strip() for h in self.body.splitlines()
                         if h.startswith("#"))
        return f"{self.name.replace('-', ' ')}: {self.summary}\n{heads}\n{self.body}"

    def entry(self) -> dict[str, Any]:
        """The catalog entry (what a listing shows; the body is fetched by name)."""
        return {"name": self.name, "category": self.category,
                "task_types": list(self.task_types), "summary": self.summary,
                "needs": list(self.needs), "source": self.source, "path": str(self.path)}

    def as_dict(self) -> dict[str, Any]:
        return {**self.entry(), "body": self.body}


@dataclass
class _File:
    path: Path
    source: Source
    skill: Skill | None
    problems: list[str]


# --- reading ------------------------------------------------------------------------------


def split_frontmatter(text: str) -> tuple[str, str] | None:
    """(frontmatter, body) of a markdown text that opens with a `---` block; else None."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != "---":
        return None
    for i in range(1, len(lines)):
        if lines[i].strip() == "---":
            return "".join(lines[1:i]), "".join(lines[i + 1:])
    return None


def parse_skill(path: Path, source: Source) -> tuple[Skill | None, list[str]]:
    """The skill in `path`, or None with the problems that keep it out (one line each)."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        return None, [f"cannot read: {e.strerror or e}"]
    if len(raw) > MAX_BYTES:
        return None, [f"{len(raw)} bytes, more than {MAX_BYTES}"]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, [f"not UTF-8 (byte {e.start})"]
    parts = split_frontmatter(text)
    if parts is None:
        return None, ["frontmatter missing: the file must open with a --- block holding "
                      + ", ".join(KEYS)]
    try:
        meta = yaml.safe_load(parts[0])
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (frontmatter line {mark.line + 1})" if mark is not None else ""
        return None, [f"frontmatter is not YAML{where}: {getattr(e, 'problem', None) or e}"]
    if not isinstance(meta, dict):
        return None, ["frontmatter must be a mapping of " + ", ".join(KEYS)]
    problems = []
    if missing := [k for k in KEYS if k not in meta]:
        problems.append(f"frontmatter: missing {', '.join(missing)}")
    if unknown := sorted(str(k) for k in meta if k not in KEYS + OPTIONAL):
        problems.append(f"frontmatter: unknown key(s) {', '.join(unknown)} "
                        f"(keys: {', '.join(KEYS + OPTIONAL)})")
    needs: Any = meta.get("needs", [])
    if not isinstance(needs, list) or any(n not in NEEDS for n in needs):
        problems.append(f"needs must be a list of {', '.join(NEEDS)} (the sandbox allowances "
                        f"its recipes need), not {needs!r}")
        needs = []
    name: Any = meta.get("name")
    category: Any = meta.get("category")
    types: Any = meta.get("task_types")
    summary: Any = meta.get("summary")
    if "name" in meta and not is_id(name, part=True):
        problems.append(f"name {name!r} is not an id (1-{MAX_PART_ID} characters a-z 0-9 _ -, "
                        "starting and ending with a letter or digit)")
    elif "name" in meta and name != path.stem:
        problems.append(f"name {name!r} differs from the file's name {path.name!r}")
    if "category" in meta and category not in CATEGORIES:
        problems.append(f"category {category!r} is not one of {', '.join(CATEGORIES)}")
    elif category in CATEGORIES and path.parent.name in CATEGORIES \
            and path.parent.name != category:
        problems.append(f"category {category!r} but the file is in folder "
                        f"{path.parent.name!r}")
    if "task_types" in meta:
        if not isinstance(types, list) or not types:
            problems.append("task_types must be a non-empty list (task types, or [any])")
        elif bad := [t for t in types if t != ANY and t not in TASK_TYPES]:
            problems.append(f"task_types: unknown {', '.join(repr(t) for t in bad)} "
                            f"(one of {', '.join(TASK_TYPES)}, or any)")
        elif ANY in types and len(types) > 1:
            problems.append("task_types: `any` stands alone")
    if "summary" in meta and (not isinstance(summary, str) or not summary.strip()
                              or "\n" in summary.strip() or len(summary) > SUMMARY_MAX):
        problems.append(f"summary must be one non-empty line of at most {SUMMARY_MAX} "
                        "characters")
    body = parts[1].strip("\n")
    if not body.strip():
        problems.append("the body is empty")
    if problems:
        return None, problems
    return Skill(name=name, category=category, task_types=tuple(types),
                 summary=" ".join(summary.split()), body=body + "\n", path=path,
                 source=source, needs=tuple(dict.fromkeys(needs))), []


def user_dirs(ws: Workspace) -> list[Path]:
    """`[skills] dirs`, relative to FORGE_HOME unless absolute."""
    out = []
    for d in ws.config.settings.skills.dirs:
        p = Path(d).expanduser()
        out.append(p if p.is_absolute() else ws.home / p)
    return out


def _scan(ws: Workspace) -> tuple[list[_File], list[str]]:
    """Every skill file, shipped first then the user folders in order (files sorted by
    path), parsed; and the problems of the folders themselves."""
    files: list[_File] = []
    problems: list[str] = []
    roots: list[tuple[Path, Source]] = [(SHIPPED_DIR, "shipped")]
    for d in user_dirs(ws):
        if not d.is_dir():
            problems.append(f"{d}: [skills] dirs names a folder that does not exist")
            continue
        roots.append((d, "user"))
    for root, source in roots:
        for p in sorted(root.rglob("*.md")):
            if p.name.lower() == "readme.md" or not p.is_file():
                continue
            skill, probs = parse_skill(p, source)
            files.append(_File(p, source, skill, probs))
    return files, problems


def _effective(files: list[_File]) -> dict[str, Skill]:
    """name -> skill: later files replace earlier ones (user over shipped, later folders
    over earlier)."""
    out: dict[str, Skill] = {}
    for f in files:
        if f.skill is not None:
            out[f.skill.name] = f.skill
    return out


def _ordered(skills: dict[str, Skill]) -> list[Skill]:
    return sorted(skills.values(), key=lambda s: (CATEGORIES.index(s.category), s.name))


def load_skills(ws: Workspace) -> list[Skill]:
    """The skills in effect, by category then name (module contract)."""
    files, _ = _scan(ws)
    return _ordered(_effective(files))


def find(ws: Workspace, *, category: str | None = None,
         task_type: str | None = None) -> list[Skill]:
    """The skills of `category` listed for `task_type` (None: any)."""
    if category is not None and category not in CATEGORIES:
        raise HarnessError(f"category {category!r} is not one of {', '.join(CATEGORIES)}")
    if task_type is not None and task_type not in TASK_TYPES:
        raise HarnessError(f"task type {task_type!r} is not one of {', '.join(TASK_TYPES)}")
    return [s for s in load_skills(ws)
            if (category is None or s.category == category) and s.listed_for(task_type)]


def get(ws: Workspace, name: str) -> Skill:
    skills = {s.name: s for s in load_skills(ws)}
    if name not in skills:
        raise HarnessError(f"no skill {name[:80]!r} (skills: {', '.join(sorted(skills))}; "
                           "forge skills list)")
    return skills[name]


# --- lint ---------------------------------------------------------------------------------


def _links(body: str) -> list[str]:
    """Link targets in markdown text, code blocks and code spans left out."""
    text = _CODE.sub("", _FENCE.sub("", body))
    return [m.group(1) for m in _LINK.finditer(text)]


def _dead_links(skill: Skill, names: set[str]) -> list[str]:
    dead = []
    for target in _links(skill.body):
        if target.startswith("#") or _SCHEME.match(target):
            continue
        rel = target.split("#", 1)[0].split("?", 1)[0]
        if not rel:
            continue
        if (skill.path.parent / rel).exists():
            continue
        if rel.endswith(".md") and Path(rel).stem in names:
            continue  # a link to a skill by its file name, wherever that skill lives
        dead.append(target)
    return dead


def recipes(body: str) -> list[list[str]]:
    """The commands of the skill's `forge run … -- CMD` recipes (module contract): each
    line of a fenced block (`\\` continuations joined) and each one-line code span."""
    lines: list[str] = []
    for m in _FENCE.finditer(body):
        lines += re.sub(r"\\\n\s*", " ", m.group(0)).splitlines()
    lines += [m.group(0).strip("`") for m in _CODE.finditer(_FENCE.sub("", body))]
    out = []
    for line in lines:
        at = line.find("forge run")
        if at < 0:
            continue
        try:
            words = shlex.split(line[at:], comments=True)
        except ValueError:
            words = line[at:].split()
        if "--" in words:
            out.append(words[words.index("--") + 1:])
    return out


def _needs_problems(skill: Skill) -> list[str]:
    """What the skill's recipes reach that its `needs` does not cover, and needs whose
    grant its text does not show."""
    problems = []
    for cmd in recipes(skill.body):
        servers = reach.named_endpoints(cmd)
        remote = [e for e in servers if not reach.is_loopback(reach.host_port(e)[0])]
        shown = " ".join(cmd)[:120]
        if remote and "network" not in skill.needs:
            problems.append(f"recipe `{shown}` reaches {', '.join(remote)} (another host) "
                            "but the skill does not declare `needs: [network]`")
        elif (servers or reach.runs_bench_client(cmd)) and not skill.needs:
            problems.append(f"recipe `{shown}` reaches "
                            f"{', '.join(servers) or 'a server (a benchmark client)'} under "
                            "a sandbox with the network off, but the skill declares no "
                            "allowance (`needs: [endpoint]` or `needs: [network]`)")
    for need in skill.needs:
        if not NEEDS[need].search(skill.body):
            grant = "sandbox: {endpoints: [http://127.0.0.1:30000]}" if need == "endpoint" \
                else "sandbox: {network: true}"
            problems.append(f"needs {need} but the text never shows a task how to grant it "
                            f"(e.g. `{grant}`)")
    return problems


def _body_key(body: str) -> str:
    return hashlib.sha256(" ".join(body.split()).encode("utf-8")).hexdigest()


def lint(ws: Workspace) -> list[str]:
    """Every problem of the shipped and user skills, one line each, `PATH: problem`."""
    files, problems = _scan(ws)
    for f in files:
        problems.extend(f"{f.path}: {p}" for p in f.problems)
    good = [f.skill for f in files if f.skill is not None]
    names = {s.name for s in good}
    for s in good:
        for target in _dead_links(s, names):
            problems.append(f"{s.path}: dead link {target!r} (no such file, no such skill)")
        problems.extend(f"{s.path}: {p}" for p in _needs_problems(s))
    by_name: dict[tuple[str, str], list[Skill]] = {}
    for s in good:
        by_name.setdefault((s.source, s.name), []).append(s)
    for (source, name), same in sorted(by_name.items()):
        if len(same) > 1:
            others = ", ".join(str(x.path) for x in same[:-1])
            problems.append(f"{same[-1].path}: duplicate name {name!r} among the {source} "
                            f"skills (also {others}); this one is used")
    by_body: dict[str, list[Skill]] = {}
    for s in good:
        by_body.setdefault(_body_key(s.body), []).append(s)
    for same in by_body.values():
        if len({s.name for s in same}) > 1:
            problems.append(f"{same[-1].path}: duplicate body: the same text as "
                            + ", ".join(f"{x.name} ({x.path})" for x in same[:-1]))
    return problems


# --- selection ----------------------------------------------------------------------------


def _similarities(ws: Workspace, skills: list[Skill], query: str) -> list[float]:
    """Cosine similarity of `query` to each skill (raises EmbeddingError)."""
    model = ws.config.settings.wiki.embedding_model
    cache = EmbeddingCache(ws.home / CACHE_NAME, model)
    texts = [s.embed_text() for s in skills]
    vecs = cache.embed(texts)
    if cache.dirty:  # being rewritten anyway: drop vectors of texts no skill has any more
        keep = {text_key(t) for t in texts}
        cache.vectors = {k: v for k, v in cache.vectors.items() if k in keep}
    cache.save()
    q = encode_query(query, model)
    return [float(x) for x in vecs @ q]


def select(ws: Workspace, task_type: str, query: str, k: int = 3, *,
           embeddings: bool | None = None) -> tuple[list[Skill], E.SkillsProvided]:
    """The skills for a block of a `task_type` task whose sub-goal is `query` (module
    contract), with the SkillsProvided that records them (not saved; no task or block).
    `embeddings` overrides `[wiki] embeddings`."""
    if task_type not in TASK_TYPES:
        raise HarnessError(f"task type {task_type!r} is not one of {', '.join(TASK_TYPES)}")
    skills = load_skills(ws)
    typed = [s for s in skills if s.listed_for(task_type)]
    use = ws.config.settings.wiki.embeddings if embeddings is None else embeddings
    fallback: str | None = None
    sims: list[float] = []
    if not use:
        why = "[wiki] embeddings = false" if embeddings is None else "asked for"
        fallback = f"embeddings are off ({why}): chosen by task type"
    elif not query.strip():
        fallback = "no sub-goal to retrieve on: chosen by task type"
    elif skills:
        try:
            sims = _similarities(ws, skills, query)
        except EmbeddingError as e:
            fallback = f"{e}: chosen by task type"
    if fallback is not None or not skills:
        chosen = [(s, 1.0, 0.0) for s in typed]
    else:
        sim = {s.name: x for s, x in zip(skills, sims, strict=True)}
        others = sorted((s for s in skills if not s.listed_for(task_type)
                         and sim[s.name] >= MIN_SIMILARITY),
                        key=lambda s: (-sim[s.name], s.name))[:max(k, 0)]
        chosen = [(s, 1.0, sim[s.name]) for s in typed]
        chosen += [(s, round(sim[s.name], 4), sim[s.name]) for s in others]
        chosen.sort(key=lambda c: (-c[2], c[0].name))
    ev = E.SkillsProvided(skills=[s.name for s, _, _ in chosen], query=query,
                          scores={s.name: score for s, score, _ in chosen}, fallback=fallback)
    return [s for s, _, _ in chosen], ev


def provide(ws: Workspace, task_id: str, block_id: str | None, task_type: str, sub_goal: str,
            *, k: int = 3, actor: E.Actor = E.SYSTEM, embeddings: bool | None = None
            ) -> E.SkillsProvided:
    """The SkillsProvided of a block (unsaved: the agent executor saves it with its block)."""
    _, ev = select(ws, task_type, sub_goal, k, embeddings=embeddings)
    return ev.model_copy(update={"task_id": task_id, "block_id": block_id, "actor": actor})


def render(skills: list[Skill]) -> str:
    """The skills as one markdown text for an agent's context."""
    return "\n\n".join(f"<skill name=\"{s.name}\" category=\"{s.category}\">\n{s.body.strip()}"
                       "\n</skill>" for s in skills)


# --- agent tools --------------------------------------------------------------------------


class ListArgs(Args):
    task_type: Literal[TASK_TYPES] | None = Field(  # type: ignore[valid-type]
        None, description="only skills listed for this task type")
    category: Literal[CATEGORIES] | None = Field(  # type: ignore[valid-type]
        None, description="only this category")


class GetArgs(Args):
    name: str = Field(min_length=1, max_length=MAX_PART_ID,
                      description="the skill's name, as skills_list gives it")


def _list(ctx: ToolContext, a: ListArgs) -> Any:
    return [s.entry() for s in find(ctx.ws, category=a.category, task_type=a.task_type)]


def _get(ctx: ToolContext, a: GetArgs) -> Any:
    return get(ctx.ws, a.name).as_dict()


TOOLS = [
    AgentTool("skills_list", "The skills (short guides: bench_serving, /metrics, PD, kernel "
              "checks, handoffs, noise, …): name, category, task types, one-line summary.",
              ListArgs, _list),
    AgentTool("skills_get", "One skill's full text, by name.", GetArgs, _get),
]
