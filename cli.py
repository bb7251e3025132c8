"""The face of infer-forge: click commands that parse, call one function, and print.

No SQL, subprocess or event building here: each command opens the workspace, calls one
function from ledger/, projections/, wiki/, harness/ or repos/, and turns that package's
error into a one-line `click.ClickException` (non-zero exit).
"""

from __future__ import annotations

import functools
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from .ledger.errors import LedgerError

# --- shared helpers ---------------------------------------------------------------------


def fail_cleanly(fn):
    """Turn the packages' own errors into one-line ClickExceptions."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except click.ClickException:
            raise
        except LedgerError as e:
            raise click.ClickException(str(e)) from None
        except _domain_errors() as e:
            raise click.ClickException(" ".join(str(e).split())) from None

    return wrapper


def _domain_errors() -> tuple[type[BaseException], ...]:
    """Error base classes of the packages above the ledger (imported lazily: fast --help)."""
    errors: list[type[BaseException]] = []
    for mod, name in (
        ("infer_forge.harness.errors", "HarnessError"),
        ("infer_forge.projections.errors", "ProjectionError"),
        ("infer_forge.wiki.errors", "WikiError"),
        ("infer_forge.repos.errors", "RepoError"),
    ):
        try:
            module = __import__(mod, fromlist=[name])
            errors.append(getattr(module, name))
        except (ImportError, AttributeError):
            continue
    return tuple(errors) or (LedgerError,)


def emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def open_ws(ctx: click.Context):
    from .ledger.workspace import open_workspace

    ws = open_workspace(ctx.obj.get("home"))
    ctx.call_on_close(ws.close)
    return ws


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


# --- workspace and ledger (issue 2) -----------------------------------------------------


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

    \b
    Example:
      forge log --task tune-tiny-cpu --type MeasurementRecorded --since 2026-11-01
    """
    ws = open_ws(ctx)
    records = list(ws.ledger.events(task=task, types=types, since=parse_time(since, "--since"),
                                    until=parse_time(until_time, "--until")))
    if limit:
        records = records[-limit:]
    for r in records:
        if as_json:
            click.echo(json.dumps(event_row(r), default=str, ensure_ascii=False))
        else:
            ev = r.event
            where = ev.task_id or r.stream
            if ev.block_id:
                where += f"/{ev.block_id}"
            who = ev.actor.name + (f"({ev.actor.model})" if ev.actor.model else "")
            click.echo(f"{r.position:>7}  {ev.occurred_at:%Y-%m-%d %H:%M:%S}  {r.type:<22} "
                       f"{where:<28} {who}")


@main.command()
@click.argument("task")
@click.option("--until", "until", type=int, help="Global position to replay up to (inclusive).")
@click.option("--json", "as_json", is_flag=True, help="Print the state as JSON.")
@click.pass_context
@fail_cleanly
def replay(ctx, task: str, until: int | None, as_json: bool) -> None:
    """Rebuild a task's state from the ledger, optionally as it was at a past position.

    \b
    Example:
      forge replay tune-tiny-cpu --until 120 --json
    """
    from .ledger.replay import replay_task
    from .ledger.state import fingerprint

    ws = open_ws(ctx)
    state = replay_task(ws.ledger, task, until)
    data = state.model_dump(mode="json")
    data["fingerprint"] = fingerprint(state)
    if as_json:
        emit_json(data)
        return
    click.echo(f"task {state.task_id}: {state.title} [{state.task_type}]")
    click.echo(f"  status: {state.status}" + (f" ({state.exit_state}: {state.exit_reason})"
                                               if state.exit_state else ""))
    click.echo(f"  as of position {state.last_position}, stream version {state.version}")
    click.echo(f"  blocks: {len(state.blocks)}, measurements: {state.measurements}, "
               f"accepted: {len(state.accepted)}, rejected: {len(state.rejected)}")
    for b in state.blocks:
        verdicts = ",".join(b.verifications) or "-"
        click.echo(f"    {b.block_id:<8} {b.status:<11} verdicts={verdicts:<12} {b.sub_goal}")
    click.echo(f"  fingerprint: {data['fingerprint']}")


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
    """Export every event as JSONL, in global order.

    \b
    Example:
      forge events export -o ledger.jsonl
    """
    ws = open_ws(ctx)
    out = output.open("w", encoding="utf-8") if output else sys.stdout
    try:
        n = 0
        for r in ws.ledger.log(include_bookkeeping=include_bookkeeping):
            out.write(json.dumps(event_row(r), default=str, ensure_ascii=False) + "\n")
            n += 1
    finally:
        if output:
            out.close()
    if output:
        click.echo(f"exported {n} events to {output}", err=True)


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
    from .ledger.check import check_workspace

    ws = open_ws(ctx)
    report = check_workspace(ws)
    if as_json:
        emit_json({**report.__dict__, "ok": report.ok})
    else:
        click.echo(f"{report.events} events in {report.streams} streams ({report.tasks} tasks), "
                   f"positions 1..{report.max_position}, {report.artifacts} artifacts")
        for p in report.problems:
            click.echo(f"problem: {p}")
        if report.ok:
            click.echo("ok")
    if not report.ok:
        raise SystemExit(1)


# --- specs and task loops (issue 3) -----------------------------------------------------


# --- harness: weights, engines, bench, gates, demo (issue 4) ----------------------------


@main.command()
@click.pass_context
@fail_cleanly
def demo(ctx) -> None:
    """Run the main job on the embedded engine and leave the workspace to explore.

    \b
    Example:
      FORGE_HOME=/tmp/forge-demo forge demo
    """
    from .harness.demo import run_demo
    from .ledger.workspace import init_workspace

    ws, _ = init_workspace(ctx.obj.get("home"))
    with ws:
        run_demo(ws, echo=click.echo)


# --- journal: index, queries, wiki (issue 5) --------------------------------------------


# --- task graph (issue 6) ---------------------------------------------------------------


if __name__ == "__main__":  # pragma: no cover
    main()
