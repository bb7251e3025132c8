"""Content-addressed artifacts: sha256 names, dedup, redaction before hashing, integrity on
read, crash-safe writes, and `forge check` catching a tampered artifact."""

from __future__ import annotations

import hashlib

import pytest
from infer_forge.ledger.artifacts import ArtifactStore
from infer_forge.ledger.errors import ArtifactIntegrityError, NotFoundError
from infer_forge.ledger.secrets.redactor import Redactor

from tests.conftest import run_forge

GH = "ghp_aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dF3hJ5"


@pytest.fixture
def store(tmp_path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "artifacts", Redactor())


def test_put_get_names_by_sha256_and_dedups(store):
    d = store.put("bench line 1\n")
    assert d == "sha256:" + hashlib.sha256(b"bench line 1\n").hexdigest()
    assert store.put(b"bench line 1\n") == d  # same bytes, str or bytes: one artifact
    assert store.get(d) == b"bench line 1\n" and store.text(d) == "bench line 1\n"
    assert list(store.digests()) == [d] and store.exists(d)
    h = d.removeprefix("sha256:")
    assert (store.root / "sha256" / h[:2] / h[2:]).is_file()


def test_text_is_redacted_before_hashing_binary_is_kept(store):
    d = store.put(f"token={GH}\n")
    data = store.get(d)
    assert GH.encode() not in data and b"[REDACTED:GitHub Token]" in data
    assert d == "sha256:" + hashlib.sha256(data).hexdigest()
    blob = bytes(range(256)) + GH.encode()  # not UTF-8: stored as is (not text)
    assert store.get(store.put(blob)) == blob


def test_tampered_artifact_fails_on_read_and_in_verify(store):
    d = store.put("measurements\n")
    h = d.removeprefix("sha256:")
    (store.root / "sha256" / h[:2] / h[2:]).write_bytes(b"measurements, edited\n")
    with pytest.raises(ArtifactIntegrityError, match=d):
        store.get(d)
    assert store.verify() == [f"artifact {d} is corrupt: its bytes hash to sha256:"
                              + hashlib.sha256(b"measurements, edited\n").hexdigest()]


def test_unknown_and_malformed_digests(store):
    with pytest.raises(NotFoundError, match="not found"):
        store.get("sha256:" + "0" * 64)
    with pytest.raises(NotFoundError, match="not an artifact digest"):
        store.get("md5:abc")


def test_leftover_temp_file_from_a_crash_is_not_an_artifact(store):
    d = store.put("x")
    h = d.removeprefix("sha256:")
    (store.root / "sha256" / h[:2] / ".tmp-crashed").write_bytes(b"half")
    assert list(store.digests()) == [d] and store.verify() == []


def test_forge_check_reports_a_tampered_artifact(workspace, forge_home):
    d = workspace.artifacts.put("server log\n")
    workspace.ledger.append("task:t", [])  # nothing: still a valid save
    h = d.removeprefix("sha256:")
    (forge_home / "artifacts" / "sha256" / h[:2] / h[2:]).write_text("forged log\n")
    result = run_forge("check", home=forge_home)
    assert result.returncode == 1
    assert f"problem: artifact {d} is corrupt" in result.stdout
