"""`forge eval prefetch` / `forge eval import` (harness/bench/dataset_cache.py): a real
Hugging Face datasets cache, built here by the datasets library in the layout a hub download
leaves (`openai___gsm8k/main/0.0.0/<commit>/`), exported with its manifest and imported on
an "offline" cache, then read by lm_eval's own GSM8K task (its YAML, 5-shot as multi-turn
chat) against a scripted engine; a tarball whose files do not match its manifest is refused,
naming the file, before anything is written."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from infer_forge.harness.errors import HarnessError

from tests.conftest import need, run_forge
from tests.helpers.hf_datasets import hub_cache

HAVE_LM_EVAL = importlib.util.find_spec("lm_eval") is not None
SHA = "e53f048856ff4f594e959d75785d2c2d37b678ee"  # a commit id, as the hub names a revision
REPO_ID, CONFIG = "openai/gsm8k", "main"


def _row(a: int, b: int) -> dict[str, str]:
    return {"question": f"What is {a} + {b}?",
            "answer": f"{a} plus {b} is {a + b}.\n#### {a + b}"}


def gsm8k_cache(root: Path, src: Path) -> Path:
    """A tiny GSM8K (8 train, 12 test rows of `What is A + B?`) in the hub's cache layout."""
    return hub_cache(root, src, REPO_ID, CONFIG,
                     {"train": [_row(i, 2 * i) for i in range(1, 9)],
                      "test": [_row(10 + i, 7 * i) for i in range(12)]}, SHA)


def gsm8k_tasks_dir(tmp_path: Path) -> Path:
    """lm_eval's own gsm8k.yaml, copied as is into a tasks folder."""
    import lm_eval

    d = tmp_path / "tasks"
    d.mkdir(parents=True)
    shutil.copy(Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml", d)
    return d


def offline_env(cache: Path) -> dict[str, str]:
    return {"HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1"}


def files_of(root: Path) -> dict[str, str]:
    """The cache's files and digests (lock files and staging folders left out)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".lock")
            and not any(part.startswith(".") for part in p.relative_to(root).parts)}


@pytest.fixture
def exported(tmp_path):
    need(HAVE_LM_EVAL, "lm_eval not installed (pip install 'infer-forge[accuracy]')")
    online = tmp_path / "online-cache"
    folder = gsm8k_cache(online, tmp_path / "src")
    out = tmp_path / "evals.tar.gz"
    res = run_forge("eval", "prefetch", "gsm8k-quick", "gsm8k", "--tasks-dir",
                    str(gsm8k_tasks_dir(tmp_path)), "--out", str(out), "--json",
                    env=offline_env(online), process=True)
    assert res.returncode == 0, res.stderr
    return online, folder, out, json.loads(res.stdout)


def test_prefetch_exports_the_cache_folder_with_its_manifest(exported):
    online, folder, out, res = exported
    rel = f"openai___gsm8k/main/0.0.0/{SHA}"
    assert folder == online / rel
    assert res["datasets"] == 1 and res["revisions"] == {rel: SHA}
    from infer_forge.harness.bench.dataset_cache import read_manifest

    m = read_manifest(out)
    assert m["format"] == "forge-dataset-cache/1" and m["suites"] == ["gsm8k-quick", "gsm8k"]
    [e] = m["datasets"]  # the named suite and the task read the same folder: carried once
    assert (e["suite"], e["task"], e["dataset_path"], e["dataset_name"], e["folder"],
            e["revision"]) == ("gsm8k-quick", "gsm8k", REPO_ID, CONFIG, rel, SHA)
    want = {k: v for k, v in files_of(online).items() if k.startswith(rel)}
    assert {f["path"]: f["sha256"] for f in e["files"]} == want
    assert any(p.endswith("gsm8k-test.arrow") for p in want)
    assert any(p.endswith("dataset_info.json") for p in want)
    assert res["files"] == len(want)


def test_import_fills_an_offline_cache_that_lm_eval_reads(exported, tmp_path, monkeypatch):
    online, _, out, _ = exported
    offline = tmp_path / "offline-cache"
    res = run_forge("eval", "import", str(out), "--json", env=offline_env(offline),
                    process=True)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["cache"] == str(offline) and got["kept"] == 0 and got["files"] >= 3
    assert files_of(offline) == files_of(online)
    again = run_forge("eval", "import", str(out), "--cache-dir", str(offline))
    assert again.returncode == 0, again.stderr
    assert again.stdout == (f"{offline}: 1 datasets, {got['files']} files imported "
                            f"({got['files']} already there, 0 bytes written)\n")

    # lm_eval's gsm8k task, offline, reads the imported cache: 5-shot from its train split
    # as multi-turn chat, the first 6 test items, each answered by the scripted engine.
    import datasets.config
    import huggingface_hub.constants
    from infer_forge.harness.bench.accuracy import run_task
    from infer_forge.harness.testing.scripted_arith import ScriptedArith

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", offline)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    tasks = gsm8k_tasks_dir(tmp_path / "again")
    with ScriptedArith() as srv:
        flex = run_task(srv.url, "scripted-arith", "gsm8k", endpoint="chat",
                        include_path=tasks, limit=6, filter_name="flexible-extract")
        strict = run_task(srv.url, "scripted-arith", "gsm8k", endpoint="chat",
                          include_path=tasks, limit=6)
    assert flex.accuracy == 1.0 and [i for i, _ in flex.items] == list(range(6))
    # the strict filter wants `#### N`, which the scripted engine never writes
    assert strict.accuracy == 0.0 and len(strict.items) == 6
    ident = flex.dataset
    assert ident["tasks"]["gsm8k"]["revision"] == SHA
    assert ident["tasks"]["gsm8k"]["cache_folder"].startswith(str(offline))
    assert ident["n_shot"] == {"gsm8k": 5} and ident["endpoint"] == "chat"
    assert ident["items_digest"] == strict.dataset["items_digest"]  # same documents
    assert len(set(flex.doc_hashes.values())) == 6
    # the named quick suite through the CLI: gsm8k, chat, its limit overridden here
    assert run_forge("init").returncode == 0
    with ScriptedArith() as srv:
        res = run_forge("eval", "accuracy", "--url", srv.url, "--model", "scripted-arith",
                        "--suite", "gsm8k-quick", "--limit", "4", "--filter",
                        "flexible-extract", "--tasks-dir", str(tasks), "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert (out["task"], out["items"], out["accuracy"]) == ("gsm8k", 4, 1.0)
    assert out["dataset"]["endpoint"] == "chat"
    assert out["dataset"]["tasks"]["gsm8k"]["revision"] == SHA


def _rewrite(src: Path, dst: Path, change) -> None:
    """Copy tarball `src` to `dst`, `change(name, data) -> data | None` (None: drop it)."""
    with tarfile.open(src, "r:gz") as tin, tarfile.open(dst, "w:gz") as tout:
        for m in tin.getmembers():
            fh = tin.extractfile(m)
            data = change(m.name, fh.read() if fh else b"")
            if data is None:
                continue
            info = tarfile.TarInfo(m.name)
            info.size = len(data)
            tout.addfile(info, io.BytesIO(data))


def test_import_refuses_a_file_that_does_not_match_the_manifest(exported, tmp_path):
    _, _, out, _ = exported
    bad = tmp_path / "bad.tar.gz"
    target = {}

    def flip(name, data):
        if name.endswith("gsm8k-test.arrow"):
            target["name"] = name
            return data[:-1] + bytes([data[-1] ^ 1])
        return data

    _rewrite(out, bad, flip)
    offline = tmp_path / "offline-cache"
    res = run_forge("eval", "import", str(bad), "--cache-dir", str(offline))
    assert res.returncode == 1
    [line] = res.stderr.strip().splitlines()
    assert f"{bad}: {target['name']}: sha256" in line and "does not match the manifest" \
        in line
    assert files_of(offline) == {}  # nothing written

    from infer_forge.harness.bench.dataset_cache import import_cache

    grown = tmp_path / "grown.tar.gz"
    _rewrite(out, grown, lambda n, d: d + b"\0" if n.endswith("dataset_info.json") else d)
    with pytest.raises(HarnessError, match=r"dataset_info.json: \d+ bytes, the manifest says "
                                           r"\d+"):
        import_cache(grown, offline)
    dropped = tmp_path / "dropped.tar.gz"
    _rewrite(out, dropped, lambda n, d: None if n.endswith("dataset_info.json") else d)
    with pytest.raises(HarnessError, match="dataset_info.json: listed in manifest.json but "
                                           "not in the tarball"):
        import_cache(dropped, offline)
    extra = tmp_path / "extra.tar.gz"
    with tarfile.open(out, "r:gz") as tin, tarfile.open(extra, "w:gz") as tout:
        for m in tin.getmembers():
            tout.addfile(m, tin.extractfile(m))
        info = tarfile.TarInfo("datasets/../../evil")
        info.size = 1
        tout.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(HarnessError, match="evil: not a relative path inside the cache"):
        import_cache(extra, offline)
    manifest_edit = tmp_path / "digest.tar.gz"

    def retag(name, data):
        if name != "manifest.json":
            return data
        m = json.loads(data)
        m["datasets"][0]["files"][0]["sha256"] = "0" * 64
        return json.dumps(m).encode()

    _rewrite(out, manifest_edit, retag)
    with pytest.raises(HarnessError, match="digest sha256:[0-9a-f]+ does not match its files"):
        import_cache(manifest_edit, offline)
    assert files_of(offline) == {}
    # a file already in the cache with other content is refused, naming it
    assert import_cache(out, offline)["kept"] == 0
    arrow = next(offline.rglob("gsm8k-test.arrow"))
    arrow.write_bytes(arrow.read_bytes() + b"\0")
    with pytest.raises(HarnessError, match="gsm8k-test.arrow: already in the cache with "
                                           "other content"):
        import_cache(out, offline)


def test_not_a_forge_tarball_is_one_line(tmp_path):
    from infer_forge.harness.bench.dataset_cache import import_cache

    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not gzip")
    with pytest.raises(HarnessError, match="junk.tar.gz: not a readable gzip tarball"):
        import_cache(junk, tmp_path / "c")
    plain = tmp_path / "plain.tar.gz"
    with tarfile.open(plain, "w:gz") as t:
        info = tarfile.TarInfo("manifest.json")
        data = b'{"format": "something-else"}'
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    with pytest.raises(HarnessError, match="format 'something-else', expected "
                                           "forge-dataset-cache/1"):
        import_cache(plain, tmp_path / "c")
