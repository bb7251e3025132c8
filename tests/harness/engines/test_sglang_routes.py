"""The HTTP routes of real SGLang releases, read with `ast` from each release's own app
(`sglang/srt/entrypoints/http_server.py`, 0.4's `sglang/srt/server.py`, the encoder's
`disaggregation/encode_server.py` / `encoder/http_server.py`), against what the harness asks
(harness/engines/sglang_routes.py) and what the stand-in server answers for the version it
claims (tests/data/sglang/fake_server.py) — and deploy and the client against both styles."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from infer_forge.harness.engines.deploy import Deployment
from infer_forge.harness.engines.host_plan import plan_with_free_ports
from infer_forge.harness.engines.plan import plan_point
from infer_forge.harness.engines.process import free_port
from infer_forge.harness.engines.sglang import SGLangClient
from infer_forge.harness.engines.sglang_routes import ENCODER_READY_PATH, info_paths
from infer_forge.ledger.specs import DeploymentPoint, RuntimeProfile

from tests.conftest import TESTS, need
from tests.helpers import real_sglang

from .test_real_router import point_of

FAKE = [sys.executable, str(TESTS / "data" / "sglang" / "fake_server.py")]
FAKE_ROUTER = [sys.executable, str(TESTS.parent / "harness" / "testing" / "fake_router.py")]
# Every (method, route) the harness sends to an SGLang server.
HARNESS_ROUTES = {("GET", "/health"), ("GET", "/health_generate"), ("GET", "/server_info"),
                  ("GET", "/get_server_info"), ("GET", "/model_info"),
                  ("GET", "/get_model_info"), ("GET", "/metrics"), ("GET", "/v1/models"),
                  ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
                  ("POST", "/generate"), ("POST", "/flush_cache"), ("POST", "/start_profile"),
                  ("POST", "/stop_profile")}
ENCODER_SINCE = (0, 5, 7)


def _v(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def app_routes(path: Path) -> set[tuple[str, str]]:
    """(method, route) of every `@app.get/post/put/delete/api_route` in the module, plus
    GET /metrics where the module mounts SGLang's Prometheus app (add_prometheus_middleware)."""
    out: set[tuple[str, str]] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == \
                "add_prometheus_middleware":
            out.add(("GET", "/metrics"))
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for d in node.decorator_list:
            if not (isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
                    and getattr(d.func.value, "id", None) == "app" and d.args
                    and isinstance(d.args[0], ast.Constant)):
                continue
            route, how = d.args[0].value, d.func.attr
            if how == "api_route":
                methods = next(k.value for k in d.keywords if k.arg == "methods")
                out |= {(m.value, route) for m in methods.elts}
            elif how in ("get", "post", "put", "delete"):
                out.add((how.upper(), route))
    return out


def real_apps(version: str) -> dict[str, set[tuple[str, str]]]:
    """{"server": routes, "encoder": routes (when the release has an encoder app)}."""
    srt = real_sglang.release(version) / "sglang" / "srt"
    main = srt / "entrypoints" / "http_server.py"
    out = {"server": app_routes(main if main.exists() else srt / "server.py")}
    for enc in (srt / "disaggregation" / "encoder" / "http_server.py",
                srt / "disaggregation" / "encode_server.py"):
        if enc.exists():
            out["encoder"] = app_routes(enc)
            break
    return out


@pytest.fixture(scope="module")
def real() -> dict[str, dict[str, set[tuple[str, str]]]]:
    return {v: real_apps(v) for v in real_sglang.KIT_VERSIONS}


def test_the_info_routes_by_version_are_the_releases_own(real):
    for version, apps in real.items():
        have = {r for m, r in apps["server"] if m == "GET"}
        for kind in ("server", "model"):
            first = info_paths(kind, version)
            assert first[0] in have, (version, kind)
            assert all(p in have for p in first), (version, kind)
            # an unknown version tries both: one of them is the release's
            assert any(p in have for p in info_paths(kind, None))
        if _v(version) < (0, 5, 6):
            assert "/server_info" not in have and "/model_info" not in have, version
    # No encoder app of any release has an info route; each has the ready path.
    encoders = {v: a["encoder"] for v, a in real.items() if "encoder" in a}
    assert set(encoders) == {v for v in real if _v(v) >= ENCODER_SINCE}
    for version, routes in encoders.items():
        paths = {r for _, r in routes}
        assert not paths & {"/server_info", "/get_server_info", "/model_info",
                            "/get_model_info"}, version
        assert ("GET", ENCODER_READY_PATH) in routes, version


def _probe(url: str, method: str) -> int:
    req = urllib.request.Request(url, method=method,
                                 data=b"{}" if method == "POST" else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _start_fakes(specs: list[tuple[str, list[str]]]) -> list[tuple[subprocess.Popen, str]]:
    """Stand-in servers (version, extra flags), all started at once; each URL once it
    prints its listening line."""
    started = []
    for version, flags in specs:
        port = free_port()
        env = {**os.environ, "FAKE_SGLANG_VERSION": version, "FAKE_SGLANG_ROUTES": "strict"}
        p = subprocess.Popen([*FAKE, "--model-path", "m", "--host", "127.0.0.1", "--port",
                              str(port), "--enable-metrics", *flags], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started.append((p, f"http://127.0.0.1:{port}"))
    for p, _ in started:
        for line in p.stdout:  # type: ignore[union-attr]
            if "Uvicorn running on" in line:
                break
    return started


def test_the_stand_in_serves_the_real_routes_of_the_version_it_claims(real):
    specs = [(v, []) for v in real] + [(v, ["--encoder-only"]) for v in real
                                       if "encoder" in real[v]]
    fakes = _start_fakes(specs)
    try:
        for (version, flags), (_, url) in zip(specs, fakes, strict=True):
            app = real[version]["encoder" if flags else "server"]
            answered = {(m, r) for m, r in HARNESS_ROUTES if _probe(url + r, m) != 404}
            assert answered == HARNESS_ROUTES & app, (version, flags)
    finally:
        for p, _ in fakes:
            p.kill()
            p.wait()


def _client(url: str, version: str | None) -> SGLangClient:
    c = SGLangClient()
    c.base_url = url
    c.versions = {"sglang": version} if version else {}  # type: ignore[attr-defined]
    return c


def test_the_client_reads_info_by_the_version_and_falls_back_when_unknown():
    fakes = _start_fakes([("0.5.1", []), ("0.5.23", [])])
    try:
        (_, old), (_, new) = fakes
        for url, version in ((old, "0.5.1"), (old, None), (new, "0.5.23"), (new, None)):
            c = _client(url, version)
            assert c.server_info()["version"] == (version or c.server_info()["version"])
            assert c.model_info()["model_path"] == "m"
    finally:
        for p, _ in fakes:
            p.kill()
            p.wait()
    logs = [p.stdout.read() for p, _ in fakes]  # type: ignore[union-attr]
    # 0.5.23 is asked by the new names only (the old ones log a deprecation warning there)
    assert "GET /get_" not in logs[1] and "GET /get_model_info" in logs[0]


def _point(arch: str, roles: list[dict]) -> DeploymentPoint:
    return point_of(arch, roles, name="routes")


def _profile(version: str, router: list[str] | None = None) -> RuntimeProfile:
    return RuntimeProfile.model_validate({
        "service": "s", "rev": 1, "engine": "sglang",
        "config": {"launcher": FAKE, "router_launcher": router or FAKE_ROUTER,
                   "startup_timeout_s": 60,
                   "env": {"FAKE_SGLANG_VERSION": version, "FAKE_SGLANG_ROUTES": "strict"}},
        "framework": {"kind": "sglang", "version": version}})


@pytest.mark.parametrize("version,arch,roles", [
    ("0.5.1", "pd", [{"role": "prefill"}, {"role": "decode"}]),
    ("0.5.23", "epd", [{"role": "encode", "count": 2}, {"role": "prefill", "count": 2},
                       {"role": "decode"}]),
])
def test_deploy_checks_each_server_by_the_routes_it_has(tmp_path, version, arch, roles):
    """Behind the real router (sglang-router), which reads the info routes itself."""
    need(importlib.util.find_spec("sglang_router") is not None,
         "the real router sglang-router is not installed (pip install -e '.[dev]')")
    router = [sys.executable, "-m", "sglang_router.launch_router"]
    plan = plan_with_free_ports(lambda base: plan_point(
        _point(arch, roles), _profile(version, router), None, base_port=base))
    with Deployment(plan, logs=tmp_path, grace_s=5) as dep:
        for p in plan.processes:
            if p.role in ("prefill", "decode"):
                assert dep.server_info[p.name]["version"] == version
                assert dep.server_info[p.name]["disaggregation_mode"] == p.role
            elif p.role == "encode":
                assert dep.server_info[p.name] == {}  # an encoder has no info route
        # two language-only prefills on one host: each its own encoder bootstrap port
        boots = [p.encoder_bootstrap_port for p in plan.by_role("prefill")]
        assert (len(set(boots)) == len(boots) and None not in boots) == (arch == "epd")


PARSE = """
import argparse, json, sys
import sglang.srt.server_args as sa
parser = argparse.ArgumentParser()
sa.ServerArgs.add_cli_args(parser)
out = []
for argv in json.loads(sys.argv[1]):
    ns = parser.parse_args(argv)
    out.append([ns.encoder_bootstrap_port, ns.disaggregation_bootstrap_port, ns.port])
print(json.dumps(out))
"""


def test_language_only_servers_get_distinct_encoder_bootstrap_ports_by_the_real_parser(
        tmp_path):
    roles = [{"role": "encode"}, {"role": "prefill", "count": 2}, {"role": "decode"}]
    version = real_sglang.LATEST
    plan = plan_point(_point("epd", roles), _profile(version), None)
    argvs = [list(p.argv[p.argv.index("--model-path"):]) for p in plan.by_role("prefill")]
    script = tmp_path / "parse.py"
    script.write_text(PARSE)
    parsed = json.loads(real_sglang.run(version, script, json.dumps(argvs)).splitlines()[-1])
    ports = [port for row in parsed for port in row]
    assert len(set(ports)) == len(ports), parsed  # no two servers bind one port


def test_a_pinned_epd_point_deploys_whole_though_its_encoders_report_no_info(workspace):
    """deploy_whole checks every server against the pinned version: not the encoders, which
    have no info route to report one."""
    from infer_forge.harness.engines.whole import deploy_whole

    roles = [{"role": "encode"}, {"role": "prefill"}, {"role": "decode"}]
    running = deploy_whole(workspace, _point("epd", roles), _profile(real_sglang.LATEST),
                           model="m")
    try:
        desc = running.describe()
        assert [(p["name"], p["version"]) for p in desc["processes"]] == [
            ("encode-0", None), ("prefill-0", real_sglang.LATEST),
            ("decode-0", real_sglang.LATEST), ("router", None)]
    finally:
        running.stop()
