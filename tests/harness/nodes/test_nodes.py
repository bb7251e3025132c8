"""The Node Registry: observations (psutil, and a simulated NVML at the library boundary),
leased claims, and the stale-claim rule, on a real ledger with real processes."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.guard import approvals
from infer_forge.harness.nodes import claims as C
from infer_forge.harness.nodes import registry
from infer_forge.harness.nodes.identity import local_host
from infer_forge.harness.nodes.observe import GpuSample, Probe, Sample, Window, observe
from infer_forge.harness.testing.fake_nvml import FakeNvml
from infer_forge.ledger import events as E
from infer_forge.ledger.streams import CLAIMS_STREAM, NODES_STREAM
from infer_forge.projections.index import open_index, rebuild
from infer_forge.projections.index.schema import fingerprint
from infer_forge.projections.nodes import read_claims, read_hosts

from tests.conftest import run_forge

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self, t: datetime):
        self.t = t

    def __call__(self) -> datetime:
        return self.t

    def advance(self, s: float) -> None:
        self.t += timedelta(seconds=s)


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock(T0)
    monkeypatch.setattr(C, "clock", c)
    monkeypatch.setattr(approvals, "clock", c)
    return c


@pytest.fixture
def holder():
    """A real process to hold claims: a session leader (its own process group) with one
    child, so killing the leader leaves a survivor in its group."""
    p = subprocess.Popen([sys.executable, "-c",
                          "import subprocess, sys, time; "
                          "c = subprocess.Popen([sys.executable, '-c', "
                          "'import time; time.sleep(600)']); "
                          "print(c.pid, flush=True); time.sleep(600)"],
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stdout is not None
    child = int(p.stdout.readline())
    yield p, child
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def _wait_gone(pgid: int) -> None:
    """Block until the group's last process is reaped (by init: it is not our child)."""
    from infer_forge.harness.proc import group_members
    deadline = time.monotonic() + 30
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not group_members(pgid)


def _gpu(fake: FakeNvml, i: int) -> E.ResourceRef:
    return E.ResourceRef(host=local_host(), kind="gpu", id=fake.gpus[i].uuid)


def _register(ws, fake: FakeNvml) -> None:
    registry.register_host(ws, local_host(), Probe(nvml=fake).inventory())


def _observe(ws, fake: FakeNvml, start: datetime, n: int, interval: float = 10.0,
             busy: dict[int, tuple[int, ...]] | None = None) -> None:
    """`n` samples of every fake GPU at `interval` from `start`, recorded as the observer
    does (changes at once, one summary at the end)."""
    win = Window(local_host(), interval, start.timestamp())
    for k in range(n):
        t = start.timestamp() + k * interval
        gpus = {g.uuid: GpuSample(0.0, 0, tuple((busy or {}).get(i, ())))
                for i, g in enumerate(fake.gpus)}
        registry.record_changes(ws, win.add(Sample(t, 5.0, 1000, gpus)))
    ev, cols = win.summary(start.timestamp() + (n - 1) * interval)
    registry.record_summary(ws, ev, cols)


def _holder_of(p: subprocess.Popen) -> E.ClaimHolder:
    from infer_forge.harness.proc import start_time
    return E.ClaimHolder(host=local_host(), pid=p.pid, pid_start=start_time(p.pid),
                         task="t-bench")


# --- claims ---------------------------------------------------------------------------


def test_conflicting_claims_are_refused_naming_the_holder(workspace, clock, holder):
    fake = FakeNvml(4)
    p, _ = holder
    a = C.claim(workspace, [_gpu(fake, 0), E.ResourceRef(host=local_host(), kind="port",
                                                         id="30000")],
                holder=_holder_of(p), purpose="bench tp1", heartbeat_s=10)
    with pytest.raises(C.ClaimConflict) as e:
        C.claim(workspace, [_gpu(fake, 0)])
    assert a.claim_id in str(e.value) and f"pid {p.pid}" in str(e.value)
    assert "task t-bench" in str(e.value) and "bench tp1" in str(e.value)
    # The same port conflicts; another GPU does not; the whole host conflicts with both.
    with pytest.raises(C.ClaimConflict):
        C.claim(workspace, [C.parse_resource("port:30000")])
    b = C.claim(workspace, [_gpu(fake, 1)])
    with pytest.raises(C.ClaimConflict) as e:
        C.claim(workspace, [C.parse_resource(f"host:{local_host()}")])
    assert a.claim_id in str(e.value) and b.claim_id in str(e.value)
    # Another host's port 30000 is another resource.
    C.claim(workspace, [C.parse_resource("other-host/port:30000")])
    # Released, the GPU can be claimed again.
    C.release(workspace, a.claim_id, "done")
    C.claim(workspace, [_gpu(fake, 0)])
    assert [c.state for c in read_claims(workspace.ledger).claims.values()] == [
        "released", "active", "active", "active"]


def test_racing_claims_on_one_gpu_exactly_one_wins(workspace, tmp_path):
    script = (
        "import sys, json\n"
        "from infer_forge.ledger.workspace import open_workspace\n"
        "from infer_forge.harness.nodes import claims as C\n"
        "from infer_forge.ledger import events as E\n"
        "ws = open_workspace(sys.argv[1])\n"
        "sys.stdin.readline()\n"
        "try:\n"
        "    c = C.claim(ws, [E.ResourceRef(host='h1', kind='gpu', id='GPU-race')])\n"
        "    print(json.dumps({'won': c.claim_id}))\n"
        "except C.ClaimConflict as e:\n"
        "    print(json.dumps({'lost': str(e)}))\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(workspace.home)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    for p in procs:  # all started before any claims
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    winners = [o["won"] for o in outs if "won" in o]
    assert len(winners) == 1, outs
    assert all(winners[0] in o["lost"] for o in outs if "lost" in o)
    assert len(read_claims(workspace.ledger).active()) == 1


def test_bad_resources_and_heartbeats_are_one_line_errors(workspace):
    for bad, needle in [("gpu", "write gpu:UUID"), ("port:0", "1..65535"),
                        ("port:http", "1..65535"), ("disk:1", "write gpu:UUID"),
                        ("gpu:$(rm -rf)", "UUID"), ("bad host!/port:1", "host"),
                        ("h1/host:h1", "whole host")]:
        with pytest.raises(HarnessError, match="resource") as e:
            C.parse_resource(bad)
        assert needle in str(e.value) and "\n" not in str(e.value)
    for hb in (0.0, -1.0, float("nan"), float("inf"), 1e9):
        with pytest.raises(HarnessError):
            C.claim(workspace, [C.parse_resource("port:1")], heartbeat_s=hb)
    assert workspace.ledger.version(CLAIMS_STREAM) == 0


def test_lease_expires_without_heartbeats_and_heartbeats_renew_it(workspace, clock, holder):
    p, _ = holder
    c = C.claim(workspace, [C.parse_resource("port:8000")], holder=_holder_of(p),
                heartbeat_s=10)

    def lease() -> str:
        (row,) = C.listing(workspace)
        return row["lease"]

    clock.advance(29)
    assert lease() == "live"
    clock.advance(2)  # 31 s > 3 x 10 s
    assert lease() == "expired"
    C.heartbeat(workspace, c.claim_id)
    assert lease() == "live"
    # An expired lease whose holder still runs is not taken over.
    clock.advance(100)
    with pytest.raises(C.ClaimConflict, match=f"pid {p.pid}"):
        C.claim(workspace, [C.parse_resource("port:8000")])
    # Its leader gone but a child left in its group: freeing it would kill, so refused.
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    with pytest.raises(C.ClaimConflict, match="stale, but freeing it kills"):
        C.claim(workspace, [C.parse_resource("port:8000")])
    # Once the whole group is gone (no GPUs claimed), a new claim frees it, recorded.
    os.killpg(p.pid, signal.SIGKILL)
    _wait_gone(p.pid)
    new = C.claim(workspace, [C.parse_resource("port:8000")])
    book = read_claims(workspace.ledger)
    assert book.claims[c.claim_id].state == "cleaned"
    sig = book.claims[c.claim_id].signals
    assert sig is not None and sig.holder_gone and sig.heartbeat_age_s == 100
    assert book.claims[new.claim_id].state == "active"
    # The old holder's heartbeat is refused from now on.
    with pytest.raises(HarnessError, match="cleaned"):
        C.heartbeat(workspace, c.claim_id)


# --- the stale-claim rule ---------------------------------------------------------------


def _stale_setup(workspace, clock, holder):
    fake = FakeNvml(2)
    _register(workspace, fake)
    p, child = holder
    c = C.claim(workspace, [_gpu(fake, 0), _gpu(fake, 1)], holder=_holder_of(p),
                heartbeat_s=10)
    return fake, p, child, c


def _verdict(workspace, claim_id):
    (v,) = C.cleanup(workspace, claim_id, dry_run=True)
    return v


def test_each_signal_alone_does_not_free_a_claim_all_together_do(workspace, clock, holder):
    fake, p, child, c = _stale_setup(workspace, clock, holder)
    busy = {0: (p.pid,)}
    # Holder alive, heartbeat fresh, GPU 0 busy: kept, three reasons.
    _observe(workspace, fake, clock.t, 3, busy=busy)
    clock.advance(20)
    v = _verdict(workspace, c.claim_id)
    assert not v.signals.eligible and v.action == "kept"
    assert len([r for r in v.signals.reasons if "still running" in r
                or "within the lease" in r or "compute processes" in r]) == 3
    # Signal 1 alone: holder gone (leader killed; its child survives in the group).
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    v = _verdict(workspace, c.claim_id)
    assert v.signals.holder_gone and not v.signals.eligible
    # Signals 1 + 2: heartbeat stale too, GPU 0 still shows a process: kept.
    clock.advance(40)
    _observe(workspace, fake, clock.t - timedelta(seconds=20), 3, busy={0: (child,)})
    v = _verdict(workspace, c.claim_id)
    assert v.signals.heartbeat_age_s == 60 and not v.signals.eligible
    assert any("compute processes" in r for r in v.signals.reasons)
    # Only two idle observations: kept.
    _observe(workspace, fake, clock.t - timedelta(seconds=10), 2)
    v = _verdict(workspace, c.claim_id)
    assert not v.signals.eligible and any("2 observation(s), 3 needed" in r
                                          for r in v.signals.reasons)
    # All three: eligible (dry run frees nothing).
    _observe(workspace, fake, clock.t - timedelta(seconds=20), 3)
    v = _verdict(workspace, c.claim_id)
    assert v.signals.eligible and v.action == "would-clean" and v.kill == [child]
    assert read_claims(workspace.ledger).claims[c.claim_id].state == "active"


def test_gpu_idle_and_stale_heartbeat_with_live_holder_keeps_the_claim(workspace, clock,
                                                                       holder):
    fake, p, _, c = _stale_setup(workspace, clock, holder)
    clock.advance(300)
    _observe(workspace, fake, clock.t - timedelta(seconds=30), 4)
    v = _verdict(workspace, c.claim_id)
    assert v.signals.holder_gone is False and v.signals.reasons == (
        f"holder pid {p.pid} on {local_host()} is still running",)


def test_missing_observations_never_count_as_idle(workspace, clock, holder):
    fake, p, _, c = _stale_setup(workspace, clock, holder)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    clock.advance(120)
    # Never observed after the claim: kept.
    v = _verdict(workspace, c.claim_id)
    assert not v.signals.eligible
    assert all(g.idle_streak == 0 or g.idle_streak is None for g in v.signals.gpus)
    # Observed idle, but long ago (the observer stopped): kept.
    _observe(workspace, fake, T0 + timedelta(seconds=1), 5)
    clock.advance(3600)
    v = _verdict(workspace, c.claim_id)
    assert any("stale observation" in r for r in v.signals.reasons)
    # Fresh samples with a gap (a missed sample) reset the streak: kept.
    win = Window(local_host(), 10.0, (clock.t - timedelta(seconds=60)).timestamp())
    for dt in (60, 50, 40, 10, 0):  # 30 s and 20 s missing
        t = (clock.t - timedelta(seconds=dt)).timestamp()
        win.add(Sample(t, 1.0, 1, {g.uuid: GpuSample(0.0, 0, ()) for g in fake.gpus}))
    ev, cols = win.summary(clock.t.timestamp())
    assert ev.missed == 2 and all(g.idle_streak == 2 for g in ev.gpus)
    registry.record_summary(workspace, ev, cols)
    v = _verdict(workspace, c.claim_id)
    assert not v.signals.eligible and any("2 observation(s)" in r for r in v.signals.reasons)
    # A window where NVML failed (no GPU data) resets it too.
    win = Window(local_host(), 10.0, clock.t.timestamp())
    for k in range(3):
        win.add(Sample(clock.t.timestamp() + k * 10, 1.0, 1, None if k == 2 else {
            g.uuid: GpuSample(0.0, 0, ()) for g in fake.gpus}))
    assert all(v == 0 for v in win.streak.values())


def test_cleanup_that_kills_waits_for_a_person_and_records_its_signals(workspace, clock,
                                                                       holder):
    fake, p, child, c = _stale_setup(workspace, clock, holder)
    os.kill(p.pid, signal.SIGKILL)  # the leader dies; its child lingers in the group
    p.wait()
    clock.advance(60)
    _observe(workspace, fake, clock.t - timedelta(seconds=20), 3)
    (v,) = C.cleanup(workspace, c.claim_id)
    assert v.action == "waiting-approval" and v.kill == [child]
    assert os.path.exists(f"/proc/{child}")
    assert read_claims(workspace.ledger).claims[c.claim_id].state == "active"
    # An agent cannot grant it; a person can.
    with pytest.raises(HarnessError):
        approvals.decide(workspace, v.approval_id, True, "ok", E.Actor.agent("a", "m"))
    approvals.decide(workspace, v.approval_id, True, "leftover bench server",
                     E.Actor.human("ana"))
    (v2,) = C.cleanup(workspace, c.claim_id)
    assert v2.action == "cleaned" and v2.approval_id == v.approval_id
    done = read_claims(workspace.ledger).claims[c.claim_id]
    assert done.state == "cleaned" and done.killed == (child,)
    assert done.signals is not None and done.signals.eligible
    assert done.signals.holder_gone and done.signals.gpus[0].idle_streak == 3
    st = C.holder_status(done.holder)
    assert st[0] is True
    # The group is gone: cleanup waits for the kill to land before recording it.
    from infer_forge.harness.proc import group_members
    assert group_members(p.pid) == []
    # The approval was spent: a second cleanup has nothing to do.
    assert C.cleanup(workspace) == []


def test_a_claim_on_another_host_cannot_be_judged_here(workspace, clock):
    fake = FakeNvml(1, host_tag="far")
    registry.register_host(workspace, "far-host", Probe(nvml=fake).inventory())
    c = C.claim(workspace, [E.ResourceRef(host="far-host", kind="gpu", id=fake.gpus[0].uuid)],
                holder=E.ClaimHolder(host="far-host", pid=1234, pid_start="1"))
    clock.advance(3600)
    v = _verdict(workspace, c.claim_id)
    assert v.signals.holder_gone is None and not v.signals.eligible
    assert "cannot be checked from here" in v.signals.reasons[0]


# --- observations -----------------------------------------------------------------------


class ScriptedProbe(Probe):
    """The real probe over a simulated NVML whose processes follow a script per sample."""

    def __init__(self, fake: FakeNvml, script: dict[int, dict[int, tuple[int, ...]]]):
        super().__init__(nvml=fake)
        self.fake, self.script, self.n = fake, script, 0
        self.t0 = time.time()

    def sample(self) -> Sample:
        for i, pids in self.script.get(self.n, {}).items():
            if pids:
                self.fake.busy(i, *pids)
            else:
                self.fake.idle(i)
        self.n += 1
        # Timestamps on the schedule: a loaded test machine must not look like a gap in
        # observation (the real probe's own clock is what production sees).
        return dataclasses.replace(super().sample(), t=self.t0 + (self.n - 1) * 0.01)


def test_observe_records_process_changes_at_once_and_samples_in_the_index(workspace):
    fake = FakeNvml(4)
    probe = ScriptedProbe(fake, {1: {0: (4242,)}, 2: {0: (4242, 4243), 2: (99,)},
                                 4: {0: ()}, 5: {2: ()}})
    lines: list[str] = []
    res = observe(workspace, interval_s=0.01, window_s=0.03, count=8, probe=probe,
                  echo=lines.append)
    assert res.samples == 8 and res.gpus == 4 and res.nvml == "ok" and res.registered
    evs = [r.event for r in workspace.ledger.stream(NODES_STREAM)]
    changes = [e for e in evs if isinstance(e, E.GpuProcessesChanged)]
    assert [(e.gpu_uuid[-2:], e.pids, e.added, e.removed) for e in changes] == [
        ("00", (4242,), (4242,), ()),
        ("00", (4242, 4243), (4243,), ()),
        ("02", (99,), (99,), ()),
        ("00", (), (), (4242, 4243)),
        ("02", (), (), (99,)),
    ]
    sums = [e for e in evs if isinstance(e, E.HostSummarized)]
    assert sum(s.samples for s in sums) == 8 and res.summaries == len(sums) >= 2
    last = {g.uuid[-2:]: g for g in sums[-1].gpus}
    assert last["00"].idle_streak == 4 and last["02"].idle_streak == 3
    assert last["01"].idle_streak == 8 and last["00"].last_pids == ()
    hosts = read_hosts(workspace.ledger)
    assert hosts.hosts[local_host()].gpus[fake.gpus[1].uuid].idle_streak == 8
    with open_index(workspace) as s:
        assert s.con.execute("SELECT count(*) FROM host_samples").fetchone() == (8,)
        assert s.con.execute("SELECT count(*), sum(procs) FROM gpu_samples").fetchone() == (
            32, 1 + (2 + 1) + (2 + 1) + 1)  # samples 1 to 4
        assert s.con.execute("SELECT count(*) FROM gpu_changes").fetchone() == (5,)
        assert s.con.execute("SELECT bool_and(samples_loaded) FROM host_windows"
                             ).fetchone() == (True,)
        incremental = fingerprint(s.con)
    rebuild(workspace)
    with open_index(workspace) as s:
        assert fingerprint(s.con) == incremental
    assert any("compute pids [4242]" in x for x in lines)


def test_absent_nvml_is_reported_not_an_error(workspace):
    probe = Probe(nvml=FakeNvml(2, fail_init="NVML Shared Library Not Found"))
    lines: list[str] = []
    res = observe(workspace, interval_s=0.01, count=2, probe=probe, echo=lines.append)
    assert res.nvml.startswith("NVML unavailable") and res.gpus == 0
    (h,) = read_hosts(workspace.ledger).hosts.values()
    assert "Shared Library Not Found" in h.inventory.accelerator_note
    assert h.last_summary is not None and h.last_summary.nvml.startswith("NVML unavailable")
    assert "observing CPU and memory only" in lines[0]


def test_registering_the_same_inventory_twice_records_once(workspace):
    inv = Probe(nvml=FakeNvml(2)).inventory()
    assert registry.register_host(workspace, "h1", inv)
    assert not registry.register_host(workspace, "h1", inv)
    bigger = inv.model_copy(update={"memory_mib": inv.memory_mib * 2})
    assert registry.register_host(workspace, "h1", bigger)
    assert workspace.ledger.version(NODES_STREAM) == 2


def test_cli_nodes_observe_list_claim_release_and_cleanup_dry_run(workspace):
    r = run_forge("nodes", "observe", "--interval", "0.05", "--count", "2", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["samples"] == 2
    r = run_forge("nodes", "list", "--json")
    (h,) = json.loads(r.stdout)
    assert h["host"] == local_host() and h["cpus"] >= 1
    r = run_forge("nodes", "claim", "port:39999", "--purpose", "cli test", "--json")
    assert r.returncode == 0, r.stderr
    cid = json.loads(r.stdout)["claim_id"]
    r = run_forge("nodes", "claim", "port:39999")
    assert r.returncode != 0 and cid in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run_forge("nodes", "claim", "port:99999")
    assert r.returncode != 0 and "1..65535" in r.stderr
    before = workspace.ledger.max_position()
    r = run_forge("nodes", "cleanup", "--dry-run", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)[0]["action"] == "kept"
    assert workspace.ledger.max_position() == before
    assert run_forge("nodes", "heartbeat", cid).returncode == 0
    assert run_forge("nodes", "release", cid).returncode == 0
    r = run_forge("nodes", "heartbeat", cid)
    assert r.returncode != 0 and "released" in r.stderr
    r = run_forge("nodes", "claims", "--all", "--json")
    assert [c["state"] for c in json.loads(r.stdout)] == ["released"]


def test_a_lease_renews_while_held_and_reports_a_lost_claim(workspace):
    from infer_forge.projections.nodes import heartbeats

    def until(cond) -> None:
        deadline = time.monotonic() + 30
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cond()

    c = C.claim(workspace, [C.parse_resource("port:7000")], heartbeat_s=0.02)
    with C.Lease(str(workspace.home), c.claim_id, 0.02) as lease:
        until(lambda: heartbeats(workspace.ledger, c.claim_id) >= 3)
    assert not lease._thread.is_alive() and lease.lost is None
    C.release(workspace, c.claim_id, "done")
    with C.Lease(str(workspace.home), c.claim_id, 0.02) as lost:
        until(lambda: lost.lost is not None)
    assert lost.lost is not None and "released" in lost.lost


def test_ctrl_c_records_the_partial_window_and_leaves_the_ledger_consistent(workspace):
    from tests.conftest import FORGE, REPO
    env = {**os.environ, "FORGE_HOME": str(workspace.home)}
    p = subprocess.Popen([*FORGE, "nodes", "observe", "--interval", "0.02", "--window", "0.2"],
                         cwd=str(REPO), env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    seen = []
    for line in p.stderr:  # the first window's progress line: a summary is recorded
        seen.append(line)
        if "window of" in line:
            break
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode != 0 and "Traceback" not in err
    sums = [r.event for r in workspace.ledger.stream(NODES_STREAM)
            if isinstance(r.event, E.HostSummarized)]
    first = int(seen[-1].split("window of ")[1].split(":")[0])
    assert sums[0].samples == first
    # The interrupted window's samples are recorded (when it had any yet).
    last = int(err.split("the last window's ")[1].split(" ")[0])
    if last:
        assert len(sums) >= 2 and sums[-1].samples == last
    assert run_forge("check").returncode == 0
    with open_index(workspace) as s:
        (rows,) = s.con.execute("SELECT count(*) FROM host_samples").fetchone()
    assert rows == sum(x.samples for x in sums)


# --- who may renew, release and signal (issue 27, item 10) -----------------------------


@pytest.fixture
def stranger():
    """A live process unrelated to this test's: orphaned (its shell exited), so it is neither
    an ancestor of a forge command run from here nor a descendant of what runs one."""
    out = subprocess.run(["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True)
    pid = int(out.stdout)
    yield pid
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _live(pid: int) -> bool:
    from infer_forge.harness.proc import alive
    return alive(pid)


def test_a_non_holder_cannot_renew_or_release_a_live_claim(workspace, stranger):
    from infer_forge.harness.proc import start_time
    c = C.claim(workspace, [C.parse_resource("port:39997")],
                holder=E.ClaimHolder(host=local_host(), pid=stranger,
                                     pid_start=start_time(stranger)))
    for cmd in ("heartbeat", "release"):
        r = run_forge("nodes", cmd, c.claim_id)
        err = r.stderr.strip()
        assert r.returncode != 0 and len(err.splitlines()) == 1, err
        assert f"held by pid {stranger}" in err and "not its holder" in err, err
    assert "forge approve appr-" in err  # the release waits for a person
    with pytest.raises(HarnessError, match="not its holder"):
        C.heartbeat(workspace, c.claim_id)
    assert read_claims(workspace.ledger).claims[c.claim_id].state == "active"
    assert _live(stranger)
    # The refused release is recorded as a request a person decides; granted, it goes
    # through once.
    (req,) = approvals.pending(workspace)
    assert (req.kind, req.target) == ("cleanup", c.claim_id)
    assert req.arguments["release"] is True and req.arguments["holder"] == stranger
    approvals.decide(workspace, req.approval_id, True, "its job is done",
                     E.Actor.human("ana"))
    C.release(workspace, c.claim_id, "freed by ana", actor=E.Actor.human("ana"))
    assert read_claims(workspace.ledger).claims[c.claim_id].state == "released"


def test_a_claim_names_a_process_of_its_claimant(workspace, stranger):
    """`--pid 1` (or any process the claimant does not own) would keep a claim live forever:
    refused. The claimant's own descendants are fine."""
    for pid in (1, stranger):
        r = run_forge("nodes", "claim", "port:39996", "--pid", str(pid))
        err = r.stderr.strip()
        assert r.returncode != 0 and len(err.splitlines()) == 1, err
        assert f"--pid {pid}: not the process that runs this command" in err, err
    assert read_claims(workspace.ledger).claims == {}
    # forge's caller here is this test process: its child is a process of the claimant.
    child = subprocess.Popen(["sleep", "600"])
    try:
        r = run_forge("nodes", "claim", "port:39996", "--pid", str(child.pid), "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["holder"]["pid"] == child.pid
    finally:
        child.kill()
        child.wait()


def test_cleanup_never_signals_a_reused_pid(workspace, clock):
    """The holder's pid now runs another process (simulated: a real `sleep`, leading its own
    group, recorded with another start time): the claim is stale, and freeing it kills
    nothing: that group is not the holder's."""
    from infer_forge.harness.proc import start_time
    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        assert start_time(other.pid) != "1"
        c = C.claim(workspace, [C.parse_resource("port:39995")], heartbeat_s=10,
                    holder=E.ClaimHolder(host=local_host(), pid=other.pid, pid_start="1"))
        clock.advance(3600)
        (v,) = C.cleanup(workspace, c.claim_id)
        assert v.signals.holder_gone and v.signals.eligible
        assert v.kill == [] and v.action == "cleaned" and v.approval_id is None
        assert other.poll() is None  # never signalled
        assert read_claims(workspace.ledger).claims[c.claim_id].killed == ()
    finally:
        other.kill()
        other.wait()
