"""A Hugging Face datasets cache as a hub download leaves it, built here without network
by the datasets library itself (tests of harness/bench/dataset_cache.py and of lm_eval's
real suites read through it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def hub_cache(root: Path, src: Path, repo_id: str, config: str,
              splits: dict[str, list[dict[str, Any]]], sha: str) -> Path:
    """`splits`' rows in a datasets cache at `root`, written by the datasets library the
    way its hub loader does (the Parquet builder configured with the repo's config
    `config`, the repo's name as dataset name, the commit `sha` as hash), then moved under
    the namespaced folder the hub loader names (`cais___mmlu`: given the repo id, the
    builder would insist that the data files come from the hub). The datasets library's
    own offline reader loads it; returns the cache folder `<ns>___<name>/<config>/0.0.0/
    <sha>`."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.data_files import DataFilesDict
    from datasets.load import configure_builder_class
    from datasets.packaged_modules.parquet.parquet import Parquet, ParquetConfig

    ns, name = repo_id.split("/")
    src.mkdir(parents=True)
    for split, rows in splits.items():
        pq.write_table(pa.Table.from_pylist(rows), src / f"{split}.parquet")
    files = DataFilesDict.from_local_or_remote(
        {s: [f"{s}.parquet"] for s in splits}, base_path=str(src))
    cls = configure_builder_class(Parquet, builder_configs=[ParquetConfig(name=config,
                                                                          data_files=files)],
                                  default_config_name=config, dataset_name=name)
    staging = root / ".staging"
    b = cls(cache_dir=str(staging), dataset_name=name, config_name=config, hash=sha)
    b.download_and_prepare()
    built = Path(b.cache_dir)
    assert built == staging / name / config / "0.0.0" / sha, built
    dest = root / f"{ns}___{name}" / config
    dest.parent.mkdir(parents=True, exist_ok=True)
    (staging / name / config).rename(dest)
    return dest / "0.0.0" / sha
