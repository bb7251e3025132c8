"""Secrets inside compressed artifacts (issue 27 item 11): a gzip, zip, tar or tar.gz artifact
is redacted inside when stored, `forge secrets scan` looks inside one written around the
store, and a decompression bomb is bounded (refused when stored, "too large to scan" when
scanned), all on real archives made with the standard library."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import tracemalloc
import zipfile
import zlib
from pathlib import Path

import pytest
from infer_forge.harness.guard.secrets_scan import scan_workspace
from infer_forge.ledger import archives
from infer_forge.ledger.archives import ArchiveError, ArchiveTooLarge
from infer_forge.ledger.artifacts import ArtifactStore
from infer_forge.ledger.secrets.redactor import Redactor

from tests.conftest import run_forge

KEY = "sk-proj-" + "CoMpReSsEdTrAcE0123456789abcdefghij"
GH = "ghp_" + "Zq9Xw8Ve7Ut6Sr5Qp4On3Ml2Kj1Ih0Gf9Ed8"
TRACE = ('{"traceEvents": [{"name": "forward", "ph": "X", "dur": 12}],\n'
         f' "args": {{"env": "OPENAI_API_KEY={KEY}"}}}}\n').encode()
LOG = f"loading\nGITHUB_TOKEN={GH}\nready\n".encode()


def tar_of(files: dict[str, bytes], mode: str = "w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1_700_000_000, 0o640
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def zip_of(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def tar_members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as t:
        return {m.name: t.extractfile(m).read() for m in t if m.isreg()}


def zip_members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {n: z.read(n) for n in z.namelist()}


def bomb(expanded: int) -> bytes:
    """A gzip stream of `expanded` zero bytes, made in bounded memory."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    parts = [c.compress(zeros) for _ in range(expanded >> 20)]
    return b"".join(parts) + c.flush()


@pytest.fixture
def store(tmp_path):
    return ArtifactStore(tmp_path / "artifacts", Redactor())


def test_a_gzipped_trace_is_redacted_inside_when_stored(store):
    digest = store.put(gzip.compress(TRACE))
    stored = gzip.decompress(store.get(digest))
    assert KEY.encode() not in stored and b"[REDACTED:API Key]" in stored
    assert stored.replace(b"[REDACTED:API Key]", KEY.encode()) == TRACE  # the rest as it was


def test_tar_gz_zip_and_plain_tar_members_are_redacted_names_and_modes_kept(store):
    files = {"trace/rank0.json": TRACE, "server.log": LOG, "clean.txt": b"nothing here\n",
             "weights.bin": bytes(range(256)) * 4}
    for data, read in ((tar_of(files), tar_members), (tar_of(files, "w"), tar_members),
                       (zip_of(files), zip_members)):
        out = read(store.get(store.put(data)))
        assert list(out) == list(files)
        assert KEY.encode() not in out["trace/rank0.json"]
        assert GH.encode() not in out["server.log"] and b"[REDACTED:" in out["server.log"]
        assert out["clean.txt"] == files["clean.txt"]
        assert out["weights.bin"] == files["weights.bin"]  # binary members as they were
    with tarfile.open(fileobj=io.BytesIO(store.get(store.put(tar_of(files)))),
                      mode="r:gz") as t:
        info = t.getmember("server.log")
        assert (info.mode, info.mtime) == (0o640, 1_700_000_000)


def test_an_archive_inside_an_archive_is_redacted(store):
    inner = gzip.compress(LOG)
    out = zip_members(store.get(store.put(zip_of({"logs.gz": inner}))))
    assert GH.encode() not in gzip.decompress(out["logs.gz"])


def test_a_clean_archive_is_stored_byte_for_byte(store):
    data = tar_of({"a.txt": b"hello\n"})
    digest = store.put(data)
    assert digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert store.get(digest) == data


def test_put_file_and_put_stream_redact_archives_too(store, tmp_path):
    path = tmp_path / "trace.json.gz"
    path.write_bytes(gzip.compress(TRACE))
    d1 = store.put_file(path)
    data = path.read_bytes()
    d2 = store.put_stream(data[i:i + 7] for i in range(0, len(data), 7))
    assert d1 == d2 == store.put(data)
    assert KEY.encode() not in gzip.decompress(store.get(d1))


def test_a_decompression_bomb_is_refused_in_bounded_memory(store, monkeypatch):
    monkeypatch.setattr(archives, "MAX_EXPANDED", 8 << 20)
    data = bomb(64 << 20)  # 64 MiB of zeros in ~64 KiB
    assert len(data) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ArchiveTooLarge, match=f"more than {8 << 20} bytes decompressed"):
            store.put(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 24 << 20, peak  # never the whole expansion
    assert list(store.digests()) == []  # nothing stored, no temporary file left
    assert [p.name for p in store.root.iterdir() if p.name.startswith(".tmp-")] == []


def test_a_damaged_archive_is_refused_with_one_line(store):
    data = gzip.compress(TRACE * 50)
    with pytest.raises(ArchiveError, match="gzip stream is truncated") as e:
        store.put(data[:len(data) // 2])
    assert "\n" not in str(e.value)
    with pytest.raises(ArchiveError, match="damaged"):
        store.put(data[:10] + b"\xff" * 40 + data[50:])
    assert list(store.digests()) == []


def _plant(home: Path, data: bytes) -> str:
    """An artifact written around the store (so not redacted)."""
    h = hashlib.sha256(data).hexdigest()
    path = home / "artifacts" / "sha256" / h[:2] / h[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return h


def test_secrets_scan_looks_inside_compressed_artifacts(forge_home):
    assert run_forge("init", home=forge_home).returncode == 0
    gz = _plant(forge_home, gzip.compress(TRACE))
    tgz = _plant(forge_home, tar_of({"profile/rank0.json": TRACE, "ok.txt": b"fine\n"}))
    zp = _plant(forge_home, zip_of({"logs/server.log": LOG}))
    r = run_forge("secrets", "scan", home=forge_home)
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout
    assert f"{gz[:12]}…) (gzip) line 2: API Key" in out, out
    assert f"{tgz[:12]}…) gzip member profile/rank0.json line 2: API Key" in out, out
    assert f"{zp[:12]}…) zip member logs/server.log line 2: GitHub Token" in out, out
    assert KEY not in out + r.stderr and GH not in out + r.stderr


def test_secrets_scan_reports_a_bomb_as_too_large_to_scan(workspace, monkeypatch):
    monkeypatch.setattr(archives, "MAX_EXPANDED", 4 << 20)
    h = _plant(workspace.home, bomb(32 << 20))
    broken = _plant(workspace.home, gzip.compress(TRACE)[:-12])
    report = scan_workspace(workspace)
    assert any(h[:12] in x.where and x.kind.startswith("too large to scan: more than")
               for x in report.hits), report.hits
    assert any(broken[:12] in x.where and x.kind == "unreadable archive: gzip stream is "
               "truncated" for x in report.hits), report.hits
