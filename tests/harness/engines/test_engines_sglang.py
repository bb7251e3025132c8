"""The SGLang adapter on recorded 0.5.x-shaped outputs: command building per version (the flag
table; test_sglang_flags.py parses such argv with the real released parsers), --config YAML,
flag checks against --help, server info, metrics, profiler, malformed answers.
SGLang itself cannot run here (no GPU): a stand-in process serves the recorded responses
over the real HTTP protocol (tests/data/sglang/fake_server.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from infer_forge.harness.engines import engine_for
from infer_forge.harness.engines.metrics import bucket_quantile, parse_prometheus, summarize
from infer_forge.harness.engines.sglang import (
    check_flags,
    help_flags,
    parse_version,
    sglang_command,
    translate,
    validate_server_info,
)
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.proc import group_alive
from infer_forge.ledger.streams import task_stream

from tests.conftest import REPO, TESTS
from tests.helpers.tasks import open_task

DATA = TESTS / "data" / "sglang"
FAKE = [sys.executable, str(DATA / "fake_server.py")]
MODEL = "Qwen/Qwen3-8B"


def processes_with(*words: str) -> list[int]:
    """Live pids whose command line contains every word (the process table, not our state)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and all(w in argv for w in words):
            out.append(int(d.name))
    return out


def args_of(config, version):
    cmd, _ = sglang_command(config, model=MODEL, port=30000, version=version)
    return cmd[cmd.index("--port") + 2:]


# --- command building -------------------------------------------------------------------


def test_renames_per_version():
    """Spelled per the pinned release's parser (the flag table; test_sglang_flags.py parses
    these with the real parsers): old names to 0.5.13, max-bs and cuda-graph backends from
    0.5.14 (the old spellings deprecated there), --attn-dp-size from 0.5.22."""
    cfg = {"cuda_graph_max_bs": 64, "disable_cuda_graph": True, "enable_dp_attention": True,
           "dp_size": 4, "tp_size": 4}
    assert args_of(cfg, "0.5.23") == [
        "--attn-dp-size", "4", "--cuda-graph-backend-decode", "disabled",
        "--cuda-graph-backend-prefill", "disabled", "--cuda-graph-max-bs-decode", "64",
        "--enable-metrics", "--tp-size", "4"]
    assert args_of(cfg, "0.5.21") == [
        "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
        "--cuda-graph-max-bs-decode", "64", "--dp-size", "4", "--enable-dp-attention",
        "--enable-metrics", "--tp-size", "4"]
    old = ["--cuda-graph-max-bs", "64", "--disable-cuda-graph", "--dp-size", "4",
           "--enable-dp-attention", "--enable-metrics", "--tp-size", "4"]
    assert args_of(cfg, "0.5.13") == args_of(cfg, "0.5.6") == old
    assert args_of(cfg, "0.4.10.post2") == args_of(cfg, "0.5.0") == old  # 0.5.0: no final
    # new names on an old server translate back; what it cannot express is an error
    new = {"cuda_graph_max_bs_decode": 32, "cuda_graph_backend_decode": "disabled",
           "cuda_graph_backend_prefill": "disabled", "attn_dp_size": 2}
    assert translate(new, "0.4.9") == {"cuda_graph_max_bs": 32, "disable_cuda_graph": True,
                                       "enable_dp_attention": True, "dp_size": 2}
    assert translate(new, "0.5.21") == {**{k: v for k, v in new.items() if k != "attn_dp_size"},
                                        "enable_dp_attention": True, "dp_size": 2}
    with pytest.raises(HarnessError, match=r"^sglang 0\.5\.13 has no --cuda-graph-max-bs-"
                                           r"prefill \(0\.5\.14 and later\)$"):
        args_of({"cuda_graph_max_bs_prefill": 4096}, "0.5.13")
    with pytest.raises(HarnessError, match="only both 'disabled'"):
        translate({"cuda_graph_backend_decode": "full"}, "0.4.9")
    with pytest.raises(HarnessError, match="enable_dp_attention needs dp_size"):
        translate({"enable_dp_attention": True}, "0.5.23")


def test_flags_checked_against_the_table():
    """A flag the pinned release lacks, or a value outside its choices, is refused."""
    with pytest.raises(HarnessError, match=r"^sglang 0\.4\.0 has no --moe-runner-backend "
                                           r"\(0\.5\.1 and later\)$"):
        args_of({"moe_runner_backend": "auto"}, "0.4.0")
    with pytest.raises(HarnessError, match=r"^sglang 0\.5\.2 has no --config "
                                           r"\(0\.5\.3 and later\)$"):
        sglang_command({"use_config_file": True}, model=MODEL, port=1, version="0.5.2",
                       config_path=Path("c.yaml"))
    with pytest.raises(HarnessError, match=r"^sglang 0\.5\.23 has no --cuda-graph-bs "
                                           r"\(0\.4\.2 to 0\.5\.19\)$"):
        args_of({"cuda_graph_bs": [1, 8]}, "0.5.23")
    with pytest.raises(HarnessError, match=r"^sglang 0\.5\.23 --cuda-graph-backend-decode: "
                                           r"piecewise is not one of "):
        args_of({"cuda_graph_backend_decode": "piecewise"}, "0.5.23")
    with pytest.raises(HarnessError, match=r"older than the oldest release"):
        args_of({}, "0.3.9")


def test_value_forms():
    cfg = {"enable_torch_compile": True, "disable_radix_cache": False,
           "chunked_prefill_size": "disabled", "cuda_graph_bs_decode": [1, 2, 4],
           "json_model_override_args": {"rope_scaling": {"factor": 2}},
           "schedule_policy": "lpm", "mem_fraction_static": 0.85, "enable_metrics": False,
           "speculative_algorithm": None}
    assert args_of(cfg, "0.5.23") == [
        "--chunked-prefill-size", "-1", "--cuda-graph-bs-decode", "1", "2", "4",
        "--enable-torch-compile", "--json-model-override-args", '{"rope_scaling": {"factor": 2}}',
        "--mem-fraction-static", "0.85", "--schedule-policy", "lpm"]
    cmd, _ = sglang_command({"python": "/opt/py/bin/python", "extra_args": ["--log-level",
                                                                            "debug"]},
                            model=MODEL, port=1, version="0.5.23")
    assert cmd[:3] == ["/opt/py/bin/python", "-m", "sglang.launch_server"]
    assert cmd[-2:] == ["--log-level", "debug"]


@pytest.mark.parametrize("cfg, match", [
    ({"port": 1}, "set by the harness"),
    ({"model_path": "x"}, "set by the harness"),
    ({"tp-size": 2}, "not a ServerArgs name"),
    ({"launcher": "python -m sglang.launch_server"}, "launcher must be a list"),
    ({"extra_args": "--x"}, "extra_args must be a list"),
])
def test_bad_configs(cfg, match):
    with pytest.raises(HarnessError, match=match):
        sglang_command(cfg, model=MODEL, port=1, version="0.5.23")
    with pytest.raises(HarnessError, match="expected MAJOR.MINOR"):
        parse_version("latest")
    assert parse_version("0.5.23rc1") == (0, 5, 23)


def test_config_yaml(tmp_path):
    cmd, text = sglang_command({"use_config_file": True, "tp_size": 2, "disable_cuda_graph": True,
                                "cuda_graph_bs_decode": [1, 8], "enable_eplb": False},
                               model=MODEL, port=31000, version="0.5.23",
                               config_path=tmp_path / "c.yaml")
    assert cmd[-2:] == ["--config", str(tmp_path / "c.yaml")]
    assert "--tp-size" not in cmd and "--port" in cmd
    assert yaml.safe_load(text) == {"tp-size": 2, "cuda-graph-backend-decode": "disabled",
                                    "cuda-graph-backend-prefill": "disabled",
                                    "cuda-graph-bs-decode": [1, 8], "enable-metrics": True}


def test_flags_checked_against_recorded_help():
    help_text = (DATA / "help.txt").read_text()
    flags = help_flags(help_text)
    assert {"--model-path", "--attn-dp-size", "--cuda-graph-max-bs-decode",
            "--enable-metrics", "--config"} <= flags
    ok, _ = sglang_command({"cuda_graph_max_bs": 8, "tp_size": 2}, model=MODEL, port=1,
                           version="0.5.23")
    check_flags(ok[ok.index("--model-path"):], help_text, "0.5.23")
    old, _ = sglang_command({"cuda_graph_max_bs": 8}, model=MODEL, port=1, version="0.4.10")
    with pytest.raises(HarnessError, match="sglang 0.5.23 does not accept --cuda-graph-max-bs "):
        check_flags(old[old.index("--model-path"):], help_text, "0.5.23")


# --- parsing recorded outputs -----------------------------------------------------------


def test_metrics_summary_from_recorded_text():
    fams = parse_prometheus((DATA / "metrics.txt").read_text())
    assert fams["sglang:num_running_reqs"]["type"] == "gauge"
    assert fams["sglang:num_running_reqs"]["samples"][0]["labels"]["tp_rank"] == "0"
    s = summarize(fams, "sglang:")
    assert s["num_running_reqs"] == 8 and s["num_queue_reqs"] == 3
    assert s["gen_throughput"] == pytest.approx(1843.27)
    assert s["prompt_tokens_total"] == 131072 and s["num_aborted_requests_total"] == 2
    assert s["time_to_first_token_seconds_count"] == 1024
    assert s["time_to_first_token_seconds_mean"] == pytest.approx(0.09)
    # rank 512 falls in (0.05, 0.1] holding counts 240..700
    assert s["time_to_first_token_seconds_p50"] == pytest.approx(0.05 + 0.05 * 272 / 460)
    # rank 1013.76 falls in (0.5, 1.0] holding counts 1010..1022
    assert s["time_to_first_token_seconds_p99"] == pytest.approx(0.5 + 0.5 * 3.76 / 12)
    assert "gc_objects_collected_total" not in s  # other prefixes are left out
    assert bucket_quantile(0.5, {float("inf"): 0.0}) != bucket_quantile(0.5, {1.0: 2.0})


def test_malformed_metrics_and_server_info():
    with pytest.raises(HarnessError) as e:
        parse_prometheus((DATA / "metrics_malformed.txt").read_text(), "http://h/metrics")
    assert str(e.value).startswith("http://h/metrics: malformed Prometheus text")
    assert "\n" not in str(e.value)
    info = json.loads((DATA / "server_info.json").read_text())
    assert validate_server_info(info)["version"] == "0.5.23"
    with pytest.raises(HarnessError, match="expected a JSON object, got list"):
        validate_server_info(json.loads((DATA / "server_info_not_object.json").read_text()))
    with pytest.raises(HarnessError, match="missing version"):
        validate_server_info({"model_path": MODEL})
    with pytest.raises(HarnessError, match="internal_states must be a list"):
        validate_server_info({**info, "internal_states": {"rank0": {}}})


# --- a launched (stand-in) server -------------------------------------------------------


def test_launch_describe_metrics_profile_stop(workspace, tmp_path):
    open_task(workspace, tmp_path)  # engine events on a task's stream go into a defined task
    cfg = {"version": "0.5.23", "launcher": FAKE, "tp_size": 1, "chunked_prefill_size": 4096,
           "cuda_graph_max_bs": 32, "check_flags": True}
    running = engine_for("sglang").launch(cfg, model=MODEL, ws=workspace,
                                          overrides={"engine.schedule_policy": "lpm"},
                                          stream=task_stream("t1"),
                                          event_fields={"task_id": "t1"})
    with running:
        info = running.describe()
        assert info["version"] == "0.5.23" and info["versions"]["sglang"] == "0.5.23"
        args = info["resolved_args"]
        assert args["chunked_prefill_size"] == 4096 and args["schedule_policy"] == "lpm"
        assert args["cuda_graph_max_bs_decode"] == 32 and args["attention_backend"] == "fa3"
        assert args["max_total_num_tokens"] == 1036044  # scheduler info rides along
        assert "--cuda-graph-max-bs-decode 32" in info["server_launch_command"]
        assert info["launch_command"][:2] == FAKE
        assert info["model_info"]["architectures"] == ["Qwen3ForCausalLM"]
        assert info["server_info"]["internal_states"][0]["memory_usage"]["kvcache"] == 63.32
        assert workspace.artifacts.text(info["help_digest"]).startswith("usage: sglang serve")
        m = running.metrics()
        assert m["num_running_reqs"] == 8 and m["generation_tokens_total"] == 65536
        started = running.start_profile(output_dir=tmp_path, num_steps=5,
                                        activities=["CPU", "GPU"])
        assert started == {"endpoint": "/start_profile", "message": "Start profiling."}
        assert running.stop_profile()["message"].startswith("Stop profiling.")
        with pytest.raises(HarnessError, match="HTTP 400: Profiling is not in progress"):
            running.stop_profile()
        with pytest.raises(HarnessError, match="unknown option"):
            running.start_profile(bogus=1)
        assert running.flush_cache()["message"].startswith("Cache flushed.")
        pid = running.pid
    assert not group_alive(pid)
    recs = [r for r in workspace.ledger.stream(task_stream("t1")) if r.type.startswith("Engine")]
    assert [r.type for r in recs] == ["EngineLaunched", "EngineStopped"]
    launched, stopped = recs[0].event, recs[1].event
    assert launched.task_id == "t1" and launched.server_info["tp_size"] == 1
    assert "--schedule-policy" in launched.command and launched.pid == pid
    assert stopped.reason == "teardown"
    log = workspace.artifacts.text(stopped.log_digest)
    assert log.startswith("$ ") and "/start_profile" in log


def test_launch_with_config_file_and_slow_start(workspace):
    cfg = {"version": "0.5.23", "launcher": FAKE, "use_config_file": True, "tp_size": 2,
           "enable_dp_attention": True, "dp_size": 2, "env": {"FAKE_SGLANG_MODE": "slow:3"}}
    with engine_for("sglang").launch(cfg, model=MODEL, ws=workspace) as running:
        info = running.describe()
        assert info["resolved_args"]["tp_size"] == 2
        assert info["resolved_args"]["attn_dp_size"] == 2
        assert yaml.safe_load(info["config_yaml"])["attn-dp-size"] == 2
        assert "--config" in info["launch_command"]


def test_crash_during_start_is_recorded_with_its_log(workspace):
    cfg = {"version": "0.5.23", "launcher": FAKE, "env": {"FAKE_SGLANG_MODE": "crash"}}
    with pytest.raises(HarnessError) as e:
        engine_for("sglang").launch(cfg, model=MODEL, ws=workspace)
    assert "sglang server" in str(e.value) and "CUDA out of memory" in str(e.value)
    (rec,) = workspace.ledger.stream("engines")
    assert rec.type == "EngineStopped" and rec.event.reason == "failed-start"
    assert rec.event.exit_code == 1
    assert "CUDA out of memory" in workspace.artifacts.text(rec.event.log_digest)


def test_malformed_server_info_fails_launch_and_stops_server(workspace):
    cfg = {"version": "0.5.23", "launcher": FAKE, "env": {"FAKE_SGLANG_MODE": "malformed"}}
    with pytest.raises(HarnessError, match=r"/server_info: response is not JSON"):
        engine_for("sglang").launch(cfg, model=MODEL, ws=workspace)
    (rec,) = workspace.ledger.stream("engines")
    assert rec.type == "EngineStopped" and rec.event.reason == "error"
    first = workspace.artifacts.text(rec.event.log_digest).splitlines()[0].split()
    port = first[first.index("--port") + 1]
    assert processes_with(str(DATA / "fake_server.py"), port) == []


def test_unknown_flag_refused_before_start(workspace):
    cfg = {"version": "0.5.23", "launcher": FAKE, "check_flags": True,
           "extra_args": ["--no-such-flag"]}
    with pytest.raises(HarnessError, match="does not accept --no-such-flag"):
        engine_for("sglang").launch(cfg, model=MODEL, ws=workspace)
    assert workspace.ledger.stream("engines") == []


def test_cli_engine_up_once(tmp_path):
    from tests.conftest import run_forge

    home = tmp_path / "home"
    assert run_forge("init", home=home).returncode == 0
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({
        "service": "qwen-test", "rev": 3, "engine": "sglang",
        "config": {"launcher": FAKE, "chunked_prefill_size": 2048},
        "framework": {"kind": "sglang", "version": "0.5.23"}}))
    r = run_forge("engine", "up", str(profile), "--model", MODEL, "--once", "--json",
                  "--set", "engine.tp_size=2", home=home)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["resolved_args"]["tp_size"] == 2
    assert info["resolved_args"]["chunked_prefill_size"] == 2048
    r = run_forge("log", "--type", "EngineLaunched", "--type", "EngineStopped", home=home)
    assert [line.split()[3] for line in r.stdout.splitlines()] == ["EngineLaunched",
                                                                   "EngineStopped"]
    r = run_forge("engine", "up", str(profile), "--model", MODEL, "--once", "--set", "x", home=home)
    assert r.returncode == 1 and "--set 'x': expected KEY=VALUE" in r.stderr


def test_cli_engine_up_until_sigterm(tmp_path):
    """`forge engine up` keeps the server up; SIGTERM unwinds it: server gone, stop recorded."""
    import os
    import signal
    import subprocess

    from tests.conftest import FORGE, run_forge

    home = tmp_path / "home"
    assert run_forge("init", home=home).returncode == 0
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({"service": "s", "rev": 1, "engine": "sglang",
                                       "config": {"launcher": FAKE, "version": "0.5.23"}}))
    p = subprocess.Popen([*FORGE, "engine", "up", str(profile), "--model", MODEL],
                         stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         cwd=str(REPO), env={**os.environ, "FORGE_HOME": str(home)})
    seen = []
    for line in p.stderr:  # blocks until the engine is up (or the command died: EOF)
        seen.append(line)
        if "Ctrl-C to stop" in line:
            break
    assert "Ctrl-C to stop" in line, "".join(seen)
    port = line.split("127.0.0.1:")[1].split()[0]
    assert processes_with(str(DATA / "fake_server.py"), port)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    assert processes_with(str(DATA / "fake_server.py"), port) == []
    r = run_forge("log", "--json", "--type", "EngineStopped", home=home)
    assert json.loads(r.stdout)["reason"] == "terminated"


def test_nsys_launches_the_server_under_nsight_systems(workspace, tmp_path, monkeypatch):
    """Engine config `nsys: true`: the server's command under `nsys profile` (the flags
    perf/nsys.py documents), its report in the workspace's trace root, named by describe().
    nsys does not run here: a stand-in on PATH writes down its argv and runs the rest, as
    `nsys profile [options] app args` runs the app."""
    from infer_forge.harness.engines.nsys_launch import profile_argv
    from infer_forge.harness.engines.trace_dir import trace_root

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "nsys-argv.json"
    stand_in = bin_dir / "nsys"
    stand_in.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"open({str(seen)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
        "args = sys.argv[2:]\n"
        "while args and args[0].startswith('--'):\n"
        "    args = args[1:]\n"
        "os.execv(args[0], args)\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    cfg = {"version": "0.5.23", "launcher": FAKE, "nsys": {"cuda_graph_trace": "graph"}}
    with engine_for("sglang").launch(cfg, model=MODEL, ws=workspace) as eng:
        desc = eng.describe()
        report = desc["nsys_report"]
        assert report.startswith(str(trace_root(workspace.home) / "nsys" / "sglang-"))
        assert report.endswith(".nsys-rep")
        argv = json.loads(seen.read_text())
        server = argv[argv.index(FAKE[0]):]
        assert [str(stand_in), *argv] == profile_argv(
            server, report[:-len(".nsys-rep")], nsys=str(stand_in), cuda_graph_trace="graph")
        assert server[:2] == FAKE and "--model-path" in server
    (launched,) = [r.event for r in workspace.ledger.stream("engines")
                   if r.type == "EngineLaunched"]
    assert launched.command[:2] == [str(stand_in), "profile"]


def test_nsys_without_nsys_on_path_is_refused_before_anything_starts(workspace, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with pytest.raises(HarnessError, match=r"^engine config nsys: nsys is not on PATH"):
        engine_for("sglang").launch({"version": "0.5.23", "launcher": FAKE, "nsys": True},
                                    model=MODEL, ws=workspace)
    with pytest.raises(HarnessError, match=r"^engine config nsys 'yes': expected true or"):
        engine_for("sglang").launch({"version": "0.5.23", "launcher": FAKE, "nsys": "yes"},
                                    model=MODEL, ws=workspace)
    assert workspace.ledger.stream("engines") == []


def test_nsys_in_an_image_runs_the_images_nsys_and_python(tmp_path):
    """In a pinned image the server is nsys's argument: the image's `nsys` and `python3`,
    not this host's paths (the container wrap only sees nsys first)."""
    from infer_forge.harness.engines.sglang import nsys_wrap

    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", MODEL]
    wrapped, report = nsys_wrap(cmd, True, tmp_path, "sglang-1", in_image=True,
                                host_python=sys.executable)
    out = wrapped.index(f"--output={report[:-len('.nsys-rep')]}")
    assert wrapped[:2] == ["nsys", "profile"]
    assert wrapped[out + 1:] == ["python3", "-m", "sglang.launch_server", "--model-path", MODEL]
    assert report == str(tmp_path / "perf-traces" / "nsys" / "sglang-1.nsys-rep")
