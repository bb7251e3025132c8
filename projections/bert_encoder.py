"""A BERT sentence encoder in numpy: the journal's MiniLM without torch.

`forge retrieve` spent its first query loading torch, transformers and sentence-transformers
(3-16 s) to encode one sentence with a 6-layer model. This module runs the same model from
the same files with numpy, `tokenizers` and `safetensors` (~0.1 s to load), and gives the
vectors sentence-transformers gives (to float32 rounding: cosine > 0.9999 against it,
tests/projections/test_bert_encoder.py).

Contracts:
- `load(path)` reads a sentence-transformers model directory: `modules.json` (a Transformer,
  then a mean Pooling, optionally Normalize), `config.json` (`model_type: bert`, absolute
  positions, GELU), `sentence_bert_config.json` (`max_seq_length`, `do_lower_case`),
  `tokenizer.json` and `model.safetensors`. Any other shape raises `Unsupported` (the caller
  falls back to sentence-transformers); nothing here reads the network.
- `BertEncoder.encode(texts, batch_size=, normalize_embeddings=)` as sentence-transformers'
  `encode` with `convert_to_numpy=True`: texts stripped, tokenized with [CLS]/[SEP],
  truncated to `max_seq_length` tokens, padded per batch (padding masked out of attention
  and pooling), mean-pooled; rows L2-normalized when asked (or when the model's modules end
  in Normalize). Returns float32 (len(texts), hidden). It draws no progress bar.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: importing this module (every forge command) stays fast
    import numpy as np

_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"
_SCORES_BYTES = 64 << 20
_BATCH_TOKENS = 4096


class Unsupported(Exception):
    """The model directory is not a plain BERT mean-pooling sentence encoder."""


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise Unsupported(f"{path}: {e}") from None


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    import numpy as np

    mean = x.mean(-1, keepdims=True)
    var = np.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * g + b


# Numerical Recipes' erfc(z) = t·exp(-z² + P(t)), t = 1 / (1 + z/2): P's coefficients,
# highest first. Fractional error below 1.2e-7 everywhere: float32 resolution.
_ERFC = (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806,
         0.09678418, 0.37409196, 1.00002368, -1.26551223)


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's "gelu", the exact one (erf, as torch's nn.functional.gelu), on float32 in
    place where it can: a batch's activations are tens of millions of numbers, and scipy's
    erf would cost its import (~0.15 s) on every first query."""
    import numpy as np

    z = np.abs(x) * np.float32(1.0 / math.sqrt(2.0))
    t = z * np.float32(0.5)
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    p = np.full_like(t, _ERFC[0])
    for c in _ERFC[1:]:  # Horner
        p *= t
        p += np.float32(c)
    z *= z
    p -= z
    np.exp(p, out=p)
    p *= t  # erfc(|x|/√2)
    # 1 + erf(x/√2) is 2 - erfc for x >= 0, erfc for x < 0.
    out = np.where(x >= 0, np.float32(2.0) - p, p)
    out *= x
    out *= np.float32(0.5)
    return out


class BertEncoder:
    def __init__(self, weights: dict[str, np.ndarray], config: dict[str, Any], tokenizer: Any,
                 max_seq_length: int, do_lower_case: bool, normalize: bool):
        self.w = weights
        self.layers = int(config["num_hidden_layers"])
        self.heads = int(config["num_attention_heads"])
        self.hidden = int(config["hidden_size"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.tokenizer = tokenizer
        self.max_seq_length = max_seq_length
        self.do_lower_case = do_lower_case
        self.normalize = normalize
        self.pad_id = int(config.get("pad_token_id") or 0)

    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        import numpy as np

        w, n, hidden, heads = self.w, ids.shape[1], self.hidden, self.heads
        d = hidden // heads
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:n]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"],
                        self.eps)
        # Padding keys get the most negative float added, as transformers does.
        bias = ((1.0 - mask[:, None, None, :]) * np.finfo(np.float32).min).astype(np.float32)
        scale = np.float32(1.0 / math.sqrt(d))
        b = ids.shape[0]
        for i in range(self.layers):
            p = f"encoder.layer.{i}."

            def lin(h: np.ndarray, name: str, p: str = p) -> np.ndarray:
                # One (b·n, in) GEMM: a 3-D operand would be b small ones (~3x slower).
                out = h.reshape(-1, h.shape[-1]) @ w[p + name + ".weight"].T
                out += w[p + name + ".bias"]
                return out.reshape(*h.shape[:-1], out.shape[-1])

            def split(h: np.ndarray) -> np.ndarray:  # (b, n, hidden) -> (b, heads, n, d)
                return h.reshape(b, n, heads, d).transpose(0, 2, 1, 3)

            q = split(lin(x, "attention.self.query"))
            k = split(lin(x, "attention.self.key"))
            v = split(lin(x, "attention.self.value"))
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + bias
            scores -= scores.max(-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(-1, keepdims=True)
            ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, n, hidden)
            x = _layer_norm(lin(ctx, "attention.output.dense") + x,
                            w[p + "attention.output.LayerNorm.weight"],
                            w[p + "attention.output.LayerNorm.bias"], self.eps)
            inter = _gelu(lin(x, "intermediate.dense"))
            x = _layer_norm(lin(inter, "output.dense") + x, w[p + "output.LayerNorm.weight"],
                            w[p + "output.LayerNorm.bias"], self.eps)
        m = mask[:, :, None]
        return (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)

    def encode(self, texts: list[str], batch_size: int = 32, normalize_embeddings: bool = False,
               **_ignored: Any) -> np.ndarray:
        """Sentence vectors (module contract); keyword arguments sentence-transformers takes
        and this encoder has no use for (`convert_to_numpy`, `show_progress_bar`) are
        accepted and ignored."""
        import numpy as np

        prepared = [str(t).strip() for t in texts]
        if self.do_lower_case:
            prepared = [t.lower() for t in prepared]
        out = np.zeros((len(prepared), self.hidden), np.float32)
        ids = [e.ids for e in self.tokenizer.encode_batch(prepared)]
        # Longest first, batches of similar lengths (less padding), each batch held to
        # _BATCH_TOKENS tokens and its attention scores to ~_SCORES_BYTES (128 texts of 256
        # tokens would hold 400 MB of scores and 50M activations).
        order = sorted(range(len(ids)), key=lambda i: (-len(ids[i]), i))
        start = 0
        while start < len(order):
            n = len(ids[order[start]])
            fit = min(_SCORES_BYTES // (4 * self.heads * n * n), _BATCH_TOKENS // n)
            idx = order[start:start + max(1, min(batch_size, fit))]
            start += len(idx)
            batch = np.full((len(idx), n), self.pad_id, np.int64)
            mask = np.zeros((len(idx), n), np.float32)
            for row, i in enumerate(idx):
                batch[row, :len(ids[i])] = ids[i]
                mask[row, :len(ids[i])] = 1.0
            out[idx] = self._forward(batch, mask)
        if normalize_embeddings or self.normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out


def load(path: str | Path) -> BertEncoder:
    """The encoder for the sentence-transformers model at `path` (module contract)."""
    root = Path(path)
    modules = _read_json(root / "modules.json")
    types = [m.get("type") for m in modules] if isinstance(modules, list) else []
    if types[:2] != [_TRANSFORMER, _POOLING] or types[2:] not in ([], [_NORMALIZE]):
        raise Unsupported(f"{root}: modules {types} (a Transformer, a Pooling, a Normalize)")
    if any(m.get("path") for m in modules[:1]):
        raise Unsupported(f"{root}: the Transformer module is in a subfolder")
    pool = _read_json(root / modules[1]["path"] / "config.json")
    modes = {k for k, v in pool.items() if k.startswith("pooling_mode") and v}
    if modes != {"pooling_mode_mean_tokens"}:
        raise Unsupported(f"{root}: pooling {sorted(modes)} (mean tokens only)")
    config = _read_json(root / "config.json")
    if (config.get("model_type") != "bert" or config.get("hidden_act") != "gelu"
            or config.get("position_embedding_type", "absolute") != "absolute"):
        raise Unsupported(f"{root}: not a BERT with absolute positions and GELU")
    st = _read_json(root / "sentence_bert_config.json")
    tok_file, weights_file = root / "tokenizer.json", root / "model.safetensors"
    if not tok_file.is_file() or not weights_file.is_file():
        raise Unsupported(f"{root}: no tokenizer.json or model.safetensors")
    import numpy as np

    try:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer
    except ImportError as e:
        raise Unsupported(f"tokenizers or safetensors cannot be imported: {e}") from None
    weights = {k.removeprefix("bert."): v for k, v in load_file(str(weights_file)).items()}
    if any(v.dtype != np.float32 for k, v in weights.items() if k.endswith((".weight", ".bias"))):
        raise Unsupported(f"{weights_file}: weights are not float32")
    # sentence-transformers truncates to min(max_seq_length, the positions the model has),
    # pads each batch to its longest text; the file's own settings (128, a fixed 128) are not.
    max_len = min(int(st.get("max_seq_length") or 512), int(config["max_position_embeddings"]))
    tokenizer = Tokenizer.from_file(str(tok_file))
    tokenizer.enable_truncation(max_length=max_len)
    tokenizer.no_padding()  # encode() pads each batch itself
    return BertEncoder(weights, config, tokenizer, max_len, bool(st.get("do_lower_case")),
                       normalize=types[2:] == [_NORMALIZE])
