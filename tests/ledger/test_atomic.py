"""Replacing a file atomically (`ledger.atomic`): real files in a temp dir, a real child
process killed mid-write."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading

import pytest
from infer_forge.ledger.atomic import replacing, write_atomic

from tests.conftest import REPO


def test_the_file_is_replaced_and_no_temporary_file_stays(tmp_path):
    path = tmp_path / "forge.toml"
    path.write_text("old\n")
    write_atomic(path, "néw\n")
    assert path.read_bytes() == "néw\n".encode()
    write_atomic(path, b"\x00bytes")
    assert path.read_bytes() == b"\x00bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["forge.toml"]


def test_a_failed_write_leaves_the_old_file_and_nothing_else(tmp_path):
    path = tmp_path / "cache.json"
    path.write_text("old")
    with pytest.raises(RuntimeError, match="disk on fire"), replacing(path) as f:
        f.write(b"half of the new")
        raise RuntimeError("disk on fire")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.json"]


def test_mode_is_given_to_the_new_file_under_the_umask(tmp_path):
    secret = tmp_path / "credentials.toml"
    secret.write_text("x")
    secret.chmod(0o644)
    write_atomic(secret, "password = 'y'\n", mode=0o600)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600  # never readable by others
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "page.md", "# page\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "page.md").stat().st_mode) == 0o640


def test_concurrent_writers_each_leave_a_whole_file(tmp_path):
    """Writers of one path never share a temporary file: the result is one writer's whole
    bytes, and no temporary file is left."""
    path = tmp_path / "traces.json"
    blobs = [bytes([65 + i]) * 200_000 for i in range(8)]
    errors: list[BaseException] = []

    def write(b: bytes) -> None:
        try:
            for _ in range(20):
                write_atomic(path, b)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(b,)) for b in blobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert path.read_bytes() in blobs
    assert [p.name for p in tmp_path.iterdir()] == ["traces.json"]


KILLED = """
import os, signal, sys
from pathlib import Path
from infer_forge.ledger.atomic import replacing
with replacing(Path(sys.argv[1]), fsync=True) as f:
    f.write(b"partial new bytes")
    f.flush()
    print("writing", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_writer_killed_mid_write_leaves_the_old_file_whole(tmp_path):
    path = tmp_path / "entry.json"
    path.write_text('{"old": true}')
    p = subprocess.run([sys.executable, "-c", KILLED, str(path)], capture_output=True,
                       text=True, cwd=REPO, timeout=60)
    assert p.returncode == -signal.SIGKILL and p.stdout == "writing\n", p.stderr
    assert path.read_text() == '{"old": true}'
    (left,) = [q.name for q in tmp_path.iterdir() if q.name != "entry.json"]
    assert left.startswith(".entry.json.") and left.endswith(".tmp")  # a sweeper's pattern
