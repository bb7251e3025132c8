"""Secrets planted through every path a user or an agent has never reach a stored byte.

Paths: a runtime profile's `config.env` (`forge profile record`, then a revision whose diff
names the changed secret), a task spec (goal, context), a block's sub-goal and handoff, the
stdout of `forge run -- env` with secret-named variables set, argv (`--env NAME=value`,
`--api-key value`), a server-log line printed by a tool (`MY_API_KEY: value`), a measurement's
source, and ids (`--task ghp_…`, a task id that is a GitHub token). Afterwards the raw bytes of
everything under FORGE_HOME (ledger.sqlite and its WAL, artifacts/, index.duckdb after
`forge index update`, wiki/ and site/ after `forge wiki build`, the site's search index),
every table of the index, and every line the CLI printed are searched for each secret.

Control: the names and ordinary values next to the secrets (`AWS_SECRET_ACCESS_KEY`,
`TOKENIZERS_PARALLELISM=false`, `max_new_tokens`) must be found in the same places, so the
search looks where the data went.
"""

from __future__ import annotations

import secrets
import string
import sys
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from infer_forge.cli import main
from infer_forge.ledger.workspace import open_workspace

from tests.conftest import REPO, run_forge

ALNUM = string.ascii_letters + string.digits


def _rand(n: int, alphabet: str = ALNUM) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


@pytest.fixture
def planted() -> dict[str, str]:
    """Realistic fake secrets, new for every run (so no fixed string can be special-cased)."""
    return {
        "aws1": _rand(40, ALNUM + "/+"),  # AWS secret access keys: 40 of [A-Za-z0-9/+]
        "aws2": _rand(40, ALNUM + "/+"),
        "aws3": _rand(40, ALNUM + "/+"),
        "profile_api_key": "pk-" + _rand(29),
        "flag_api_key": _rand(24),
        "goal_key": "gk" + _rand(22),
        "notes_key": "nk" + _rand(22),
        "subgoal_password": "Pw!" + _rand(13),
        "env_api_key": "ek-" + _rand(29),
        "env_password": "Ep#" + _rand(17),
        "log_key": "lk" + _rand(30),
        "argv_key": "ak" + _rand(26),
        "source_password": _rand(18),
        "finding_token": "ft" + _rand(30),
        "github": "ghp_" + _rand(36),
        "github_lower": "ghp_" + _rand(36, string.ascii_lowercase + string.digits),
    }


def cli(home: Path, *args: str):
    return CliRunner().invoke(main, ["--home", str(home), *args])


def _specs(root: Path, s: dict[str, str]) -> tuple[Path, Path, Path]:
    for sub in ("points", "profiles", "tasks"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "points/tiny-cpu.yaml").write_text(
        (REPO / "examples/points/tiny-cpu.yaml").read_text())
    profile = """\
service: tiny-cpu
rev: {rev}
engine: hf
config:
  attn_implementation: sdpa
  max_new_tokens: 128
  api_key: {api_key}
  env:
    AWS_SECRET_ACCESS_KEY: {aws}
    TOKENIZERS_PARALLELISM: "false"
  server_args: ["--port", "30000", "--api-key", "{flag}"]
"""
    rev1 = root / "profiles/tiny-cpu.yaml"
    rev1.write_text(profile.format(rev=1, api_key=s["profile_api_key"], aws=s["aws1"],
                                   flag=s["flag_api_key"]))
    rev2 = root / "profiles/tiny-cpu-rev2.yaml"
    rev2.write_text(profile.format(rev=2, api_key=s["profile_api_key"], aws=s["aws2"],
                                   flag=s["flag_api_key"]))
    task = root / "tasks/leaky.yaml"
    task.write_text(f"""\
id: leaky
type: deployment-tuning
goal: "Raise throughput; the client needs export MY_API_KEY={s['goal_key']} first"
point: ../points/tiny-cpu.yaml
scope:
  engine.attn_implementation: [sdpa, eager]
context:
  notes: "from the server log: MY_API_KEY: {s['notes_key']}"
contract:
  gates:
    - {{name: throughput, metric: output_throughput, vs_baseline: ratio, at_least: 1.05}}
exit: {{max_blocks: 2}}
executor: {{kind: manual}}
sandbox: {{secret_env: [MY_API_KEY]}}  # a tool call gets a secret only when the task names it
""")
    return rev1, rev2, task


def _ok(r) -> str:
    assert r.exit_code == 0, r.output
    return r.output


def _dump_index(path: Path) -> str:
    """Every row of every table of the index, as text (DuckDB compresses strings on disk, so
    a grep of the file alone could miss one)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        out = []
        for (table,) in con.execute("SELECT table_name FROM information_schema.tables "
                                    "WHERE table_type = 'BASE TABLE'").fetchall():
            out.append(repr(con.execute(f'SELECT * FROM "{table}"').fetchall()))
        return "\n".join(out)
    finally:
        con.close()


def test_planted_secrets_reach_no_stored_byte(forge_home, tmp_path, planted):
    s = planted
    home = forge_home
    printed: list[str] = []
    _ok(cli(home, "init"))
    rev1, rev2, task = _specs(tmp_path / "specs", s)

    # Secrets written into specs are refused at definition (the field named, nothing
    # printed or recorded); the specs then name the variables instead of the values.
    for kind, spec in (("profile", rev1), ("task", task)):
        r = cli(home, kind, "record" if kind == "profile" else "new", str(spec))
        assert r.exit_code == 1 and "looks like a secret" in r.output, r.output
        printed.append(r.output)
    clean = {**s, "profile_api_key": "OPENAI_API_KEY", "flag_api_key": "OPENAI_API_KEY",
             "aws1": "AWS_KEY_ONE", "aws2": "AWS_KEY_TWO", "goal_key": "$KEY",
             "notes_key": "${KEY}"}
    rev1, rev2, task = _specs(tmp_path / "specs", clean)
    printed.append(_ok(cli(home, "profile", "record", str(rev1))))
    out = _ok(cli(home, "profile", "record", str(rev2)))  # prints the diff: a secret changed
    printed.append(out)
    assert "config.env.AWS_SECRET_ACCESS_KEY" in out and "REDACTED" in out
    printed.append(_ok(cli(home, "task", "new", str(task))))
    printed.append(_ok(cli(home, "task", "run", "leaky")))
    printed.append(_ok(cli(home, "block", "start", "leaky", "--sub-goal",
                           f"retry with db_password={s['subgoal_password']}")))

    # `forge run -- env` in a real subprocess, its environment holding secret-named variables.
    env = {"MY_API_KEY": s["env_api_key"], "MY_SERVICE_PASSWORD": s["env_password"],
           "TOKENIZERS_PARALLELISM": "false"}
    p = run_forge("run", "--task", "leaky", "--json", "--", "env", home=home, env=env)
    assert p.returncode == 0, p.stderr
    printed.append(p.stdout + p.stderr)
    # A tool that prints a server-log line, called with secrets in its argv.
    script = tmp_path / "tool.py"
    script.write_text("import sys\n"
                      f"print('[2026-11-29 10:00:01] INFO MY_API_KEY: {s['log_key']}')\n"
                      "print('[2026-11-29 10:00:02] TOKENIZERS_PARALLELISM=false ok')\n")
    p = run_forge("run", "--task", "leaky", "--json", "--", sys.executable, str(script),
                  "--env", f"AWS_SECRET_ACCESS_KEY={s['aws3']}", "--api-key", s["argv_key"],
                  home=home)
    assert p.returncode == 0, p.stderr
    printed.append(p.stdout + p.stderr)
    printed.append(_ok(cli(home, "measure", "leaky", "--metric", "output_throughput=10",
                           "--source", f"bench password={s['source_password']}")))
    printed.append(_ok(cli(home, "block", "handoff", "leaky", "--state-reached", "baseline",
                           "--finding", f"the server wants auth_token={s['finding_token']}")))

    # Ids: a GitHub token given as a task id is refused, by name of its kind, never echoed.
    with open_workspace(home) as ws:
        before = ws.ledger.max_position()
    p = run_forge("run", "--task", s["github"], "--", "true", home=home)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    printed.append(p.stdout + p.stderr)
    gh_task = tmp_path / "specs/tasks/gh.yaml"
    gh_task.write_text(task.read_text().replace("id: leaky", f"id: {s['github_lower']}"))
    r = cli(home, "task", "new", str(gh_task))
    assert r.exit_code != 0 and "task id looks like a secret (GitHub Token)" in r.output
    printed.append(r.output)
    r = cli(home, "bench", "import",
            str(REPO / "tests/data/bench_serving/sglang-0.5.4.jsonl"), "--task", s["github"])
    assert r.exit_code != 0
    printed.append(r.output)
    with open_workspace(home) as ws:
        assert ws.ledger.max_position() == before, "a refused id wrote something"

    printed.append(_ok(cli(home, "index", "update")))
    printed.append(_ok(cli(home, "wiki", "build", "--no-embeddings")))
    printed.append(_ok(cli(home, "events", "export")))

    files = {p: p.read_bytes() for p in home.rglob("*") if p.is_file()}
    raw = b"\n".join(files.values())
    index_text = _dump_index(home / "index.duckdb")
    everything_printed = "\n".join(printed)
    for name, secret in s.items():
        assert secret.encode() not in raw, (name, [str(p) for p, b in files.items()
                                                  if secret.encode() in b])
        assert secret not in index_text, name
        assert secret not in everything_printed, name

    # Control: the data around the secrets did reach every place searched.
    ledger = b"".join(b for p, b in files.items() if p.name.startswith("ledger.sqlite"))
    for marker in (b"AWS_SECRET_ACCESS_KEY", b"TOKENIZERS_PARALLELISM", b"max_new_tokens",
                   b"[REDACTED:named-secret]", b"--api-key"):
        assert marker in ledger, marker
    artifacts = b"".join(b for p, b in files.items() if "artifacts" in p.parts)
    assert b"TOKENIZERS_PARALLELISM=false" in artifacts and b"MY_API_KEY=[REDACTED" in artifacts
    assert b"MY_API_KEY: [REDACTED" in artifacts
    assert "max_new_tokens" in index_text and "AWS_SECRET_ACCESS_KEY" in index_text
    site = b"".join(b for p, b in files.items() if "site" in p.parts)
    wiki = b"".join(b for p, b in files.items() if "wiki" in p.parts)
    search = files[home / "site" / "search.json"]
    for where in (site, wiki):
        assert b"max_new_tokens" in where and b"REDACTED" in where
    assert b"leaky" in search


# --- a child's own environment ----------------------------------------------------------------

PRINT_ENV = ("import os, sys; print(os.environ['MY_API_KEY']); "
             "print(os.environ['DB_PASSWORD'], file=sys.stderr)")


def test_values_set_for_the_child_only_are_redacted_from_its_output(workspace, planted):
    """`run_tool` with an env the forge process does not have: the child's secret-named values
    are redacted from its captured stdout/stderr (artifacts and the returned text), from argv
    (a shell expands them) and the environment digest ignores them."""
    from infer_forge.harness.tool_calls.calls import run_tool

    key, pw = planted["env_api_key"], planted["env_password"]
    env = {"MY_API_KEY": key, "DB_PASSWORD": pw, "TOKENIZERS_PARALLELISM": "false"}
    run = run_tool(workspace, [sys.executable, "-c", PRINT_ENV, f"--echo={key}"], env=env)
    assert run.returncode == 0
    stored = workspace.artifacts.text(run.event.stdout_digest) + workspace.artifacts.text(
        run.event.stderr_digest)
    for text in (run.stdout, run.stderr, stored, " ".join(run.event.argv)):
        assert key not in text and pw not in text
    assert "[REDACTED:configured-secret]" in run.stdout and "--echo=" in run.event.argv[-1]
    other = run_tool(workspace, [sys.executable, "-c", PRINT_ENV],
                     env={**env, "MY_API_KEY": key[::-1], "DB_PASSWORD": pw[::-1]})
    assert other.event.env_digest == run.event.env_digest  # secret values are not hashed in
    changed = run_tool(workspace, [sys.executable, "-c", PRINT_ENV],
                       env={**env, "TOKENIZERS_PARALLELISM": "true"})
    assert changed.event.env_digest != run.event.env_digest  # ordinary ones are


def test_graph_node_env_and_its_output_reach_no_stored_byte(workspace, tmp_path, planted):
    from infer_forge.harness.graph.commands import define_graph
    from infer_forge.harness.graph.run import run_graph

    key, pw = planted["env_api_key"], planted["env_password"]
    (tmp_path / "g.yaml").write_text(f"""\
name: leak
nodes:
  - id: work
    type: evaluation
    work:
      env: {{MY_API_KEY: "{key}", DB_PASSWORD: "{pw}", TOKENIZERS_PARALLELISM: "false"}}
      sh: 'echo "key=$MY_API_KEY"; echo "{{\\"value\\": 1}}"'
      verify:
        - {{name: value, metric: value, at_least: 1}}
        - {{name: says-password, sh: 'echo "failing with $DB_PASSWORD" >&2; exit 1'}}
""")
    define_graph(workspace, tmp_path / "g.yaml")
    summary = run_graph(workspace, "leak", jobs=1)
    assert summary.counts.get("rejected") == 1  # the second check failed, quoting stderr
    checks = [c for r in workspace.ledger.log() for c in getattr(r.event, "checks", None) or []]
    assert {c.name: c.passed for c in checks} == {"value": True, "says-password": False}
    workspace.close()
    raw = b"".join(p.read_bytes() for p in workspace.home.rglob("*") if p.is_file())
    assert key.encode() not in raw and pw.encode() not in raw
    assert b"failing with [REDACTED" in raw and b"key=[REDACTED" in raw
    assert b"TOKENIZERS_PARALLELISM" in raw
