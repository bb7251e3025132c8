"""The hf engine: `transformers serve` on the generated tiny-llama (one real server for the
session), its knobs as flags, a bad model failing at once with the server's own error."""

from __future__ import annotations

import json
import urllib.request

import pytest
from infer_forge.harness.engines import engine_for
from infer_forge.harness.engines.base import NotSupported, request_json
from infer_forge.harness.engines.hf import CPU_CB_NUM_BLOCKS, hf_command, resolve_config
from infer_forge.harness.errors import HarnessError
from infer_forge.harness.proc import group_alive


def test_real_server_describe_and_complete(hf_server):
    info = hf_server.engine.describe()
    assert info["engine"] == "hf" and info["base_url"] == hf_server.base_url
    assert info["server_info"]["models"]["data"][0]["id"] == str(hf_server.model_dir)
    cmd = info["launch_command"]
    assert cmd[2:5] == ["transformers.cli.transformers", "serve", str(hf_server.model_dir)]
    assert cmd[cmd.index("--attn-implementation") + 1] == "sdpa"
    assert cmd[cmd.index("--dtype") + 1] == "float32" and "--no-continuous-batching" in cmd
    assert info["resolved_args"]["device"] == "cpu"
    assert set(info["versions"]) >= {"transformers", "torch", "python"}
    assert info["startup_s"] > 0
    body = json.dumps({"model": hf_server.model, "prompt": "The harbour was", "max_tokens": 6,
                       "temperature": 0}).encode()
    req = urllib.request.Request(hf_server.base_url + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out = json.loads(r.read())
    assert out["usage"]["completion_tokens"] == 6  # random weights: runs to max_tokens
    assert out["choices"][0]["text"]
    hf_server.engine.check()
    m = hf_server.engine.metrics()
    assert m["process_cpu_seconds"] > 0 and m["process_rss_bytes"] > 50e6
    with pytest.raises(NotSupported, match="no profiler"):
        hf_server.engine.start_profile()


def test_unknown_request_field_is_422(hf_server):
    """Measured fact the bench client relies on: no ignore_eos on transformers serve."""
    with pytest.raises(HarnessError, match="HTTP 422"):
        request_json("POST", hf_server.base_url + "/v1/completions",
                     {"prompt": "x", "max_tokens": 2, "ignore_eos": True})


def test_knobs_become_flags():
    cfg = resolve_config({"continuous_batching": True, "cb_block_size": 32, "cb_num_blocks": 256,
                          "cb_max_batch_tokens": 512, "attn_implementation": "eager",
                          "dtype": "bfloat16", "compile": True, "default_seed": 7})
    cmd = hf_command(cfg, model="/m", port=8123)
    assert cmd[4:9] == ["/m", "--host", "127.0.0.1", "--port", "8123"]
    flags = " ".join(cmd[9:])
    for part in ("--continuous-batching", "--cb-block-size 32", "--cb-num-blocks 256",
                 "--cb-max-batch-tokens 512", "--attn-implementation eager",
                 "--dtype bfloat16", "--compile", "--default-seed 7", "--device cpu"):
        assert part in flags
    off = hf_command(resolve_config({"continuous_batching": False, "cb_block_size": 32}),
                     model="/m", port=1)
    assert "--no-continuous-batching" in off and "--cb-block-size" not in off


def test_a_cpu_server_with_continuous_batching_gets_a_bounded_kv_cache():
    # Unsized, transformers takes 60% of the host's free memory for the cache on the CPU.
    cb = hf_command(resolve_config({"continuous_batching": True}), model="/m", port=1)
    assert cb[cb.index("--cb-num-blocks") + 1] == str(CPU_CB_NUM_BLOCKS)
    for sized in ({"cb_num_blocks": 8}, {"cb_max_memory_percent": 0.1}):
        cmd = hf_command(resolve_config({"continuous_batching": True, **sized}), model="/m",
                         port=1)
        assert cmd.count("--cb-num-blocks") == ("cb_num_blocks" in sized)  # the profile's own
    for other in ({"continuous_batching": False}, {"continuous_batching": True,
                                                   "device": "cuda"}):
        assert "--cb-num-blocks" not in hf_command(resolve_config(other), model="/m", port=1)


@pytest.mark.parametrize("cfg, match", [
    ({"continous_batching": True}, "unknown key.*continous_batching"),
    ({"dtype": "fp8"}, "dtype='fp8'"),
    ({"cb_block_size": "32"}, "cb_block_size='32': expected int"),
    ({"compile": "yes"}, "expected bool"),
])
def test_bad_config_is_refused_before_start(cfg, match):
    with pytest.raises(HarnessError, match=match):
        engine_for("hf").launch(cfg, model="/nonexistent")


def test_model_not_pulled_names_the_command(workspace):
    with pytest.raises(HarnessError, match="run `forge weights pull tiny-llama`"):
        engine_for("hf").launch({}, model="tiny-llama", ws=workspace)


def test_bad_model_dir_fails_at_once_with_the_servers_error(workspace, tmp_path):
    bad = tmp_path / "broken-model"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "no-such-architecture"}')
    with pytest.raises(HarnessError) as e:
        engine_for("hf").launch({"startup_timeout_s": 300}, model=bad, ws=workspace)
    msg = str(e.value)
    assert "hf server" in msg and "exited while starting" in msg
    tail = msg.split("; last lines of ", 1)[1]
    assert "Error" in tail and len(tail.splitlines()) > 3  # transformers' own traceback
    (rec,) = workspace.ledger.stream("engines")
    assert rec.event.reason == "failed-start" and rec.event.exit_code not in (None, 0)
    log = workspace.artifacts.text(rec.event.log_digest)
    assert log.startswith("$ ") and str(bad) in log.splitlines()[0]
    pid = int(msg.split("(pid ", 1)[1].split(")", 1)[0])
    assert not group_alive(pid)


def test_override_keys_reach_the_command():
    from infer_forge.harness.engines.base import apply_overrides

    cfg = apply_overrides({"dtype": "float32", "compile": True},
                          {"engine.dtype": "bfloat16", "compile": None})
    assert cfg == {"dtype": "bfloat16"}
    with pytest.raises(HarnessError, match="not an engine configuration key"):
        apply_overrides({}, {"scenario.traffic.concurrency": 8})
    assert not group_alive(2**22 + 12345)  # no such group
