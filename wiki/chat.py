"""The journal's model calls (narrative paragraphs, concept syntheses, phrased answers): one
chat completion from an OpenAI-compatible endpoint, sent by the caller's `Post`.

Contract:
- The wiki has no HTTP client of its own: it may not import harness/, where the one outbound
  client lives (harness/guard/outbound.py). A wiki function that may ask a model takes
  `post`; cli.py passes `wiki_post`, the outbound client on the model tiers' rules (no
  redirect followed, a byte cap, one deadline on the whole response).
- `Post(url, body, headers, timeout_s) -> bytes`: POST `body` to `url`; the body of a 2xx
  response, or `WikiError` with one line (the endpoint's failure, its cap, its deadline).
- `complete(post, url, ...)` -> the reply's content. Without a `post` (a library caller that
  gave none) or with a reply that is not a chat completion it raises `WikiError`: the callers
  report it as a failing endpoint (never fatal; the pages stay deterministic).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from .errors import WikiError

Post = Callable[[str, bytes, Mapping[str, str], float], bytes]


def complete(post: Post | None, url: str, prompt: str, *, model: str,
             temperature: float = 0.0, max_tokens: int = 512, api_key: str | None = None,
             timeout_s: float = 60.0) -> Any:
    """The content of the first choice of one chat completion (module contract)."""
    if post is None:
        raise WikiError(f"{url}: no outbound HTTP client was given for the model call")
    body = {"model": model, "temperature": temperature, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompt}]}
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    raw = post(url.rstrip("/") + "/chat/completions", json.dumps(body).encode(), headers,
               timeout_s)
    try:
        return json.loads(raw)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise WikiError(f"{url}: not a chat completion ({type(e).__name__}: "
                        f"{' '.join(str(e).split())[:120]})") from None
