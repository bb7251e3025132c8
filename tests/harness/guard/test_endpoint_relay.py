"""Listed endpoints (harness/guard/endpoint_relay.py): a task's `sandbox.endpoints` lets its
sandboxed calls reach exactly those servers on this host, the network otherwise off. For real:
bubblewrap, the shipped skills' own recipes as they are written (`sglang-metrics`'s curl of
`/metrics`, `bench-serving`'s run of SGLang's released bench client, 0.5.23 of the kit) run
through `forge run` / `run_tool` in a task, against the SGLang stand-in server
(tests/data/sglang/fake_server.py) and an SGLang-like server on 127.0.0.1 that logs what it
receives: refused without the grant (the call's stderr names the YAML to add), served with
it, a second server unreachable from the same call, nothing left running after a call ends
or is killed, a production endpoint held to the production guard."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest
from infer_forge.harness.agents import skills as Sk
from infer_forge.harness.guard import endpoint_relay as R
from infer_forge.harness.guard import reach
from infer_forge.harness.loop.manual import run_command
from infer_forge.harness.tool_calls.calls import run_tool
from infer_forge.ledger import events as E
from infer_forge.ledger.errors import SpecError
from infer_forge.ledger.specs import SandboxSpec, load_task
from infer_forge.ledger.streams import GUARD_STREAM

from tests.conftest import run_forge
from tests.helpers import real_bench_client as B
from tests.helpers import real_sglang
from tests.helpers.sandboxed import processes_naming, still_alive
from tests.helpers.sglang_like import SGLangLike

from ..loop.test_loop import make_task_dir
from .test_sandbox import has_bwrap, set_guard, task, tool_events

PY = sys.executable


@pytest.fixture
def relay_tmp(tmp_path, monkeypatch):
    """forge's temporary directory (where the relay keeps its sockets) inside this test's."""
    d = tmp_path / "forge-tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


@pytest.fixture(scope="module")
def stand_in():
    """The SGLang stand-in server, with /metrics (as `--enable-metrics` gives it)."""
    with B.stand_in("--enable-metrics") as url:
        yield url


@pytest.fixture
def other():
    with SGLangLike() as srv:
        yield srv


def recipe(skill: str, program: str, ws) -> list[str]:
    """The shipped skill's one `forge run -- PROGRAM …` recipe, as the skill writes it."""
    (cmd,) = [c for c in Sk.recipes(Sk.get(ws, skill).body) if program in c[:3]]
    return cmd


def on(cmd: list[str], url: str) -> list[str]:
    """The recipe pointed at `url` instead of the skill's 127.0.0.1:30000."""
    return [a.replace("http://127.0.0.1:30000", url) for a in cmd]


def left_running(marker: str) -> list[int]:
    deadline = time.monotonic() + 10  # killed with the call; reaped by the kernel
    while alive := still_alive(processes_naming(marker)):
        if time.monotonic() > deadline:
            return alive
        time.sleep(0.02)
    return []


def test_the_metrics_recipe_is_refused_naming_the_grant_and_served_with_it(
        workspace, tmp_path, stand_in, other, relay_tmp):
    has_bwrap()
    cmd = on(recipe("sglang-metrics", "curl", workspace), stand_in)
    assert cmd[-1] == f"{stand_in}/metrics"

    # The default sandbox: the network off, and the failure says what to grant.
    task(workspace, tmp_path / "a", "scrape-off")
    p = run_forge("run", "--task", "scrape-off", "--", *cmd, home=workspace.home)
    assert p.returncode != 0
    assert f"sandbox: {{endpoints: [{stand_in}]}}" in p.stderr
    ev = tool_events(workspace, "scrape-off")[-1]
    assert ev.sandbox["network"] is False and "endpoints" not in ev.sandbox

    # Granted: the same recipe scrapes the stand-in's page; a second server stays out of
    # reach from the same call, and nothing of the call is left running after it.
    marker = f"linger-{os.getpid()}-{tmp_path.name}"
    task(workspace, tmp_path / "b", "scrape", f"{{endpoints: [{stand_in}]}}")
    script = (f"{PY} -c 'import time; time.sleep(300)' {marker} & "
              f"{shlex.join(cmd)} && curl -sS --fail {other.url}/metrics")
    p = run_forge("run", "--task", "scrape", "--", "sh", "-c", script, home=workspace.home)
    assert p.returncode == 7, p.stderr  # curl: cannot connect (the second server)
    assert "sglang:num_running_reqs" in p.stdout  # the stand-in's page, through the relay
    assert other.paths() == []  # the second server got nothing
    assert f"sandbox: {{endpoints: [{other.url}]}}" in p.stderr
    ev = tool_events(workspace, "scrape")[-1]
    assert ev.sandbox["endpoints"] == [stand_in] and ev.sandbox["network"] is False
    assert left_running(marker) == []
    assert left_running(str(R.FORWARDER)) == [] and left_running(R.__name__) == []
    assert list((relay_tmp / f"forge-relay-{os.getuid()}").iterdir()) == []

    # The recipe alone succeeds.
    p = run_forge("run", "--task", "scrape", "--", *cmd, home=workspace.home)
    assert p.returncode == 0, p.stderr
    assert "sglang:num_running_reqs" in p.stdout


def test_a_call_killed_on_timeout_leaves_nothing(workspace, tmp_path, stand_in, relay_tmp):
    has_bwrap()
    marker = f"killed-{os.getpid()}-{tmp_path.name}"
    spec = SandboxSpec(endpoints=[stand_in])
    run = run_tool(workspace, ["sh", "-c", f"{PY} -c 'import time; time.sleep(300)' {marker}"],
                   cwd=tmp_path, sandbox=spec, timeout=2)
    assert run.event.error == "timed out after 2s"
    assert left_running(marker) == [] and left_running(str(R.FORWARDER)) == []
    parent = relay_tmp / f"forge-relay-{os.getuid()}"
    (killed,) = list(parent.iterdir())  # a SIGKILL runs no cleanup: its sockets stay ...
    run = run_tool(workspace, ["true"], cwd=tmp_path, sandbox=spec)
    assert run.returncode == 0
    assert not killed.exists()  # ... until the next relayed call sweeps them


def test_the_bench_serving_recipe_runs_the_real_client_through_the_relay(
        workspace, tmp_path, stand_in, tiny_tokenizer_dir):
    """The bench-serving skill's recipe, its flags as written (dataset, lengths, seed,
    concurrency; only the sizes made small), run by SGLang 0.5.23's own client in the
    sandbox with only the stand-in granted: it completes every request, streamed."""
    has_bwrap()
    root = real_sglang.release(real_sglang.LATEST)
    cmd = recipe("bench-serving", "sglang.benchmark.serving", workspace)
    assert cmd[:3] == ["python", "-m", "sglang.benchmark.serving"]
    assert reach.named_endpoints(cmd) == ["http://127.0.0.1:30000"]
    host, port = stand_in.rsplit("/", 1)[-1].rsplit(":", 1)
    small = {"--port": port, "--host": host, "--tokenizer": str(tiny_tokenizer_dir),
             "--random-input-len": "16", "--random-output-len": str(B.OUTPUT_LEN),
             "--num-prompts": str(B.PROMPTS), "--max-concurrency": "4",
             # the task's scratch directory: where the call may write
             "--output-file": str(workspace.home / "scratch" / "bench" / "b3.jsonl")}
    args = [small.get(cmd[i - 1], a) for i, a in enumerate(cmd)][3:]
    task(workspace, tmp_path / "t", "bench", f"{{endpoints: [{stand_in}]}}")
    out = Path(small["--output-file"])
    info = run_command(workspace, "bench", [PY, "-m", "infer_forge.harness.engines."
                                            "sglang_import", str(root), str(B.DRIVER), *args],
                       tee=False)
    err = workspace.artifacts.text(info["stderr_digest"]) if info.get("stderr_digest") else ""
    assert info["exit_code"] == 0, err[-2000:]
    (line,) = B.lines(out)
    assert line["completed"] == B.PROMPTS, line.get("errors")
    assert line["total_output_tokens"] == B.PROMPTS * B.OUTPUT_LEN
    profile = tool_events(workspace, "bench")[-1].sandbox
    assert profile["endpoints"] == [stand_in] and profile["network"] is False


def test_a_production_endpoint_gets_only_what_the_guard_allows(workspace, tmp_path, other,
                                                               relay_tmp):
    has_bwrap()
    set_guard(workspace, production_endpoints=[f"127.0.0.1:{other.port}"])
    task(workspace, tmp_path / "p", "prod", f"{{endpoints: [{other.url}]}}")
    read = ["curl", "-sS", "--fail", f"{other.url}/metrics"]
    info = run_command(workspace, "prod", read, tee=False)
    assert info["exit_code"] == 0
    assert other.paths() == ["GET /metrics"]
    flush = ["curl", "-sS", "--fail-with-body", "-X", "POST", f"{other.url}/flush_cache"]
    info = run_command(workspace, "prod", flush, tee=False)
    assert info["exit_code"] == 22  # curl: HTTP 403
    assert "flush_cache empties the production server's cache" in \
        workspace.artifacts.text(info["stdout_digest"])
    assert other.paths() == ["GET /metrics"]  # never sent
    refused = [r.event for r in workspace.ledger.stream(GUARD_STREAM)
               if isinstance(r.event, E.ProductionRefused)]
    assert [(e.action, e.task_id) for e in refused] == [("POST /flush_cache", "prod")]


def test_endpoints_in_a_task_file_are_checked(tmp_path):
    path = make_task_dir(tmp_path, "bad")
    for value, words in [("http://10.1.2.3:30000", "not this host's loopback"),
                         ("ftp://127.0.0.1:21", "scheme must be http or https"),
                         ("http://127.0.0.1:30000/metrics", "scheme://host:port only"),
                         ("http://127.0.0.1:99999", "out of range")]:
        path.write_text(path.read_text().split("sandbox:")[0].rstrip("\n") + "\n"
                        f"sandbox: {{endpoints: ['{value}']}}\n")
        with pytest.raises(SpecError) as e:
            load_task(path)
        assert "sandbox.endpoints" in str(e.value) and words in str(e.value), str(e.value)
        assert value in str(e.value) or "99999" in str(e.value)
    spec = SandboxSpec(endpoints=["http://localhost", "https://[::1]:8443/",
                                  "http://127.0.0.1:30000"])
    assert spec.endpoints == ["http://localhost:80", "https://[::1]:8443",
                              "http://127.0.0.1:30000"]
    assert "endpoints" not in SandboxSpec().model_dump()  # old specs keep their hashes


def test_without_bwrap_the_call_runs_unsandboxed_and_says_so(workspace, tmp_path, monkeypatch,
                                                             other, capsys):
    task(workspace, tmp_path / "n", "nobwrap", f"{{endpoints: [{other.url}]}}")
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "curl").symlink_to(shutil.which("curl"))
    monkeypatch.setenv("PATH", str(bare))
    info = run_command(workspace, "nobwrap", ["curl", "-sS", f"{other.url}/metrics"],
                       tee=False)
    assert info["exit_code"] == 0
    assert "tool call runs unsandboxed" in capsys.readouterr().err
    ev = tool_events(workspace, "nobwrap")[-1]
    assert ev.sandbox["kind"] == "none" and ev.sandbox["network"] is True
    assert ev.sandbox["endpoints"] == [other.url]


def test_what_a_command_line_names(relay_tmp):
    assert reach.named_endpoints(["curl", "-s", "http://LOCALHOST/metrics?x=1"]) == \
        ["http://localhost:80"]
    assert reach.named_endpoints(["sh", "-c", "curl http://127.0.0.1:30000/x; "
                                  "wget 'https://gpu3:8443/y'"]) == \
        ["http://127.0.0.1:30000", "https://gpu3:8443"]
    # SGLang's bench client, as it computes its target (sglang/benchmark/serving.py).
    assert reach.named_endpoints(["python", "-m", "sglang.bench_serving"]) == \
        ["http://0.0.0.0:30000"]
    assert reach.named_endpoints(["python", "-m", "sglang.benchmark.serving", "--backend",
                                  "vllm", "--host", "127.0.0.1"]) == ["http://127.0.0.1:8000"]
    assert reach.named_endpoints(["python", "-m", "sglang.benchmark.serving", "--base-url",
                                  "http://h:1"]) == ["http://h:1"]
    assert reach.runs_bench_client(["aiperf", "profile"])
    assert not reach.runs_bench_client(["python", "-m", "sglang.launch_server"])
    # The hint: a 0.0.0.0 target is reached through 127.0.0.1's grant.
    line = R.hint(["python", "-m", "sglang.bench_serving"], [])
    assert "sandbox: {endpoints: [http://127.0.0.1:30000]}" in line
    assert R.hint(["python", "-m", "sglang.bench_serving"], ["http://127.0.0.1:30000"]) is None
    assert "network: true" in R.hint(["curl", "http://gpu3:30000"], [])
    assert R.plan(None, ["curl", "http://h:1"], [], network=True, task=None) == R.Wrapped([], [])
    # localhost listens on 127.0.0.1 and (where the host has IPv6) ::1; one listener each.
    inner = R.plan(None, ["true"], ["http://localhost:30000", "http://127.0.0.1:30000"],
                   network=False, task=None).inner
    assert inner[:4] == [PY, "-I", "-S", str(R.FORWARDER)] and inner[-1] == "--"
    assert json.loads(inner[4])["relay"] == [["127.0.0.1", 30000, "0.sock", True],
                                             ["::1", 30000, "0.sock", False]]
