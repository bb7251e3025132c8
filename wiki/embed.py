"""Sentence embeddings for related pages and retrieval, with a cache keyed by text hash.

The model, its offline loading and the cache live in `projections/embed.py` (shared with skill
selection); this module is the journal's face on them: the same names, and a model that cannot
load is a `WikiError` here (one line), as every journal error is. The journal's cache is
`wiki/_embeddings.npz`: a rebuilt wiki re-embeds only texts it has not seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..projections import embed as _embed
from ..projections.embed import DEFAULT_MODEL, EmbeddingError, text_key
from .errors import WikiError

if TYPE_CHECKING:  # imported where used: importing the wiki (every forge command) stays fast
    import numpy as np

__all__ = ["DEFAULT_MODEL", "EmbeddingCache", "encode_query", "load_model", "model_path",
           "text_key"]


@contextmanager
def _as_wiki_error() -> Iterator[None]:
    try:
        yield
    except EmbeddingError as e:
        raise WikiError(str(e)) from None


def model_path(name: str | None) -> str:
    with _as_wiki_error():
        return _embed.model_path(name)


def load_model(name: str | None = None) -> Any:
    with _as_wiki_error():
        return _embed.load_model(name)


class EmbeddingCache(_embed.EmbeddingCache):
    """sha256(text) -> vector, persisted as one .npz per model."""

    def embed(self, texts: list[str], batch_size: int = 128) -> np.ndarray:
        with _as_wiki_error():
            return super().embed(texts, batch_size)


def encode_query(text: str, model_name: str | None = None) -> np.ndarray:
    with _as_wiki_error():
        return _embed.encode_query(text, model_name)
