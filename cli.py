"""The face of infer-forge: click commands that parse, call one function, and print.

No SQL, subprocess or event building here: each command opens the workspace, calls one
function from ledger/, projections/, wiki/, harness/ or repos/, and turns that package's
error into a one-line `click.ClickException` (non-zero exit).
"""

from __future__ import annotations

import csv
import functools
import json
import math
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .harness.errors import HarnessError
from .ledger.errors import LedgerError, SpecError
from .ledger.numbers import check_finite, finite_float, json_text
from .ledger.text import PrintableStream, printable
from .projections.errors import ProjectionError
from .repos.errors import RepoError
from .wiki.errors import WikiError

if TYPE_CHECKING:
    from .ledger.workspace import Workspace

# Every in-function import in this module is for start-up time: each command imports the
# ledger, harness, projections, wiki or repos function it calls in its own body, so one
# `forge` call loads its own command's floors, not every command's, and `forge --help` loads
# no pydantic model and no yaml: at the top only click, the packages' error bases (standard
# library only) and the printing edge (ARCHITECTURE.md; held by tests/cli/test_startup.py).

# --- shared helpers ---------------------------------------------------------------------

# The packages' own error bases: each becomes one line (and a non-zero exit).
DOMAIN_ERRORS = (HarnessError, ProjectionError, WikiError, RepoError)


def redact_message(message: str) -> str:
    """The secret redactor's (ledger/secrets/redactor.py) text of `message`, which loads on
    the first message that needs it."""
    from .ledger.secrets.redactor import redact_message as redact

    return redact(message)


def fail_cleanly(fn):
    """Turn the packages' own errors into one-line ClickExceptions."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except click.ClickException as e:
            # click declares `message` Final; redacting in place keeps the exception's class
            # (a UsageError's exit code and usage text).
            e.message = redact_message(e.message)  # type: ignore[misc]
            raise
        except LedgerError as e:
            if len(getattr(e, "problems", ())) > 1:
                _spec_error(e)  # a spec's problems: one `error: FILE:LINE: …` line each
            raise click.ClickException(redact_message(" ".join(str(e).split()))) from None
        except DOMAIN_ERRORS as e:
            raise click.ClickException(redact_message(" ".join(str(e).split()))) from None

    return wrapper


def printable_streams() -> None:
    """The printing edge: whatever forge prints on stdout and stderr passes through the one
    sanitiser (ledger/text.py): a stored summary's `\r`, a metric name's OSC, a SQL cell's
    ESC show as escapes, never act on the terminal. JSON stays valid (JSON's own escapes)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, PrintableStream):
            setattr(sys, name, PrintableStream(stream))


def to_json(value: Any, indent: int | None = None) -> str:
    """JSON text of `value`, always valid: a NaN or an infinity (from SQL or a computation)
    is written `null` (ledger.numbers.json_safe), other types by their str()."""
    return json_text(value, indent)


def emit_json(value: Any) -> None:
    click.echo(to_json(value, indent=2))


def open_ws(ctx: click.Context) -> Workspace:
    from .ledger.workspace import open_workspace

    ws = open_workspace(ctx.obj.get("home"))
    ctx.call_on_close(ws.close)
    ctx.call_on_close(lambda: _keep_reads(ws))  # LIFO: before the close
    return ws


def _keep_reads(ws: Workspace) -> None:
    """After a command that wrote to task streams and ended well (no exception on its way
    out, Ctrl-C included): keep their `task list` / `task memory` rows for the next reads
    (projections/fast_reads.py)."""
    if sys.exc_info()[0] is not None or not ws.ledger.written():
        return
    from .projections.fast_reads import keep_written

    keep_written(ws.ledger)


def parse_time(value: str | None, field: str) -> datetime | None:
    if value is None:
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO-8601 time", param_hint=field) from None
    if dt.tzinfo is None:
        dt = dt.astimezone()
    return dt


def warn_undecodable(u) -> None:
    """A reader met a stored event it cannot decode (`store.Undecodable`): say so on stderr,
    one line with its position, stream and version, and keep reading."""
    click.echo(f"warning: {u.line()}", err=True)


def event_row(r) -> dict[str, Any]:
    return {
        "position": r.position,
        "stream": r.stream,
        "version": r.version,
        "type": r.type,
        **r.event.model_dump(mode="json"),
    }


# --- root -------------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="FORGE_HOME",
    help="Workspace directory (default: $FORGE_HOME, else ./.forge).",
)
@click.version_option(package_name="infer-forge")
@click.pass_context
def main(ctx: click.Context, home: Path | None) -> None:
    """infer-forge: pin a deployment point, run optimization work as gated task loops,
    and keep every step in an append-only ledger you can replay, query and browse.

    \b
    Example:
      forge init && forge demo && forge log --type TaskExited
    """
    ctx.ensure_object(dict)
    ctx.obj["home"] = home
    printable_streams()


# --- workspace and ledger ---------------------------------------------------------------


@main.command()
@click.option("--home", "init_home", type=click.Path(file_okay=False, path_type=Path),
              help="Where to create the workspace (overrides the global --home).")
@click.option("--ledger-url", help="sqlite:///ledger.sqlite (default) or postgresql://…")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def init(ctx: click.Context, init_home: Path | None, ledger_url: str | None, as_json: bool) -> None:
    """Create a workspace: forge.toml, the ledger, artifacts/, models/, wiki/, site/.

    Idempotent: running it again on an existing workspace changes nothing.

    \b
    Example:
      forge init --home ./.forge
    """
    from .ledger.workspace import init_workspace

    ws, created = init_workspace(init_home or ctx.obj.get("home"), ledger_url=ledger_url)
    with ws:
        info = {"home": str(ws.home), "created": created, "ledger": ws.config.ledger_url}
    if as_json:
        emit_json(info)
    else:
        verb = "created" if created else "already exists"
        click.echo(f"workspace {verb}: {info['home']} (ledger {info['ledger']})")


def _time_arg(value: str | None, field: str) -> datetime | None:
    """parse_time with a one-line error (click's usage errors take four lines)."""
    try:
        return parse_time(value, field)
    except click.BadParameter:
        raise click.ClickException(
            f"{field}: {value!r} is not an ISO-8601 time (e.g. 2026-11-01 or 2026-11-01T12:00Z)"
        ) from None


def _position_arg(value: str | None, field: str) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise click.ClickException(
            f"{field}: {value!r} is not a ledger position (an integer from 1; see `forge log`)"
        ) from None


@main.command("log")
@click.option("--task", help="Only events of this task.")
@click.option("--type", "types", multiple=True, help="Only this event type (repeatable).")
@click.option("--since", help="Only events at or after this ISO-8601 time.")
@click.option("--until", "until_time", help="Only events at or before this ISO-8601 time.")
@click.option("--limit", type=click.IntRange(min=1), help="At most this many (the latest).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event (JSONL).")
@click.pass_context
@fail_cleanly
def log_cmd(ctx, task, types, since, until_time, limit, as_json) -> None:
    """Show the ledger's events in global order.

    An event that cannot be decoded is reported on stderr with its position, stream and
    version (with --json also as a record with "undecodable": true) and the rest is shown.

    \b
    Example:
      forge log --task tune-tiny-cpu --type MeasurementRecorded --since 2026-11-01
    """
    from .projections.fast_reads import LogRow, read_log

    since_t, until_t = _time_arg(since, "--since"), _time_arg(until_time, "--until")
    # An event that cannot be decoded stays in its place: on stderr (and, with --json, as
    # a record with "error") and reading goes on; `forge check` fails on it.
    records = read_log(ctx.obj.get("home"), task=task, types=types, since=since_t,
                       until=until_t)
    if limit:
        records = records[-limit:]
    for r in records:
        if not isinstance(r, LogRow):  # an Undecodable (ledger/store.py)
            warn_undecodable(r)
            if as_json:
                click.echo(to_json(r.as_dict()))
            continue
        if as_json:
            click.echo(to_json(r.fields()))
        else:
            at, task_id, block_id, name, model = r.head()
            where = task_id or r.stream
            if block_id:
                where += f"/{block_id}"
            who = name + (f"({model})" if model else "")
            click.echo(f"{r.position:>7}  {at:%Y-%m-%d %H:%M:%S}  {r.type:<22} "
                       f"{where:<28} {who}")


@main.command()
@click.argument("task")
@click.option("--until", "until", help="Global position to replay up to (inclusive).")
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
@click.pass_context
@fail_cleanly
def replay(ctx, task: str, until: str | None, as_json: bool) -> None:
    """Rebuild a task's state from the ledger, optionally as it was at a past position.

    A state is never shown from part of a history: if the task's stream holds an event that
    cannot be decoded, this fails naming its position (replay with --until before it; `forge
    check` lists all damage). Other tasks replay as usual.

    \b
    Example:
      forge replay tune-tiny-cpu --until 120 --json
    """
    from .ledger.replay import replay_task
    from .ledger.state import fingerprint

    position = _position_arg(until, "--until")
    ws = open_ws(ctx)
    state = replay_task(ws.ledger, task, position)
    data = state.model_dump(mode="json")
    data["fingerprint"] = fingerprint(state)
    if as_json:
        emit_json(data)
        return
    click.echo(f"task {state.task_id}: {state.title} [{state.task_type}]")
    click.echo(f"  status: {state.status}" + (f" ({state.exit_state}: {state.exit_reason})"
                                               if state.exit_state else ""))
    click.echo(f"  as of position {state.last_position}, stream version {state.version}")
    if any(x["reopened"] for x in state.exits):  # a reopened task: its exit history
        click.echo("  exits: " + " -> ".join(
            x["state"] + (f" (reopened: {x['reopened']})" if x["reopened"] else "")
            for x in state.exits))
    click.echo(f"  blocks: {len(state.blocks)}, measurements: {state.measurements}, "
               f"accepted: {len(state.accepted)}, rejected: {len(state.rejected)}")
    for b in state.blocks:
        verdicts = ",".join(b.verifications) or "-"
        click.echo(f"    {b.block_id:<8} {b.status:<11} verdicts={verdicts:<12} {b.sub_goal}")
        if b.steps:
            click.echo(f"    {'':<8} steps: {_steps_text(b.steps)}")
    click.echo(f"  fingerprint: {data['fingerprint']}")


def _steps_text(steps: list[dict[str, Any]]) -> str:
    """A verification path on one line: `baseline pass, gates fail, decide deferred`."""
    return ", ".join(f"{x['name']} {x['outcome']}" for x in steps)


@main.group()
def events() -> None:
    """Export the ledger's events."""


@events.command("export")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write to this file (default: stdout).")
@click.option("--include-bookkeeping", is_flag=True, help="Also export CommandHandled markers.")
@click.pass_context
@fail_cleanly
def events_export(ctx, output: Path | None, include_bookkeeping: bool) -> None:
    """Export every event as JSONL, in global order. With -o, a line on stderr says how
    many of the ledger's events it wrote and what it left out (the CommandHandled markers
    that close each save, unless --include-bookkeeping), so its count meets `forge check`'s.

    \b
    Example:
      forge events export -o ledger.jsonl
    """
    from .ledger.store import BOOKKEEPING_TYPES

    ws = open_ws(ctx)
    out = output.open("w", encoding="utf-8") if output else sys.stdout
    bad = markers = 0

    def undecodable(u) -> None:
        # Kept in the export at its place, with the stored text, so nothing is lost.
        nonlocal bad
        bad += 1
        warn_undecodable(u)
        raw = ws.ledger.raw_state(u.position)
        out.write(to_json({**u.as_dict(), "raw": raw.decode("utf-8", "replace")}) + "\n")

    try:
        n = 0
        # One pass over every stored event: what is left out is counted, not guessed.
        for r in ws.ledger.log(include_bookkeeping=True, on_error=undecodable):
            if not include_bookkeeping and r.type in BOOKKEEPING_TYPES:
                markers += 1
                continue
            out.write(to_json(event_row(r)) + "\n")
            n += 1
    finally:
        if output:
            out.close()
    if output:
        total = n + bad + markers
        click.echo(f"exported {n} of {total} events to {output}"
                   + (f"; {bad} undecodable ones as error records" if bad else "")
                   + (f"; {markers} left out: CommandHandled markers, each closing a save "
                      "(bookkeeping; --include-bookkeeping exports them)" if markers else ""),
                   err=True)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
@fail_cleanly
def check(ctx, as_json: bool) -> None:
    """Verify the ledger: integrity, gap-free positions, every stream replays, artifacts hash.

    \b
    Example:
      forge check
    """
    from .ledger.check import check_home

    # A ledger too damaged to open is reported here (what, where), not raised.
    report = check_home(ctx.obj.get("home"))
    if as_json:
        emit_json({**report.__dict__, "ok": report.ok})
    else:
        click.echo(f"{report.events} events in {report.streams} streams ({report.tasks} tasks), "
                   f"positions 1..{report.max_position}, {report.artifacts} artifacts")
        for p in report.problems:
            click.echo(f"problem: {p}")
        for n in report.notes:
            click.echo(f"note: {n}")
        if report.ok:
            click.echo("ok")
    if not report.ok:
        raise SystemExit(1)


# --- specs and task loops ---------------------------------------------------------------


def parse_assignments(items: tuple[str, ...] | list[str], what: str, *,
                      numbers: bool = False) -> dict[str, Any]:
    """`KEY=VALUE` options, one parser for every command (--set, --metric). VALUE is JSON when
    it is JSON (8, 1e3, true, "text", [1, 2]), else the text as given (bfloat16, eager: no
    YAML, so `yes` stays text and a value can hold any character). A number the ledger
    cannot hold (NaN, infinities, integers past 64 bits) is refused naming the key; with
    `numbers`, every VALUE must be a finite number."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.ClickException(f"{what} {item!r}: expected KEY=VALUE")
        where = f"{what} {key}"
        try:
            value = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON (or too deep for it): the text
            value = raw
        if numbers:
            if isinstance(value, str):
                try:
                    value = float(value)  # "nan", "inf", "-Infinity": refused just below
                except ValueError:
                    raise click.ClickException(f"{where}: {raw!r} is not a number") from None
            value = finite_float(value, where)
        else:
            check_finite(value, where)
        out[key] = value
    return out


def _spec_error(e: Exception) -> None:
    """Print a SpecError's problems one per line on stderr and exit 1."""
    for line in getattr(e, "problems", [str(e)]):
        click.echo(f"error: {redact_message(line)}", err=True)
    raise SystemExit(1)


@main.group()
def point() -> None:
    """Deployment points, runtime profiles and task specs: show, validate, diff (no workspace)."""


@point.command("show")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print kind, hash and spec as JSON.")
def point_show(file: Path, as_json: bool) -> None:
    """Show a spec file's kind, canonical content hash and normalized content.

    \b
    Example:
      forge point show examples/points/tiny-cpu.yaml
    """
    import yaml

    from .ledger.specs import canonical, detect_kind, load_spec, spec_hash
    from .ledger.yamlio import load_yaml

    try:
        spec = load_spec(file)
    except SpecError as e:
        _spec_error(e)
    kind = detect_kind(load_yaml(file)[0])
    data = {"file": str(file), "kind": kind, "hash": spec_hash(spec), "spec": canonical(spec)}
    if as_json:
        emit_json(data)
    else:
        click.echo(f"# {kind} {data['hash']}")
        click.echo(yaml.safe_dump(data["spec"], sort_keys=True).rstrip())


@point.command("validate")
@click.argument("files", nargs=-1, required=True,
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
def point_validate(files: tuple[Path, ...], as_json: bool) -> None:
    """Validate spec files: one line per problem (file:line: field: message), exit 1 if any.

    \b
    Example:
      forge point validate examples/points/*.yaml examples/tasks/*.yaml
    """
    from .ledger.specs import load_spec, spec_hash

    results: list[dict[str, Any]] = []
    bad = False
    for f in files:
        try:
            spec = load_spec(f)
            results.append({"file": str(f), "ok": True, "kind": type(spec).__name__,
                            "hash": spec_hash(spec), "problems": []})
        except SpecError as e:
            bad = True
            results.append({"file": str(f), "ok": False, "problems": e.problems})
    if as_json:
        emit_json(results)
    else:
        for r in results:
            if r["ok"]:
                click.echo(f"ok {r['file']} ({r['kind']} {r['hash']})")
            for p in r["problems"]:
                click.echo(f"error: {p}", err=True)
    if bad:
        raise SystemExit(1)


@point.command("diff")
@click.argument("a", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("b", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the changes as JSON.")
def point_diff(a: Path, b: Path, as_json: bool) -> None:
    """Name the dimensions that differ between two specs (exit 0 either way).

    \b
    Example:
      forge point diff examples/points/tiny-cpu.yaml examples/points/qwen-h200.yaml
    """
    from .ledger.specs import diff_specs, load_spec, spec_hash

    try:
        sa, sb = load_spec(a), load_spec(b)
    except SpecError as e:
        _spec_error(e)
    changes = diff_specs(sa, sb)
    dims = sorted({c["dimension"] for c in changes})
    if as_json:
        emit_json({"a": spec_hash(sa), "b": spec_hash(sb), "dimensions": dims,
                   "changes": changes})
        return
    if not changes:
        click.echo(f"same content ({spec_hash(sa)})")
    else:
        click.echo(f"changed dimensions: {', '.join(dims)}")
    for c in changes:
        click.echo(f"  {c['path']}: {json.dumps(c['a'])} -> {json.dumps(c['b'])}")


@main.group()
def profile() -> None:
    """Versioned runtime profiles (service + revision)."""


@profile.command("record")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def profile_record(ctx, file: Path, as_json: bool) -> None:
    """Record a runtime profile revision; rev N+1 records what changed from rev N.

    \b
    Example:
      forge profile record examples/profiles/tiny-cpu.yaml
    """
    from .harness.loop.define import record_profile
    info = record_profile(open_ws(ctx), file)
    if as_json:
        emit_json(info)
    else:
        verb = "recorded" if info["recorded"] else "already recorded"
        click.echo(f"{info['service']} rev {info['rev']} {verb} ({info['profile_hash']})")
        for c in info["changes"].get("diff", []):
            click.echo(f"  {c['path']}: {json.dumps(c['a'])} -> {json.dumps(c['b'])}")


@main.group()
def task() -> None:
    """Task loops: define, run, resume, inspect, accept, reject, exit."""


@task.command("new")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--from", "from_task", metavar="TASK",
              help="Follow up this exited task: its handoff (exit, state reached, findings, "
                   "next sub-goal) becomes the new task's context.start_from, and it joins "
                   "context.prior_tasks.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def task_new(ctx, file: Path, from_task: str | None, as_json: bool) -> None:
    """Define a task from YAML (records its point and profile too). Idempotent.

    \b
    Example:
      forge task new examples/tasks/tune-tiny-cpu.yaml
      forge task new next-step.yaml --from tune-tiny-cpu
    """
    from .harness.loop.define import define_task
    ws = open_ws(ctx)
    try:
        info = define_task(ws, file, from_task=from_task)
    except SpecError as e:
        _spec_error(e)
    if as_json:
        emit_json(info)
    else:
        verb = "defined" if info["created"] else "already defined"
        click.echo(f"task {info['task_id']} {verb} ({info['definition_hash']})")


@task.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the tasks as JSON.")
@click.pass_context
@fail_cleanly
def task_list(ctx, as_json: bool) -> None:
    """List tasks with their status.

    \b
    Example:
      forge task list --json
    """
    from .projections.fast_reads import read_task_list
    rows = read_task_list(ctx.obj.get("home"), on_error=warn_undecodable)
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        status = r["status"] + (f" ({r['exit_state']})" if r["exit_state"] else "")
        click.echo(f"{r['task_id']:<28} {r['type'] or '':<20} {status:<28} "
                   f"blocks={r['blocks']} accepted={r['accepted']} rejected={r['rejected']}")


@task.command("show")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print the task as JSON.")
@click.pass_context
@fail_cleanly
def task_show(ctx, task_id: str, as_json: bool) -> None:
    """Show a task: definition hashes, status and its blocks.

    \b
    Example:
      forge task show tune-tiny-cpu
    """
    from .ledger.candidates import shown_differences
    from .ledger.titles import candidate_title
    from .projections.memory import task_summary
    s = task_summary(open_ws(ctx).ledger, task_id, on_error=warn_undecodable)
    if as_json:
        emit_json(s)
        return
    click.echo(f"task {task_id} [{s['definition'].get('type')}]: {s['definition'].get('goal')}")
    click.echo(f"  status: {s['status']}" + (f" ({s['exit_state']}: {s['exit_reason']})"
                                              if s["exit_state"] else ""))
    click.echo(f"  point {s['point_hash']}  profile {s['profile_hash']}")
    click.echo(f"  contract {s['contract_hash']}")
    c = s["correctness"]
    click.echo(f"  correctness: {', '.join(c['gates']) or 'no gate'} ({c['source']}; "
               f"a {c['type']} task's default: {c['default']})")
    for b in s["blocks"]:
        cand = candidate_title(b["candidate"])
        click.echo(f"    {b['block_id']:<5} {b['status']:<11} verdict={b['verdict'] or '-':<12} "
                   f"{b['decision'] or '-':<9} {cand}")
        if b.get("differs"):
            click.echo(f"          differs from the baseline: {shown_differences(b['differs'])}")
    if s["best_so_far"]:
        click.echo(f"  best so far: {json.dumps(s['best_so_far'], sort_keys=True)}")
    start = (s["definition"].get("context") or {}).get("start_from")
    if start:
        click.echo(f"  follows {start['task_id']} ({start.get('exit_state')}): next "
                   f"{start.get('next_sub_goal') or '-'}")
    for p in s["prior_tasks"]:
        best = p.get("best_so_far") or {}
        click.echo(f"  prior task {p['task_id']}: {p['status']}"
                   + (f" ({p['exit_state']})" if p.get("exit_state") else "")
                   + (f", best {best.get('metric')} {best.get('median')}" if best else "")
                   + (f"; handoff: {p['exit_handoff']}" if p.get("exit_handoff") else ""))


def _run_loop(ctx, task_id: str, as_json: bool) -> None:
    from .harness.loop.run import run_task
    ws = open_ws(ctx)

    def say(line: str) -> None:
        click.echo(line, err=as_json)
        (sys.stderr if as_json else sys.stdout).flush()

    r = run_task(ws, task_id, progress=say)
    info = {"task_id": r.task_id, "status": r.status, "exit_state": r.exit_state,
            "exit_reason": r.exit_reason, "blocks": r.blocks}
    if as_json:
        emit_json(info)
    else:
        click.echo(f"task {task_id}: {r.status}" + (f" {r.exit_state}" if r.exit_state else "")
                   + f" after {r.blocks} blocks")


@task.command("run")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Progress on stderr, result as JSON.")
@click.pass_context
@fail_cleanly
def task_run(ctx, task_id: str, as_json: bool) -> None:
    """Run a task's loop until it exits (or, for a manual task, waits for a person).

    \b
    Example:
      forge task run tune-tiny-cpu
    """
    _run_loop(ctx, task_id, as_json)


@task.command("resume")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Progress on stderr, result as JSON.")
@click.pass_context
@fail_cleanly
def task_resume(ctx, task_id: str, as_json: bool) -> None:
    """Resume a killed loop from the ledger alone (finished steps are not repeated).

    \b
    Example:
      forge task resume tune-tiny-cpu
    """
    _run_loop(ctx, task_id, as_json)


@task.command("memory")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print the whole Task Memory as JSON.")
@click.pass_context
@fail_cleanly
def task_memory_cmd(ctx, task_id: str, as_json: bool) -> None:
    """Show Task Memory: current block, last handoff, next block, record, best, rejected.

    \b
    Example:
      forge task memory tune-tiny-cpu --json
    """
    from .projections.fast_reads import read_task_memory
    mem = read_task_memory(ctx.obj.get("home"), task_id, on_error=warn_undecodable)
    if as_json:
        emit_json(mem)
        return
    click.echo(f"task {task_id}: {mem['status']}"
               + (f" ({mem['exit_state']})" if mem["exit_state"] else ""))
    cur, lh, nb, best = (mem["current_block"], mem["last_handoff"], mem["next_block"],
                         mem["best_so_far"])
    click.echo("  current block: " + (f"{cur['block_id']} {cur['sub_goal']}" if cur else "-"))
    click.echo("  last handoff: " + (f"{lh['block_id']} {lh['outcome']}: {lh['state_reached']}"
                                     if lh else "-"))
    click.echo("  next block: " + (f"b{nb['index']} {nb['sub_goal'] or ''}" if nb else "-"))
    click.echo("  best so far: " + (json.dumps(best, sort_keys=True) if best else "-"))
    click.echo(f"  no-progress streak: {mem['no_progress_streak']}")
    click.echo(f"  execution record ({len(mem['execution_record'])} blocks):")
    for b in mem["execution_record"]:
        v = (b["verification"]["verdict"] if b["verification"] else None) or "-"
        click.echo(f"    {b['block_id']:<5} {b['routing'].get('model_tier', '-'):<6} {v:<12} "
                   f"{b['decision'] or '-':<9} {json.dumps(b['candidate'], sort_keys=True)}")
        if b["verification"] and (steps := b["verification"]["steps"]):
            click.echo(f"    {'':<5} steps: {_steps_text(steps)}")
    for r in mem["rejected"]:
        click.echo(f"  rejected {r['block_id']}: {json.dumps(r['candidate'], sort_keys=True)}: "
                   f"{r['reason']}")


@task.command("noise")
@click.argument("task_id")
@click.option("--metric", "metrics", multiple=True,
              help="Metric (repeatable; default: the contract's gated metrics).")
@click.option("--json", "as_json", is_flag=True, help="Print the bands as JSON.")
@click.pass_context
@fail_cleanly
def task_noise(ctx, task_id: str, metrics: tuple[str, ...], as_json: bool) -> None:
    """The noise band at a task's deployment point: each metric's run-to-run CV learned from
    the point's repeated runs (what `contract.noise: learned` gates use; docs/noise.md).

    \b
    Example:
      forge task noise tune-tiny-cpu --metric output_throughput
    """
    from .projections.noise import task_bands

    info = task_bands(open_ws(ctx).ledger, task_id, metrics)
    if as_json:
        emit_json(info)
        return
    click.echo(f"task {task_id}: point {info['point_hash'] or '-'}")
    for m, b in info["bands"].items():
        click.echo(f"  {m}: " + ("no band (fewer than 2 degrees of freedom of repeated runs)"
                                 if b is None else
                                 f"{b['cv']:.2%} over {b['groups']} groups, {b['runs']} runs"))


@task.command("accept")
@click.argument("task_id")
@click.option("--block", help="Block to accept (default: the open or last block).")
@click.option("--summary", default="", help="What is delivered.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def task_accept(ctx, task_id: str, block: str | None, summary: str, as_json: bool) -> None:
    """Accept a block's candidate (needs a passing verification of the task's contract).

    \b
    Example:
      forge task accept tune-tiny-cpu --block b4 --summary "eager + continuous batching"
    """
    from .harness.loop.manual import accept
    info = accept(open_ws(ctx), task_id, block=block, summary=summary)
    emit_json(info) if as_json else click.echo(f"accepted {task_id}/{info['block_id']}")


@task.command("reject")
@click.argument("task_id")
@click.option("--reason", required=True, help="Why this direction is rejected.")
@click.option("--block", help="Block to reject (default: the open or last block).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def task_reject(ctx, task_id: str, reason: str, block: str | None, as_json: bool) -> None:
    """Reject a block's direction, with a reason.

    \b
    Example:
      forge task reject tune-tiny-cpu --reason "bf16 breaks token match"
    """
    from .harness.loop.manual import reject as reject_direction
    info = reject_direction(open_ws(ctx), task_id, reason, block=block)
    emit_json(info) if as_json else click.echo(f"rejected {task_id}/{info['block_id']}")


@task.command("exit")
@click.argument("task_id")
@click.option("--state", required=True, type=click.Choice(
    ["delivered", "follow-up-handoff", "failed-budget", "failed-unverifiable", "failed-blocked",
     "failed-no-progress", "aborted-by-human"]), help="Terminal state.")
@click.option("--reason", required=True, help="Why the task ends here.")
@click.option("--handoff", help="Handoff note (required for follow-up-handoff).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def task_exit(ctx, task_id: str, state: str, reason: str, handoff: str | None,
              as_json: bool) -> None:
    """End a task in a typed terminal state (its criteria are checked).

    \b
    Example:
      forge task exit tune-tiny-cpu --state aborted-by-human --reason "superseded"
    """
    from .harness.loop.manual import exit_task
    info = exit_task(open_ws(ctx), task_id, state, reason, handoff=handoff)
    emit_json(info) if as_json else click.echo(f"task {task_id} exited: {state}")


@task.command("reopen")
@click.argument("task_id")
@click.option("--reason", required=True, help="Why the task runs again (the blocker is gone…).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def task_reopen(ctx, task_id: str, reason: str, as_json: bool) -> None:
    """Reopen an exited task; its exit stays in the history (forge replay shows it).

    Reopens failed-blocked, failed-unverifiable, failed-no-progress, follow-up-handoff and
    aborted-by-human; `forge task run` (or the manual path) then continues the task.

    \b
    Example:
      forge task reopen tune-tiny-cpu --reason "the engine image is fixed"
    """
    from .harness.loop.manual import reopen_task
    info = reopen_task(open_ws(ctx), task_id, reason)
    emit_json(info) if as_json else click.echo(
        f"task {task_id} reopened (was {info['reopened']})")


@main.group()
def block() -> None:
    """Loop blocks driven by hand (manual executor): start, verify, handoff."""


@block.command("start")
@click.argument("task_id")
@click.option("--sub-goal", required=True, help="What this block tries to reach.")
@click.option("--set", "sets", multiple=True, help="Candidate KEY=VALUE (scope key; repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def block_start(ctx, task_id: str, sub_goal: str, sets: tuple[str, ...], as_json: bool) -> None:
    """Open a loop block (no --set: a baseline block).

    \b
    Example:
      forge block start tune-tiny-cpu --sub-goal "try eager" --set engine.attn_implementation=eager
    """
    from .harness.loop.manual import start_block
    info = start_block(open_ws(ctx), task_id, sub_goal, parse_assignments(sets, "--set"))
    emit_json(info) if as_json else click.echo(f"started {task_id}/{info['block_id']}")


@block.command("verify")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@click.pass_context
@fail_cleanly
def block_verify(ctx, task_id: str, as_json: bool) -> None:
    """Verify the open block: run the task's verification path in order (its command steps
    as recorded tool calls; the contract's gates judged against the baseline at `gates`).

    \b
    Example:
      forge block verify tune-tiny-cpu
    """
    from .harness.loop.manual import verify_block
    info = verify_block(open_ws(ctx), task_id)
    if as_json:
        emit_json(info)
        return
    click.echo(f"{task_id}/{info['block_id']}: {info['verdict']}")
    for s in info["steps"]:
        click.echo(f"  step {s['name']:<14} {s['outcome']:<12} {s['detail']}")
    for g in info["gates"]:
        click.echo(f"  {g['name']:<14} {g['verdict']:<12} {g['reason']}")


@block.command("handoff")
@click.argument("task_id")
@click.option("--state-reached", required=True, help="The state this block reached.")
@click.option("--finding", "findings", multiple=True, help="A finding (repeatable).")
@click.option("--next", "next_sub_goal", help="The next block's sub-goal.")
@click.option("--outcome", default="progress",
              type=click.Choice(["progress", "no-progress", "failed", "delivered"]))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def block_handoff(ctx, task_id, state_reached, findings, next_sub_goal, outcome, as_json) -> None:
    """Close the open block with a handoff note.

    \b
    Example:
      forge block handoff tune-tiny-cpu --state-reached "eager: +2%" --next "try cb"
    """
    from .harness.loop.manual import handoff_block
    info = handoff_block(open_ws(ctx), task_id, state_reached=state_reached,
                         findings=list(findings), next_sub_goal=next_sub_goal, outcome=outcome)
    emit_json(info) if as_json else click.echo(f"handed off {task_id}/{info['block_id']}")


@main.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--task", "task_id", envvar="FORGE_TASK", required=True,
              help="Task whose open block records the call (default: $FORGE_TASK).")
@click.option("--json", "as_json", is_flag=True, help="Print the recorded call as JSON.")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
@fail_cleanly
def run_cmd(ctx, task_id: str, as_json: bool, argv: tuple[str, ...]) -> None:
    """Run a command as a recorded tool call of the task's open block; exits with its code.

    The command reads no input (its stdin is /dev/null, never forge's): give it files.

    \b
    Example:
      forge run --task tune-tiny-cpu -- python bench.py --concurrency 8
    """
    from .harness.loop.manual import run_command
    info = run_command(open_ws(ctx), task_id, list(argv), tee=not as_json)
    if as_json:
        emit_json(info)
    code = info["exit_code"]
    if code is None:
        raise click.ClickException(info["error"] or "command did not run")
    if code:
        ctx.exit(code)


@main.command("measure")
@click.argument("task_id")
@click.option("--metric", "metrics", multiple=True, help="NAME=NUMBER (repeatable).")
@click.option("--from-json", "from_json", type=click.Path(dir_okay=False, path_type=Path),
              help="A JSON file with an object of metrics (e.g. a bench_serving result).")
@click.option("--source", default="manual", help="Where the numbers come from.")
@click.option("--failed", is_flag=True, help="Record a failed run.")
@click.option("--error", help="The failed run's error.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def measure_cmd(ctx, task_id, metrics, from_json, source, failed, error, as_json) -> None:
    """Record a measurement in the task's open block.

    \b
    Example:
      forge measure tune-tiny-cpu --metric output_throughput=512 --metric median_ttft_ms=80
    """
    from .harness.bench.importer import metrics_from_json
    from .harness.loop.manual import record_measurement
    values = parse_assignments(metrics, "--metric", numbers=True)
    if from_json:
        values = {**metrics_from_json(from_json), **values}
    bad = [k for k, v in values.items() if not isinstance(v, int | float) or isinstance(v, bool)]
    if bad:
        raise click.BadParameter(f"not numbers: {', '.join(bad)}", param_hint="--metric")
    if not values and not failed:
        raise click.UsageError("give --metric NAME=NUMBER, --from-json FILE or --failed")
    info = record_measurement(open_ws(ctx), task_id, values, source=source,
                              success=not failed, error=error,
                              artifact=from_json)
    emit_json(info) if as_json else click.echo(f"recorded {info['run_id']} in "
                                               f"{task_id}/{info['block_id']}")


# --- harness: weights, engines, bench, gates, demo --------------------------------------


# weights and engines


@main.group()
def weights() -> None:
    """Pull, reference and list model weights (generated into FORGE_HOME/models; hub
    snapshots and directories referenced where they lie)."""


@weights.command("pull")
@click.argument("name")
@click.option("--allow-patterns", "allow_patterns", multiple=True, metavar="GLOB",
              help="A hub model: only the files matching a pattern (repeatable), as "
                   "huggingface_hub's allow_patterns.")
@click.option("--verify", is_flag=True,
              help="Read every byte: a directory's files hashed (sha256), a hub snapshot's "
                   "blobs checked against the hub's hashes they are named by.")
@click.option("--refresh", is_flag=True,
              help="A hub model: ask the hub what the revision names now, even when the "
                   "cache has a snapshot for it (a branch that moved).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def weights_pull(ctx, name: str, allow_patterns: tuple[str, ...], verify: bool,
                 refresh: bool, as_json: bool) -> None:
    """Pull a model. `tiny-llama` is generated offline (same digest everywhere); a hub id
    (org/model[@revision]) is referenced in the shared Hugging Face cache (HF_HUB_CACHE /
    HF_HOME), downloaded there only when missing, its revision resolved to a commit; a
    directory (path:/abs/dir) is referenced in place. Nothing is copied.

    \b
    Examples:
      forge weights pull tiny-llama
      forge weights pull Qwen/Qwen3-30B-A3B@main --allow-patterns '*.json' \\
          --allow-patterns '*.safetensors'
      forge weights pull path:/data/models/my-finetune --verify
    """
    from .harness.models.weights import pull
    pulled = pull(open_ws(ctx), name, allow_patterns=list(allow_patterns) or None,
                  verify=verify, refresh=refresh).as_dict()
    if as_json:
        emit_json(pulled)
    elif pulled["source"] == "recipe":
        verb = "already present" if pulled["reused"] else "pulled"
        click.echo(f"{pulled['name']} {verb}: {pulled['path']} ({pulled['digest']})")
    else:
        at = (f"@{pulled['revision']} = commit {pulled['commit']}"
              if pulled["source"] == "hub" else "")
        click.echo(f"{pulled['name']}{at} referenced in place: {pulled['path']} "
                   f"({pulled['files']} files, {pulled['digest_kind']} digest "
                   f"{pulled['digest']})")


@weights.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the models as JSON.")
@click.pass_context
@fail_cleanly
def weights_list(ctx, as_json: bool) -> None:
    """List pulled models with their digests.

    \b
    Example:
      forge weights list --json
    """
    from .harness.models.weights import list_models
    models = list_models(open_ws(ctx).home)
    if as_json:
        emit_json(models)
    else:
        for m in models:
            click.echo(f"{m['name']:<24} {m['digest']}  {m['path']}")


@main.group()
def engine() -> None:
    """Launch and inspect serving engines (hf, sglang, external)."""


def _host_values(items: tuple[str, ...], what: str) -> dict[str, str]:
    """`HOST=VALUE` options as {host: value}; one line for a malformed one."""
    out: dict[str, str] = {}
    for item in items:
        host, sep, value = item.partition("=")
        if not sep or not host.strip() or not value.strip():
            raise click.ClickException(f"{what} {item!r}: expected HOST=VALUE")
        out[host.strip()] = value.strip()
    return out


@engine.command("up")
@click.argument("profile", required=False, type=click.Path(dir_okay=False, exists=True))
@click.option("--point", "point", type=click.Path(dir_okay=False, exists=True),
              help="Deploy a whole deployment point (its topology: colocated, PD or EPD with "
                   "the router); PROFILE defaults to the point's runtime_profile.file.")
@click.option("--plan", "plan_only", is_flag=True,
              help="With --point: print the launch plan (every command line, port and device) "
                   "and start nothing.")
@click.option("--base-port", type=click.IntRange(1, 65535),
              help="With --point: the entry's port; servers count up from it, bootstrap "
                   "ports from +1000 (default: a free block; 30000 for --plan).")
@click.option("--model", help="A pulled model name, a model directory, or a hub id.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override an engine config key (repeatable), e.g. engine.dtype=bfloat16.")
@click.option("--once", is_flag=True, help="Describe the running engine and stop at once.")
@click.option("--check-parser", is_flag=True,
              help="With --point --plan: parse every server's command line with the real "
                   "argument parser of the pinned SGLang release (its wheel, ~39 MB, is "
                   "fetched from the package index once); exit 1 when one is rejected.")
@click.option("--hosts", help="With --point --plan (or --ray): the Node Registry hosts of a "
                             "point over several hosts, comma-separated (rank 0 and the "
                             "router first).")
@click.option("--ray", "ray_address", metavar="ADDRESS",
              help="With --point --hosts: launch the plan through the Ray cluster at ADDRESS "
                   "(one agent per host, pinned to the node offering resource host:NAME, or "
                   "named NAME).")
@click.option("--ib-device", "ib_devices", multiple=True, metavar="HOST=DEVICES",
              help="With --point: that host's --disaggregation-ib-device (repeatable), "
                   "e.g. node-0=mlx5_0,mlx5_1.")
@click.option("--json", "as_json", is_flag=True, help="Print the description as JSON.")
@click.pass_context
@fail_cleanly
def engine_up_cmd(ctx, profile: str | None, point: str | None, plan_only: bool,
                  base_port: int | None, model: str | None, sets: tuple[str, ...], once: bool,
                  check_parser: bool, hosts: str | None, ib_devices: tuple[str, ...],
                  ray_address: str | None, as_json: bool) -> None:
    """Launch a runtime profile's engine, print what runs, keep it up until Ctrl-C.

    \b
    Examples:
      forge engine up examples/profiles/tiny-cpu.yaml --model tiny-llama --once
      forge engine up --point examples/points/qwen3-235b-pd-h200.yaml --plan
      forge engine up --point examples/points/qwen3-235b-pd-h200.yaml --plan --check-parser
      forge engine up --point examples/points/deepseek-v3-pd-2x8-h200.yaml --plan \
          --hosts gpu-a,gpu-b --ib-device gpu-a=mlx5_0,mlx5_1 --ib-device gpu-b=mlx5_0,mlx5_1
      forge engine up --point examples/points/deepseek-v3-pd-2x8-h200.yaml \
          --hosts gpu-a,gpu-b --ray gpu-a:6379
    """
    from .harness.engines.up import engine_up
    if check_parser and not (point is not None and plan_only):
        raise click.UsageError("--check-parser needs --point and --plan")
    if point is not None:
        from .harness.engines.point_up import point_up
        ws = None
        try:
            ws = open_ws(ctx)
        except LedgerError:
            if not plan_only:  # a printed plan needs no workspace (no registry: NVML only)
                raise
        out = point_up(ws, point, profile_path=profile,
                       model=model, overrides=parse_assignments(sets, "--set"),
                       base_port=base_port, plan_only=plan_only, once=once,
                       echo=lambda s: click.echo(s, err=True), check_parser=check_parser,
                       hosts=[h.strip() for h in hosts.split(",") if h.strip()] if hosts
                       else None,
                       ib_devices=_host_values(ib_devices, "--ib-device"), ray=ray_address)
        check = out.get("parser_check")
        if as_json:
            emit_json(out)
        else:
            from .harness.engines.plan import LaunchPlan
            plan = LaunchPlan.model_validate({k: v for k, v in out["plan"].items()
                                              if k != "digest"})
            click.echo("\n".join(plan.lines()))
            click.echo(f"  plan digest {out['plan']['digest']}")
            for p in (out.get("deployment") or {}).get("processes", []):
                where = f" on {p['host']} (Ray node {p['ray_node'][:12]})" \
                    if p.get("ray_node") else ""
                click.echo(f"  ran {p['name']}{where}: pid {p['pid']}, ready in "
                           f"{p['startup_s']:.1f}s, sglang {p['version'] or '-'}, "
                           f"log {p['log_path']}")
            for r in (check or {}).get("servers", []):
                click.echo(f"  sglang {(check or {})['version']} parser: {r['name']} "
                           f"{'accepted' if r['ok'] else 'REJECTED: ' + r['error']}")
        if check is not None and not check["ok"]:
            ctx.exit(1)
        return
    if profile is None or plan_only or base_port is not None:
        raise click.UsageError("give a PROFILE, or --point POINT (--plan and --base-port "
                               "need --point)")
    info = engine_up(open_ws(ctx), profile, model=model,
                     overrides=parse_assignments(sets, "--set"), once=once,
                     echo=lambda s: click.echo(s, err=True))
    if as_json:
        emit_json(info)
    else:
        click.echo(f"{info['engine']} at {info['base_url']}: model {info['model']}")
        click.echo(f"  command: {' '.join(info.get('launch_command') or [])}")
        for k, v in sorted((info.get("versions") or {}).items()):
            click.echo(f"  {k} {v}")


# perf: profile a running engine under load (harness/perf/)


@main.group("perf")
def perf() -> None:
    """Profile a running engine under load and compare profiles (not runtime profiles)."""


@perf.command("capture")
@click.option("--url", required=True, help="The engine's base URL.")
@click.option("--engine", "engine_name", type=click.Choice(["hf", "sglang", "external"]),
              required=True, help="sglang/external: /start_profile; hf: py-spy on --pid.")
@click.option("--model", required=True, help="Model name (a local directory also gives the "
              "tokenizer).")
@click.option("--pid", type=int, help="hf: the server's process id (py-spy attaches to it).")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(file_okay=False),
              help="The model's tokenizer directory (default: --model when a directory).")
@click.option("--duration", "duration_s", type=float, default=10.0, show_default=True,
              help="Seconds of load under the profiler (at least one round).")
@click.option("--load", "load_text", metavar="KEY=N,...",
              help="concurrency, requests (per round), input_len, output_len, seed.")
@click.option("--load-url", help="Send the load here instead of --url (a PD point's router, "
              "--url one role's server).")
@click.option("--rate", "rate_hz", type=int, default=100, show_default=True,
              help="py-spy samples per second.")
@click.option("--activities", default="CPU,GPU", show_default=True,
              help="sglang: CPU, GPU, MEM, CUDA_PROFILER, RPD (SGLang's ProfileReq).")
@click.option("--profile", "profile_text", metavar="KEY=VALUE,...",
              help="sglang: num_steps, start_step, profile_by_stage, with_stack, "
                   "record_shapes, merge_profiles, profile_prefix, profile_stages "
                   "(prefill+decode), detailed_annotations.")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--task", "task_id", help="Record on this task's stream (else 'profiles').")
@click.option("--block", "block_id", help="The loop block the profile belongs to.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@fail_cleanly
def perf_capture(ctx, url, engine_name, model, pid, tokenizer_dir, duration_s, load_text,
                 load_url, rate_hz, activities, profile_text, top, task_id, block_id,
                 as_json) -> None:
    """Profile the engine at --url while a load runs; traces become artifacts, the top
    operators/kernels/functions by time go into a ProfileCaptured event.

    \b
    Example:
      forge perf capture --url http://127.0.0.1:30000 --engine sglang --model M \\
        --tokenizer DIR --duration 10 --load concurrency=8,requests=32 --task T --block B
    """
    from .harness.perf.capture import capture_profile, format_summary, parse_load
    from .harness.perf.options import parse_options

    out = capture_profile(
        open_ws(ctx), url=url, engine=engine_name, model=model, duration_s=duration_s,
        load=parse_load(load_text), tokenizer_dir=tokenizer_dir, pid=pid, rate_hz=rate_hz,
        options=parse_options(profile_text, activities), top=top, task_id=task_id,
        block_id=block_id, load_url=load_url)
    if as_json:
        emit_json(out)
        return
    click.echo(format_summary(out))
    click.echo(f"recorded {out['event_id']} in {out['stream']}; traces: "
               + ", ".join(f"{n} {d}" for n, d in out["traces"].items()))


@perf.command("nsys")
@click.option("--url", required=True, help="The server that ran under nsys profile.")
@click.option("--report", type=click.Path(dir_okay=False, exists=True),
              help="The .nsys-rep (kept as an artifact; summarised by nsys stats if no "
                   "--stats).")
@click.option("--stats", "stats_csv", type=click.Path(dir_okay=False, exists=True),
              help="nsys stats --report=cuda_gpu_kern_sum --format=csv output.")
@click.option("--output-tokens", type=float, help="The window's output tokens (per-token "
              "figures).")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--task", "task_id", help="Record on this task's stream (else 'profiles').")
@click.option("--block", "block_id", help="The loop block the profile belongs to.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@fail_cleanly
def perf_nsys(ctx, url, report, stats_csv, output_tokens, top, task_id, block_id,
              as_json) -> None:
    """Record an Nsight Systems capture: the report as an artifact, its kernel summary as
    the profile's table (docs/perf.md has the recipe)."""
    from .harness.perf.capture import format_summary
    from .harness.perf.nsys_record import record_nsys

    out = record_nsys(open_ws(ctx), url=url, report=report, stats_csv=stats_csv,
                      output_tokens=output_tokens, top=top, task_id=task_id,
                      block_id=block_id)
    if as_json:
        emit_json(out)
        return
    click.echo(format_summary(out))
    click.echo(f"recorded {out['event_id']} in {out['stream']}; artifacts: "
               + ", ".join(f"{n} {d}" for n, d in out["traces"].items()))


@perf.command("compare")
@click.argument("a")
@click.argument("b")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@fail_cleanly
def perf_compare(ctx, a: str, b: str, as_json: bool) -> None:
    """Two recorded profiles kernel by kernel, per phase, largest time delta first (event
    ids or prefixes); captures without phases: their top entries' shares."""
    from .projections.perf import compare_captures, format_phases

    out = compare_captures(open_ws(ctx).ledger, a, b)
    if as_json:
        emit_json(out)
        return
    click.echo(f"A {out['a']['event_id']} ({out['a']['engine']}, {out['a']['at']})")
    click.echo(f"B {out['b']['event_id']} ({out['b']['engine']}, {out['b']['at']})")
    if out["phases"]:
        click.echo(format_phases(out))
        return
    for r in out["rows"]:
        fa = "-" if r["share_a"] is None else f"{r['share_a'] * 100:.2f} %"
        fb = "-" if r["share_b"] is None else f"{r['share_b'] * 100:.2f} %"
        click.echo(f"  {fa:>9}  {fb:>9}  {r['delta'] * 100:+7.2f}  {r['name']}")


# bench: benchmark client, bench_serving import


@main.group("bench", invoke_without_command=True)
@click.option("--url", help="Server base URL, e.g. http://127.0.0.1:8000.")
@click.option("--model", help="Model name sent in the request body.")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(file_okay=False),
              help="The model's tokenizer directory (exact prompt lengths).")
@click.option("--dataset", type=click.Choice(["random", "shared-prefix", "custom"]),
              default="random", show_default=True)
@click.option("--dataset-path", type=click.Path(dir_okay=False),
              help="custom: JSONL of {\"prompt\": ..., \"output_len\": ...}.")
@click.option("--input-len", type=int, default=128, show_default=True)
@click.option("--output-len", type=int, default=64, show_default=True)
@click.option("--range-ratio", type=float, default=1.0, show_default=True,
              help="Lengths uniform in [L*ratio, L] (sglang's default is 0.0).")
@click.option("--num-prompts", type=int, default=64, show_default=True)
@click.option("--max-concurrency", type=click.IntRange(min=1), help="Closed-loop limit.")
@click.option("--request-rate", type=float, default=float("inf"),
              help="Poisson arrivals per second (default inf: all at t=0).")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--seed", type=int, default=42, show_default=True)
@click.option("--engine", type=click.Choice(["hf", "sglang", "external", "scripted"]),
              default="hf", show_default=True, help="Decides extra body fields (ignore_eos).")
@click.option("--endpoint", type=click.Choice(["completions", "chat"]), default="completions",
              show_default=True)
@click.option("--extra-body", help="JSON object merged into every request body.")
@click.option("--transport", type=click.Choice(["auto", "raw", "aiohttp"]), default="auto",
              show_default=True, help="auto: the lean asyncio client for http://, else aiohttp.")
@click.option("--workers", default="auto", show_default=True,
              help="Processes sending a closed loop: auto (one per 64 streams, ≤ half the "
                   "CPUs) or N.")
@click.option("--goodput", multiple=True, help="SLO KEY:MS (ttft, tpot, e2el), repeatable.")
@click.option("--gsp-num-groups", type=int, default=4, show_default=True)
@click.option("--gsp-prompts-per-group", type=int, default=16, show_default=True)
@click.option("--gsp-system-prompt-len", type=int, default=512, show_default=True)
@click.option("--gsp-question-len", type=int, default=64, show_default=True)
@click.option("--records-out", type=click.Path(dir_okay=False), help="Per-request JSONL here.")
@click.option("--record", is_flag=True, help="Append a MeasurementRecorded (+ records artifact).")
@click.option("--task", "task_id", help="With --record: the task (else stream 'measurements').")
@click.option("--block", "block_id", help="With --record: the loop block.")
@click.option("--json", "as_json", is_flag=True, help="Print config and metrics as JSON.")
@click.option("--point", "point_file", type=click.Path(dir_okay=False, exists=True),
              help="Send this deployment point's workload: its dataset, lengths, prefix "
                   "reuse, images, load and SLO as goodput (docs/workload.md).")
@click.pass_context
@fail_cleanly
def bench(ctx, url, model, tokenizer_dir, dataset, dataset_path, input_len, output_len,
          range_ratio, num_prompts, max_concurrency, request_rate, warmup, seed, engine,
          endpoint, extra_body, transport, workers, goodput, gsp_num_groups, gsp_prompts_per_group,
          gsp_system_prompt_len, gsp_question_len, records_out, record, task_id, block_id,
          as_json, point_file) -> None:
    """Benchmark an OpenAI-compatible server with sglang.bench_serving's metrics.

    \b
    Example:
      forge bench --url http://127.0.0.1:8000 --model tiny-llama --tokenizer DIR \\
        --dataset random --input-len 128 --output-len 64 --num-prompts 64 \\
        --max-concurrency 8 --goodput ttft:500 --record --task tune-tiny-cpu
      forge bench --point examples/points/tiny-cpu.yaml --url URL --model M --tokenizer DIR
      forge bench import results.jsonl --task tune-tiny-cpu
    """
    if ctx.invoked_subcommand is not None:
        return  # (click runs a group's body before its subcommand's, --help included)
    from .harness.bench.client import bench_command, format_table
    if not url or not model:
        raise click.UsageError("forge bench needs --url and --model (or a subcommand)")
    if (task_id or block_id) and not record:
        raise click.UsageError("--task/--block only apply with --record")
    try:
        extra = json.loads(extra_body) if extra_body else {}
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e.msg}", param_hint="--extra-body") from None
    if not isinstance(extra, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--extra-body")
    if point_file:
        from click.core import ParameterSource

        from .harness.bench.workload import POINT_SETS, bench_point

        given = [n for n in POINT_SETS
                 if ctx.get_parameter_source(n) == ParameterSource.COMMANDLINE]
        if given:
            raise click.UsageError(f"--point sets the workload; drop --"
                                   f"{given[0].replace('_', '-')}")
        out = bench_point(point_file, url=url, model=model, tokenizer_dir=tokenizer_dir,
                          seed=seed, warmup=warmup, engine=engine, extra_body=extra,
                          transport=transport, workers=workers,
                          ws=open_ws(ctx) if record else None,
                          task_id=task_id, block_id=block_id, records_out=records_out,
                          guard_home=ctx.obj.get("home"))
    else:
        out = bench_command(
            url=url, model=model, dataset=dataset, tokenizer_dir=tokenizer_dir,
            dataset_path=dataset_path, num_prompts=num_prompts, input_len=input_len,
            output_len=output_len, range_ratio=range_ratio, max_concurrency=max_concurrency,
            request_rate=request_rate, warmup=warmup, seed=seed, engine=engine, endpoint=endpoint,
            extra_body=extra, goodput=goodput, transport=transport, workers=workers,
            gsp={"gsp_num_groups": gsp_num_groups, "gsp_prompts_per_group": gsp_prompts_per_group,
                 "gsp_system_prompt_len": gsp_system_prompt_len,
                 "gsp_question_len": gsp_question_len},
            ws=open_ws(ctx) if record else None, task_id=task_id, block_id=block_id,
            records_out=records_out, guard_home=ctx.obj.get("home"))
    if as_json:
        emit_json(out)
        return
    click.echo(format_table(out["metrics"]))
    if "measurement" in out:
        m = out["measurement"]
        click.echo(f"recorded {m['run_id']} in {m['stream']} (records {m['artifact']})")


@bench.command("import")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--task", "task_id", help="Record into this task's stream (else 'measurements').")
@click.option("--block", "block_id", help="Link the measurements to this loop block.")
@click.option("--sglang-version", help="The servers' SGLang version (their /server_info), "
              "for lines without server_info (0.5.4 and older, or through a router).")
@click.option("--client-version", help="The bench client's SGLang release (checked against "
              "the keys; the version recorded when nothing else says).")
@click.option("--json", "as_json", is_flag=True, help="Print the import summary as JSON.")
@click.pass_context
@fail_cleanly
def bench_import(ctx, file: Path, task_id, block_id, sglang_version, client_version,
                 as_json) -> None:
    """Record sglang.bench_serving JSONL results (any 0.4–0.5 version) as measurements.

    \b
    Example:
      forge bench import sglang_1129_1000_1024_1024.jsonl --task tune-qwen --block b3
    """
    from .harness.bench.importer import Given, import_results
    out = import_results(open_ws(ctx), file, task_id=task_id, block_id=block_id,
                         given=Given(sglang_version, client_version))
    if as_json:
        emit_json(out)
        return
    verb = "already imported" if out["duplicate"] else "recorded"
    click.echo(f"{verb} {out['runs']} bench_serving runs ({', '.join(out['shapes'])}) from "
               f"{out['file']} in {out['stream']}")
    for m in out["measurements"]:
        click.echo(f"  {m['run_id']:<40} {m['shape']}  output_throughput="
                   f"{m['output_throughput']:.2f}  median_ttft_ms={m['median_ttft_ms']:.2f}")
    if out["runs"] > len(out["measurements"]):
        click.echo(f"  … and {out['runs'] - len(out['measurements'])} more")


@main.command()
@click.option("--no-wiki", is_flag=True, help="Skip building the index and the wiki at the end.")
@click.option("--json", "as_json", is_flag=True, help="Also print the result as JSON at the end.")
@click.pass_context
@fail_cleanly
def demo(ctx, no_wiki: bool, as_json: bool) -> None:
    """Run the main job on the embedded engine and leave the workspace to explore.

    Pulls the generated tiny-llama, pins a CPU deployment point, defines a deployment-tuning
    task over the `hf` engine's knobs with throughput, TTFT-SLO, token-match and stability
    gates, runs the loop (baseline, candidates, verification, accept or reject, exit), then
    updates the index and builds the wiki. Running it again resumes from the ledger: a
    delivered demo reports again; one that exited without delivering is reopened and
    continues. A demo that does not deliver exits 1 with one line: why, with the numbers,
    and the command that continues it.

    \b
    Example:
      FORGE_HOME=/tmp/forge-demo forge demo
    """
    from .harness.demo import run_demo
    from .ledger.workspace import init_workspace
    from .wiki.build import build
    from .wiki.concepts.compiler import compile_wiki
    ws, _ = init_workspace(ctx.obj.get("home"))
    with ws:
        result = run_demo(ws, echo=click.echo)
        if not no_wiki:
            t = time.monotonic()
            click.echo("building the index and the wiki …")
            concepts = compile_wiki(ws, stale=True, deterministic=True)  # concept pages
            report = build(ws, post=wiki_post)
            result["timings"]["wiki_s"] = time.monotonic() - t
            click.echo(f"  {report.pages} wiki pages at ledger position {report.position}, "
                       f"site in {report.site_dir} ({result['timings']['wiki_s']:.1f}s)")
            click.echo(f"  {concepts.pages} concept pages (forge wiki compile) among them")
            forge = result["forge"]  # how this shell runs forge, with the home
            for cmd in (
                f'{forge} sql "SELECT block_id, metric, round(median(value), 2) '
                f"AS median FROM measurements WHERE metric IN ('output_throughput', "
                f"'median_ttft_ms') GROUP BY ALL ORDER BY ALL\"",
                f'{forge} wiki ask "why was bfloat16 rejected?"',
                f"{forge} wiki serve",
            ):
                click.echo(f"  {cmd}")
        _keep_reads(ws)  # the tour's first `forge task memory` reads the kept rows
    if as_json:
        emit_json(result)
    if result["problem"]:
        raise click.ClickException(result["problem"])


# --- journal: index, queries, wiki ------------------------------------------------------


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        # Four significant digits, never an exponent (11734.5, not 1.173e+04).
        s = f"{v:.4g}"
        if "e" not in s or not math.isfinite(v):
            return s
        if abs(v) >= 1:
            return f"{v:.0f}" if abs(v) >= 1e6 else f"{v:.1f}"
        from .wiki.numbers import number
        return number(v)
    return printable(str(v))  # one cell, one line: a newline in it is data


def print_table(columns: list[str], rows: list[Any], max_width: int = 60) -> None:
    """A plain aligned text table (the default output of query commands)."""
    cells = [[_cell(v)[:max_width] for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    click.echo("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    click.echo("  ".join("-" * w for w in widths))
    for r in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    click.echo(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")


def print_csv(columns: list[str], rows: list[Any]) -> None:
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow(["" if v is None else v for v in r])


def emit_rows(columns: list[str], rows: list[Any], as_json: bool, as_csv: bool) -> None:
    if as_json:
        emit_json([dict(zip(columns, r, strict=True)) for r in rows])
    elif as_csv:
        print_csv(columns, rows)
    else:
        print_table(columns, rows)


@main.group("index")
def index_group() -> None:
    """The DuckDB index (FORGE_HOME/index.duckdb): a rebuildable projection of the ledger."""


def _index_report(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit_json(report)
        return
    click.echo(f"index {report['path']}: position {report['position']} of "
               f"{report['ledger_position']} ({report['behind']} behind)")
    if "caught_up" in report:
        c = report["caught_up"]
        click.echo(f"  caught up {c['events']} events in {c['seconds']}s "
                   f"({c['events_per_s']} events/s, {c['batches']} batches)")
    click.echo("  " + ", ".join(f"{t} {n}" for t, n in report["rows"].items()))
    for u in report.get("skipped", []):
        click.echo(f"warning: index left out undecodable event at position {u['position']}: "
                   f"{u['error']} (`forge check` lists the damage)", err=True)


def _index_progress(p: Any) -> None:
    """A catch-up's progress after each batch when it takes more than one, on stderr
    (stdout stays the report, --json included)."""
    click.echo(p.line(), err=True)


@index_group.command("update")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--batch", type=click.IntRange(min=1), default=None,
              help="Notifications per transaction (default 200,000).")
@click.pass_context
@fail_cleanly
def index_update(ctx, as_json: bool, batch: int | None) -> None:
    """Catch the index up with the ledger (exactly once; resumes where it stopped).

    \b
    Example:
      forge index update
    """
    from .projections.index import update
    more = {} if batch is None else {"batch": batch}
    _index_report(update(open_ws(ctx), progress=_index_progress, **more), as_json)


@index_group.command("rebuild")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--batch", type=click.IntRange(min=1), default=None,
              help="Notifications per transaction (default 200,000).")
@click.pass_context
@fail_cleanly
def index_rebuild(ctx, as_json: bool, batch: int | None) -> None:
    """Delete the index and project the whole ledger again.

    \b
    Example:
      forge index rebuild --json
    """
    from .projections.index import rebuild
    more = {} if batch is None else {"batch": batch}
    _index_report(rebuild(open_ws(ctx), progress=_index_progress, **more), as_json)


@index_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
@fail_cleanly
def index_status(ctx, as_json: bool) -> None:
    """Show the tracked position, how far behind the ledger it is, and row counts.

    \b
    Example:
      forge index status
    """
    from .projections.index import status
    _index_report(status(open_ws(ctx)), as_json)


@main.command("sql", context_settings={"ignore_unknown_options": True})  # "-- note\nSELECT …"
@click.argument("query")
@click.option("--json", "as_json", is_flag=True, help="Rows as a JSON list of objects.")
@click.option("--csv", "as_csv", is_flag=True, help="Rows as CSV with a header.")
@click.option("--max-rows", type=click.IntRange(min=0), default=None,
              help="Print at most this many rows; a cut result says so on stderr "
                   "(default 10000; 0: no limit).")
@click.option("--timeout", "timeout_s", type=float, default=None,
              help="Stop the query after this many seconds (default 30; 0: no limit).")
@click.pass_context
@fail_cleanly
def sql_cmd(ctx, query: str, as_json: bool, as_csv: bool, max_rows: int | None,
            timeout_s: float | None) -> None:
    """Run read-only SQL over the index (caught up first). Tables: events, tasks,
    loop_blocks, tool_calls, measurements, verifications, gate_verdicts, decisions,
    handoffs, skills_provided, model_calls, points, runtime_profiles; views: task_overview,
    block_overview, metric_summary, profile_tradeoff, decision_evidence, valid_measurements.

    Queries only (SELECT/WITH, DESCRIBE, SHOW, EXPLAIN, PRAGMA, CALL), in a locked-down
    session: the index read-only, no other file (no COPY, EXPORT, ATTACH, read_csv, glob),
    no extension INSTALL/LOAD, no SET/RESET of the configuration.

    \b
    Example:
      forge sql "SELECT task_id, kind, reason FROM decisions WHERE kind = 'rejected'"
      forge sql "SELECT task_id, tier, sum(cost_usd) FROM model_calls GROUP BY ALL"
    """
    from .projections.queries import sql_ws
    t = sql_ws(open_ws(ctx), query, max_rows=max_rows, timeout_s=timeout_s)
    emit_rows(t.columns, t.rows, as_json, as_csv)
    if t.truncated:
        click.echo(f"forge sql: output cut at {len(t.rows)} rows; the result has more "
                   "(--max-rows N to raise the limit, 0 for none)", err=True)


@main.command("compare")
@click.argument("a")
@click.argument("b")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.pass_context
@fail_cleanly
def compare_cmd(ctx, a: str, b: str, as_json: bool) -> None:
    """Compare two tasks, blocks (task/block), runtime profiles (service@rev) or points, in
    this order: the deployment-point dimensions that differ, the gated metrics (medians with
    95% intervals, delta B - A, ratio B / A, the better side), the other metrics, the gate
    verdicts, then the latency percentiles from the runs' per-request records.

    \b
    Example:
      forge compare qwen-h200@1 qwen-h200@2
      forge compare tune-tiny-cpu/b1 tune-tiny-cpu/b2 --json
    """
    from .projections.comparison import LATENCIES, comparison_ws
    r = comparison_ws(open_ws(ctx), a, b)
    if as_json:
        emit_json(r)
        return
    click.echo(f"A: {a} ({r['a']['kind']}{', ' + r['a']['scope'] if r['a']['scope'] else ''})")
    click.echo(f"B: {b} ({r['b']['kind']}{', ' + r['b']['scope'] if r['b']['scope'] else ''})")
    click.echo("\nwhat differed:")
    if r["differing_dimensions"]:
        from .ledger.titles import dimension_value
        print_table(["dimension", "A", "B"],
                    [("candidate" if d["dimension"] == "candidate_key" else d["dimension"],
                      dimension_value(d["dimension"], d["a"]),
                      dimension_value(d["dimension"], d["b"]))
                     for d in r["differing_dimensions"]])
    else:
        click.echo("  (nothing: same deployment point)")

    def ci(v, lo, hi) -> str:
        return _cell(v) + ("" if lo is None or hi is None else f" [{_cell(lo)}, {_cell(hi)}]")

    def metric_rows(rows, gated: bool) -> list[tuple]:
        return [(m["metric"], *([", ".join(m["gates"])] if gated else []),
                 ci(m["a"], *m["a_ci"]), ci(m["b"], *m["b_ci"]), m["delta"], m["delta_pct"],
                 ci(m["ratio"], *m["ratio_ci"]),
                 *([{"a": "A", "b": "B"}.get(m["better"], m["better"] or "-"),
                    {True: "yes", False: "no"}.get(m["beyond_noise"], "-")] if gated else []),
                 m["a_n"], m["b_n"]) for m in rows]

    head = ["A [95% CI]", "B [95% CI]", "delta", "delta %", "B/A [95% CI]"]
    click.echo("\ngated metrics (medians):")
    if r["gated"]:
        print_table(["metric", "gates", *head, "better", "beyond noise", "n A", "n B"],
                    metric_rows(r["gated"], True))
    else:
        click.echo("  (no gate names a metric of these subjects)")
    click.echo("\nother metrics (medians):")
    print_table(["metric", *head, "n A", "n B"], metric_rows(r["other_metrics"], False))
    for side in ("a", "b"):
        gates = r["gates"][side]
        click.echo(f"\ngates {side.upper()}:")
        if not gates:
            click.echo("  (no verification)")
            continue
        print_table(["task", "block", "verification", "gate", "verdict", "observed",
                     "threshold", "reason"],
                    [(g["task_id"], g["block_id"], g["verification"], g["gate"], g["verdict"],
                      g["observed"], g["threshold"], g["reason"]) for g in gates])
    lat = r["latency"]
    click.echo("\nlatency from per-request records (ms):")
    print_table(["latency", "side", "n", "p50", "p90", "p99", "mean"],
                [(name, side.upper(), d["n"], d["p50"], d["p90"], d["p99"], d["mean"])
                 for key, name in LATENCIES for side, d in lat[key].items()])
    for side in ("a", "b"):
        for m in lat["missing"][side]:
            click.echo(f"  {side.upper()} {m['run_id']}: {m['why']}")
    for acc in r.get("accuracy", []):
        same = {True: "", False: "; NOT the same documents"}.get(acc["same_documents"], "")
        click.echo(f"\naccuracy items {acc['gate']}: {acc['items']} shared, "
                   f"{len(acc['lost'])} lost {acc['lost'][:20]}, {len(acc['gained'])} gained "
                   f"{acc['gained'][:20]}{same}")


@main.command("filter")
@click.option("--model", multiple=True, help="Model name (repeat for OR).")
@click.option("--type", "task_type", multiple=True, help="Task type (repeat for OR).")
@click.option("--gpu", multiple=True, help="Accelerator model, e.g. H200 (repeat for OR).")
@click.option("--engine", multiple=True, help="Engine: sglang, hf, external (repeat for OR).")
@click.option("--metric", multiple=True, help="Metric name (repeat for OR).")
@click.option("--task", multiple=True, help="Task id (repeat for OR).")
@click.option("--profile", multiple=True, help="Runtime profile service@rev (repeat for OR).")
@click.option("--arch", "architecture", multiple=True,
              help="Architecture: colocated, pd, epd (repeat for OR).")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Rows as a JSON list of objects.")
@click.option("--csv", "as_csv", is_flag=True, help="Rows as CSV with a header.")
@click.pass_context
@fail_cleanly
def filter_cmd(ctx, model, task_type, gpu, engine, metric, task, profile, architecture,
               limit, as_json, as_csv) -> None:
    """Measurements (median per task, block, candidate and metric) matching every given
    flag; repeated values of one flag are alternatives (OR). Text matches ignore case.

    \b
    Example:
      forge filter --model Qwen3-30B-A3B --gpu H200 --gpu H20 --metric output_throughput
    """
    from .projections.queries import filter_ws
    t = filter_ws(open_ws(ctx), limit=limit, model=model, task_type=task_type, gpu=gpu,
                  engine=engine, metric=metric, task=task, profile=profile,
                  architecture=architecture)
    emit_rows(t.columns, t.rows, as_json, as_csv)

@main.command("retrieve")
@click.argument("text")
@click.option("-k", "--top-k", "k", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--kind", "kinds", multiple=True, type=click.Choice(["decision", "handoff", "task"]),
              help="Only this kind of document (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.pass_context
@fail_cleanly
def retrieve_cmd(ctx, text: str, k: int, kinds: tuple[str, ...], as_json: bool) -> None:
    """Semantic search over decisions, handoffs and task goals (sentence embeddings).

    \b
    Example:
      forge retrieve "why was the DeepGEMM MoE path rejected on H20?" -k 3
    """
    from .wiki.retrieve import retrieve
    r = retrieve(open_ws(ctx), text, k, kinds)
    if as_json:
        emit_json(r)
        return
    for x in r["results"]:
        click.echo(f"{x['score']:.3f}  {x['kind']:<8} {x['title']}  ({x['url']})")
        click.echo(f"       {x['text'][:160]}")
    click.echo(f"({len(r['results'])} of {r['corpus']} documents; search {r['search_s']}s)")


@main.group("wiki")
def wiki_group() -> None:
    """The journal: markdown pages (FORGE_HOME/wiki) and a static site (FORGE_HOME/site)."""


@wiki_group.command("build")
@click.option("--no-embeddings", is_flag=True,
              help="Related pages from shared dimensions only (no embedding model).")
@click.option("--force", is_flag=True, help="Rebuild even if the wiki is fresh.")
@click.option("--no-compile", is_flag=True,
              help="Render the concept pages as compiled (stale ones show as stale) instead "
                   "of compiling what is stale first.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
@fail_cleanly
def wiki_build(ctx, no_embeddings: bool, force: bool, no_compile: bool, as_json: bool) -> None:
    """Generate the pages from the index (caught up first) and write the site.

    \b
    Example:
      forge wiki build && forge wiki lint
    """
    from .wiki.build import build
    rep = build(open_ws(ctx), embeddings=not no_embeddings, force=force, post=wiki_post,
                compile_concepts=not no_compile)
    if as_json:
        emit_json(rep.__dict__)
        return
    if rep.fresh:
        click.echo(f"wiki is fresh at ledger position {rep.position} ({rep.pages} pages)")
    else:
        click.echo(f"wiki at ledger position {rep.position}: {rep.pages} pages, "
                   f"{rep.written} written, {rep.unchanged} unchanged, {rep.removed} removed "
                   f"in {rep.seconds:.1f}s")
    if rep.concepts:
        click.echo(f"  {rep.concepts} concept pages compiled first (stale or new)")
    click.echo(f"  journal {rep.wiki_dir}\n  site    {rep.site_dir}/index.html")


@wiki_group.command("compile")
@click.option("--stale", is_flag=True,
              help="Recompile only pages that are not fresh, and concepts without a page.")
@click.option("--tier", default=None,
              help="The [models.TIER] that writes each page's synthesis (default: "
                   "[models.wiki] when configured).")
@click.option("--deterministic", is_flag=True,
              help="Tables and lists only, even with a model tier configured.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
@fail_cleanly
def wiki_compile(ctx, stale: bool, tier: str | None, deterministic: bool,
                 as_json: bool) -> None:
    """Compile concept pages across tasks (flags, model × accelerator pairings, recurring
    failures, rejected directions), every claim citing its ledger events.

    \b
    Example:
      forge wiki compile --stale && forge wiki build
    """
    from .wiki.concepts.compiler import compile_wiki
    rep = compile_wiki(open_ws(ctx), stale=stale, tier=tier, deterministic=deterministic,
                       post=wiki_post)
    if as_json:
        emit_json(rep.as_dict())
        return
    click.echo(f"concepts at ledger position {rep.position}: {rep.pages} pages, "
               f"{len(rep.compiled)} compiled, {rep.written} written, "
               f"{len(rep.removed)} removed in {rep.seconds:.1f}s")
    if rep.states:
        before = sorted(rep.states.items())
        click.echo("  pages before: " + ", ".join(f"{n} {s}" for s, n in before))
    if rep.model:
        m = rep.model
        click.echo(f"  model {m['tier']}:{m['model']}: {m['asked']} asked, {m['cached']} "
                   f"cached, {m['failed']} failed" + (f" ({m['error']})" if m["error"] else ""))
    for d in rep.dropped:
        click.echo(f"  dropped ({d['page']}): {d['reason']}: {d['text'][:120]}")
    click.echo(f"  journal {rep.wiki_dir}/concepts")


@wiki_group.command("lint")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too (stale claims, "
              "concepts without a page, a journal behind the ledger).")
@click.option("--files-only", is_flag=True, help="Check the journal's files only (not the "
              "record: no contradictions, stale claims or missing concepts).")
@click.pass_context
@fail_cleanly
def wiki_lint(ctx, as_json: bool, strict: bool, files_only: bool) -> None:
    """Check the journal: broken links, orphan pages, untyped pages, staleness; and the
    whole record: contradictions (errors), stale claims, concepts without a page
    (warnings). Exits 1 on an error (with --strict, on a warning too).

    \b
    Example:
      forge wiki lint --json
    """
    from .wiki.lint import lint
    rep = lint(open_ws(ctx), record=not files_only)
    if as_json:
        emit_json(rep.as_dict())
    else:
        click.echo(f"{rep.pages} pages, {rep.links} links")
        for b in rep.broken:
            click.echo(f"broken link: {b['page']} -> {b['target']}")
        for o in rep.orphans:
            click.echo(f"orphan: {o}")
        for u in rep.untyped:
            click.echo(f"no typed frontmatter: {u}")
        for c in rep.contradictions:
            click.echo(f"contradiction: {c['what']} on point "
                       f"{c['point_hash'][7:19]}: {c['metric']} {c['a']['effect']:+.1%} "
                       f"({c['a']['task_id']}, {c['a']['decision_id']}) vs "
                       f"{c['b']['effect']:+.1%} ({c['b']['task_id']}, "
                       f"{c['b']['decision_id']}), beyond ±{c['tolerance']:.1%} "
                       f"({c['band']} band)")
        for x in rep.stale_claims:
            click.echo(f"stale claim: {x['decision_id']} ({x['task_id']}): {x['reason']}")
        for m in rep.missing_concepts[:20]:
            click.echo(f"concept without a page: {m['concept']} ({m['page']})")
        if len(rep.missing_concepts) > 20:
            click.echo(f"… and {len(rep.missing_concepts) - 20} more concepts without a page")
        if rep.missing_concepts:
            click.echo("  (forge wiki compile writes them)")
        for oc in rep.orphaned_concepts:
            click.echo(f"orphaned concept page: {oc['page']} ({oc['concept']} is no longer "
                       "in the ledger)")
        if rep.stale:
            click.echo(f"stale: wiki reflects position {rep.wiki_position}, ledger is at "
                       f"{rep.ledger_position} (run forge wiki build)")
        if rep.ok:
            click.echo("ok" + (f" ({rep.warnings} warnings)" if rep.warnings else ""))
    if not rep.ok or (strict and rep.warnings):
        raise SystemExit(1)


@wiki_group.command("ask")
@click.argument("question")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
@click.option("--file", "file_it", is_flag=True,
              help="File the answer back as a journal page (answers/; on the site after the "
              "next forge wiki build).")
@click.option("--tier", help="The [models.<tier>] that phrases the answer (default: "
              "[models.wiki] when forge.toml has it).")
@click.option("--deterministic", is_flag=True,
              help="No model: the extractive answer (the matching claims).")
@click.option("--no-embeddings", is_flag=True, help="Never fall back to retrieval.")
@click.pass_context
@fail_cleanly
def wiki_ask(ctx, question: str, as_json: bool, file_it: bool, tier: str | None,
             deterministic: bool, no_embeddings: bool) -> None:
    """Answer a question from the journal: the concept catalog first, the pages it links,
    the index, then retrieval; every claim cites its ledger events.

    \b
    Example:
      forge wiki ask "why was bfloat16 rejected?"
      forge wiki ask "what do we know about FlashInfer MoE on H200?" --file
    """
    from .wiki.answers import file_answer
    from .wiki.ask import ask as ask_question
    ws = open_ws(ctx)
    ans = ask_question(ws, question, tier=tier, deterministic=deterministic,
                       embeddings=not no_embeddings, post=wiki_post)
    if file_it:
        file_answer(ws, ans)
    if as_json:
        emit_json(ans.as_dict())
        return
    site = ws.home / "site"
    if not ans.claims:
        click.echo("The journal holds nothing that answers this.")
    for i, c in enumerate(ans.claims, 1):
        click.echo(f"{i}. {c.text}")
        for x in c.citations:
            where = f" -> {site / x.page}.html" if x.page else ""
            click.echo(f"   [e:{x.event_id}] {x.type} at position {x.position}{where}")
        for v in c.caveats:
            click.echo(f"   caveat: {v}")
    for d in ans.dropped:
        click.echo(f"dropped: {d['text'][:160]} ({d['reason']})")
    if ans.mode == "model":
        for v in ans.caveats:
            click.echo(f"caveat: {v}")
    if ans.note:
        click.echo(f"note: {ans.note}")
    how = ans.model or "extractive"
    click.echo(f"({how}; ledger position {ans.position}; read: "
               f"{', '.join(ans.route)}"
               + (f"; filed as {ans.filed}" if ans.filed else "") + ")")


@wiki_group.command("serve")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="Port on 127.0.0.1 (0 picks a free one).")
@click.option("--no-build", is_flag=True, help="Serve the site as it is.")
@click.option("--no-embeddings", is_flag=True, help="Text search only.")
@click.pass_context
@fail_cleanly
def wiki_serve(ctx, port: int, no_build: bool, no_embeddings: bool) -> None:
    """Serve the site on localhost with search (semantic plus text).

    \b
    Example:
      forge wiki serve --port 8765   # then open http://127.0.0.1:8765/
    """
    from .wiki.serve import serve
    def echo(line: str) -> None:
        click.echo(line)
        sys.stdout.flush()

    serve(open_ws(ctx), port=port, build_first=not no_build, embeddings=not no_embeddings,
          echo=echo, post=wiki_post)



# --- task graph -------------------------------------------------------------------------


@main.group()
def graph() -> None:
    """Task graphs: tasks, shared repos and external systems joined by handoff, state and
    control edges; run in parallel, with verified handoffs and rework propagation.

    \b
    Example:
      forge graph new examples/graphs/serving-project.yaml && forge graph run -j 2
    """


def _graph_id(ws: Workspace, graph_id: str | None) -> str:
    from .projections.graph import resolve_graph_id
    return resolve_graph_id(ws.ledger, graph_id)


_graph_opt = click.option("-g", "--graph", "graph_id",
                          help="Graph name (default: the latest defined graph).")


@graph.command("new")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the graph summary as JSON.")
@click.pass_context
@fail_cleanly
def graph_new(ctx, file: Path, as_json: bool) -> None:
    """Define a graph from YAML (idempotent for the same file).

    Cycles through handoff/control edges and dangling edges are refused, naming the culprit.

    \b
    Example:
      forge graph new examples/graphs/serving-project.yaml
    """
    from .harness.graph.commands import define_graph
    from .projections.graph_views import summary
    ws = open_ws(ctx)
    view, created = define_graph(ws, file)
    if as_json:
        emit_json({"created": created, **summary(view)})
        return
    verb = "defined" if created else "already defined"
    click.echo(f"graph {view.graph_id} {verb}: {len(view.tasks())} tasks, "
               f"{len(view.nodes) - len(view.tasks())} repos/systems, {len(view.edges)} edges; "
               f"ready: {', '.join(view.ready()) or '-'}")


@graph.command("show")
@_graph_opt
@click.option("--json", "as_json", is_flag=True,
              help="States, ready queue, blocked, critical path.")
@click.option("--tree", is_flag=True, help="Draw the gating DAG as a tree.")
@click.option("--mermaid", is_flag=True, help="Print a Mermaid flowchart.")
@click.option("--dot", is_flag=True, help="Print Graphviz DOT.")
@click.pass_context
@fail_cleanly
def graph_show(ctx, graph_id, as_json, tree, mermaid, dot) -> None:
    """Show node states, the ready queue, why blocked nodes wait, and the critical path.

    \b
    Example:
      forge graph show --tree
      forge graph show --mermaid > graph.mmd
    """
    from .projections.graph import load_graph
    from .projections.graph_views import summary, to_dot, to_mermaid, tree_lines
    ws = open_ws(ctx)
    view = load_graph(ws.ledger, _graph_id(ws, graph_id))
    if mermaid:
        click.echo(to_mermaid(view), nl=False)
        return
    if dot:
        click.echo(to_dot(view), nl=False)
        return
    data = summary(view)
    if as_json:
        emit_json(data)
        return
    if tree:
        for line in tree_lines(view):
            click.echo(line)
        return
    click.echo(f"graph {view.graph_id}: {view.title}")
    counts = ", ".join(f"{k} {v}" for k, v in sorted(data["counts"].items()))
    click.echo(f"  {data['tasks']} tasks, {len(view.edges)} edges — {counts}")
    click.echo(f"  {'node':<28} {'type':<19} {'state':<13} {'att':>3} {'secs':>6}  why")
    for r in data["rows"]:
        state = "ready" if r["ready"] and r["state"] == "pending" else r["state"]
        why = ("ready to re-run: " if r["ready"] and state == "needs-rework" else "") + r["why"]
        secs = f"{r['duration_s']:.2f}" if r["duration_s"] is not None else "-"
        click.echo(f"  {r['id']:<28} {r['type']:<19} {state:<13} {r['attempt']:>3} {secs:>6}  "
                   f"{why}")
    click.echo(f"  critical path ({data['critical_path_s']:.2f}s): "
               f"{' -> '.join(data['critical_path'])}")


@graph.command("add-node")
@_graph_opt
@click.option("--file", "node_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A YAML mapping describing the node (as in the graph file).")
@click.option("--id", "node_id", help="Node id (when not using --file).")
@click.option("--kind", type=click.Choice(["task", "repo", "system"]), default="task")
@click.option("--type", "task_type", help="Task type, e.g. kernel, evaluation.")
@click.option("--title", default="")
@click.option("--sh", help="Work: a shell command line.")
@click.option("--verify", "verify", multiple=True, help="Verification shell line (repeatable).")
@click.option("--reason", default="", help="Why the graph changes (recorded).")
@click.pass_context
@fail_cleanly
def graph_add_node(ctx, graph_id, node_file, node_id, kind, task_type, title, sh, verify,
                   reason) -> None:
    """Add a node to a defined graph (recorded as NodeAdded).

    \b
    Example:
      forge graph add-node --id kernel-rope --type kernel --sh 'make rope' --verify './check'
    """
    from .harness.graph.commands import add_node
    from .ledger.graphspec import load_graph_yaml
    if node_file:
        data = load_graph_yaml(node_file)
    else:
        data = {"id": node_id, "kind": kind, "title": title}
        if task_type:
            data["type"] = task_type
        if sh:
            data["work"] = {"sh": sh, "verify": [{"name": f"verify{i + 1}", "sh": v}
                                                 for i, v in enumerate(verify)]}
    ws = open_ws(ctx)
    gid = _graph_id(ws, graph_id)
    view = add_node(ws, gid, data, reason)
    click.echo(f"graph {gid}: node {data.get('id')} added ({len(view.nodes)} nodes)")


@graph.command("add-edge")
@_graph_opt
@click.argument("src")
@click.argument("dst")
@click.option("--kind", type=click.Choice(["handoff", "state", "control"]), required=True)
@click.option("--action", type=click.Choice(["start", "stop", "rework"]),
              help="Control edges: start (default), stop, rework.")
@click.option("--deliverable", default="", help="Handoff edges: what flows.")
@click.option("--access", type=click.Choice(["read", "write"]), default="read")
@click.option("--reason", default="", help="Why the graph changes (recorded).")
@click.pass_context
@fail_cleanly
def graph_add_edge(ctx, graph_id, src, dst, kind, action, deliverable, access, reason) -> None:
    """Add an edge to a defined graph (recorded as EdgeAdded; cycles are refused).

    \b
    Example:
      forge graph add-edge kernel-rope eval-accuracy --kind handoff --deliverable rope.so
    """
    from .harness.graph.commands import add_edge
    data: dict[str, Any] = {"from": src, "to": dst, "kind": kind, "access": access,
                            "deliverable": deliverable}
    if action:
        data["action"] = action
    ws = open_ws(ctx)
    gid = _graph_id(ws, graph_id)
    view = add_edge(ws, gid, data, reason)
    click.echo(f"graph {gid}: edge {src} -> {dst} ({kind}) added ({len(view.edges)} edges)")


def _print_run(summary, as_json: bool) -> None:
    if as_json:
        emit_json(summary.as_dict())
    else:
        c = summary.counts
        waiting = c.get("pending", 0) + c.get("needs-rework", 0)
        click.echo(f"run {summary.run_id}: {summary.outcome} in {summary.wall_s:.1f}s with "
                   f"-j {summary.jobs}: delivered {c.get('delivered', 0)}, rejected "
                   f"{c.get('rejected', 0)}, waiting {waiting}"
                   f"; peak in flight {summary.peak_in_flight}; overhead "
                   f"{summary.overhead_per_node_s * 1000:.0f} ms/node")
        for node, why in summary.blocked.items():
            click.echo(f"  blocked {node}: {'; '.join(why)}")
    if summary.outcome != "completed":
        raise SystemExit(1)


def _backend_opts(f):
    f = click.option("--by", "by", metavar="NAME",
                     help="Who runs the graph: the actor of the run's start, named on each "
                          "node it starts (default: the OS user).")(f)
    f = click.option("--address", default=None,
                     help="Ray cluster address (--backend ray; default: RAY_ADDRESS, else "
                          "a cluster started on this host, else a new local instance).")(f)
    return click.option("--backend", type=click.Choice(["local", "ray"]), default="local",
                        show_default=True,
                        help="local worker processes, or Ray tasks on a cluster.")(f)


@graph.command("run")
@_graph_opt
@click.option("-j", "--jobs", type=click.IntRange(min=1),
              help="Parallel workers (default: cores; with Ray: the cluster's CPUs).")
@_backend_opts
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON.")
@click.pass_context
@fail_cleanly
def graph_run(ctx, graph_id, jobs, backend, address, by, as_json) -> None:
    """Run ready tasks in parallel worker processes until nothing more can run.

    Progress lines print as nodes start, deliver or are rejected. Exit 1 unless completed.
    With --backend ray, each ready node is a Ray task asking for the GPUs of its deployment
    point; the ledger stays the one record (PostgreSQL when workers span hosts).

    \b
    Example:
      forge graph run -j 4
      forge graph run -j 2 --by ana
      forge graph run --backend ray --address 10.0.0.5:6379
    """
    from .harness.graph.run import run_graph
    from .harness.guard.approvals import person
    ws = open_ws(ctx)
    s = run_graph(ws, _graph_id(ws, graph_id), jobs=jobs, backend=backend, address=address,
                  by=person(by),
                  echo=(lambda m: click.echo(m, err=True)) if as_json else click.echo)
    _print_run(s, as_json)


@graph.command("resume")
@_graph_opt
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="Parallel workers (default: cores).")
@_backend_opts
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON.")
@click.pass_context
@fail_cleanly
def graph_resume(ctx, graph_id, jobs, backend, address, by, as_json) -> None:
    """Resume after a crash: re-run nodes that were in flight, never a delivered one.

    \b
    Example:
      forge graph resume -j 2
    """
    from .harness.graph.run import run_graph
    from .harness.guard.approvals import person
    ws = open_ws(ctx)
    s = run_graph(ws, _graph_id(ws, graph_id), jobs=jobs, resume=True, backend=backend,
                  address=address, by=person(by),
                  echo=(lambda m: click.echo(m, err=True)) if as_json else click.echo)
    _print_run(s, as_json)


def _print_plan(plan: dict[str, list[str]], as_json: bool) -> None:
    from .harness.graph.commands import format_plan
    if as_json:
        emit_json(plan)
        return
    for line in format_plan(plan):
        click.echo(f"needs-rework {line}")


@graph.command("rework")
@_graph_opt
@click.argument("node")
@click.option("--reason", required=True, help="Why it must be redone (recorded).")
@click.option("--json", "as_json", is_flag=True, help="Print node -> path as JSON.")
@click.pass_context
@fail_cleanly
def graph_rework(ctx, graph_id, node, reason, as_json) -> None:
    """Reopen a task; every downstream consumer is marked needs-rework with the path.

    \b
    Example:
      forge graph rework kernel-rmsnorm --reason "epsilon handling wrong for fp16"
    """
    from .harness.graph.commands import request_rework
    ws = open_ws(ctx)
    _print_plan(request_rework(ws, _graph_id(ws, graph_id), node, reason), as_json)


@graph.command("invalidate")
@_graph_opt
@click.argument("node")
@click.option("--reason", required=True, help="Why the deliverable is invalid (recorded).")
@click.option("--evidence", multiple=True, help="Event id or artifact digest (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print node -> path as JSON.")
@click.pass_context
@fail_cleanly
def graph_invalidate(ctx, graph_id, node, reason, evidence, as_json) -> None:
    """Invalidate a delivered deliverable: the node and its consumers need rework.

    \b
    Example:
      forge graph invalidate bench-baseline --reason "measured on the wrong image"
    """
    from .harness.graph.commands import invalidate
    ws = open_ws(ctx)
    _print_plan(invalidate(ws, _graph_id(ws, graph_id), node, reason, evidence), as_json)


@graph.command("reject")
@_graph_opt
@click.argument("node")
@click.option("--reason", required=True, help="Why the direction is rejected (recorded).")
@click.option("--evidence", multiple=True, help="Event id or artifact digest (repeatable).")
@click.pass_context
@fail_cleanly
def graph_reject(ctx, graph_id, node, reason, evidence) -> None:
    """Reject a direction: the node stays in the graph, linked to its evidence.

    \b
    Example:
      forge graph reject kernel-moe-deepgemm --reason "slower than triton on H20" --evidence E1
    """
    from .harness.graph.commands import reject as reject_node
    ws = open_ws(ctx)
    gid = _graph_id(ws, graph_id)
    reject_node(ws, gid, node, reason, evidence)
    click.echo(f"graph {gid}: {node} rejected")


@graph.command("handoff")
@_graph_opt
@click.argument("src")
@click.argument("dst")
@click.pass_context
@fail_cleanly
def graph_handoff(ctx, graph_id, src, dst) -> None:
    """Hand SRC's deliverable to DST by hand; refused (and recorded) unless SRC is verified.

    \b
    Example:
      forge graph handoff kernel-rmsnorm engine-integrate-rmsnorm
    """
    from .harness.graph.commands import hand_off
    ws = open_ws(ctx)
    gid = _graph_id(ws, graph_id)
    ev = hand_off(ws, gid, src, dst)
    click.echo(f"graph {gid}: handoff {src} -> {dst} delivered ({ev.deliverable_digest})")


# --- the MonoRepo ------------------------------------------------------------------------


@main.group("repos")
def repos_group() -> None:
    """The MonoRepo: stack and harness repos as git submodules of one root ([repos] root)."""


@repos_group.command("init")
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def repos_init(ctx, manifest: str, as_json: bool) -> None:
    """Create (or adopt) the MonoRepo root from MANIFEST and record its first snapshot.

    \b
    Example:
      forge repos init examples/monorepo/local.yaml
    """
    from .repos import commands as repo_commands
    out = repo_commands.init(open_ws(ctx), manifest,
                             None if as_json else lambda s: click.echo(s, err=True))
    if as_json:
        emit_json(out)
        return
    click.echo(f"{'adopted' if out['adopted'] else 'created'} MonoRepo {out['root']} "
               f"({len(out['members'])} members), snapshot {out['snapshot_id']}")


@repos_group.command("snapshot")
@click.option("--reason", default="forge repos snapshot", show_default=True,
              help="Why it was taken (kept with it).")
@click.option("--json", "as_json", is_flag=True, help="Print the snapshot as JSON.")
@click.pass_context
@fail_cleanly
def repos_snapshot(ctx, reason: str, as_json: bool) -> None:
    """Record every member's URL, branch, commit, uncommitted diff and untracked files.

    \b
    Example:
      forge repos snapshot --json
    """
    from .repos import commands as repo_commands
    ev = repo_commands.take_snapshot(open_ws(ctx), reason)
    if as_json:
        emit_json({"snapshot_id": ev.snapshot_id, "root": ev.root,
                   "members": [m.model_dump(mode="json") for m in ev.members]})
        return
    click.echo(ev.snapshot_id)
    for m in ev.members:
        dirty = " dirty" if m.dirty else ""
        click.echo(f"  {m.name:<16} {m.branch or '(detached)':<20} "
                   f"{(m.commit or '-')[:12]}{dirty}")


@repos_group.command("restore")
@click.argument("snapshot_id")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def repos_restore(ctx, snapshot_id: str, as_json: bool) -> None:
    """Bring the root and every member back to SNAPSHOT_ID, byte for byte.

    The state it replaces is snapshotted first, so nothing is lost.

    \b
    Example:
      forge repos restore snap-3f2a9c0d1e2b
    """
    from .repos import commands as repo_commands
    out = repo_commands.restore(open_ws(ctx), snapshot_id)
    if as_json:
        emit_json(out)
        return
    click.echo(f"restored {out['snapshot_id']} (the state before: "
               f"{out['previous_snapshot_id']})")


@repos_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.pass_context
@fail_cleanly
def repos_status(ctx, as_json: bool) -> None:
    """Members, pins, dirty state and which tasks hold worktrees.

    \b
    Example:
      forge repos status
    """
    from .repos import commands as repo_commands
    out = repo_commands.status(open_ws(ctx))
    if as_json:
        emit_json(out)
        return
    click.echo(f"MonoRepo {out['root']} (state {out['snapshot_id']})")
    for m in out["members"]:
        state = "dirty" if m["dirty"] else "clean"
        click.echo(f"  {m['name']:<16} {m['group']:<9} {m['branch'] or '(detached)':<20} "
                   f"{(m['commit'] or '-')[:12]}  {state}")
        for w in m["worktrees"]:
            click.echo(f"      worktree of task {w['task_id']}: {w['path']} "
                       f"({(w['head'] or '-')[:12]})")


@repos_group.command("sync")
@click.option("--member", default=None, help="Sync only this member (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcomes as JSON.")
@click.pass_context
@fail_cleanly
def repos_sync(ctx, member: str | None, as_json: bool) -> None:
    """Fetch members and bring task branches onto their upstream (fast-forward or rebase).

    A conflict is reported with its files and hunks and leaves every tree as it was. Exits 1
    when any branch ended in a conflict or failed (after printing them all).

    \b
    Example:
      forge repos sync --member sglang
    """
    from .repos import commands as repo_commands
    events = repo_commands.sync(open_ws(ctx), member,
                                None if as_json else lambda s: click.echo(s, err=True))
    if as_json:
        emit_json({"synced": [e.model_dump(mode="json", include={
            "member", "branch", "upstream", "outcome", "old", "new", "conflicts", "error"})
            for e in events]})
    else:
        for e in events:
            span = f"{(e.old or '-')[:12]}..{(e.new or '-')[:12]}"
            click.echo(f"{e.member:<16} {e.branch:<28} {e.outcome:<12} {span}")
            if e.conflicts:
                click.echo(f"    conflicts: {', '.join(c.path for c in e.conflicts)}")
            if e.error:
                click.echo(f"    error: {e.error}")
    if any(e.outcome in ("conflict", "failed") for e in events):
        raise SystemExit(1)


@main.command("build")
@click.argument("member")
@click.option("--task", "task_id", help="Build the task's worktree of MEMBER and record the "
              "call in the task's open block.")
@click.option("--no-cache", "no_cache", is_flag=True,
              help="Build even when the same inputs were built before (replaces the entry).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.pass_context
@fail_cleanly
def build_cmd(ctx, member: str, task_id: str | None, no_cache: bool, as_json: bool) -> None:
    """Run MEMBER's build command (manifest `build:`), cached by its inputs' digest.

    The key is the tree's content + the command + the environment; a hit runs nothing and
    gives the cached outcome and logs. Exits 1 when the build failed.

    \b
    Example:
      forge build sglang --task tune-tiny-cpu
    """
    from .harness.tool_calls.build import build_command

    out = build_command(open_ws(ctx), member, task_id, force=no_cache, tee=not as_json,
                        progress=None if as_json else lambda s: click.echo(s, err=True))
    if as_json:
        emit_json(out.as_dict())
    else:
        how = "cached" if out.cached else "ran"
        click.echo(f"build {out.member}: {'ok' if out.success else 'FAILED'} ({how}, "
                   f"{out.build_duration_s:.2f} s; this call {out.duration_s:.2f} s), key "
                   f"{out.key.split(':')[-1][:12]}")
        click.echo(f"  stdout {out.stdout_digest or '-'}")
        click.echo(f"  stderr {out.stderr_digest or '-'}")
        if out.error:
            click.echo(f"  error: {out.error}")
    if not out.success:
        raise SystemExit(1)


@main.command("ab")
@click.option("--point", "point", required=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The deployment point file.")
@click.option("--base", required=True, help="The base: a commit, branch or tag of the member.")
@click.option("--candidate", required=True, help="The candidate: a commit, branch or tag.")
@click.option("--member", help="The MonoRepo member (default: the only one with `deploy:`).")
@click.option("--profile", type=click.Path(dir_okay=False, path_type=Path),
              help="A runtime profile file (default: the point's).")
@click.option("--metric", default="output_throughput", show_default=True,
              help="The metric judged (latency metrics: lower is better).")
@click.option("--min-ratio", type=float, default=1.0, show_default=True,
              help="The candidate/base ratio the whole interval must clear (1.05: 5 % better).")
@click.option("--type", "task_type", default="engine-integration", show_default=True,
              help="What the change is (kernel, quantization, moe-backend, …): its default "
                   "correctness gate (docs/accuracy.md).")
@click.option("--correctness", type=float,
              help="Greedy-output token match against the base at least this (default: "
                   "the --type's default gate; engine-integration: token match >= 0.99).")
@click.option("--no-correctness", is_flag=True, help="No correctness gate (dummy weights).")
@click.option("--repeats", type=int, default=3, show_default=True, help="Runs per side.")
@click.option("--id", "task_id", help="The task's id (default: ab-<member>-<base>-<cand>).")
@click.option("--max-wall-s", type=float, default=4 * 3600.0, show_default=True,
              help="The A/B's wall-time limit (both sides' builds, loads and runs).")
@click.option("--json", "as_json", is_flag=True, help="Progress on stderr, result as JSON.")
@click.pass_context
@fail_cleanly
def ab_cmd(ctx, point: Path, base: str, candidate: str, member: str | None,
           profile: Path | None, metric: str, min_ratio: float, task_type: str,
           correctness: float | None, no_correctness: bool, repeats: int,
           task_id: str | None, max_wall_s: float, as_json: bool) -> None:
    """Is CANDIDATE better than BASE at a deployment point? Build both commits of the
    member (cached by their inputs), deploy each at the point, check each server is the
    build it claims, measure both the same way and judge under the gates.

    The result is a normal task (forge task show ID, forge sql, the wiki). Exits 0 when the
    candidate was accepted, 1 when rejected or not measured.

    \b
    Example:
      forge ab --point points/qwen-h200.yaml --base main --candidate my-branch
    """
    from .harness.loop.ab import run_ab
    from .ledger.candidates import shown_differences

    def say(line: str) -> None:
        click.echo(line, err=as_json)
        (sys.stderr if as_json else sys.stdout).flush()

    r = run_ab(open_ws(ctx), point=point, base=base, candidate=candidate, member=member,
               profile=profile, metric=metric, min_ratio=min_ratio,
               correctness=None if no_correctness else "default" if correctness is None
               else correctness, repeats=repeats, task_id=task_id, max_wall_s=max_wall_s,
               progress=say, task_type=task_type)
    if as_json:
        emit_json(r.to_json())
    else:
        click.echo("")
        click.echo(f"A/B {r.task_id}: {r.member} {r.candidate.ref} vs {r.base.ref}: "
                   f"{r.verdict.upper()}")
        for side, name in ((r.base, "base"), (r.candidate, "candidate")):
            b = side.build
            click.echo(f"  {name:<9} {side.commit[:12]}  "
                       + (f"{b.get('module')} {b.get('server_version') or b.get('version')}"
                          f"{' (cached build)' if b.get('cached') else ''}" if b else "not built"))
        for g in r.gates:
            ci = g.get("ci")
            nums = (f" ratio {g['ratio']:.4f} [{ci[0]:.4f}, {ci[1]:.4f}]"
                    if g.get("ratio") is not None and ci else
                    f" median {g['median']:.4g}" if g.get("median") is not None else "")
            click.echo(f"  gate {g['name']:<12} {g['verdict']:<12}{nums}  {g.get('reason', '')}")
        if r.differs:
            click.echo(f"  differs: {shown_differences(r.differs)}")
        if r.verdict != "accepted":
            click.echo(f"  why: {r.reason}")
    if r.verdict != "accepted":
        raise SystemExit(1)


@repos_group.command("pre-push", hidden=True)
@click.option("--member", required=True, help="The member the hook belongs to (`.`: root).")
@click.argument("remote")
@click.argument("url")
@click.pass_context
@fail_cleanly
def repos_pre_push(ctx, member: str, remote: str, url: str) -> None:
    """The push guard's check, run by the pre-push hook with git's input on stdin."""
    from .repos import push as repo_push
    refusals = repo_push.hook_check(open_ws(ctx), member, remote, url,
                                    sys.stdin.read())
    for line in refusals:
        click.echo(redact_message(line), err=True)
    if refusals:
        ctx.exit(1)


KEY_FILE_HELP = ("The workspace's approver key (FORGE_HOME/approver.key, which the sandbox "
                 "cannot read; env FORGE_APPROVER_KEY_FILE). Without it, confirm on the "
                 "terminal.")


@repos_group.command("pre-receive", hidden=True)
@click.option("--member", required=True, help="The member the remote belongs to (`.`: root).")
@click.option("--remote", required=True, help="The remote's name in the member.")
@click.option("--url", required=True, help="The remote's URL in the member.")
@click.pass_context
@fail_cleanly
def repos_pre_receive(ctx, member: str, remote: str, url: str) -> None:
    """The push guard's check on the receiving side, run by a managed remote's pre-receive."""
    from .repos import push as repo_push
    refusals = repo_push.receive_check(open_ws(ctx), member, remote, url, sys.stdin.read())
    for line in refusals:
        click.echo(redact_message(line), err=True)
    if refusals:
        ctx.exit(1)


@repos_group.command("approve")
@click.argument("member")
@click.option("--ref", required=True, help="The protected ref (refs/heads/main, or main).")
@click.option("--range", "span", required=True, metavar="OLD..NEW",
              help="The remote's commit now and the commit to push (shas or revs; "
                   "OLD all zeros for a new branch).")
@click.option("--remote", default="origin", show_default=True, help="Remote name or URL.")
@click.option("--reason", required=True, help="Why this push may go ahead.")
@click.option("--by", "by", required=True, help="Who approves it (recorded beside the OS "
              "user: a label, not an identity).")
@click.option("--key-file", type=click.Path(dir_okay=False), help=KEY_FILE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the approval as JSON.")
@click.pass_context
@fail_cleanly
def repos_approve(ctx, member: str, ref: str, span: str, remote: str, reason: str, by: str,
                  key_file: str | None, as_json: bool) -> None:
    """Approve one push of MEMBER to a protected ref: that remote, ref and commit range.

    The approval is used by that push only, once.

    \b
    Example:
      forge repos approve sglang --ref main --range 1a2b3c..HEAD --reason "hotfix" --by ana
    """
    from .harness.guard import approvals as gate
    old, sep, new = span.partition("..")
    if not sep or new.startswith(".") or not old or not new:
        raise click.BadParameter(f"{span!r} is not OLD..NEW", param_hint="--range")
    a, created = gate.approve_push(open_ws(ctx), member, remote, ref, old, new, reason, by,
                                   key_file=key_file)
    if as_json:
        emit_json({**a, "created": created})
        return
    click.echo(f"{'approved' if created else 'already approved (unused)'}: "
               f"{a['approval_id']} {a['member']} {a['remote']} {a['ref']} "
               f"{a['old'][:12]}..{a['new'][:12]} by {a['actor']['name']}")


@repos_group.command("push")
@click.argument("member")
@click.argument("remote", default="origin")
@click.argument("refspec", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def repos_push(ctx, member: str, remote: str, refspec: str | None, as_json: bool) -> None:
    """Push one ref of MEMBER (`.`: the root) under the push guard.

    REFSPEC is SRC:DST, or a branch (default: the checked-out one). A protected ref takes
    an approval for exactly this push; a refusal is recorded with a pending approval
    request (forge approvals; forge approve ID, or forge repos approve).

    \b
    Example:
      forge repos push sglang origin HEAD:main
    """
    from .repos import push as repo_push
    out = repo_push.push(open_ws(ctx), member, remote, refspec)
    if as_json:
        emit_json(out)
        return
    span = f"{out['old'][:12]}..{out['new'][:12]}"
    if not out["pushed"]:
        click.echo(f"{member}: {remote} {out['ref']} is already at {out['new'][:12]}")
    else:
        under = f" under approval {out['approval_id']}" if out["approval_id"] else ""
        click.echo(f"pushed {member} to {remote} {out['ref']} ({span}){under}")


@repos_group.command("hooks")
@click.option("--json", "as_json", is_flag=True, help="Print where the hooks are as JSON.")
@click.pass_context
@fail_cleanly
def repos_hooks(ctx, as_json: bool) -> None:
    """Install or refresh the push guard's pre-push hook in the root and every member.

    \b
    Example:
      forge repos hooks
    """
    from .repos import hooks as repo_hooks
    rows = repo_hooks.refresh_hooks(open_ws(ctx))
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        click.echo(f"  {r['member']:<16} {r['hook']}")


# --- agents: forge mcp (the harness as an MCP server) ------------------------------------


@main.command("mcp")
@click.option("--http", "http", metavar="HOST:PORT",
              help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (port 0: "
              "any free port; the URL is printed on stderr).")
@click.option("--allow-remote", is_flag=True,
              help="Allow a --http host that is not loopback (the server runs commands).")
@click.option("--task", "task_id", help="Bind the session to this task.")
@click.pass_context
@fail_cleanly
def mcp_cmd(ctx, http: str | None, allow_remote: bool, task_id: str | None) -> None:
    """Serve the harness to a coding agent over MCP: the task, block, run, measure, engine,
    bench, evaluate, journal and skills tools, with the agent (its client name, version and
    model: `_meta.model` or FORGE_AGENT_MODEL) recorded as the actor of every step.

    \b
    Example:
      claude mcp add forge --env FORGE_HOME=$FORGE_HOME -- forge mcp --task tune-tiny-cpu
      forge mcp --http 127.0.0.1:8765
    """
    if http is None:
        from .harness.mcp.front import serve as serve_front
        ctx.exit(serve_front(ctx.obj.get("home"), task_id, journal=mcp_journal))
        return
    from .harness.mcp.server import serve as serve_mcp
    ws = open_ws(ctx)
    retrieve, ask = mcp_journal(ws)
    serve_mcp(ws, http, allow_remote=allow_remote, task_id=task_id, retrieve=retrieve, ask=ask)


def mcp_journal(ws: Workspace) -> tuple[Any, Any]:
    """The journal's retrieval and `forge wiki ask` for the MCP server's journal_retrieve and
    journal_ask (the harness does not import the wiki)."""
    from .wiki.retrieve import retrieve
    return (lambda query, k: retrieve(ws, query, k)), (lambda question: journal_ask(ws, question))


def wiki_post(url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> bytes:
    """The wiki's model requests (narrative, a concept page's synthesis, a phrased answer:
    wiki/chat.py's `Post`) through the one outbound client on the model tiers' rules: no
    redirect followed, MODEL_MAX_BYTES, one deadline; its HarnessError as a WikiError (the
    wiki does not import the harness)."""
    from .harness.agents.models import MODEL_MAX_BYTES
    from .harness.guard.outbound import fetch
    try:
        return fetch("POST", url, body=body, headers=headers, timeout_s=timeout_s,
                     max_bytes=MODEL_MAX_BYTES, max_redirects=0).ok("POST").body
    except HarnessError as e:
        raise WikiError(str(e)) from None


def journal_ask(ws: Workspace, question: str) -> dict[str, Any]:
    """`forge wiki ask` for the MCP tool journal_ask: a WikiError is the tool's one-line error
    (the harness, which runs the tool, does not import the wiki)."""
    from .wiki.ask import ask as ask_question
    try:
        return ask_question(ws, question, post=wiki_post).as_dict()
    except WikiError as e:
        raise HarnessError(str(e)) from None


# --- agents: skills (forge skills list|show|lint) ----------------------------------------


@main.group("skills")
def skills_group() -> None:
    """Skills: short guides an agent gets for a block (the shipped set and [skills] dirs)."""


@skills_group.command("list")
@click.option("--category", help="Only this category (sglang-upstream, cross-library, task, ops).")
@click.option("--task-type", "task_type", help="Only skills listed for this task type.")
@click.option("--json", "as_json", is_flag=True, help="Print the catalog as JSON.")
@click.pass_context
@fail_cleanly
def skills_list_cmd(ctx, category: str | None, task_type: str | None, as_json: bool) -> None:
    """List the skills in effect: name, category, task types, summary.

    \b
    Example:
      forge skills list --task-type deployment-tuning
    """
    from .harness.agents.skills import find

    rows = [s.entry() for s in find(open_ws(ctx), category=category, task_type=task_type)]
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        user = "  (user)" if r["source"] == "user" else ""
        click.echo(f"{r['name']:<22} {r['category']:<16} {', '.join(r['task_types'])}{user}")
        click.echo(f"  {r['summary']}")


@skills_group.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the skill as JSON.")
@click.pass_context
@fail_cleanly
def skills_show_cmd(ctx, name: str, as_json: bool) -> None:
    """Print one skill.

    \b
    Example:
      forge skills show result-noise
    """
    from .harness.agents.skills import get

    skill = get(open_ws(ctx), name).as_dict()
    if as_json:
        emit_json(skill)
        return
    click.echo(f"{skill['name']} ({skill['category']}; {', '.join(skill['task_types'])}; "
               f"{skill['source']}: {skill['path']})")
    click.echo(skill["body"], nl=False)


@skills_group.command("lint")
@click.option("--json", "as_json", is_flag=True, help="Print the problems as JSON.")
@click.pass_context
@fail_cleanly
def skills_lint_cmd(ctx, as_json: bool) -> None:
    """Check every skill: frontmatter, names, categories, task types, relative links,
    duplicate names and bodies. Exits 1 with one line per problem.

    \b
    Example:
      forge skills lint
    """
    from .harness.agents.skills import lint as lint_skills

    problems = lint_skills(open_ws(ctx))
    if as_json:
        emit_json({"problems": problems})
    else:
        for p in problems:
            click.echo(p)
        if not problems:
            click.echo("skills: no problems")
    if problems:
        ctx.exit(1)


# --- the human gate: forge approvals, approve, deny (harness/guard/approvals.py) ---------


@main.command("approvals")
@click.option("--all", "everything", is_flag=True,
              help="Every approval (granted, denied, used, expired), not only pending ones.")
@click.option("--json", "as_json", is_flag=True, help="Print the approvals as JSON.")
@click.pass_context
@fail_cleanly
def approvals_cmd(ctx, everything: bool, as_json: bool) -> None:
    """List the actions waiting for a person (pushes to protected refs, production calls,
    cleanups, acceptances under human: required).

    \b
    Example:
      forge approvals --all
    """
    from .harness.guard import approvals as gate
    rows = gate.listing(open_ws(ctx), everything)
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("no approvals" if everything else "nothing waits for approval")
    for r in rows:
        exp = f"  expires {r['expires_at']}" if r["expires_at"] else ""
        click.echo(f"{r['approval_id']}  {r['state']:<8} {r['kind']:<15} {r['target']}{exp}")
        asked, dec = r["requested_by"], r["decided_by"]
        who = f"asked by {asked['kind']} {asked['name']}" + (
            f"; decided by {dec['name']}: {r['reason']}" if dec else "")
        click.echo(f"    action: {r['action']}")  # what the approval is bound to
        click.echo(printable(f"    summary: {r['summary']}  ({who})"))


def _decide_cmd(ctx, approval_id: str, grant: bool, reason: str, by: str | None,
                as_json: bool, key_file: str | None = None) -> None:
    from .harness.guard import approvals as gate
    ws = open_ws(ctx)
    a = gate.grant(ws, approval_id, reason, by, key_file=key_file) if grant else \
        gate.deny(ws, approval_id, reason, by)
    if as_json:
        emit_json(a)
        return
    click.echo(f"{a['state']}: {a['approval_id']} {a['kind']} {a['target']} by "
               f"{a['decided_by']['name']}")


@main.command("approve")
@click.argument("approval_id")
@click.option("--reason", required=True, help="Why the action may go ahead.")
@click.option("--by", "by", help="What to record as who decides, beside the OS user (a "
              "label, not an identity).")
@click.option("--key-file", type=click.Path(dir_okay=False), help=KEY_FILE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the approval as JSON.")
@click.pass_context
@fail_cleanly
def approve_cmd(ctx, approval_id: str, reason: str, by: str | None, key_file: str | None,
                as_json: bool) -> None:
    """Grant a pending approval (forge approvals lists them): that exact action, once.

    A person confirms it: on the terminal (it shows the action and asks for the approval's
    last six characters), or with the approver key file, which no sandboxed call can read.

    \b
    Example:
      forge approve appr-1a2b3c4d5e6f --reason "hotfix reviewed"
      forge approve appr-1a2b3c4d5e6f --reason "ok" --key-file ~/.forge/approver.key
    """
    _decide_cmd(ctx, approval_id, True, reason, by, as_json, key_file)


@main.command("deny")
@click.argument("approval_id")
@click.option("--reason", required=True, help="Why the action may not go ahead.")
@click.option("--by", "by", help="Who decides (default: the OS user).")
@click.option("--json", "as_json", is_flag=True, help="Print the approval as JSON.")
@click.pass_context
@fail_cleanly
def deny_cmd(ctx, approval_id: str, reason: str, by: str | None, as_json: bool) -> None:
    """Deny a pending approval: the action does not go ahead (a waiting task rejects it).

    \b
    Example:
      forge deny appr-1a2b3c4d5e6f --reason "not during the freeze"
    """
    _decide_cmd(ctx, approval_id, False, reason, by, as_json)


# --- the Safety Guard: secrets scan and the traceable path (forge secrets scan, trace) ----


@main.group("secrets")
def secrets_group() -> None:
    """Secrets: check that none reached what the workspace stored."""


@secrets_group.command("scan")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.pass_context
@fail_cleanly
def secrets_scan_cmd(ctx, as_json: bool) -> None:
    """Scan the whole workspace for secrets: every ledger event, every artifact, every text
    column of the index, the wiki and the site. Prints `where: kind` per finding (never the
    secret) and exits 1 when there is one; progress goes to stderr.

    \b
    Example:
      forge secrets scan
    """
    from .harness.guard.secrets_scan import scan_workspace

    report = scan_workspace(open_ws(ctx), progress=lambda m: click.echo(m, err=True))
    if as_json:
        emit_json(report.as_dict())
    else:
        for h in report.hits:
            click.echo(h.line())
        click.echo(f"{len(report.hits)} finding(s); scanned {report.lines} lines "
                   f"({report.bytes / 1e6:.1f} MB) in {report.seconds:.2f}s: "
                   f"{report.lines_per_s:,.0f} lines/s", err=True)
    if report.hits:
        ctx.exit(1)


@main.command("trace")
@click.argument("ident", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the chain as JSON.")
@click.pass_context
@fail_cleanly
def trace_cmd(ctx, ident: str, as_json: bool) -> None:
    """Print the causal chain behind a deliverable, decision, measurement, tool call or
    verification (its event id, or a unique prefix of at least 8 characters): task, block,
    routing, tool calls (argv, snapshot), measurements, verification (each gate with its
    numbers), decision, handoff, the graph edges it fed, and the artifacts on the way.

    \b
    Example:
      forge trace 5f3c1a2b
    """
    from .projections.trace import chain_lines, trace

    chain = trace(open_ws(ctx), ident)
    if as_json:
        emit_json(chain)
        return
    for line in chain_lines(chain):
        click.echo(line)


@main.command("concurrency")
@click.option("--by", "by", multiple=True, type=click.Choice(["engineer", "host"]),
              help="Also count per engineer or per host (repeatable).")
@click.option("--since", help="From this ISO-8601 time (default: the first task's start).")
@click.option("--until", "until_time", help="Up to this ISO-8601 time (default: now).")
@click.option("--period", type=click.Choice(["day", "week", "month"]), default="month",
              show_default=True, help="The peak of each such period (UTC).")
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
@click.pass_context
@fail_cleanly
def concurrency_cmd(ctx, by, since, until_time, period, as_json) -> None:
    """Tasks in flight over time, across graphs and runs: the peak (value, when, which tasks)
    and the peak of each period, overall and per engineer or host. A task is in flight from
    its first block's start (or its reopening) until it exits.

    \b
    Example:
      forge concurrency --by engineer --period month
    """
    from .projections.concurrency import concurrency_report, report_lines

    rep = concurrency_report(open_ws(ctx).ledger, by=by, period=period,
                             since=_time_arg(since, "--since"),
                             until=_time_arg(until_time, "--until"),
                             on_error=warn_undecodable)
    if as_json:
        emit_json(rep)
        return
    for line in report_lines(rep):
        click.echo(line)


# --- the Node Registry ------------------------------------------------------------------


@main.group("nodes")
def nodes_group() -> None:
    """The Node Registry: hosts and their observations, leased claims on GPUs, ports and
    whole hosts, and the cleanup of stale claims."""


@nodes_group.command("observe")
@click.option("--interval", "interval_s", type=float, default=10.0, show_default=True,
              help="Seconds between samples.")
@click.option("--window", "window_s", type=float, default=300.0, show_default=True,
              help="Seconds per summary recorded in the ledger (samples go to the index).")
@click.option("--count", type=int, help="Stop after this many samples.")
@click.option("--for", "duration_s", type=float, help="Stop after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def nodes_observe(ctx, interval_s: float, window_s: float, count: int | None,
                  duration_s: float | None, as_json: bool) -> None:
    """Sample this host (CPU, memory; GPUs through NVML) into the registry until --count,
    --for, or Ctrl-C. The host is FORGE_NODE, else the hostname.

    \b
    Example:
      forge nodes observe --interval 10 --for 3600
    """
    from .harness.nodes.observe import observe as observe_host
    res = observe_host(open_ws(ctx), interval_s=interval_s, window_s=window_s, count=count,
                       duration_s=duration_s, echo=lambda m: click.echo(m, err=True))
    if as_json:
        emit_json(res.as_dict())
        return
    click.echo(f"{res.host}: {res.samples} samples, {res.summaries} summaries, "
               f"{res.changes} GPU process changes, {res.gpus} GPUs (NVML: {res.nvml})")


@nodes_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the hosts as JSON.")
@click.pass_context
@fail_cleanly
def nodes_list(ctx, as_json: bool) -> None:
    """Registered hosts: CPUs, memory, GPUs and what was last observed on them."""
    from .projections.nodes import host_listing
    rows = host_listing(open_ws(ctx).ledger)
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("no hosts registered (run: forge nodes observe)")
    for r in rows:
        note = f"  ({r['accelerator_note']})" if r["accelerator_note"] else ""
        click.echo(f"{r['host']}  {r['cpus']} CPUs, {r['memory_mib']} MiB, "
                   f"{len(r['gpus'])} GPUs, last seen {r['last_seen']}{note}")
        for g in r["gpus"]:
            state = (f"pids {g['pids']}" if g["pids"] else
                     "idle" if g["idle_streak"] else "not observed")
            click.echo(f"    {g['index']}: {g['uuid']}  {g['model']}  "
                       f"{g['memory_mib']} MiB  {state}")


@nodes_group.command("claims")
@click.option("--all", "everything", is_flag=True, help="Released and cleaned claims too.")
@click.option("--json", "as_json", is_flag=True, help="Print the claims as JSON.")
@click.pass_context
@fail_cleanly
def nodes_claims(ctx, everything: bool, as_json: bool) -> None:
    """Claims on resources, with their lease (live or expired) and holder."""
    from .harness.nodes import claims as node_claims
    rows = node_claims.listing(open_ws(ctx), everything)
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("no claims" if everything else "no active claims")
    for r in rows:
        h = r["holder"]
        click.echo(f"{r['claim_id']}  {r['state']:<8} lease {r['lease']:<7} "
                   f"{', '.join(r['resources']) or '(no resources)'}")
        click.echo(f"    pid {h['pid']} on {h['host']}, heartbeat {r['heartbeat_age_s']}s ago "
                   f"(every {r['heartbeat_s']:g}s)" + (f"; {r['purpose']}" if r["purpose"]
                                                        else "")
                   + (f"; ended: {r['end_reason']}" if r["ended_at"] else ""))


@nodes_group.command("claim")
@click.argument("resources", nargs=-1, required=True)
@click.option("--heartbeat", "heartbeat_s", type=float, default=10.0, show_default=True,
              help="Seconds between the holder's heartbeats.")
@click.option("--purpose", default="", help="What the resources are for.")
@click.option("--task", help="The task the claim is for.")
@click.option("--pid", type=int, help="The holder process (default: this command's parent, "
              "the shell or script that runs it).")
@click.option("--json", "as_json", is_flag=True, help="Print the claim as JSON.")
@click.pass_context
@fail_cleanly
def nodes_claim(ctx, resources: tuple[str, ...], heartbeat_s: float, purpose: str,
                task: str | None, pid: int | None, as_json: bool) -> None:
    """Claim RESOURCES ([HOST/]gpu:UUID, [HOST/]port:N, host:NAME) for a holder process.
    A resource held by another live claim is refused, naming its holder.

    \b
    Example:
      forge nodes claim gpu:GPU-8f2c... port:30000 --purpose "bench tp8" --heartbeat 30
    """
    from .harness.guard import approvals as gate
    from .harness.nodes import claims as node_claims
    c = node_claims.claim_for(open_ws(ctx), list(resources), heartbeat_s=heartbeat_s,
                              purpose=purpose, task=task, pid=pid, actor=gate.person(None))
    if as_json:
        emit_json(c)
        return
    click.echo(f"claimed {c['claim_id']}: {', '.join(c['resources'])} for pid "
               f"{c['holder']['pid']} (heartbeat every {c['heartbeat_s']:g}s: "
               f"forge nodes heartbeat {c['claim_id']})")


@nodes_group.command("heartbeat")
@click.argument("claim_id")
@click.pass_context
@fail_cleanly
def nodes_heartbeat(ctx, claim_id: str) -> None:
    """Renew a claim's lease (fails once the claim was released or cleaned up)."""
    from .harness.nodes import claims as node_claims
    node_claims.heartbeat(open_ws(ctx), claim_id)
    click.echo(f"renewed {claim_id}")


@nodes_group.command("release")
@click.argument("claim_id")
@click.option("--reason", default="released", help="Why.")
@click.pass_context
@fail_cleanly
def nodes_release(ctx, claim_id: str, reason: str) -> None:
    """Give a claim back."""
    from .harness.guard import approvals as gate
    from .harness.nodes import claims as node_claims
    node_claims.release(open_ws(ctx), claim_id, reason, gate.person(None))
    click.echo(f"released {claim_id}")


@nodes_group.command("cleanup")
@click.argument("claim_id", required=False)
@click.option("--dry-run", is_flag=True, help="Judge the claims; free nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@click.pass_context
@fail_cleanly
def nodes_cleanup(ctx, claim_id: str | None, dry_run: bool, as_json: bool) -> None:
    """Free stale claims: only when the holder process is gone, its heartbeat is older than
    3 intervals and its GPUs showed no compute process for 3 fresh observations. Killing
    leftover processes waits for a person: forge approve ID.
    """
    from .harness.guard import approvals as gate
    from .harness.nodes import claims as node_claims
    verdicts = node_claims.cleanup(open_ws(ctx), claim_id, dry_run=dry_run,
                                   actor=gate.person(None))
    if as_json:
        emit_json([v.as_dict() for v in verdicts])
        return
    if not verdicts:
        click.echo("no active claims")
    for v in verdicts:
        extra = (f" (kills {v.kill})" if v.kill else "") + (
            f": waiting for approval {v.approval_id}: forge approve {v.approval_id} "
            "--reason ..." if v.action == "waiting-approval" else "")
        click.echo(f"{v.claim.claim_id}  {v.action}{extra}")
        for r in v.signals.reasons:
            click.echo(f"    kept: {r}")


# --- diagnose online and monitor (harness/diagnose/) ------------------------------------


class _DiagnoseFailed(click.ClickException):
    exit_code = 2  # 1 means "a rule fired"


@main.command("diagnose")
@click.argument("url")
@click.option("--log", "log_file", type=click.Path(dir_okay=False),
              help="The server's log file (its tail is read).")
@click.option("--tail-mb", type=float, default=8.0, show_default=True,
              help="How much of the log's end to read, in MB.")
@click.option("--samples", type=int, default=5, show_default=True,
              help="Scrapes of /metrics in the window.")
@click.option("--interval", "interval_s", type=float, default=1.0, show_default=True,
              help="Seconds between scrapes.")
@click.option("--timeout", "timeout_s", type=float, default=30.0, show_default=True,
              help="Seconds one scrape may take, its whole response (then one line, exit 2).")
@click.option("--slo", help="SLO in ms: ttft_ms=500,tpot_ms=50 (p99; or ttft_ms.p50=...).")
@click.option("--point", "point_file", type=click.Path(dir_okay=False),
              help="A deployment point YAML whose scenario.slo is the SLO (unless --slo).")
@click.option("--task", "task_id", help="Record the diagnosis in this task (its open block).")
@click.option("--router-metrics", help="A PD/EPD router's own Prometheus page "
              "(http://HOST:METRICS_PORT, `forge engine up` shows it): its worker health "
              "and circuit breakers are judged too.")
@click.option("--json", "as_json", is_flag=True, help="Print the diagnosis as JSON.")
@click.pass_context
@fail_cleanly
def diagnose_cmd(ctx, url: str, log_file: str | None, tail_mb: float, samples: int,
                 interval_s: float, timeout_s: float, slo: str | None,
                 point_file: str | None, task_id: str | None, router_metrics: str | None,
                 as_json: bool) -> None:
    """Diagnose a running endpoint, read-only (GET /metrics and a router's GET /workers:
    allowed on production): scrape its Prometheus /metrics --samples times (a router entry:
    every server behind it, each finding naming its server), read its log's tail, apply the
    rules (harness/diagnose/rules.py; docs/diagnose.md) and record a DiagnosisRecorded with
    the evidence. Exit code: 0 healthy, 1 a rule fired, 2 the diagnosis could not be made.

    \b
    Example:
      forge diagnose http://127.0.0.1:30000 --log server.log --slo ttft_ms=500,tpot_ms=50
      forge diagnose http://ROUTER:8000 --router-metrics http://ROUTER:9000
    """
    from .harness.diagnose import collect
    from .harness.guard import approvals as gate

    try:
        objective = (collect.parse_slo(slo) if slo is not None else
                     collect.slo_of_point(point_file) if point_file else {})
        if not tail_mb > 0:
            raise HarnessError(f"--tail-mb {tail_mb:g}: must be above 0")
        ev = collect.diagnose(open_ws(ctx), url, samples=samples, interval_s=interval_s,
                              log=log_file, tail_bytes=int(min(tail_mb, 16384) * (1 << 20)),
                              slo=objective, task_id=task_id, actor=gate.person(None),
                              timeout_s=timeout_s, router_metrics=router_metrics)
    except (*DOMAIN_ERRORS, LedgerError) as e:
        raise _DiagnoseFailed(redact_message(" ".join(str(e).split()))) from None
    if as_json:
        emit_json(collect.as_dict(ev))
    else:
        click.echo(f"{ev.url}: {'healthy' if ev.healthy else 'UNHEALTHY'} ({ev.samples} "
                   f"scrapes, {ev.log_lines_read} log lines, {len(ev.rules)} rules)")
        for f in ev.findings:
            click.echo(f"  {f.rule}: {f.summary}")
            for ln in f.log_lines[:3]:
                click.echo(f"    line {ln.line}: {ln.text[:160]}")
    if not ev.healthy:
        ctx.exit(1)


@main.group("eval")
def eval_group() -> None:
    """Evaluate an engine's answers (accuracy with lm-evaluation-harness)."""


@eval_group.command("suites")
@click.option("--json", "as_json", is_flag=True)
def eval_suites(as_json: bool) -> None:
    """The named accuracy suites and what each costs (items per side; `--suite NAME`)."""
    from dataclasses import asdict

    from .ledger.correctness import SUITES

    if as_json:
        emit_json([{**asdict(s), "items": s.items} for s in SUITES.values()])
        return
    print_table(["suite", "lm_eval task", "items", "of", "endpoint", "few-shot"],
                [(s.name, s.task, s.items, s.test_items, s.endpoint, s.few_shot)
                 for s in SUITES.values()])


@eval_group.command("accuracy")
@click.option("--url", required=True, help="The candidate engine's base URL.")
@click.option("--model", required=True, help="Model name sent in the request body.")
@click.option("--suite", "suite_name",
              help="A named suite (forge eval suites: gsm8k-quick, mmlu-quick, gsm8k, mmlu): "
                   "its task, limit and endpoint, unless given.")
@click.option("--task", help="A task of --tasks-dir, else of lm_eval's registry (gsm8k, "
                             "mmlu_generative, ...). Default: arith.")
@click.option("--baseline-url", help="The baseline engine's URL: judge non-inferiority.")
@click.option("--baseline-model", help="The baseline's model name (default: --model).")
@click.option("--margin", type=click.FloatRange(min=0), default=0.02, show_default=True,
              help="Largest accuracy loss tolerated (0.02 = 2 points).")
@click.option("--endpoint", type=click.Choice(["completions", "chat"]),
              help="Default: the suite's, else completions.")
@click.option("--limit", type=click.IntRange(min=1),
              help="Evaluate the first N items (of each task of a group).")
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--metric", default="exact_match", show_default=True,
              help="The per-item metric that says correct (acc for multiple choice).")
@click.option("--filter", "filter_name",
              help="lm_eval's answer filter (gsm8k: strict-match, flexible-extract; default: "
                   "the task's first).")
@click.option("--tasks-dir", type=click.Path(file_okay=False),
              help="Folder of lm_eval task YAMLs (default: the shipped examples/accuracy).")
@click.option("--task-id", help="Record on this task's stream (else 'measurements').")
@click.option("--block", "block_id", help="The loop block the measurement belongs to.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@fail_cleanly
def eval_accuracy(ctx, url, model, suite_name, task, baseline_url, baseline_model, margin,
                  endpoint, limit, concurrency, metric, filter_name, tasks_dir, task_id,
                  block_id, as_json) -> None:
    """Run an accuracy task with lm-evaluation-harness against --url (and --baseline-url);
    with a baseline, judge non-inferiority (CI of the accuracy difference above -margin).
    Records a MeasurementRecorded (source forge-accuracy). Exit code: 0 pass (or no
    baseline), 1 fail, 3 inconclusive.

    \b
    Example:
      forge eval accuracy --url http://127.0.0.1:30001 --baseline-url http://127.0.0.1:30000 \\
        --model M --task arith --limit 200
    """
    from .harness.bench import accuracy as acc
    from .ledger.correctness import suite

    if suite_name is not None:
        try:
            chosen = suite(suite_name)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--suite") from None
        task = task or chosen.task
        limit = limit if limit is not None else chosen.limit
        endpoint = endpoint or chosen.endpoint
    task = task or "arith"
    endpoint = endpoint or "completions"
    out = acc.evaluate_accuracy(
        open_ws(ctx), url, model, task, baseline_url=baseline_url,
        baseline_model=baseline_model, margin=margin, endpoint=endpoint,
        include_path=tasks_dir or acc.TASKS_DIR, limit=limit, concurrency=concurrency,
        metric=metric, filter_name=filter_name, task_id=task_id, block_id=block_id)
    gate = out["gate"]
    if as_json:
        emit_json(out)
    else:
        click.echo(f"{task}: accuracy {out['accuracy']:.4f} over {out['items']} items"
                   + (f" (baseline {out['baseline_accuracy']:.4f})" if gate else ""))
        if gate:
            click.echo(f"{gate['verdict']}: {gate['reason']}")
        click.echo("runtime: " + ", ".join(f"{k} {v:.1f} s"
                                           for k, v in out["runtime_s"].items()))
        revs = {t: d.get("revision") for t, d in out["dataset"].get("tasks", {}).items()}
        if len(revs) == 1:
            click.echo(f"dataset: {next(iter(revs))} revision {next(iter(revs.values()))}")
        elif revs:
            click.echo(f"dataset: {len(revs)} tasks")
        click.echo(f"recorded {out['event_id']} (items {out['items_digest']})")
    if gate and gate["verdict"] != "pass":
        ctx.exit(1 if gate["verdict"] == "fail" else 3)


@eval_group.command("prefetch")
@click.argument("suites", nargs=-1, required=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The tarball to write (manifest + the datasets' cache folders).")
@click.option("--tasks-dir", type=click.Path(file_okay=False),
              help="Folder of lm_eval task YAMLs (default: the shipped examples/accuracy).")
@click.option("--json", "as_json", is_flag=True)
@fail_cleanly
def eval_prefetch(suites, out: Path, tasks_dir, as_json) -> None:
    """Fill the Hugging Face datasets cache with SUITES' datasets (on a host with network)
    and export them as one tarball with a manifest (suite, dataset, revision, file
    digests) for `forge eval import` on an offline host.

    \b
    Example:
      forge eval prefetch gsm8k mmlu_generative --out evals.tar.gz
    """
    from .harness.bench import accuracy as acc
    from .harness.bench.dataset_cache import prefetch

    res = prefetch(list(suites), out, include_path=tasks_dir or acc.TASKS_DIR)
    if as_json:
        emit_json(res)
        return
    click.echo(f"{res['out']}: {res['datasets']} datasets, {res['files']} files, "
               f"{res['bytes']} bytes (from {res['cache']})")
    for folder, rev in res["revisions"].items():
        click.echo(f"  {folder}  revision {rev}")


@eval_group.command("import")
@click.argument("file", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path),
              help="The datasets cache to fill (default: HF_DATASETS_CACHE, HF_HOME/datasets).")
@click.option("--json", "as_json", is_flag=True)
@fail_cleanly
def eval_import(file: Path, cache_dir: Path | None, as_json: bool) -> None:
    """Import a `forge eval prefetch` tarball into this host's datasets cache; every file's
    digest is checked against the manifest before anything is written.

    \b
    Example:
      HF_HOME=/data/hf forge eval import evals.tar.gz
    """
    from .harness.bench.dataset_cache import import_cache

    res = import_cache(file, cache_dir)
    if as_json:
        emit_json(res)
        return
    click.echo(f"{res['cache']}: {res['datasets']} datasets, {res['files']} files imported "
               f"({res['kept']} already there, {res['bytes']} bytes written)")


@main.command("reproduce")
@click.argument("ident", metavar="ID")
@click.option("--repeats", type=int, help="Runs of the workload (default: the contract's).")
@click.option("--band", type=float,
              help="Relative band for every metric (0.1 = 10%; default: from the runs' spread).")
@click.option("--json", "as_json", is_flag=True, help="Print the reproduction as JSON.")
@click.pass_context
def reproduce_cmd(ctx, ident: str, repeats: int | None, band: float | None,
                  as_json: bool) -> None:
    """Re-deploy the point a measurement, block (TASK:BLOCK) or deliverable was recorded on
    (profile revision, model digest, code snapshot), re-run the same workload and say whether
    the recorded figures come back, with the band used; records a ReproductionRecorded.
    Exit code: 0 reproduced, 1 not reproduced (or not comparable: the host's state then and
    now apart beyond the contract's host limits), 2 cannot be reproduced here (why, one line).
    """
    from .harness.loop import reproduce as rp

    try:
        ev = rp.reproduce(open_ws(ctx), ident, repeats=repeats, band=band,
                          progress=lambda s: click.echo(s, err=True) if not as_json else None)
    except (*DOMAIN_ERRORS, LedgerError) as e:
        raise _DiagnoseFailed(redact_message(" ".join(str(e).split()))) from None
    if as_json:
        emit_json(rp.as_dict(ev))
    else:
        click.echo("\n".join(rp.lines(ev)))
    if not ev.reproduced or ev.not_comparable:
        ctx.exit(1)


@main.command("monitor")
@click.argument("url")
@click.option("--interval", "interval_s", type=float, default=10.0, show_default=True,
              help="Seconds between scrapes of /metrics.")
@click.option("--window", "window_s", type=float, default=60.0, show_default=True,
              help="Seconds per summary recorded in the ledger (samples go to the index).")
@click.option("--for", "duration_s", type=float, help="Stop after this many seconds.")
@click.option("--count", type=int, help="Stop after this many scrapes.")
@click.option("--slo", help="SLO in ms, drawn on the journal's plots: ttft_ms=500,tpot_ms=50.")
@click.option("--point", "point_file", type=click.Path(dir_okay=False),
              help="A deployment point YAML whose scenario.slo is the SLO (unless --slo).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
@fail_cleanly
def monitor_cmd(ctx, url: str, interval_s: float, window_s: float, duration_s: float | None,
                count: int | None, slo: str | None, point_file: str | None,
                as_json: bool) -> None:
    """Sample an endpoint's /metrics (read-only) until --count, --for or Ctrl-C: a summary
    per --window in the ledger (the `endpoints` stream), the samples in the index
    (`endpoint_samples`), a progress line per window. Ctrl-C records the partial window.

    \b
    Example:
      forge monitor http://127.0.0.1:30000 --interval 5 --for 3600
    """
    from .harness.diagnose.collect import parse_slo, slo_of_point
    from .harness.diagnose.monitor import monitor
    from .harness.guard import approvals as gate

    objective = (parse_slo(slo) if slo is not None else
                 slo_of_point(point_file) if point_file else {})
    res = monitor(open_ws(ctx), url, interval_s=interval_s, window_s=window_s,
                  duration_s=duration_s, count=count, actor=gate.person(None), slo=objective,
                  echo=lambda m: click.echo(m, err=True))
    if as_json:
        emit_json(res.as_dict())
        return
    click.echo(f"{res.url}: {res.samples} samples, {res.errors} failed scrapes, "
               f"{res.summaries} summaries")


if __name__ == "__main__":  # pragma: no cover
    main()
