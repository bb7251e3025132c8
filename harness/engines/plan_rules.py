"""Combinations of a server's settings that SGLang would silently change or refuse at start,
refused while planning instead (pure; one line naming the dimension).

Why refuse rather than let SGLang adjust: the deployment checks that every requested
argument resolves as asked (image.check_server), so a setting SGLang rewrites at start would
fail the launch minutes later, after GPUs were taken. The rules, per server role:

- experts: with the point's `model.experts` known, the physical experts (routed experts plus
  `ep_num_redundant_experts`) must be a multiple of ep (SGLang shards them evenly).
- EP-spanning all-to-all backends (`moe_a2a_backend` deepep, deepep_v2, megamoe, mooncake,
  mori, nixl, flashinfer, pplx...: `A2A_EP_SPANNING`): SGLang sets ep to tp, so ep must equal
  tp (the point's topology states it).
- EPLB (`enable_eplb`) and redundant experts need ep > 1.
- Speculative decoding: steps, top-k and draft tokens come together (all three or none: a
  partial set is auto-chosen by SGLang per model, so a sweep over one of them would measure
  SGLang's choice); with top-k 1, draft tokens must be steps + 1 (SGLang rewrites it);
  the algorithm is one SGLang names (`SPEC_ALGORITHMS`; NEXTN is EAGLE's alias). Whether the
  release has the flags at all is the flag table's (`sglang X has no
  --speculative-algorithm (...)`).
- HiCache sizes (`hicache_ratio`, `hicache_size`) need `enable_hierarchical_cache`.
- Two-batch overlap needs an EP all-to-all backend (it overlaps the dispatch of one
  micro-batch with the other's compute: with `none` there is nothing to overlap).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...ledger.specs import Parallelism
from ..errors import HarnessError

# SGLang 0.5.23 arg_groups/overrides.py _A2A_EP_SPANNING_BACKENDS (ep_size := tp_size).
A2A_EP_SPANNING = frozenset({"deepep", "deepep_v2", "megamoe", "mooncake", "mori", "nixl",
                             "flashinfer", "flashinfer_megamoe", "pplx", "ascend_fuseep"})
# SGLang 0.5.23 speculative/spec_info.py SpeculativeAlgorithm, and its alias NEXTN.
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "UNO",
                   "DSPARK", "FROZEN_KV_MTP")
SPEC_SIZES = ("speculative_num_steps", "speculative_eagle_topk",
              "speculative_num_draft_tokens")
TREE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")


def check_server(cfg: Mapping[str, Any], par: Parallelism, role: str,
                 experts: int | None) -> None:
    """A HarnessError (one line, `<role>: ...`) for the first rule `cfg` breaks."""
    a2a = str(cfg.get("moe_a2a_backend") or "none")
    redundant = int(cfg.get("ep_num_redundant_experts") or 0)
    if experts is not None and par.ep > 1 and (experts + redundant) % par.ep:
        extra = f" + {redundant} redundant" if redundant else ""
        raise HarnessError(f"{role}: ep {par.ep} does not divide the model's {experts} "
                           f"experts{extra} (model.experts)")
    if a2a in A2A_EP_SPANNING and par.ep != par.tp:
        raise HarnessError(f"{role}: moe_a2a_backend {a2a} needs ep = tp (SGLang sets ep_size "
                           f"to tp_size): ep {par.ep}, tp {par.tp}")
    if (cfg.get("enable_eplb") or redundant) and par.ep == 1:
        what = "enable_eplb" if cfg.get("enable_eplb") else "ep_num_redundant_experts"
        raise HarnessError(f"{role}: {what} needs ep > 1 (ep 1)")
    if cfg.get("enable_two_batch_overlap") and a2a == "none":
        raise HarnessError(f"{role}: enable_two_batch_overlap needs an EP all-to-all backend "
                           "(moe_a2a_backend none)")
    hicache = [k for k in ("hicache_ratio", "hicache_size") if cfg.get(k)]
    if hicache and not cfg.get("enable_hierarchical_cache"):
        raise HarnessError(f"{role}: {hicache[0]} needs enable_hierarchical_cache")
    _check_speculative(cfg, role)


def _check_speculative(cfg: Mapping[str, Any], role: str) -> None:
    algo = cfg.get("speculative_algorithm")
    sizes: dict[str, Any] = {k: cfg[k] for k in SPEC_SIZES if cfg.get(k) is not None}
    if algo is None:
        if sizes:
            raise HarnessError(f"{role}: {next(iter(sizes))} needs speculative_algorithm")
        return
    if str(algo).upper() not in SPEC_ALGORITHMS:
        raise HarnessError(f"{role}: speculative_algorithm {algo} is not one of "
                           f"{', '.join(SPEC_ALGORITHMS)}")
    if str(algo).upper() not in TREE_ALGORITHMS:
        return
    if sizes and len(sizes) < len(SPEC_SIZES):
        missing = [k for k in SPEC_SIZES if k not in sizes]
        raise HarnessError(f"{role}: speculative {', '.join(sizes)} without "
                           f"{', '.join(missing)} (give all three or none)")
    if sizes and int(sizes["speculative_eagle_topk"]) == 1 and \
            int(sizes["speculative_num_draft_tokens"]) != int(sizes["speculative_num_steps"]) + 1:
        raise HarnessError(f"{role}: speculative_num_draft_tokens "
                           f"{sizes['speculative_num_draft_tokens']} with speculative_eagle_topk"
                           f" 1 must be speculative_num_steps + 1 = "
                           f"{int(sizes['speculative_num_steps']) + 1}")
