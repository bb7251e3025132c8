"""The citation check on generated text: a model's page (or an answer) is split into
sentences; a sentence is published only when it cites ledger events (`[e:<event id>]`),
every cited id is an event the index holds, and every figure it states is in one of its cited
events. Anything else is dropped with the reason. Pure: the caller passes the events'
payloads (`evidence.payloads`).

A figure is a number standing on its own (`1.4`, `40%`, `1.05x`; not the digits inside a
name such as `bfloat16`, `H200` or `-O1`). It is supported when a cited payload holds a
number equal to it at the precision it is written with, as a percentage (x·100) or as a
change in percent (|x − 1|·100, from a ratio), or when it counts the sentence's citations.

A concept page's synthesis is checked against the page too (`Concept`): a sentence must cite
only the page's own evidence (the events its compiled claims cite) and name the page's
concept (one of `concept_terms`: a flag's key or value, a pairing's model or accelerator, a
gate, rule or candidate's names). A true sentence about something else is dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .model import DroppedClaim

CITE = re.compile(r"\[e:([0-9A-Za-z][0-9A-Za-z_.:-]{0,79})\]")
FIGURE = re.compile(r"(?<![A-Za-z0-9_.\-])[-+]?(\d+(?:\.\d+)?)(?=(?:%|x|×)?(?![A-Za-z0-9_]))")
_NUMBER = re.compile(r"(?<![A-Za-z0-9_.])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?(?![A-Za-z0-9_])")
# Payload fields that hold ids, times and digests, not figures
_SKIP = frozenset({"event_id", "occurred_at", "command_id", "causation_id", "input_digests",
                   "actor", "evidence", "verification_event_id", "_v"})
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[^a-z\s])")
_BULLET = re.compile(r"^\s*(?:[-*+]|\d{1,3}[.)])\s+")


def sentences(text: str) -> list[str]:
    """The claims of a generated text: its lines, each split into sentences (a citation
    right after a sentence's full stop stays with it)."""
    out: list[str] = []
    for line in text.splitlines():
        line = _BULLET.sub("", line).strip().lstrip("#").strip()
        if not line:
            continue
        parts = _SENTENCE.split(line)
        for part in parts:
            part = part.strip()
            if not part:
                continue
            if CITE.fullmatch(part) is not None or (out and CITE.sub("", part).strip(" .") == ""
                                                    and part.startswith("[e:")):
                out[-1] = f"{out[-1]} {part}"  # citations after the full stop
            else:
                out.append(part)
    return out


def figures(sentence: str) -> list[str]:
    return [m.group(1) for m in FIGURE.finditer(CITE.sub(" ", sentence))]


def _walk(v: Any, out: set[float]) -> None:
    if isinstance(v, bool) or v is None:
        return
    if isinstance(v, int | float):
        out.add(float(v))
    elif isinstance(v, str):
        for m in _NUMBER.finditer(v):
            try:
                out.add(float(m.group()))
            except ValueError:
                continue
    elif isinstance(v, dict):
        for k, x in v.items():
            if k not in _SKIP:
                _walk(x, out)
    elif isinstance(v, list):
        for x in v:
            _walk(x, out)


def _numbers(payload: str) -> set[float]:
    """The figures an event's stored payload holds (numbers, and numbers written in its
    texts), not its ids, times or digests."""
    out: set[float] = set()
    try:
        _walk(json.loads(payload), out)
    except ValueError:
        _walk(payload, out)
    return out


def supported(figure: str, numbers: set[float], cites: int) -> bool:
    f = float(figure)
    decimals = len(figure.partition(".")[2])
    tol = 0.5 * 10 ** -decimals + 1e-9 * max(1.0, abs(f))
    if decimals == 0 and f == cites:
        return True
    for x in numbers:
        for y in (x, x * 100, abs(x - 1) * 100, abs(x)):
            if abs(y - f) <= tol:
                return True
    return False


def check(sentence: str, payloads: Mapping[str, str]) -> DroppedClaim | None:
    """None when `sentence` may be published; else why not. `payloads`: event id → its stored
    payload, for every event the index holds among those cited (a missing id: unknown)."""
    ids = CITE.findall(sentence)
    body = CITE.sub("", sentence).strip()
    if not body:
        return DroppedClaim(text=sentence, reason="no text")
    if not ids:
        return DroppedClaim(text=sentence, reason="uncited")
    unknown = [i for i in dict.fromkeys(ids) if i not in payloads]
    if unknown:
        return DroppedClaim(text=sentence, reason=f"cites an unknown event: {unknown[0]}")
    numbers: set[float] = set()
    for i in ids:
        numbers |= _numbers(payloads[i])
    for fig in figures(sentence):
        if not supported(fig, numbers, len(set(ids))):
            return DroppedClaim(text=sentence,
                                reason=f"figure {fig} is in none of its cited events")
    return None


# Words of a concept key that name no concept of their own (a kind's prefix, a boolean).
_GENERIC = frozenset({"gate", "rule", "node", "engine", "true", "false", "none", "null"})
_TERM = re.compile(r"[A-Za-z0-9_.\-]+")


def _words(text: str) -> str:
    """`text` for matching terms: lower case words (letters, digits, inner dots) between
    single spaces: `continuous_batching=true.` reads ` continuous batching true `."""
    words = (w.strip(".") for w in re.sub(r"[^a-z0-9.]+", " ", text.lower()).split())
    return " " + " ".join(w for w in words if w) + " "


def concept_terms(concept: str) -> frozenset[str]:
    """The names a sentence about `concept` ("kind:value") uses: the value's words (a
    dotted key also by its last part), less generic ones, numbers and one- or two-letter
    words."""
    _, _, value = concept.partition(":")
    out: set[str] = set()
    for tok in _TERM.findall(value):
        tok = tok.strip(".-")
        for t in (tok, tok.rsplit(".", 1)[-1]):
            t = t.lower()
            if len(t) > 2 and t not in _GENERIC and not re.fullmatch(r"[\d.\-]+", t):
                out.add(t)
    return frozenset(out)


@dataclass(frozen=True)
class Concept:
    """What a concept page's synthesis must concern: the concept key and the page's evidence
    (the events its compiled claims cite)."""

    concept: str
    evidence: frozenset[str]

    @property
    def terms(self) -> frozenset[str]:
        return concept_terms(self.concept)


def concerns(sentence: str, concept: Concept) -> DroppedClaim | None:
    """None when `sentence` (checked by `check`) is about the page's concept; else why not:
    it cites an event that is not the page's evidence, or names none of its terms."""
    foreign = [i for i in dict.fromkeys(CITE.findall(sentence)) if i not in concept.evidence]
    if foreign:
        return DroppedClaim(text=sentence, reason=f"cites an event that is not evidence of "
                            f"{concept.concept}: {foreign[0]}")
    terms = concept.terms
    body = _words(CITE.sub(" ", sentence))
    if terms and not any(_words(t) in body for t in terms):
        return DroppedClaim(text=sentence, reason=f"does not concern {concept.concept} (names "
                            f"none of: {', '.join(sorted(terms))})")
    return None


def split(text: str, payloads: Mapping[str, str], concept: Concept | None = None
          ) -> tuple[list[tuple[str, list[str]]], list[DroppedClaim]]:
    """(published: (text without markers, cited ids), dropped) of a generated text; with
    `concept`, a concept page's synthesis: its sentences must concern it (`concerns`)."""
    kept: list[tuple[str, list[str]]] = []
    dropped: list[DroppedClaim] = []
    for s in sentences(text):
        bad = check(s, payloads)
        if bad is None and concept is not None:
            bad = concerns(s, concept)
        if bad is not None:
            dropped.append(bad)
            continue
        ids = list(dict.fromkeys(CITE.findall(s)))
        kept.append((" ".join(CITE.sub("", s).split()).replace(" .", "."), ids))
    return kept, dropped
