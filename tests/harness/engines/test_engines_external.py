"""The external engine (an endpoint already running; read-only unless configured otherwise),
and the engine factory over runtime profiles."""

from __future__ import annotations

import sys

import pytest
from infer_forge.harness.engines import engine_for
from infer_forge.harness.engines.base import NotSupported, ReadOnlyError, engine_config_of
from infer_forge.harness.engines.process import ServerProcess, free_port
from infer_forge.harness.errors import HarnessError

from tests.conftest import REPO, TESTS

FAKE = TESTS / "data" / "sglang" / "fake_server.py"
EXAMPLES = REPO / "examples" / "profiles"


@pytest.fixture
def endpoint(tmp_path):
    """A running SGLang-speaking endpoint that forge did not launch as an engine."""
    port = free_port()
    server = ServerProcess([sys.executable, str(FAKE), "--port", str(port), "--model-path",
                            "Qwen/Qwen3-8B"], health_url=f"http://127.0.0.1:{port}/health",
                           log_path=tmp_path / "endpoint.log")
    with server:
        server.wait_ready()
        yield server, f"http://127.0.0.1:{port}"


def test_read_only_by_default(endpoint):
    server, url = endpoint
    with engine_for("external").launch({"base_url": url + "/", "api": "sglang"}) as ext:
        assert ext.model == "Qwen/Qwen3-8B"  # from /v1/models
        info = ext.describe()
        assert info["read_only"] is True and info["launch_command"] is None
        assert info["version"] == "0.5.23" and info["resolved_args"]["tp_size"] == 1
        assert ext.metrics()["num_running_reqs"] == 8  # reading is allowed
        for call in (ext.start_profile, ext.stop_profile, ext.flush_cache):
            with pytest.raises(ReadOnlyError, match="is read-only"):
                call()
    server.check()  # leaving the block did not stop someone else's server
    assert "/start_profile" not in (server.log_path.read_text())


def test_writable_when_configured(endpoint):
    _, url = endpoint
    ext = engine_for("external").launch({"base_url": url, "api": "sglang", "read_only": False},
                                        model="served-name")
    assert ext.model == "served-name"
    assert ext.start_profile(num_steps=3)["message"] == "Start profiling."
    assert ext.stop_profile()["message"].startswith("Stop profiling.")
    plain = engine_for("external").launch({"base_url": url, "read_only": False})
    assert plain.metrics() == {}
    with pytest.raises(NotSupported, match="no start_profile"):
        plain.start_profile()


@pytest.mark.parametrize("cfg, match", [
    ({}, "base_url must be an http"),
    ({"base_url": "127.0.0.1:8000"}, "base_url must be an http"),
    ({"base_url": "http://x", "api": "vllm"}, "openai or sglang"),
    ({"base_url": "http://x", "token": "t"}, "unknown key.*token"),
])
def test_bad_external_configs(cfg, match):
    with pytest.raises(HarnessError, match=match):
        engine_for("external").launch(cfg)


def test_unreachable_endpoint_is_a_clear_error():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(HarnessError, match=rf"GET {url}/v1/models: .*refused"):
        engine_for("external").launch({"base_url": url})


def test_factory_and_profiles():
    from infer_forge.ledger.specs import RuntimeProfile, load_profile, stored_profile

    assert type(engine_for("hf")).__name__ == "HFEngine"
    with pytest.raises(HarnessError, match="unknown engine 'vllm'"):
        engine_for("vllm")
    name, cfg = engine_config_of(load_profile(EXAMPLES / "qwen-h200-sglang.yaml"))
    assert name == "sglang" and cfg["version"] == "0.5.23" and cfg["cuda_graph_max_bs"] == 64
    # One shape: the RuntimeProfile spec (a stored profile is read back as one).
    ext = stored_profile({"service": "prod", "rev": 1, "engine": "external",
                          "endpoint": "http://prod:30000", "config": {"api": "sglang"}})
    name, cfg = engine_config_of(ext)
    assert (name, cfg) == ("external", {"api": "sglang", "base_url": "http://prod:30000"})
    given = ext.model_copy(update={"config": {"base_url": "http://other:1"}})
    assert engine_config_of(given) == ("external", {"base_url": "http://other:1"})
    hf = RuntimeProfile(service="s", rev=1, engine="hf", config={"dtype": "float32"})
    assert engine_config_of(hf) == ("hf", {"dtype": "float32"})
