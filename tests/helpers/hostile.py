"""A ledger written by a hostile user through the real CLI: script, markup and foreign links
planted in every text field a user or an agent types, then the wiki built.

Used by tests/wiki/test_wiki_safety.py (fast, parses the produced HTML) and
tests/wiki/test_browser.py (headless Chromium loads every page). `build_hostile(home, tmp)`
returns the field markers: each field's text starts with its marker, so a test can see that
the field reached a page.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import yaml
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]

# Script, attribute breakouts and links out of the site, in the shapes that matter.
PAYLOADS = [
    "[[javascript:window.__pwned=1;//|x]]",
    '<img src=x onerror="window.__pwned=1">',
    "</script><script>window.__pwned=1</script>",
    "[[https://evil.example|click]]",
    '" onmouseover="window.__pwned=1" x="',
    "' onfocus='window.__pwned=1' autofocus '",
    "[click](javascript:window.__pwned=1)",
    "<https://evil.example/autolink>",
    "[[../../../../etc/passwd|up]]",
    "[[//evil.example/x|protocol-relative]]",
    "[[index|a real page, from user text]]",
    "<svg onload=window.__pwned=1>",
    "\\[[javascript:window.__pwned=1|escaped]]",
    "]]|[[ ``` \n## Backlinks\n---",
]
HOSTILE = " ".join(PAYLOADS)
TASK = "xss-task"
GRAPH = "xss-graph"


def hostile(field: str) -> str:
    """The planted text of one field: its marker, then every payload."""
    return f"fld-{field} {HOSTILE}"


# Fields whose text a page shows (the tool call's argv and a measurement's source are
# recorded but no page shows them; they are planted all the same).
SHOWN = ["title", "goal", "sub-goal", "candidate", "state-reached", "finding", "next",
         "reason", "exit-reason", "graph-title", "deliverable", "graph-reason", "metric"]
# A metric name (no `=`: the CLI splits NAME=VALUE at the first one); `!` sorts it into the
# measurement table's columns.
METRIC = "!fld-metric [[javascript:window.__pwned++;//|m]] <img src onerror> </script>"


class CliError(AssertionError):
    pass


def forge(home: Path, *args: str) -> str:
    """The real CLI, in-process (click's runner): fails the test unless it exits 0."""
    from infer_forge.cli import main

    r = CliRunner().invoke(main, ["--home", str(home), *args], catch_exceptions=False)
    if r.exit_code != 0:
        raise CliError(f"forge {' '.join(args)} -> {r.exit_code}: {r.output}")
    return r.output


def _specs(tmp: Path) -> tuple[Path, Path]:
    for sub in ("points", "profiles", "tasks", "graphs"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "examples/profiles/tiny-cpu.yaml", tmp / "profiles/tiny-cpu.yaml")
    point = yaml.safe_load((REPO / "examples/points/tiny-cpu.yaml").read_text())
    point["name"] = "xss-point"
    (tmp / "points/tiny-cpu.yaml").write_text(yaml.safe_dump(point, sort_keys=False))
    task = {
        "id": TASK, "title": hostile("title"), "type": "deployment-tuning",
        "goal": hostile("goal"), "point": "../points/tiny-cpu.yaml",
        "scope": {"engine.attn_implementation": ["sdpa", hostile("candidate")]},
        "context": {"notes": hostile("notes")},
        "contract": {"gates": [{"name": "throughput", "metric": "output_throughput",
                                "at_least": 1}]},
        "exit": {"when": "all_gates_pass", "max_blocks": 8},
        "executor": {"kind": "manual"},
    }
    task_file = tmp / "tasks" / f"{TASK}.yaml"
    task_file.write_text(yaml.safe_dump(task, sort_keys=False))
    work = {"sh": "true", "verify": [{"name": "ok", "sh": "true"}]}
    graph = {
        "name": GRAPH, "title": hostile("graph-title"), "description": hostile("graph-desc"),
        "nodes": [
            {"id": "repo-a", "kind": "repo", "path": "repos/a", "title": hostile("repo")},
            {"id": "prod", "kind": "system", "url": "javascript:window.__pwned=1",
             "title": hostile("system")},
            {"id": "n1", "type": "kernel", "title": hostile("node-title"),
             "goal": hostile("node-goal"), "work": work},
            {"id": "n2", "type": "evaluation", "title": hostile("node-title"), "work": work},
        ],
        "edges": [
            {"from": "n1", "to": "n2", "kind": "handoff", "deliverable": hostile("deliverable")},
            {"from": "repo-a", "to": "n1", "kind": "state"},
            {"from": "prod", "to": "n2", "kind": "state"},
        ],
    }
    graph_file = tmp / "graphs" / f"{GRAPH}.yaml"
    graph_file.write_text(yaml.safe_dump(graph, sort_keys=False))
    return task_file, graph_file


def build_hostile(home: Path, tmp: Path) -> dict[str, str]:
    """Plant every field through the CLI, build the wiki and site (no embeddings)."""
    task_file, graph_file = _specs(tmp)
    if not (home / "forge.toml").exists():
        forge(home, "init")
    forge(home, "task", "new", str(task_file))
    forge(home, "block", "start", TASK, "--sub-goal", hostile("sub-goal"))
    forge(home, "run", "--task", TASK, "--", sys.executable, "-c", "pass", hostile("argv"))
    forge(home, "measure", TASK, "--metric", "output_throughput=100",
          "--metric", "median_ttft_ms=50", "--source", hostile("source"))
    forge(home, "measure", TASK, "--metric", f"{METRIC}=1")
    forge(home, "block", "handoff", TASK, "--state-reached", hostile("state-reached"),
          "--finding", hostile("finding"), "--next", hostile("next"))
    forge(home, "block", "start", TASK, "--sub-goal", hostile("sub-goal"),
          "--set", f"engine.attn_implementation={hostile('candidate')}")
    forge(home, "measure", TASK, "--metric", "output_throughput=90",
          "--metric", "median_ttft_ms=70")
    forge(home, "task", "reject", TASK, "--reason", hostile("reason"))
    forge(home, "block", "handoff", TASK, "--state-reached", hostile("state-reached"),
          "--outcome", "no-progress")
    # bench_serving results on the task without --block, after block measurements.
    forge(home, "bench", "import", str(REPO / "tests/data/bench_serving/sglang-0.5.4.jsonl"),
          "--task", TASK)
    forge(home, "task", "exit", TASK, "--state", "aborted-by-human",
          "--reason", hostile("exit-reason"))
    forge(home, "graph", "new", str(graph_file))
    forge(home, "graph", "reject", "-g", GRAPH, "n2", "--reason", hostile("graph-reason"))
    forge(home, "wiki", "build", "--no-embeddings")
    return {f: f"fld-{f}" for f in SHOWN}
