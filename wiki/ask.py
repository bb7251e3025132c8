"""`forge wiki ask "QUESTION"`: an answer from the journal, every claim with its citations.

Contract:
- Where it looks, in order: the concept catalog (`concepts/_catalog.json`, compiled by
  `forge wiki compile`): the concept pages whose key, title or summary match the question, and
  their claims; then the pages their citations link to (the decisions they cite, read from the
  index); then the index itself (decisions, handoffs, task goals and exits), matched by words;
  and only when all that matches nothing, retrieval by embeddings (`wiki/retrieve.py`).
- Matching is by words (lowercased, split on anything not a letter or a digit, a few suffixes
  stemmed, common words left out), weighted by how rare a word is among the documents read.
  The same question on the same record gives the same answer.
- Without a model tier the answer is extractive: the best-matching claims (at most
  `MAX_CLAIMS`), each with the ledger events it cites. With a `[models.<tier>]` tier the
  model phrases the answer from those claims and their cited events only, marking each
  sentence with `[e:<event id>]` (the request sent by the caller's `post`, wiki/chat.py: cli.py
  passes the one outbound client); each sentence goes through the compile's citation check
  (`concepts.claims`: the ids must be among the evidence given, the figures in the cited
  events) and is dropped with its reason otherwise. A model that fails, or whose every
  sentence is dropped, leaves the extractive answer (and says so in `note`).
- A citation is an event id with its type, ledger position and the journal page that shows
  it (a decision's page, else its task's page); `url` is that page on the site.
- Reads only (the index, the catalog, the embedding cache); filing is answers.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..ledger.titles import BASELINE, candidate_title_of_key
from ..ledger.workspace import Workspace
from ..projections.index import open_index, tracked_position
from .chat import Post
from .concepts import claims as C
from .concepts import evidence
from .concepts.compiler import ask as chat
from .concepts.compiler import tier_settings
from .concepts.evidence import lookup, payloads
from .concepts.freshness import page_states
from .concepts.model import Catalog, Citation, ConceptPage, load_catalog
from .embed import EmbeddingCache
from .errors import WikiError
from .pages import decision_path, task_path
from .record_lint import stale_by_decision
from .retrieve import Retriever, corpus_docs

MAX_CLAIMS = 8
MAX_CONCEPTS = 3
KEEP = 0.35  # a claim scoring under this share of the best one is left out
CONCEPT_BONUS = 0.5  # a claim on a matched concept page gets this share of the page's score
MIN_SIMILARITY = 0.2  # retrieval hits less similar (cosine) than this are left out
PAYLOAD_CHARS = 1200  # of each cited event shown to the model
STOP = frozenset("""a about after again all also am an and any are as at be been before being
but by can could did do does doing for from had has have how i if in into is it its just me
more most my no nor not of on once only or other our out over own same should so some such
than that the their them then there these they this those through to too under until up very
was we were what when where which while who whom why will with would you your know tell show
there's what's""".split())
_WORD = re.compile(r"[a-z0-9]+")
_SUFFIXES = ("ations", "ation", "ions", "ion", "ing", "ed", "es", "s")

PROMPT = """You answer an engineer's question about LLM inference optimization from an
engineering journal. Use only the evidence below: each item is a claim with the ledger
events it comes from. Write at most six short sentences. End every sentence with the markers
of the events it comes from, like [e:<event id>], using only ids given below. State only
figures that appear in the cited events. If the evidence does not answer the question, say so
in one sentence that cites the closest evidence."""


def stem(word: str) -> str:
    for s in _SUFFIXES:
        if word.endswith(s) and len(word) - len(s) >= 4:
            return word[:-len(s)]
    return word


def terms(text: str) -> set[str]:
    """The words of `text` that matching looks at (stemmed; common words left out)."""
    return {stem(w) for w in _WORD.findall(text.lower()) if w not in STOP}


@dataclass
class AnswerClaim:
    text: str
    citations: list[Citation]
    source: str  # the page it was read from (a concept or decision page), or "retrieval"
    score: float = 0.0
    caveats: list[str] = field(default_factory=list)  # a stale claim it cites, a stale page

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "source": self.source, "score": round(self.score, 4),
                "caveats": self.caveats,
                "citations": [{**c.model_dump(), "url": f"{c.page}.html" if c.page else None}
                              for c in self.citations]}


@dataclass
class Answer:
    question: str
    position: int  # the ledger position the answer reflects
    claims: list[AnswerClaim] = field(default_factory=list)
    dropped: list[dict[str, str]] = field(default_factory=list)  # {text, reason}
    mode: str = "extractive"  # extractive | model
    model: str | None = None  # "<tier>:<model>" when a model phrased it
    consulted: list[str] = field(default_factory=list)  # pages read, in order
    route: list[str] = field(default_factory=list)  # catalog, index, retrieval
    note: str | None = None
    filed: str | None = None  # the journal page it was filed as
    caveats: list[str] = field(default_factory=list)  # of every claim, once each

    def cited(self) -> list[str]:
        return list(dict.fromkeys(c.event_id for cl in self.claims for c in cl.citations))

    def as_dict(self) -> dict[str, Any]:
        return {"question": self.question, "position": self.position, "mode": self.mode,
                "model": self.model, "answer": self.text(),
                "claims": [c.as_dict() for c in self.claims], "cited": self.cited(),
                "dropped": self.dropped, "consulted": self.consulted, "route": self.route,
                "caveats": self.caveats, "note": self.note, "filed": self.filed}

    def text(self) -> str:
        """The answer as text: one line per claim, its citations as `[e:<id>]`."""
        if not self.claims:
            return "The journal holds nothing that answers this."
        return "\n".join(f"{c.text} " + " ".join(f"[e:{x.event_id}]" for x in c.citations)
                         for c in self.claims)


# --- what is read ------------------------------------------------------------------------


@dataclass
class _Doc:
    text: str  # what is matched (and, for index documents, the claim)
    ids: list[str]  # the events it cites
    pages: dict[str, str]  # event id -> the page showing it
    source: str
    bonus: float = 0.0
    keys: str = ""  # more text that is matched but not shown (concept keys, candidates)


def _rows(con: Any, sql: str) -> list[dict[str, Any]]:
    rel = con.execute(sql)
    names = [d[0] for d in rel.description]
    return [dict(zip(names, r, strict=True)) for r in rel.fetchall()]


def _where(r: dict[str, Any]) -> str:
    parts = [str(r[k]) for k in ("model", "accelerator", "engine") if r.get(k)]
    rp = r.get("runtime_profile")
    return " / ".join(parts) + (f" ({rp})" if rp else "")


def _candidate(key: str | None) -> str:
    # The journal's spelling of a candidate (ledger/titles.py), so an answer cites what the
    # pages show.
    title = candidate_title_of_key(key)
    return "the baseline" if title == BASELINE else title


def _decision_doc(d: dict[str, Any]) -> _Doc:
    page = decision_path(d)
    ids = [d["decision_id"], *(d.get("evidence") or [])]
    if d.get("verification_event_id"):
        ids.append(d["verification_event_id"])
    ids = list(dict.fromkeys(str(i) for i in ids if i))
    text = (f"{d['kind'].capitalize()}: {_candidate(d['candidate_key'])} in task "
            f"{d['task_id']} block {d['block_id'] or '-'} on {_where(d)}: "
            f"{d['reason'] or '(no reason recorded)'}")
    return _Doc(text, ids, {i: page for i in ids}, page, keys=f"{d['candidate_key']} {d['kind']}")


def index_docs(con: Any) -> list[_Doc]:
    """Decisions, handoffs and tasks (goal and exit) as documents with their citations."""
    docs = [_decision_doc(d) for d in _rows(con, """
        SELECT decision_id, task_id, block_id, kind, candidate_key, reason, evidence,
               verification_event_id, model, accelerator, engine, runtime_profile
        FROM decisions ORDER BY position, decision_id""")]
    for h in _rows(con, """SELECT event_id, task_id, block_id, outcome, state_reached,
                                  findings, next_sub_goal FROM handoffs
                           WHERE event_id IS NOT NULL ORDER BY position, event_id"""):
        bits = [h["state_reached"] or ""]
        if h["findings"]:
            bits.append("findings: " + "; ".join(h["findings"]))
        if h["next_sub_goal"]:
            bits.append(f"next: {h['next_sub_goal']}")
        page = task_path(h["task_id"] or "")
        docs.append(_Doc(f"Handoff of {h['task_id']} block {h['block_id'] or '-'} "
                         f"({h['outcome']}): " + "; ".join(b for b in bits if b),
                         [str(h["event_id"])], {str(h["event_id"]): page}, page))
    ids: dict[str, list[str]] = {}
    for eid, tid in con.execute(
            """SELECT event_id, task_id FROM events WHERE type IN ('TaskDefined', 'TaskExited')
               AND task_id IS NOT NULL ORDER BY position""").fetchall():
        ids.setdefault(tid, []).append(str(eid))
    for t in _rows(con, """SELECT task_id, task_type, goal, exit_state, exit_reason, model,
                                  accelerator, engine, runtime_profile
                           FROM tasks ORDER BY task_id"""):
        tid = t["task_id"]
        if tid not in ids:
            continue
        page = task_path(tid)
        ex = (f"; exit {t['exit_state']}: {t['exit_reason']}" if t["exit_state"] else "")
        docs.append(_Doc(f"Task {tid} ({t['task_type']}) on {_where(t)}: {t['goal']}{ex}",
                         ids[tid], {i: page for i in ids[tid]}, page))
    return docs


def _concept_docs(page: ConceptPage, bonus: float) -> list[_Doc]:
    return [_Doc(c.text, [x.event_id for x in c.citations],
                 {x.event_id: x.page for x in c.citations if x.page}, page.path, bonus,
                 keys=page.concept) for c in page.claims]


def _score(doc_terms: set[str], wanted: set[str], idf: dict[str, float]) -> float:
    return sum(idf.get(t, 0.0) for t in wanted & doc_terms)


def _idf(docs: list[set[str]]) -> dict[str, float]:
    df: dict[str, int] = {}
    for ts in docs:
        for t in ts:
            df[t] = df.get(t, 0) + 1
    n = max(1, len(docs))
    return {t: math.log(1 + n / c) for t, c in df.items()}


def gather(con: Any, wiki_dir: Path, question: str, answer: Answer) -> list[_Doc]:
    """The documents that answer `question`, best first (the catalog, the pages its
    citations link to, the index); `answer.consulted` and `.route` say what was read."""
    wanted = terms(question)
    catalog = load_catalog(wiki_dir)
    index = index_docs(con)
    pool_terms = [terms(f"{p.concept} {p.title} {p.summary}") for p in catalog.pages.values()]
    idx_terms = [terms(f"{d.text} {d.keys}") for d in index]
    idf = _idf(pool_terms + idx_terms)
    pages = sorted(((_score(ts, wanted, idf), p.slug, p)
                    for ts, p in zip(pool_terms, catalog.pages.values(), strict=True)),
                   key=lambda x: (-x[0], x[1]))
    best = pages[0][0] if pages else 0.0
    chosen = [p for s, _, p in pages[:MAX_CONCEPTS] if s > 0 and s >= KEEP * best]
    docs: list[_Doc] = []
    if catalog.pages:
        answer.route.append("catalog")
    for p in chosen:
        answer.consulted.append(p.path)
        docs += _concept_docs(p, CONCEPT_BONUS * _score(terms(f"{p.concept} {p.title}"),
                                                        wanted, idf))
    # Follow the links: the decisions the chosen pages cite, read from the index.
    cited = {i for d in docs for i in d.ids}
    linked = [d for d in index if d.source.startswith("decisions/") and d.ids[0] in cited]
    for d in linked:
        if d.source not in answer.consulted:
            answer.consulted.append(d.source)
        d.bonus = max(d.bonus, CONCEPT_BONUS * best)
    answer.route.append("index")
    docs += index
    scored = [(_score(terms(f"{d.text} {d.keys}"), wanted, idf) + d.bonus, d) for d in docs]
    return [d for _, d in _rank(scored)]


def _rank(scored: list[tuple[float, _Doc]]) -> list[tuple[float, _Doc]]:
    scored = [x for x in scored if x[0] > 0]
    if not scored:
        return []
    best = max(s for s, _ in scored)
    seen: set[str] = set()
    out = []
    for s, d in sorted(scored, key=lambda x: (-x[0], x[1].source, x[1].text)):
        if s < KEEP * best or d.text in seen:
            continue
        seen.add(d.text)
        d.bonus = s  # the score it is kept with
        out.append((s, d))
    return out[:MAX_CLAIMS]


def _retrieval_docs(ws: Workspace, question: str, con: Any) -> list[_Doc]:
    # The retriever of `forge retrieve`, on this session's connection (the index is locked)
    model = ws.config.settings.wiki.embedding_model
    corpus = corpus_docs(con)
    cache = EmbeddingCache(Path(ws.home) / "wiki" / "_embeddings.npz", model)
    vecs = cache.embed([d.text for d in corpus])
    cache.save()
    hits = Retriever(corpus, vecs, model).search(question, k=MAX_CLAIMS)
    by_id = {d.ids[0]: d for d in index_docs(con)}
    out = []
    for h in hits:
        d = by_id.get(str(h["id"]))
        if d is None and h["kind"] == "task":
            d = next((x for x in by_id.values() if x.source == task_path(str(h["id"]))
                      and x.text.startswith("Task ")), None)
        if d is not None and h["score"] >= MIN_SIMILARITY:
            d.source, d.bonus = "retrieval", float(h["score"])
            out.append(d)
    return out


def _citations(con: Any, docs: list[_Doc]) -> dict[str, Citation]:
    ids = sorted({i for d in docs for i in d.ids})
    known = lookup(con, ids)
    pages: dict[str, str] = {}
    for d in docs:
        for i, p in d.pages.items():
            pages.setdefault(i, p)
    return {i: Citation(event_id=i, position=known[i][0], type=known[i][1],
                        page=pages.get(i)) for i in ids if i in known}


def caveats(con: Any, wiki_dir: Path, answer: Answer) -> None:
    """What the reader should know about a claim: a finding it cites whose runtime profile
    moved on without a re-verification (lint's stale claims), a concept page it comes from
    that is stale or orphaned now."""
    stale = stale_by_decision(con)
    pages = {p.path: p for p in load_catalog(wiki_dir).pages.values()}
    used = {c.source: pages[c.source] for c in answer.claims if c.source in pages}
    states = page_states(evidence.load(con), Catalog(pages={p.slug: p for p in used.values()})
                         ) if used else {}
    for c in answer.claims:
        for x in c.citations:
            if x.event_id in stale:
                c.caveats.append(f"stale claim {x.event_id}: {stale[x.event_id]}")
        page = used.get(c.source)
        if page is not None and states[page.slug][0] != "fresh":
            state, why = states[page.slug]
            c.caveats.append(f"{page.path} is {state}: " + "; ".join(why))
        answer.caveats += [v for v in c.caveats if v not in answer.caveats]


# --- the model tier -------------------------------------------------------------------------


def phrase(con: Any, tier: str, settings: Any, answer: Answer, post: Post | None = None
           ) -> None:
    """Let the tier's model phrase `answer` from its claims; keep what passes the check."""
    ids = answer.cited()
    evidence = payloads(con, ids)
    lines = []
    for c in answer.claims:
        lines.append(f"- {c.text} " + " ".join(f"[e:{x.event_id}]" for x in c.citations))
    lines.append("\nThe cited events (type, payload):")
    for x in {x.event_id: x for cl in answer.claims for x in cl.citations}.values():
        lines.append(f"[e:{x.event_id}] {x.type}: {evidence.get(x.event_id, '')[:PAYLOAD_CHARS]}")
    prompt = f"{PROMPT}\n\nQuestion: {answer.question}\n\nEvidence:\n" + "\n".join(lines)
    try:
        reply = chat(post, settings, prompt)
    except WikiError as e:
        answer.note = f"model tier {tier} failed ({' '.join(str(e).split())[:200]}); " \
                      "the extractive answer stands"
        return
    kept, dropped = C.split(reply, evidence)
    answer.dropped = [{"text": d.text, "reason": d.reason} for d in dropped]
    cites = {x.event_id: x for cl in answer.claims for x in cl.citations}
    claims = [AnswerClaim(t, [cites[i] for i in ids_], "model") for t, ids_ in kept]
    if not claims:
        answer.note = (f"every sentence of model tier {tier} was dropped by the citation "
                       "check; the extractive answer stands")
        return
    answer.claims, answer.mode = claims, "model"
    answer.model = f"{tier}:{settings.model}"


# --- the command ----------------------------------------------------------------------------


def ask(ws: Workspace, question: str, *, tier: str | None = None,
        deterministic: bool = False, embeddings: bool = True, post: Post | None = None
        ) -> Answer:
    """Answer `question` from the journal (module contract). The model tier: `tier`, else
    `[models.wiki]` when forge.toml has it (as `forge wiki compile`); none if
    `deterministic`; its requests sent by `post`. `embeddings`: may fall back to retrieval."""
    question = " ".join(question.split())
    if not terms(question):
        raise WikiError(f"question {question[:80]!r}: no word to look for (ask about a flag, "
                        "a model, an accelerator, a failure, …)")
    if len(question) > 2000:
        raise WikiError(f"question: {len(question)} characters, at most 2000")
    model = tier_settings(ws, tier, deterministic)  # an unknown tier fails before any work
    embeddings = embeddings and ws.config.settings.wiki.embeddings
    wiki_dir = Path(ws.home) / "wiki"
    with open_index(ws) as s:
        answer = Answer(question, tracked_position(s.con))
        docs = gather(s.con, wiki_dir, question, answer)
        if not docs and embeddings:
            answer.route.append("retrieval")
            docs = _retrieval_docs(ws, question, s.con)
        cites = _citations(s.con, docs)
        for d in docs:
            cs = [cites[i] for i in d.ids if i in cites]
            if cs:  # nothing uncited is answered
                answer.claims.append(AnswerClaim(d.text, cs, d.source, d.bonus))
        caveats(s.con, wiki_dir, answer)
        if model is not None and answer.claims:
            phrase(s.con, model[0], model[1], answer, post)
    return answer
