"""`forge perf capture`: profile a running engine under a given load, keep the traces as
artifacts and record a `ProfileCaptured` with their summary.

How each engine is profiled:
- `sglang` (and an `external` endpoint with the SGLang API): POST `/start_profile` with
  `output_dir` (a fresh directory under `<FORGE_HOME>/perf-traces`, engines/trace_dir.py)
  and the options of `ProfileOptions` (options.py: SGLang's ProfileReq, each field checked
  against the server's release), run the load, POST `/stop_profile` (not with `num_steps`: SGLang
  stops by itself); SGLang's scheduler writes one torch-profiler chrome trace per rank (and
  per stage with `profile_by_stage`), `*.trace.json.gz`, into `output_dir`, which is
  collected (waiting up to `collect_timeout_s` for complete files; one over
  `max_trace_bytes` is refused). The directory is the *server's* filesystem: a server forge
  runs in a pinned image has the trace root mounted read-write at the same path; a server
  on another host leaves nothing here and the capture fails naming the directory. The
  calls go through the external engine's client, so the production guard refuses them
  against an endpoint forge.toml marks production (profiling is not a read).
- `hf` (the embedded engine, `transformers serve`, a process of this host): py-spy
  (`py-spy record --pid PID --format raw --function --nonblocking`, attached for the window,
  stopped with SIGINT, which makes it write its output). Non-blocking sampling does not pause
  the engine, so the load's figures are the engine's own; the ranking is Python functions by
  self samples (torch's C++ operators show as the Python frame that called them). py-spy
  needs ptrace on the pid (CAP_SYS_PTRACE, or the same user with ptrace_scope 0); a refusal
  is a HarnessError carrying py-spy's message. py-spy is the `perf` extra (`pip install
  py-spy`); its binary is looked up next to this Python, then on PATH. Without a pid, the
  one of the engine forge launched at `url` and recorded (`EngineLaunched`, not stopped).

The window: the profiler starts, the load runs in rounds (`Load.requests` prompts at
`Load.concurrency`, through the bench client; warmup only in the first round) until
`duration_s` has passed (at least one round), the profiler stops. `bench` in the event holds
the window's figures: rounds, completed and failed requests, output tokens, seconds and
output throughput. Nothing is attached or enabled outside the window, so a server that is not
being captured pays nothing (bench/perf_profile.py measures the window's cost).

Summaries: the top entries of the whole capture (summary.py) and, for torch traces, one table
per phase (phases.py: prefill, decode, ... from SGLang's step spans and stage files, per
output token of the window).

Recording: traces go to the artifact store (gzipped SGLang traces redacted inside, as any
gzip artifact; py-spy's text output through the redactor), then one `ProfileCaptured` on
the task's stream with `task_id` (and `block_id`, which must be the task's open block, as
for a measurement; an unknown or exited task or a block not open is refused before anything
runs), else on the `profiles` stream. `forge perf compare A B` reads two captures from the
ledger (projections/perf.py).
"""

from __future__ import annotations

import gzip
import math
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from ...ledger import events as E
from ...ledger.ids import check_optional_id
from ...ledger.numbers import without_non_finite
from ...ledger.streams import PROFILES_STREAM, task_stream
from ...ledger.workspace import Workspace
from ...projections.perf import running_engine_pid
from ..bench.client import bench_command
from ..engines.trace_dir import trace_root
from ..errors import HarnessError
from ..proc import alive
from ..record import append_to_task, check_measurement_target
from .options import ProfileOptions
from .phases import Phase, select_files, stage_of_file, summarize_phases
from .summary import (
    DEFAULT_TOP,
    Summary,
    TraceError,
    load_chrome_trace,
    summarize_chrome,
    summarize_pyspy_raw,
)

ENGINES = ("hf", "sglang", "external")
MAX_TRACE_BYTES = 1 << 30  # one rank's file; a 10 s H200 capture with stacks is ~100s of MB
LOAD_KEYS = ("concurrency", "requests", "input_len", "output_len", "seed")


@dataclass(frozen=True)
class Load:
    """The load run during a capture (one round; rounds repeat until the window is full)."""

    concurrency: int = 4
    requests: int = 16
    input_len: int = 32
    output_len: int = 32
    seed: int = 42


def parse_load(text: str | None) -> Load:
    """`concurrency=4,requests=16,input_len=32,output_len=32,seed=42` (any subset) -> Load;
    an unknown key or a value that is not a positive integer (seed: any integer >= 0) is a
    one-line HarnessError naming it."""
    values: dict[str, int] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, eq, raw = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in LOAD_KEYS:
            raise HarnessError(f"--load {part.strip()!r}: expected KEY=N with KEY one of "
                               f"{', '.join(LOAD_KEYS)}")
        try:
            n = int(raw.strip())
        except ValueError:
            n = -1
        if n < (0 if key == "seed" else 1):
            raise HarnessError(f"--load {key}={raw.strip()!r}: expected "
                               f"{'an integer >= 0' if key == 'seed' else 'a positive integer'}")
        values[key] = n
    return Load(**values)


class Capturer(Protocol):
    method: str

    def start(self) -> None: ...

    def stop(self) -> list[tuple[str, bytes]]: ...

    def summarize(self, files: Sequence[tuple[str, bytes]], top: int) -> Summary: ...


def py_spy_binary() -> str:
    """py-spy next to this Python (a venv's bin), else on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    if here.exists():
        return str(here)
    found = shutil.which("py-spy")
    if not found:
        raise HarnessError("py-spy not found (pip install py-spy, or infer-forge[perf]): the "
                           "embedded engine is profiled with it")
    return found


class PySpyCapture:
    """py-spy attached to `pid` for the window (see module docstring)."""

    method = "py-spy"

    def __init__(self, pid: int, workdir: Path, rate_hz: int = 100, binary: str | None = None):
        self.pid, self.rate_hz = pid, rate_hz
        self.binary = binary or py_spy_binary()
        self.out = workdir / "py-spy.raw.txt"
        self.log = workdir / "py-spy.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        if not alive(self.pid):
            raise HarnessError(f"py-spy: no process {self.pid} to attach to")
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [self.binary, "record", "--pid", str(self.pid), "--rate", str(self.rate_hz),
                 "--format", "raw", "--function", "--nonblocking", "--output", str(self.out)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> list[tuple[str, bytes]]:
        proc = self.proc
        if proc is None:
            return []
        self.proc = None
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
                raise HarnessError("py-spy did not stop within 60 s of SIGINT") from None
        log = self.log.read_text(errors="replace") if self.log.exists() else ""
        if proc.returncode != 0 or not self.out.exists():
            last = " ".join(log.split())[-300:] or "(no output)"
            raise HarnessError(f"py-spy on pid {self.pid} exited {proc.returncode}: {last}")
        return [(self.out.name, self.out.read_bytes())]

    def summarize(self, files: Sequence[tuple[str, bytes]], top: int) -> Summary:
        return summarize_pyspy_raw(files[0][1].decode("utf-8", errors="replace"),
                                   self.rate_hz, top)


class SGLangCapture:
    """SGLang's torch profiler through /start_profile and /stop_profile (see module
    docstring). `client` has start_profile(**options) and stop_profile(). With `num_steps`
    SGLang stops by itself: the files are awaited (every stage's, by stage) and /stop_profile
    is called only to flush a capture still running when `collect_timeout_s` has passed."""

    method = "torch-profiler"

    def __init__(self, client: Any, workdir: Path, options: ProfileOptions | None = None,
                 collect_timeout_s: float = 120.0, max_bytes: int = MAX_TRACE_BYTES):
        self.client, self.options = client, options or ProfileOptions()
        self.dir = workdir / "sglang-traces"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.collect_timeout_s, self.max_bytes = collect_timeout_s, max_bytes
        self.started = False

    def start(self) -> None:
        self.client.start_profile(output_dir=str(self.dir), **self.options.body())
        self.started = True

    def stop(self) -> list[tuple[str, bytes]]:
        if not self.started:
            return []
        self.started = False
        if not self.options.self_stopping:
            self.client.stop_profile()
        deadline = time.monotonic() + self.collect_timeout_s
        interval = 0.05
        flushed = not self.options.self_stopping
        while True:
            files = self._complete()
            if files and (flushed or self._all_stages(files)):
                return files
            if time.monotonic() > deadline:
                if not flushed:  # num_steps not reached within the window: flush what runs
                    flushed = True
                    try:
                        self.client.stop_profile()
                    except HarnessError:
                        pass  # SGLang had stopped already ("not in progress")
                    deadline = time.monotonic() + self.collect_timeout_s
                    continue
                raise HarnessError(
                    f"sglang /stop_profile: no complete *.trace.json.gz in {self.dir} after "
                    f"{self.collect_timeout_s:.0f}s (is the server on another host? its "
                    "output_dir is on its own filesystem; with num_steps, did the load run "
                    "that many steps?)")
            time.sleep(interval)  # poll interval of a wait for files the server writes
            interval = min(1.0, interval * 1.5)

    def _all_stages(self, files: Sequence[tuple[str, bytes]]) -> bool:
        want = set(self.options.stages())
        return want <= {stage_of_file(n) for n, _ in files}

    def _complete(self) -> list[tuple[str, bytes]]:
        out = []
        paths = sorted(self.dir.glob("*.trace.json.gz"))
        if "MEM" in self.options.activities:
            paths += sorted(self.dir.glob("*-memory*.pickle"))
        for p in paths:
            size = p.stat().st_size
            if size > self.max_bytes:
                raise HarnessError(f"{p.name}: {size} bytes, over the limit of "
                                   f"{self.max_bytes} for one trace (fewer num_steps, a "
                                   "shorter --duration, or with_stack=false)")
            data = p.read_bytes()
            if p.suffix == ".gz":
                try:
                    gzip.decompress(data)
                except (OSError, EOFError):
                    return []  # still being written: wait for every rank's file
            out.append((p.name, data))
        return out

    def summarize(self, files: Sequence[tuple[str, bytes]], top: int) -> Summary:
        return summarize_chrome([t for _n, t in self.traces(files)], top)

    def traces(self, files: Sequence[tuple[str, bytes]]) -> list[tuple[str, dict[str, Any]]]:
        """The chrome traces to summarise, named: the per-rank files (a merged file repeats
        their events), no memory snapshot."""
        named = [(n, d) for n, d in files if n.endswith(".trace.json.gz")]
        out = []
        for i in select_files([n for n, _ in named]):
            name, data = named[i]
            try:
                out.append((name, load_chrome_trace(data)))
            except TraceError as e:
                raise TraceError(f"{name}: {e}") from None
        return out

    def phases(self, files: Sequence[tuple[str, bytes]], output_tokens: float | None,
               top: int) -> tuple[Phase, ...]:
        return summarize_phases(self.traces(files), output_tokens=output_tokens, top=top)


def run_window(capturer: Capturer, *, duration_s: float, round_fn: Callable[[bool], Mapping]
               ) -> tuple[dict[str, float], list[tuple[str, bytes]]]:
    """Start the profiler, run `round_fn(first)` rounds until `duration_s` has passed (at
    least one), stop it (also when a round fails). Returns the window's bench figures and
    the collected files."""
    capturer.start()
    rounds = completed = failed = out_tokens = 0
    t0 = time.perf_counter()
    try:
        while True:
            m = round_fn(rounds == 0)
            rounds += 1
            completed += int(m.get("completed", 0))
            failed += int(m.get("failed", 0))
            out_tokens += int(m.get("total_output_tokens", 0))
            if time.perf_counter() - t0 >= duration_s:
                break
    finally:
        elapsed = time.perf_counter() - t0
        files = capturer.stop()
    return {"rounds": float(rounds), "completed": float(completed), "failed": float(failed),
            "total_output_tokens": float(out_tokens), "window_s": round(elapsed, 6),
            "output_throughput": round(out_tokens / elapsed, 6) if elapsed > 0 else 0.0}, files


def capture_profile(ws: Workspace, *, url: str, engine: str, model: str,
                    duration_s: float = 10.0, load: Load | None = None,
                    tokenizer_dir: str | None = None, pid: int | None = None,
                    rate_hz: int = 100, activities: Sequence[str] = ("CPU", "GPU"),
                    options: ProfileOptions | None = None,
                    top: int = DEFAULT_TOP, task_id: str | None = None,
                    block_id: str | None = None, actor: E.Actor | None = None,
                    collect_timeout_s: float = 120.0,
                    max_trace_bytes: int = MAX_TRACE_BYTES,
                    load_url: str | None = None) -> dict[str, Any]:
    """Profile the engine at `url` under `load` for `duration_s`; store the traces, record
    `ProfileCaptured`; returns {event_id, stream, method, traces, summary, phases, options,
    bench, load}. `options` (SGLang's /start_profile; default: `activities` only).
    `load_url`: where the load goes when it is not `url` (a PD or EPD point's router, with
    `url` one role's server: each role captured apart; recorded as the load's `url`)."""
    load = load or Load()
    if options is None:
        options = ProfileOptions(activities=tuple(activities))
    if engine == "hf" and options != ProfileOptions():
        raise HarnessError("the hf engine is profiled with py-spy: SGLang's profiler options "
                           "(--activities, --profile) do not apply")
    if engine not in ENGINES:
        raise HarnessError(f"engine {engine!r}: expected one of {', '.join(ENGINES)}")
    if not (isinstance(duration_s, (int, float)) and math.isfinite(duration_s)
            and duration_s > 0):
        raise HarnessError(f"duration {duration_s!r}: expected a positive number of seconds")
    if not 1 <= rate_hz <= 1000:
        raise HarnessError(f"rate {rate_hz!r}: expected 1..1000 samples per second")
    if top < 1:
        raise HarnessError(f"top {top!r}: expected a positive integer")
    check_optional_id(task_id, "task id")
    check_optional_id(block_id, "block id")
    if block_id is not None and task_id is None:
        raise HarnessError("a block needs its task (--task)")
    if tokenizer_dir is None and Path(model).is_dir():
        tokenizer_dir = model  # a local model directory carries its tokenizer
    if tokenizer_dir is None:
        raise HarnessError("the load needs a tokenizer (--tokenizer DIR: the model's)")
    actor = actor or E.Actor.tool("forge-perf")
    # Refused now, not after the run: an unknown or exited task, a block that is not open
    # (the rule a measurement of the same window would meet).
    check_measurement_target(ws, task_id, block_id)
    # Under the trace root, not /tmp: a server forge runs in an image has that root mounted
    # (engines/trace_dir.py), so the directory it writes is this one.
    with tempfile.TemporaryDirectory(prefix="capture-", dir=trace_root(ws.home)) as tmp:
        workdir = Path(tmp)
        capturer: Capturer
        if engine == "hf":
            if pid is None:
                pid = running_engine_pid(ws.ledger, url)  # one forge launched and recorded
            if pid is None:
                raise HarnessError(f"the hf engine is profiled with py-spy: give the pid of "
                                   f"the server at {url} (--pid); forge recorded no launch "
                                   "there that is still up")
            capturer = PySpyCapture(pid, workdir, rate_hz=rate_hz)
        else:
            # In the function for start-up time: the external engine (~12 ms).
            from ..engines.external import ExternalEngine

            client = ExternalEngine().launch(
                {"base_url": url, "api": "sglang", "read_only": False, "model": model}, ws=ws,
                event_fields={"task_id": task_id, "actor": actor})
            capturer = SGLangCapture(client, workdir, options,
                                     collect_timeout_s=collect_timeout_s,
                                     max_bytes=max_trace_bytes)
        bench_engine = "hf" if engine == "hf" else "sglang"

        def round_fn(first: bool) -> dict[str, Any]:
            out = bench_command(url=load_url or url, model=model, tokenizer_dir=tokenizer_dir,
                                num_prompts=load.requests, input_len=load.input_len,
                                output_len=load.output_len, max_concurrency=load.concurrency,
                                warmup=1 if first else 0, seed=load.seed, engine=bench_engine,
                                guard_ws=ws)
            return out["metrics"]

        bench, files = run_window(capturer, duration_s=duration_s, round_fn=round_fn)
        if not files:
            raise HarnessError(f"{capturer.method}: the capture produced no trace")
        # Stored first: a trace the summariser refuses is kept for a look (its digest is in
        # the error).
        # A gzipped trace is redacted inside (ledger/archives.py): it can hold a key.
        digests = tuple(ws.artifacts.put(data) for _name, data in files)
        phases: tuple[Phase, ...] = ()
        try:
            summary = capturer.summarize(files, top)
            if isinstance(capturer, SGLangCapture):
                phases = capturer.phases(files, bench.get("total_output_tokens"), top)
        except TraceError as e:
            raise HarnessError(f"{capturer.method} trace: {e} (stored as "
                               f"{', '.join(digests)})") from None
    load_rec = {**asdict(load), **({"url": load_url} if load_url else {})}
    ev = event(engine=engine, url=url, method=capturer.method, duration_s=duration_s,
                load=load_rec, bench=bench, names=tuple(n for n, _ in files),
                digests=digests, summary=summary, phases=phases,
                options=options.body() if engine != "hf" else {}, task_id=task_id,
                block_id=block_id, actor=actor)
    stream = record(ws, ev)
    return {"event_id": str(ev.event_id), "stream": stream, "method": capturer.method,
            "engine": engine, "url": url, "traces": dict(zip(ev.trace_names, digests,
                                                             strict=True)),
            "summary": summary.as_dict(), "phases": [p.as_dict() for p in phases],
            "options": dict(ev.options), "bench": bench, "load": load_rec}


def record(ws: Workspace, ev: E.ProfileCaptured) -> str:
    """Append `ev` on its task's stream (else `profiles`); returns the stream."""
    # The capture's own id: a retried save of this event adds nothing, while another capture
    # whose traces came out byte-identical (same engine, same trace) is still recorded. (Keyed
    # by the traces' digests, the second of two such captures was dropped as a retry and the
    # command printed an event id the ledger did not hold.)
    command_id = f"perf:{ev.event_id}"
    if ev.task_id is not None:
        append_to_task(ws, ev.task_id, [ev], command_id=command_id)
        return task_stream(ev.task_id)
    ws.ledger.append(PROFILES_STREAM, [ev], command_id=command_id)
    return PROFILES_STREAM


def event(*, engine: str, url: str, method: str, duration_s: float, load: Mapping[str, Any],
           bench: Mapping[str, float], names: tuple[str, ...], digests: tuple[str, ...],
           summary: Summary, phases: Sequence[Phase], options: Mapping[str, Any],
           task_id: str | None, block_id: str | None, actor: E.Actor) -> E.ProfileCaptured:
    clean, _ = without_non_finite(dict(bench), "bench")
    return E.ProfileCaptured(
        engine=engine, url=url, method=method, duration_s=float(duration_s), load=dict(load),
        bench={k: float(v) for k, v in clean.items() if v is not None}, traces=digests,
        trace_names=names, kind=summary.kind, unit=summary.unit, total_ms=summary.total_ms,
        samples=summary.count,
        top=tuple(E.ProfileOp(**op.as_dict()) for op in summary.top),
        phases=tuple(E.ProfilePhase(**{**p.as_dict(), "top": tuple(
            E.PhaseOp(**op.as_dict()) for op in p.top)}) for p in phases),
        options=dict(options), task_id=task_id, block_id=block_id, actor=actor)


def format_summary(result: Mapping[str, Any], per_phase: int = 10) -> str:
    """A human table of a capture's top entries, then each phase's first `per_phase`."""
    s = result["summary"]
    lines = [f"{result['method']} profile of {result['engine']} at {result['url']}: "
             f"{s['kind']}, {s['unit']}, total {s['total_ms']:.1f} ms over {s['count']} "
             f"{'samples' if s['kind'] == 'py-spy' else 'events'}"]
    for op in s["top"]:
        lines.append(f"  {op['share'] * 100:6.2f} %  {op['total_ms']:10.2f} ms  "
                     f"{op['count']:7d}  {op['name']}")
    for ph in result.get("phases") or ():
        per_tok = ("" if ph["per_token_ms"] is None
                   else f", {ph['per_token_ms'] * 1000:.1f} us per output token")
        lines.append(f"phase {ph['name']}: {ph['total_ms']:.1f} ms{per_tok}, {ph['steps']} "
                     f"steps, {ph['tokens']} tokens, {ph['graph_replays']} graph replays")
        lines.append(f"  {'share':>8}  {'total ms':>10}  {'calls':>7}  {'mean us':>9}  "
                     f"{'graph ms':>9}  name")
        for op in ph["top"][:per_phase]:
            lines.append(f"  {op['share'] * 100:6.2f} %  {op['total_ms']:10.2f}  "
                         f"{op['count']:7d}  {op['mean_ms'] * 1000:9.1f}  "
                         f"{op['graph_ms']:9.2f}  {op['name']}")
    return "\n".join(lines)
