"""Optional narrative paragraphs from a model behind any OpenAI-compatible endpoint
(forge.toml `[wiki.narrative] url = "http://127.0.0.1:30000/v1"`, `model = "…"`,
optional `api_key_env`). Pages are complete without it; a failing endpoint costs one
attempt per build and is reported, never fatal. Answers are cached by page content. The
request goes through the caller's `post` (chat.py: the one outbound client, from cli.py);
without one the endpoint counts as failing.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from .chat import Post, complete
from .errors import WikiError
from .page import Page, to_markdown

CACHE = "_narrative.json"
KINDS = ("task", "decision")
PROMPT = ("You write the narrative paragraph of an engineering journal page about LLM "
          "inference optimization. Using only the facts on the page below, explain in at "
          "most four sentences what was tried, what the measurements and gates showed, and "
          "why the outcome follows. No speculation.\n\n")


def ask(post: Post | None, url: str, model: str | None, text: str, api_key: str | None = None,
        timeout: float = 60.0) -> str:
    content = complete(post, url, PROMPT + text, model=model or "default", max_tokens=220,
                       api_key=api_key, timeout_s=timeout)
    return " ".join(str(content).split())


def add_narratives(pages: list[Page], settings: Any, wiki_dir: Path,
                   post: Post | None = None) -> dict[str, int]:
    path = wiki_dir / CACHE
    cache: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    key_env = settings.narrative_key_env
    api_key = os.environ.get(key_env) if key_env else None
    stats = {"asked": 0, "cached": 0, "failed": 0}
    broken = False
    for p in pages:
        if p.kind not in KINDS:
            continue
        text = to_markdown(p)[:4000]
        key = hashlib.sha256(f"{settings.narrative_model}\n{text}".encode()).hexdigest()
        answer = cache.get(key)
        if answer is None and not broken:
            try:
                answer = ask(post, settings.narrative_url, settings.narrative_model, text,
                             api_key)
                cache[key] = answer
                stats["asked"] += 1
            except WikiError:
                broken = True  # one failure per build: the endpoint is down or not OpenAI-like
                stats["failed"] += 1
        elif answer is not None:
            stats["cached"] += 1
        if answer:
            p.blocks[2:2] = [("h", "Narrative"), ("p", answer)]
    wiki_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cache, indent=1, sort_keys=True))
    return stats
