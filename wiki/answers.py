"""Answers filed back into the journal (`forge wiki ask --file`).

Contract:
- `file_answer(ws, answer)` keeps the answer as a `FiledAnswer` in `answers/_answers.json`
  under the journal (the source of truth, by slug; written atomically) and writes its page
  `answers/<slug>.md` at once. The slug comes from the question (`page_name`), so asking the
  same question again and filing it replaces the earlier answer. Only a good answer is
  filed: at least one claim, every claim cited (an answer without one is refused, one line).
  The question and the claims are redacted (the ledger's redactor) before anything is written.
- A filed answer records the question, the ledger position it reflects, who phrased it (the
  compiler's extraction or `<tier>:<model>`), its claims with their citations, and each
  cited event's sha256 (type and stored payload, as the concept pages record their sources).
- `answer_pages(wiki_dir)`: the pages `forge wiki build` adds: one per filed answer (kind
  `answer`) and the list of them (`answers/index`, kind `answers`, linked from the home
  page). Filing drops the build's recorded position, so the next build renders them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..ledger.workspace import Workspace
from ..projections.index import open_index
from .ask import Answer
from .concepts.evidence import lookup
from .concepts.model import Claim, DroppedClaim, SourceEvent
from .concepts.render import cites
from .errors import WikiError
from .files import write_if_changed
from .numbers import count
from .page import Page, code, link, page_name, strong, text, to_markdown

ANSWERS_DIR = "answers"
RECORD = "_answers.json"
INDEX = f"{ANSWERS_DIR}/index"
RECORD_VERSION = 1


class FiledAnswer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    slug: str
    question: str
    position: int  # the ledger (index) position the answer reflects
    mode: str  # extractive | model
    author: str  # "compiler" or "<tier>:<model>"
    claims: tuple[Claim, ...] = Field(min_length=1)
    sources: tuple[SourceEvent, ...] = ()
    dropped: tuple[DroppedClaim, ...] = ()
    consulted: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        return f"{ANSWERS_DIR}/{self.slug}"


class AnswerRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = RECORD_VERSION
    answers: dict[str, FiledAnswer] = Field(default_factory=dict)


def load_answers(wiki_dir: Path) -> AnswerRecord:
    """The filed answers (empty when none, or when the record is damaged or of another
    version)."""
    try:
        raw = json.loads((Path(wiki_dir) / ANSWERS_DIR / RECORD).read_text(encoding="utf-8"))
        rec = AnswerRecord.model_validate(raw)
    except (OSError, ValueError):
        return AnswerRecord()
    return rec if rec.version == RECORD_VERSION else AnswerRecord()




def to_filed(answer: Answer, sources: dict[str, tuple[int, str, str]],
             clean: Callable[[str], str] = str) -> FiledAnswer:
    """The record of `answer`; `clean` redacts what a person or a model typed."""
    if not answer.claims or any(not c.citations for c in answer.claims):
        raise WikiError(f"question {answer.question[:80]!r}: the journal holds no cited answer "
                        "to it; nothing to file")
    claims = tuple(Claim(section="Answer", text=clean(c.text), citations=tuple(c.citations),
                         author="model" if answer.mode == "model" else "compiler")
                   for c in answer.claims)
    question = clean(answer.question)
    src = tuple(sorted((SourceEvent(event_id=i, position=p, type=t, sha256=h)
                        for i, (p, t, h) in sources.items()),
                       key=lambda s: (s.position, s.event_id)))
    return FiledAnswer(slug=page_name(question), question=question,
                       position=answer.position, mode=answer.mode,
                       author=answer.model or "compiler", claims=claims, sources=src,
                       dropped=tuple(DroppedClaim(text=clean(d["text"]), reason=d["reason"])
                                     for d in answer.dropped),
                       consulted=tuple(answer.consulted))


def file_answer(ws: Workspace, answer: Answer) -> FiledAnswer:
    """File `answer` as a journal page (module contract); sets `answer.filed`."""
    with open_index(ws) as s:
        sources = lookup(s.con, answer.cited())
    filed = to_filed(answer, sources, ws.ledger.redactor.text)  # nothing secret is written
    wiki_dir = Path(ws.home) / "wiki"
    rec = load_answers(wiki_dir)
    new = AnswerRecord(answers={**rec.answers, filed.slug: filed})
    write_if_changed(wiki_dir / ANSWERS_DIR / RECORD,
           json.dumps(new.model_dump(mode="json"), sort_keys=True, indent=1,
                      ensure_ascii=False))
    write_if_changed(wiki_dir / f"{filed.path}.md", to_markdown(answer_page(filed)))
    state = wiki_dir / "_state.json"  # the next build renders the new page (build.STATE)
    try:
        st = json.loads(state.read_text())
        st.pop("position", None)
        write_if_changed(state, json.dumps(st, indent=1))
    except (OSError, ValueError, AttributeError):
        pass
    answer.filed = filed.path
    return filed


def answer_page(a: FiledAnswer) -> Page:
    p = Page(a.path, "answer", f"Q: {a.question}", position=a.position,
             summary=" ".join(c.text for c in a.claims)[:300],
             meta={"question": a.question, "position": a.position, "mode": a.mode,
                   "author": a.author, "claims": len(a.claims), "sources": len(a.sources),
                   "dropped": len(a.dropped)},
             embed=a.question)
    p.add("p", text(strong("Question:"), f" {a.question}"))
    p.add("p", text(f"Answered at ledger position {a.position} by the {a.mode} answer"
                    + (f" ({a.author})" if a.mode == "model" else "")
                    + f", from {len(a.sources)} events. See all ", link(INDEX, "answers"), "."))
    p.add("h", "Answer")
    p.add("list", [text(c.text, " ", cites(c.citations)) for c in a.claims])
    if a.consulted:
        p.add("h", "Pages read")
        p.add("list", [link(x, x) for x in a.consulted])
    p.add("h", "Sources")
    p.add("table", ["event", "type", "position", "sha256"],
          [(code(s.event_id), s.type, s.position, code(s.sha256[:16])) for s in a.sources])
    if a.dropped:
        p.add("h", "Dropped claims")
        p.add("list", [f"{d.text} — {d.reason}" for d in a.dropped])
    return p


def answer_pages(wiki_dir: Path) -> list[Page]:
    """The filed answers' pages and their index page; none when nothing was filed."""
    rec = load_answers(wiki_dir)
    if not rec.answers:
        return []
    items = sorted(rec.answers.values(), key=lambda a: (a.position, a.slug))
    idx = Page(INDEX, "answers", "Filed answers", position=max(a.position for a in items),
               summary=f"{count(len(items), 'answer')} filed with forge wiki ask --file")
    idx.add("list", [text(link(a.path, a.question), f" — position {a.position}, "
                      f"{count(len(a.claims), 'claim')}") for a in items])
    return [idx, *(answer_page(a) for a in items)]


def as_dict(a: FiledAnswer) -> dict[str, Any]:
    return {"path": a.path, **a.model_dump(mode="json")}
