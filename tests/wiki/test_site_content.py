"""What the journal site says, as a person reads it (no browser: the built files): human
titles, numbers by unit without e-notation, plurals, statuses (the decide step, an engine
forge stopped), tool output as a redacted preview with its artifact page, tables in their
scroll box. The browser's view of the same pages: test_site_look.py."""

from __future__ import annotations

import re

from infer_forge.ledger import events as E
from infer_forge.ledger.payloads import StepResult
from infer_forge.ledger.streams import ENGINES_STREAM, task_stream
from infer_forge.wiki import build as B
from infer_forge.wiki.artifacts import HEAD_LINES, LINE_CHARS, preview

from tests.helpers.index_ledger import TASKS
from tests.helpers.index_ledger import build as build_ledger

E_NOTATION = re.compile(r"\b\d(\.\d+)?e[+-]\d+\b", re.IGNORECASE)
TASK = "deepgemm-moe-h20"
SECRET = "sk-proj-" + "Zq8" * 10  # an API key's shape: redacted wherever it is shown


def _visible(html: str) -> str:
    return re.sub(r"<svg.*?</svg>|<style>.*?</style>|<script>.*?</script>", "", html,
                  flags=re.S)


def _tool_output_and_engine(ws) -> None:
    """The rejected block of TASK ran a tool with output and an engine forge stopped, and its
    verification's path ends with the decide step (recorded as deferred, as the loop does)."""
    bid = f"b{len(TASKS[TASK]['blocks'])}"
    common = {"task_id": TASK, "block_id": bid, "actor": E.Actor.tool("forge-test")}
    ws.ledger.append(task_stream(TASK), [E.VerificationRecorded(
        contract_hash="sha256:contract", passed=False, verdict="fail",
        steps=[StepResult(name="gates", kind="phase", outcome="fail", detail="token match"),
               StepResult(name="decide", kind="phase", outcome="deferred",
                          detail="accept or reject on this verification's verdict")],
        **common)], command_id="test-steps")
    lines = ["profiling decode", f"token {SECRET}"] + [f"step {i} ok" for i in range(30)]
    out = ws.artifacts.put("\n".join(lines) + "\n")
    ws.ledger.append(task_stream(TASK), [E.ToolInvoked(
        tool="profile", argv=["forge", "profile", TASK], exit_code=0, stdout_digest=out,
        **common)], command_id="test-tool-output")
    log = ws.artifacts.put("server up\nshutting down on SIGTERM\n")
    url = "http://127.0.0.1:30000"
    ws.ledger.append(ENGINES_STREAM, [
        E.EngineLaunched(engine="sglang", command=["python", "-m", "sglang.launch_server"],
                         url=url, log_digest=log, **common),
        E.EngineStopped(engine="sglang", url=url, exit_code=-15, log_digest=log, **common)],
        command_id="test-engine-stop")


def test_pages_read_as_a_person_writes_them(workspace):
    build_ledger(workspace)
    _tool_output_and_engine(workspace)
    rep = B.build(workspace, embeddings=False)
    site = workspace.home / "site"
    dec_file = next((site / "decisions").glob(f"{TASK}-rejected-*.html"))
    dec = dec_file.read_text()
    h1 = re.search(r"<h1>(.*?)</h1>", dec).group(1)
    assert h1 == f"Rejected: moe_runner_backend=deep_gemm in {TASK}", h1
    # Numbers by unit, gated metrics first, the rest one click away.
    assert "1,100 tok/s" in dec and "0.61" in dec and "e+0" not in dec
    assert "<details><summary>" in dec
    # The engine forge stopped (exit -15) reads "stopped"; the tool output is a preview,
    # redacted, bounded, linking to its artifact page.
    assert "<td>stopped</td>" in dec or '<span class="stopped">stopped</span>' in dec
    assert "-15" not in re.sub(r"<[^>]+>", " ", dec).split()
    assert "profiling decode" in dec and SECRET not in dec
    art = re.search(r'href="\.\./(artifacts/[0-9a-f]{16})\.html">output</a>', dec)
    assert art, "a link to the output's artifact page"
    page = (site / f"{art.group(1)}.html").read_text()
    assert "step 29 ok" in page and SECRET not in page and "sha256:" in page
    assert rep.pages >= 2 and (workspace.home / "wiki" / f"{art.group(1)}.md").exists()
    # The home page: plurals, and tables in their scroll box.
    home = (site / "index.html").read_text()
    assert "4 tasks, " in home and "(1 values)" not in home
    assert '<div class="scroll"><table>' in home
    # The task page: its title, the decide step as the decision the task took.
    task = (site / "tasks" / f"{TASK}.html").read_text()
    assert re.search(r"<h1>(.*?)</h1>", task).group(1) == TASK  # its given title
    assert "<td>decide</td>" in task and "deferred" not in _visible(task)
    assert "rejected on this verification&#x27;s verdict" in task
    for f in site.rglob("*.html"):
        assert not E_NOTATION.search(_visible(f.read_text())), f


def test_a_preview_is_bounded_and_redacted():
    data = "\n".join([f"x{i} " + "y" * 300 for i in range(20)] + [SECRET]).encode()
    p = preview("sha256:" + "ab" * 32, "stdout of t", "artifacts/sha256/ab/ab", data)
    lines = p.head.split("\n")
    assert len(lines) == HEAD_LINES and all(len(ln) <= LINE_CHARS for ln in lines)
    assert SECRET not in p.excerpt and not p.cut
    cut = preview("sha256:" + "ab" * 32, "w", "r", b"\x1b[31mred\x1b[0m\x00\n", whole=False)
    assert cut.head == "red" and cut.cut


def test_an_slo_and_a_gate_on_one_value_are_one_line():
    from infer_forge.wiki.plot import Line, Point, merged_guides, plot_svg

    lines = [Line("x", 500, "TTFT SLO p50 500 ms"), Line("x", 500.0, "gate ttft-slo: ≤ 500 ms"),
             Line("y", 100, "throughput floor 100 tok/s")]
    assert merged_guides(lines) == [
        ("x", 500.0, "TTFT SLO p50 500 ms\n= gate ttft-slo: ≤ 500 ms"),
        ("y", 100.0, "throughput floor 100 tok/s")]
    svg = plot_svg([Point(400, 120, "b1", "baseline")], xlabel="x", ylabel="y", title="t",
                   lines=lines)
    assert svg.count("stroke-dasharray") == 2 + 2  # two dashed lines, two legend samples


def test_a_search_snippet_ends_at_a_word():
    from infer_forge.wiki.search_index import SNIPPET, snippet

    s = snippet("throughput " * 40)
    assert len(s) <= SNIPPET and s.endswith("throughput…")
    assert snippet("short text") == "short text"
