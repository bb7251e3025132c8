"""Model weights: generated into `FORGE_HOME/models/`, or referenced where they lie.

Three sources:
- `tiny-llama` (also `forge:tiny-llama`): generated offline from a recipe — a seeded
  Llama-architecture model in safetensors, a byte-level BPE tokenizer trained on text this
  package ships (`harness/data/corpus.txt`), a chat template and a generation config. Every
  file is written with deterministic bytes, so the same recipe gives the same digest on every
  machine (for the same torch/tokenizers serialization formats).
- A hub id (`org/model`, `org/model@revision`, `hf:org/model`): a snapshot of the shared
  Hugging Face cache, resolved to its commit by the real `huggingface_hub` and referenced in
  place, digested by the hub's own hashes; optional allow-patterns (weight_refs.py). Nothing
  is copied into `models/`; without the snapshot and without network, a one-line HarnessError.
- A directory (`path:/abs/dir`, or an absolute path): referenced in place, digested by its
  listing (size, mtime_ns per file), or by each file's sha256 with `verify` (weight_refs.py).

Contracts:
- A generated model is a directory `models/<dirname>/` with `forge-manifest.json`: every file's
  sha256, the recipe/source, and `digest` = canonical sha256 over the sorted
  (relative path, file sha256) pairs (the manifest itself excluded). A referenced model is a
  record `models/<name>.ref.json` (weight_refs.py); `model_path` finds either (and a hub
  model copied by an older forge, a directory with a manifest).
- Idempotent: a model already present whose files match its manifest (and, for a recipe,
  whose recipe matches) is not rebuilt. Generation happens in a temporary directory renamed
  into place, under a file lock, so a crash or a concurrent pull never leaves a half model.
- Each pull records `ModelPulled` on the `workspace` stream, once per (name, digest) (a hub
  model: per revision asked); a reference's record is its `recipe`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...ledger import events as E
from ...ledger.clock import digest as canonical_digest
from ...ledger.streams import WORKSPACE_STREAM
from ...ledger.workspace import Workspace
from ..errors import HarnessError
from . import weight_refs as refs
from .weight_refs import sha256_file

MANIFEST = "forge-manifest.json"
# harness/data/ (package data): the path is part of the recipe below, so it stays there.
CORPUS = Path(__file__).resolve().parent.parent / "data" / "corpus.txt"

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

# The recipe is data: changing any value changes the model and its digest.
TINY_LLAMA: dict[str, Any] = {
    "name": "tiny-llama",
    "revision": "1",
    "architecture": "LlamaForCausalLM",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "init_std": 0.02,
    "seed": 0,
    "dtype": "float32",
    "tokenizer": {"type": "byte-level-bpe", "vocab_size": 4096, "min_frequency": 1,
                  "corpus": "harness/data/corpus.txt"},
}
RECIPES = {"tiny-llama": TINY_LLAMA}


@dataclass(frozen=True)
class PulledModel:
    name: str
    path: Path
    digest: str
    source: str  # "recipe", "hub" or "path"
    files: dict[str, str]
    reused: bool  # True when the model was already present and nothing was rebuilt
    record: dict[str, Any] | None = None  # a reference's record (weight_refs.py)

    def as_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "path": str(self.path), "digest": self.digest,
               "source": self.source, "files": len(self.files), "reused": self.reused}
        if self.record is not None:
            out.update({k: self.record.get(k) for k in (
                "revision", "commit", "digest_kind", "allow_patterns", "network")
                if k in self.record})
        return out


# --- hashing and manifests --------------------------------------------------------------


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under root (posix relative paths), manifest and caches excluded."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not p.is_file() or rel == MANIFEST or rel.startswith(".cache/") or "/.cache/" in rel:
            continue
        out[rel] = sha256_file(p)
    return out


def manifest_digest(files: dict[str, str]) -> str:
    return canonical_digest(sorted([path, sha] for path, sha in files.items()))


def read_manifest(model_dir: Path) -> dict[str, Any]:
    path = model_dir / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HarnessError(f"{path}: missing (not a pulled model)") from None
    except (OSError, ValueError) as e:
        raise HarnessError(f"{path}: unreadable manifest: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict) \
            or not isinstance(data.get("digest"), str):
        raise HarnessError(f"{path}: malformed manifest (needs 'files' and 'digest')")
    return data


def verify_model(model_dir: Path) -> list[str]:
    """Problems (one line each) where the files no longer match the manifest."""
    manifest = read_manifest(model_dir)
    actual = file_hashes(model_dir)
    problems = []
    for rel, sha in sorted(manifest["files"].items()):
        if rel not in actual:
            problems.append(f"{model_dir / rel}: missing")
        elif actual[rel] != sha:
            problems.append(f"{model_dir / rel}: sha256 {actual[rel]} != manifest {sha}")
    problems += [f"{model_dir / rel}: not in manifest" for rel in sorted(set(actual)
                                                                          - set(manifest["files"]))]
    if manifest_digest(manifest["files"]) != manifest["digest"]:
        problems.append(f"{model_dir / MANIFEST}: digest does not match its file list")
    return problems


def _write_manifest(model_dir: Path, name: str, source: str, extra: dict[str, Any]) -> dict:
    files = file_hashes(model_dir)
    manifest = {"name": name, "source": source, "digest": manifest_digest(files),
                "files": files, **extra}
    _write_json(model_dir / MANIFEST, manifest)
    return manifest


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                    encoding="utf-8")


# --- name resolution --------------------------------------------------------------------


def parse_name(name: str) -> tuple[str, str, str | None]:
    """-> (kind, id, revision): kind "recipe" (a RECIPES key), "hub" (repo id) or "path"
    (an absolute directory: `path:/abs/dir` or `/abs/dir`)."""
    raw = name.strip()
    if raw.startswith("path:") or raw.startswith("/"):
        p = raw[len("path:"):] if raw.startswith("path:") else raw
        if not Path(p).is_absolute():
            raise HarnessError(f"model {name!r}: give an absolute path (path:/abs/dir)")
        return "path", os.path.normpath(p), None
    if raw.startswith("forge:"):
        raw = raw[len("forge:"):]
        if raw not in RECIPES:
            known = ", ".join(sorted(RECIPES))
            raise HarnessError(f"unknown forge model {name!r} (known: {known})")
        return "recipe", raw, None
    if raw in RECIPES:
        return "recipe", raw, None
    if raw.startswith("hf:"):
        raw = raw[len("hf:"):]
    repo, _, revision = raw.partition("@")
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") for p in parts):
        raise HarnessError(f"model {name!r}: not a known recipe ({', '.join(sorted(RECIPES))}) "
                           "nor a hub id 'org/model[@revision]'")
    return "hub", repo, revision or None


def dir_name(kind: str, ident: str) -> str:
    return ident if kind == "recipe" else ident.replace("/", "--")


def models_dir(home: Path) -> Path:
    return Path(home) / "models"


def model_path(home: Path, name: str, revision: str | None = None) -> Path:
    """The directory of a pulled or referenced model, or a HarnessError telling how to pull
    it. `revision` is the hub revision when `name` carries none (default `main`)."""
    p = Path(name.removeprefix("path:"))
    if p.is_absolute() or name.startswith("."):  # an explicit directory
        if not (p / "config.json").is_file():
            raise HarnessError(f"{p}: not a model directory (no config.json)")
        return p
    kind, ident, rev = parse_name(name)
    d = models_dir(home) / dir_name(kind, ident)
    if kind == "hub":
        rev = rev or revision
        ref = refs.find_hub_ref(home, ident, rev)
        if ref is not None:
            snap = Path(ref["path"])
            if not snap.is_dir():
                raise HarnessError(f"model {ident}@{ref['revision']}: its snapshot {snap} is "
                                   f"gone from the Hugging Face cache: run `forge weights pull "
                                   f"{ident}@{ref['revision']}`")
            return snap
        if (d / MANIFEST).is_file():  # copied by a forge before references
            return d
        name = f"{ident}@{rev}" if rev else ident
    if not (d / MANIFEST).is_file():
        raise HarnessError(f"model {name!r} is not pulled into {models_dir(home)}: "
                           f"run `forge weights pull {name}`")
    return d


def resolve_model(ws: Workspace, source: str, revision: str | None = None) -> Path:
    """A point's model on disk: as `model_path` finds it, else pulled (a recipe generated, a
    hub snapshot found in the shared cache or downloaded into it, `revision` when the source
    names none) and recorded."""
    try:
        return model_path(Path(ws.home), source, revision)
    except HarnessError:
        kind, _, rev = parse_name(source)
        if kind == "path":
            raise
    return Path(pull(ws, f"{source}@{revision}" if kind == "hub" and revision and not rev
                     else source).path)


def list_models(home: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    root = models_dir(home)
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        if d.is_dir() and (d / MANIFEST).is_file():
            m = read_manifest(d)
            out.append({"name": m.get("name", d.name), "path": str(d), "digest": m["digest"],
                        "source": m.get("source"), "files": len(m["files"])})
    for r in refs.list_refs(home):
        out.append({"name": r["name"], "path": r["path"], "digest": r["digest"],
                    "source": r["kind"], "files": len(r.get("files") or {}),
                    **{k: r[k] for k in ("revision", "commit", "digest_kind") if k in r}})
    return out


# --- pulling ----------------------------------------------------------------------------


def pull(ws: Workspace, name: str, *, allow_patterns: list[str] | None = None,
         verify: bool = False, refresh: bool = False,
         actor: E.Actor | None = None) -> PulledModel:
    """Pull (a recipe) or reference (a hub snapshot, a directory) `name` and record
    `ModelPulled`. Idempotent."""
    pulled = fetch_model(Path(ws.home), name, allow_patterns=allow_patterns, verify=verify,
                         refresh=refresh)
    kind, ident, _ = parse_name(name)
    recipe = RECIPES[ident] if kind == "recipe" else pulled.record or {}
    once = f"{ident}@{recipe.get('revision')}" if kind == "hub" else ident
    ws.ledger.append(
        WORKSPACE_STREAM,
        [E.ModelPulled(name=ident, digest=pulled.digest, path=str(pulled.path), recipe=recipe,
                       actor=actor or E.Actor.tool("forge-weights"))],
        command_id=f"model-pulled:{once}:{pulled.digest}",  # once per (model, digest)
    )
    return pulled


def fetch_model(home: Path, name: str, *, allow_patterns: list[str] | None = None,
                verify: bool = False, refresh: bool = False) -> PulledModel:
    """`pull` without touching a ledger (tests, fixtures): a recipe generated into
    `home/models/`, a hub snapshot or a directory referenced (its record written there)."""
    kind, ident, revision = parse_name(name)
    if (allow_patterns or refresh) and kind != "hub":
        raise HarnessError(f"model {name!r}: --allow-patterns and --refresh are for a hub "
                           "model, not a recipe or a directory")
    if verify and kind == "recipe":
        raise HarnessError(f"model {name!r}: --verify checks a referenced model; a generated "
                           "one is checked against its manifest at every pull")
    if kind != "recipe":
        record, reused = refs.reference(home, kind, ident, revision, verify=verify,
                                        allow_patterns=allow_patterns, refresh=refresh)
        files = {rel: f.get("hash") or f"{f['size']}:{f['mtime_ns']}"
                 for rel, f in record["files"].items()}
        return PulledModel(ident, Path(record["path"]), record["digest"], kind, files, reused,
                           record)
    root = models_dir(home)
    root.mkdir(parents=True, exist_ok=True)
    target = root / dir_name(kind, ident)
    from filelock import FileLock

    with FileLock(str(root / f".{target.name}.lock")):
        return _pull_recipe(ident, target)


def _existing(target: Path, recipe: dict[str, Any] | None) -> dict[str, Any] | None:
    """The manifest of an intact existing model (matching recipe), else None."""
    if not (target / MANIFEST).is_file():
        return None
    try:
        manifest = read_manifest(target)
    except HarnessError:
        return None
    if recipe is not None and manifest.get("recipe") != recipe:
        return None
    return None if verify_model(target) else manifest


def _replace_dir(tmp: Path, target: Path) -> None:
    if target.exists():
        old = target.with_name(f".old-{target.name}-{os.getpid()}")
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)


def _install(ident: str, target: Path, kind: str,
             fill: Callable[[Path], dict[str, Any]]) -> PulledModel:
    """Build a model in a fresh directory beside `target` (`fill` writes its files and returns
    the manifest's source fields), write its manifest and move it into place; the directory
    is removed when anything fails, so `target` is either the old model or the whole new one."""
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    try:
        manifest = _write_manifest(tmp, ident, kind, fill(tmp))
        tmp.chmod(0o755)
        _replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PulledModel(ident, target, manifest["digest"], kind, manifest["files"], False)


def _pull_recipe(ident: str, target: Path) -> PulledModel:
    recipe = RECIPES[ident]
    manifest = _existing(target, recipe)
    if manifest is not None:
        return PulledModel(ident, target, manifest["digest"], "recipe", manifest["files"], True)

    def fill(tmp: Path) -> dict[str, Any]:
        generate_tiny_llama(recipe, tmp)
        return {"recipe": recipe, "versions": _versions()}

    return _install(ident, target, "recipe", fill)


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {}
    for pkg in ("torch", "tokenizers", "safetensors"):
        try:
            out[pkg] = version(pkg)
        except Exception:  # pragma: no cover - informational only
            out[pkg] = "unknown"
    return out


# --- the tiny-llama recipe --------------------------------------------------------------


def llama_config(recipe: dict[str, Any], special_ids: dict[str, int]) -> dict[str, Any]:
    """config.json written by hand (no library version in it, so the bytes are stable)."""
    h, heads = recipe["hidden_size"], recipe["num_attention_heads"]
    return {
        "architectures": [recipe["architecture"]],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": recipe["intermediate_size"],
        "num_hidden_layers": recipe["num_hidden_layers"],
        "num_attention_heads": heads,
        "num_key_value_heads": recipe["num_key_value_heads"],
        "head_dim": h // heads,
        "vocab_size": recipe["vocab_size"],
        "max_position_embeddings": recipe["max_position_embeddings"],
        "rms_norm_eps": recipe["rms_norm_eps"],
        "rope_theta": recipe["rope_theta"],
        "rope_parameters": {"rope_type": "default", "rope_theta": recipe["rope_theta"]},
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": recipe["init_std"],
        "tie_word_embeddings": False,
        "use_cache": True,
        "dtype": recipe["dtype"],
        "torch_dtype": recipe["dtype"],
        "bos_token_id": special_ids[BOS],
        "eos_token_id": special_ids[EOS],
        "pad_token_id": special_ids[PAD],
    }


def train_tokenizer(recipe: dict[str, Any], corpus: Path = CORPUS):
    """Byte-level BPE trained on the shipped corpus. Deterministic (single-threaded)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    spec = recipe["tokenizer"]
    text = corpus.read_text(encoding="utf-8")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec["vocab_size"], min_frequency=spec["min_frequency"],
        special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: same merges on every machine
    try:
        tok.train_from_iterator(text.split("\n\n"), trainer)
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)])
    return tok


def generate_tiny_llama(recipe: dict[str, Any], out: Path) -> None:
    """Write config, generation config, tokenizer and seeded weights into `out`."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(recipe)
    if tok.get_vocab_size() != recipe["vocab_size"]:  # every id the model emits must decode
        raise HarnessError(f"{CORPUS}: trains a tokenizer of {tok.get_vocab_size()} tokens, "
                           f"the recipe needs {recipe['vocab_size']} (add varied text)")
    (out / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n", encoding="utf-8")
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
        "add_bos_token": True, "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": recipe["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    })
    _write_json(out / "special_tokens_map.json", {"bos_token": BOS, "eos_token": EOS,
                                                  "pad_token": PAD})
    config = llama_config(recipe, ids)
    _write_json(out / "config.json", config)
    # Random weights never learned to stop: eos is the end of text, and <|eot_id|> ends a
    # chat turn. Greedy decoding by default so outputs are comparable across candidates.
    _write_json(out / "generation_config.json", {
        "bos_token_id": ids[BOS], "eos_token_id": [ids[EOS], ids["<|eot_id|>"]],
        "pad_token_id": ids[PAD], "do_sample": False, "max_new_tokens": 256,
    })
    torch_dtype = getattr(torch, recipe["dtype"])
    gen = torch.Generator(device="cpu").manual_seed(int(recipe["seed"]))
    tensors = {}
    for name, shape in llama_parameter_shapes(recipe):
        if name.endswith("norm.weight"):
            t = torch.ones(shape, dtype=torch.float32)
        else:
            t = torch.empty(shape, dtype=torch.float32).normal_(0.0, recipe["init_std"],
                                                                 generator=gen)
        tensors[name] = t.to(torch_dtype).contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def llama_parameter_shapes(recipe: dict[str, Any]) -> list[tuple[str, tuple[int, ...]]]:
    """Parameter names and shapes of LlamaForCausalLM (untied), in a fixed order."""
    h, inter = recipe["hidden_size"], recipe["intermediate_size"]
    heads, kv = recipe["num_attention_heads"], recipe["num_key_value_heads"]
    hd, vocab = h // heads, recipe["vocab_size"]
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, h))]
    for i in range(recipe["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (heads * hd, h)),
            (p + "self_attn.k_proj.weight", (kv * hd, h)),
            (p + "self_attn.v_proj.weight", (kv * hd, h)),
            (p + "self_attn.o_proj.weight", (h, heads * hd)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (inter, h)),
            (p + "mlp.up_proj.weight", (inter, h)),
            (p + "mlp.down_proj.weight", (h, inter)),
        ]
    shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (vocab, h))]
    return shapes
