"""`forge retrieve`: semantic search over decisions, handoffs and task goals.

The corpus comes from the index (caught up first); vectors come from the embedding cache
that `forge wiki build` fills, so after a build only the query is embedded. A `Retriever`
holds the corpus as one float32 matrix (rows L2-normalized: a query is one matrix-vector
product and an argpartition). `forge wiki serve` keeps one warm; `retrieve()` keeps the last
one per (workspace, index position, model) in the process, so a long-lived caller (the MCP
server's journal_retrieve) loads the corpus once and again only after the ledger moved.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..ledger.workspace import Workspace
from ..projections.index import open_index
from .embed import EmbeddingCache, encode_query
from .pages import decision_path, decision_text, task_path, task_text

if TYPE_CHECKING:  # imported where used: importing the wiki (every forge command) stays fast
    import numpy as np

_FACETS = "model, task_type, accelerator, engine, runtime_profile"
CORPUS_SQL = f"""
SELECT 'decision' AS kind, decision_id AS id, task_id, block_id, position,
       kind AS decision_kind, candidate_key, reason, NULL AS title, NULL AS goal,
       NULL AS state_reached, NULL AS findings, NULL AS next_sub_goal, {_FACETS}
FROM decisions
UNION ALL
SELECT 'handoff', event_id, task_id, block_id, position, NULL, NULL, NULL, NULL, NULL,
       state_reached, findings, next_sub_goal, NULL, NULL, NULL, NULL, NULL
FROM handoffs
UNION ALL
SELECT 'task', task_id, task_id, NULL, defined_position, NULL, NULL, NULL, title, goal,
       NULL, NULL, NULL, {_FACETS}
FROM tasks
ORDER BY position, kind, id
"""


@dataclass
class Doc:
    kind: str
    id: str
    task_id: str | None
    block_id: str | None
    text: str
    url: str
    title: str


def corpus_docs(con: Any) -> list[Doc]:
    """Decisions, handoffs and task goals. Texts leave out ids (they are in the metadata),
    so decision and task texts equal the wiki's page embeddings and share their cache."""
    rel = con.execute(CORPUS_SQL)
    names = [d[0] for d in rel.description]
    docs = []
    for row in rel.fetchall():
        r = dict(zip(names, row, strict=True))
        kind, task, block = r["kind"], r["task_id"], r["block_id"]
        if kind == "decision":
            d = {**r, "kind": r["decision_kind"], "decision_id": r["id"]}
            docs.append(Doc(kind, str(r["id"]), task, block, decision_text(d),
                            decision_path(d) + ".html",
                            f"{r['decision_kind']} decision in {task}"))
        elif kind == "handoff":
            text = ". ".join(x for x in (
                r["state_reached"], "; ".join(r["findings"] or []),
                f"next: {r['next_sub_goal']}" if r["next_sub_goal"] else "") if x)
            docs.append(Doc(kind, str(r["id"]), task, block, text or "handoff",
                            task_path(task or "") + ".html",
                            f"handoff {task}/{block or 'task'}"))
        else:
            docs.append(Doc(kind, str(r["id"]), task, None, task_text(r),
                            task_path(r["id"]) + ".html", f"task {r['id']}"))
    return docs


class Retriever:
    def __init__(self, docs: list[Doc], vecs: np.ndarray, model: str | None = None):
        import numpy as np

        self.docs, self.model = docs, model
        self.vecs = np.ascontiguousarray(vecs, dtype=np.float32)
        self.kinds = np.array([d.kind for d in docs], dtype=object)

    @classmethod
    def from_index(cls, ws: Workspace, model: str | None = None) -> Retriever:
        with open_index(ws) as s:
            docs = corpus_docs(s.con)
        cache = EmbeddingCache(Path(ws.home) / "wiki" / "_embeddings.npz", model)
        vecs = cache.embed([d.text for d in docs])
        cache.save()
        return cls(docs, vecs, model)

    def search(self, query: str, k: int = 10,
               kinds: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        if not self.docs:
            return []
        import numpy as np

        q = encode_query(query, self.model)
        scores = self.vecs @ q
        if kinds:
            scores = np.where(np.isin(self.kinds, list(kinds)), scores, -np.inf)
        k = min(k, len(self.docs))
        top = np.argpartition(-scores, k - 1)[:k]
        ranked = sorted(top, key=lambda i: (-scores[i], i))
        return [{"score": round(float(scores[i]), 4), "kind": self.docs[i].kind,
                 "id": self.docs[i].id, "task_id": self.docs[i].task_id,
                 "block_id": self.docs[i].block_id, "title": self.docs[i].title,
                 "url": self.docs[i].url, "text": self.docs[i].text}
                for i in ranked if np.isfinite(scores[i])]


_WARM: dict[tuple[str, str | None], tuple[int, Retriever]] = {}


def warm_retriever(ws: Workspace, model: str | None = None) -> Retriever:
    """The process's Retriever for this workspace and model, loaded again only when the
    index moved past the position it was loaded at."""
    with open_index(ws) as s:
        position = s.caught_up.position if s.caught_up else 0
    key = (str(Path(ws.home).resolve()), model)
    kept = _WARM.get(key)
    if kept is None or kept[0] != position:
        _WARM[key] = kept = (position, Retriever.from_index(ws, model))
    return kept[1]


def retrieve(ws: Workspace, query: str, k: int = 10, kinds: tuple[str, ...] = (),
             model: str | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    model = model or ws.config.settings.wiki.embedding_model
    r = warm_retriever(ws, model)
    t1 = time.perf_counter()
    results = r.search(query, k, kinds)
    return {"query": query, "results": results, "corpus": len(r.docs),
            "load_s": round(t1 - t0, 3), "search_s": round(time.perf_counter() - t1, 4)}
