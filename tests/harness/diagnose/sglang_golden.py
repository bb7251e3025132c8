"""Golden `/metrics` pages and log lines of real SGLang releases (tests/data/sglang/golden/).

- Metrics: `render_metrics(version)` runs tests/data/sglang/golden/render_metrics.py under
  the kit (the release's own collector classes, one process per scheduler rank) and returns
  `{case: [page, ...] | reason}`.
- Logs: `render_logs(version)` fills the release's **own** format strings, found with `ast`
  in its unpacked source (the string literal or f-string holding a marker such as
  `#retracted-req: `), with the values of `LOG_VALUES`, into the lines of each case of
  `LOG_CASES` -> `{case: text | reason}`. A line is the concatenation of its pieces, each the
  release's literal holding that marker; a piece's alternatives are tried in order (the
  wording of older releases). A placeholder with no value in LOG_VALUES is an error naming
  it: a new placeholder in a release is noticed, not filled with a guess.

`python tests/harness/diagnose/sglang_golden.py regen [VERSION ...]` rewrites the golden
files (the kit's releases in GOLDEN_VERSIONS by default); the tests re-render and compare.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[3]
GOLDEN = REPO / "tests" / "data" / "sglang" / "golden"
RENDER_METRICS = GOLDEN / "render_metrics.py"
GOLDEN_VERSIONS = ("0.4.0", "0.5.6", "0.5.23")
PREFIX = "[2026-12-02 10:00:00 TP0] "  # SGLang's log prefix: time and rank

# case -> lines; a line -> its forms, tried in order (older releases' wording); a form -> the
# markers of its pieces (template text: `{expr}` for a placeholder), concatenated.
Form = tuple[str, ...]
LOG_CASES: dict[str, list[tuple[Form, ...]]] = {
    # A healthy PD decode server's periodic line: `#retracted-req: 0` (0.5.1+).
    "pd_decode_healthy": [(("Decode batch{iter_msg}, #running-req: ", "pre-allocated usage: ",
                            "#prealloc-req: ", "#transfer-req: ", "#retracted-req: ",
                            "gen throughput (token/s): "),)],
    # A colocated server's decode line (every release).
    "decode_healthy": [(("Decode batch{iter_msg}, #running-req: ",
                         "gen throughput (token/s): "), ("Decode batch. #running-req: ",))],
    # The scheduler retracts requests when the KV pool is full (0.4.0: "Decode out of
    # memory happened", a retraction, not a crash).
    "retract": [(("KV cache pool is full. Retract requests. ", "#retracted_reqs: ",
                  ", #new_token_ratio: "),
                 ("KV cache pool is full. Retract requests. #retracted_reqs: ",),
                 ("Decode out of memory happened. #retracted_reqs: ",))],
    # SGLang's own out-of-memory lines.
    "oom_prefill": [(("Prefill out of memory. Try to lower your batch size.",),
                     ("{phase_str} out of memory. Try to lower your batch size.",))],
    "oom_decode": [(("Decode out of memory. Try to lower your batch size.",),
                    ("{phase_str} out of memory. Try to lower your batch size.",))],
    "oom_alloc": [(("Out of memory. Try to lower your batch size.",),
                   ("alloc_req_slots runs out of memory. ",))],
    "oom_startup": [(("Not enough memory. Please try to increase --mem-fraction-static.",),)],
    # A hung forward: `Watchdog timeout (...)` to 0.5.6, `Scheduler watchdog timeout` after.
    "hang": [(("{self.debug_name} watchdog timeout (",),
              ("Watchdog timeout (self.watchdog_timeout=",))],
    # CUDA graph capture failed at start.
    "cuda_graph": [(("Capture cuda graph failed: ",),)],
    # PD disaggregation: KV transfer failures and timeouts.
    "pd_transfer_failed": [(("Decode transfer failed for request rank=",),)],
    "pd_bootstrap_timeout": [(("Some requests timed out when bootstrapping, ",),)],
    "pd_waiting_timeout": [(("Some requests fail to receive KV Cache transfer done signal",),)],
}

# A placeholder's expression (as `ast.unparse` writes it) -> the value it is rendered with.
LOG_VALUES: dict[str, object] = {
    "len(retracted_reqs)": 3, "num_retracted_reqs": 3, "new_token_gained": 5120, "old_ratio": 0.7,
    "new_token_ratio": 0.9, "self.new_token_ratio": 0.9, "iter_msg": "",
    "num_running_reqs": 12, "token_usage_msg": "#token: 9344, token usage: 0.30, ",
    "token_msg": "#token: 9344, token usage: 0.30, ",
    "num_used": 9344, "num_used / self.max_total_num_tokens": 0.3,
    "can_run_cuda_graph": True, "self._graph_backend_label": "cuda graph",
    "self.last_gen_throughput": 1432.11, "gen_throughput": 1432.11,
    "len(self.waiting_queue)": 0, "len(self.scheduler.waiting_queue)": 0,
    "phase_str": None, "self.debug_name": "Scheduler", "self.watchdog_timeout": 300,
    "self.soft": False, "e": "CUDA error: operation not permitted when stream is capturing",
    "CUDA_GRAPH_CAPTURE_FAILED_MSG": "",
    "'cuda graph' if self.device == 'cuda' else 'cpu graph'": "cuda graph", "self.tp_rank": 0,
    "decode_req.req.rid": "3f1c9a2e5b7d4c1a", "decode_req.req.bootstrap_room": 6149152382,
    "self.server_args.mem_fraction_static": 0.88, "num_tokens": 4096,
    "self.token_to_kv_pool.available_size() + self.tree_cache.evictable_size()": 120,
}
# Substrings of longer expressions (the PD decode queues) -> value.
LOG_VALUE_PARTS: tuple[tuple[str, object], ...] = (
    ("num_tokens_pre_allocated", 0.0), ("retracted_queue", 0),
    ("disagg_decode_prealloc_queue.queue", 0), ("disagg_decode_transfer_queue.queue", 2),
)
PHASE = {"oom_prefill": "Prefill", "oom_decode": "Decode"}


@cache
def _sources(root: Path) -> tuple[tuple[Path, str], ...]:
    return tuple((p, p.read_text(encoding="utf-8", errors="replace"))
                 for p in sorted((root / "sglang" / "srt").rglob("*.py")))


def _strings(tree: ast.AST) -> Iterator[ast.expr]:
    """String literals and f-strings (an f-string's own parts are not literals of their own)."""
    parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if id(node) in parts:
            continue
        if isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant)
                                                and isinstance(node.value, str)):
            yield node


def _template(node: ast.expr) -> str:
    """The literal as source-like text: `{expr}` for a placeholder."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    assert isinstance(node, ast.JoinedStr)
    out = []
    for v in node.values:
        out.append(v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value)
                   + "}")
    return "".join(out)


@cache
def _parsed(path: Path, text: str) -> ast.AST:
    return ast.parse(text)


def find_literal(root: Path, marker: str) -> tuple[ast.expr, str] | None:
    """The release's first literal (in path order) whose template holds `marker`, and where."""
    # A chunk of the marker that is in the source text as written (adjacent literals are
    # one literal to the parser, but not in the text).
    needle = max(re.split(r"\{[^}]*\}", marker), key=len)[:12]
    found: list[tuple[int, ast.expr, str]] = []
    for path, text in _sources(root):
        if needle not in text:
            continue
        for node in _strings(_parsed(path, text)):
            if marker in _template(node):
                found.append((len(_template(node)), node,
                              f"{path.relative_to(root)}:{node.lineno}"))
        if found:  # the smallest literal of the first file holding one
            _, node, where = min(found, key=lambda f: f[0])
            return node, where
    return None


def _value(expr: str, case: str) -> object:
    if expr == "phase_str":
        return PHASE.get(case, "Decode")
    if expr in LOG_VALUES:
        return LOG_VALUES[expr]
    for key, val in LOG_VALUE_PARTS:
        if key in expr:
            return val
    raise KeyError(f"no value for placeholder {{{expr}}}")


def fill(node: ast.expr, case: str) -> str:
    """The literal with its placeholders filled from LOG_VALUES (format spec and `!r`
    applied as the f-string would)."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    assert isinstance(node, ast.JoinedStr)
    out = []
    for v in node.values:
        if isinstance(v, ast.Constant):
            out.append(str(v.value))
            if "\n" in str(v.value):  # a log line is the message's first line
                break
            continue
        assert isinstance(v, ast.FormattedValue)
        val = _value(ast.unparse(v.value), case)
        if v.conversion == ord("r"):
            val = repr(val)
        spec = ast.unparse(v.format_spec)[2:-1] if v.format_spec is not None else ""
        out.append(format(val, spec))
    return "".join(out)


def render_logs(version: str, root: Path) -> dict[str, str]:
    """Each LOG_CASES case's lines for this release, or the reason it has none."""
    out: dict[str, str] = {}
    for case, lines in LOG_CASES.items():
        text: list[str] = []
        for forms in lines:
            for form in forms:
                hits = [find_literal(root, m) for m in form]
                if all(hits):
                    text.append(PREFIX + "".join(fill(h[0], case) for h in hits if h)
                                .split("\n", 1)[0].rstrip())
                    break
            else:
                out[case] = f"not in {version}: {forms[0][0]!r}"
                break
        else:
            out[case] = "\n".join(text) + "\n"
    return out


def metrics_path(version: str, case: str, step: int) -> Path:
    return GOLDEN / "metrics" / f"{version}-{case}.{step}.txt"


def logs_path(version: str, case: str) -> Path:
    return GOLDEN / "logs" / f"{version}-{case}.log"


def render_metrics(version: str, run) -> dict[str, list[str] | str]:
    return json.loads(run(version, RENDER_METRICS))


def regen(versions: Sequence[str]) -> None:
    sys.path.insert(0, str(REPO))
    from tests.helpers import real_sglang

    for v in versions:
        for case, pages in render_metrics(v, real_sglang.run).items():
            for k, page in enumerate(pages if isinstance(pages, list) else ()):
                metrics_path(v, case, k).parent.mkdir(parents=True, exist_ok=True)
                metrics_path(v, case, k).write_text(page)
        for case, text in render_logs(v, real_sglang.release(v)).items():
            if not text.startswith("not in "):
                logs_path(v, case).parent.mkdir(parents=True, exist_ok=True)
                logs_path(v, case).write_text(text)
        print(f"{v}: written")


if __name__ == "__main__":
    if sys.argv[1:2] != ["regen"]:
        sys.exit("usage: python tests/harness/diagnose/sglang_golden.py regen [VERSION ...]")
    regen(sys.argv[2:] or GOLDEN_VERSIONS)
