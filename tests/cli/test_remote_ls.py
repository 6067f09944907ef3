"""``shardio ls`` on a URL: sizes from the shards' indexes, records not downloaded.

A generic pack (no labels) is uploaded to S3 (moto, behind the proxy); its
listing by URL must equal the local one, and the only ranged GETs are the
shards' tails. A labelled pack's listing (labels live in the records) is
checked against the local one too, its ranges read ahead in stored order,
each downloaded once.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from click.testing import CliRunner
from storage_servers import FAST_RETRY, S3Endpoint

import shardio
from shardio.backends.remoterecords import tail_guess
from shardio.cli import main
from shardio.storage import open_store
from shardio.synth import make_imagefolder

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers


def _upload(folder: Path, url: str) -> str:
    store = open_store(url, retry=FAST_RETRY)
    for path in sorted(folder.iterdir()):
        store.put_file(path.name, path)
    return url


def _ls(*args: str) -> list[dict[str, object]]:
    result = CliRunner().invoke(main, ["ls", *args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    listing: list[dict[str, object]] = json.loads(result.stdout)
    return listing


def _tails(packed: Path) -> int:
    manifest = shardio.read_manifest(packed)
    return sum(tail_guess(s.num_bytes, s.num_samples) for s in manifest.shards)


def test_ls_of_a_url_reads_sizes_from_the_index_not_the_records(
        s3: S3Endpoint, tmp_path: Path) -> None:
    rng = random.Random(7)
    src = tmp_path / "src"
    for i in range(60):
        path = src / f"d{i % 3}" / f"f{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(rng.randrange(1000, 30_000)))
    packed = tmp_path / "packed"
    shardio.pack(src, packed, options=shardio.WriteOptions(max_shard_samples=25, version=2))
    url = _upload(packed, s3.url)
    s3.plan.reset()
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert _ls(url, *cache) == _ls(str(packed))
    data_bytes = sum(s.num_bytes for s in shardio.read_manifest(packed).shards)
    assert 0 < s3.plan.body_bytes <= _tails(packed) < data_bytes // 2


def test_ls_of_a_labelled_url_reads_each_range_once(s3: S3Endpoint, tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_imagefolder(src, num_classes=3, per_class=20, seed=3, long_side=(120, 200))
    packed = tmp_path / "packed"
    shardio.pack(src, packed, options=shardio.WriteOptions(max_shard_samples=25, version=2))
    url = _upload(packed, s3.url)
    s3.plan.reset()
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert _ls(url, *cache) == _ls(str(packed))
    data_bytes = sum(s.num_bytes for s in shardio.read_manifest(packed).shards)
    assert s3.plan.body_bytes <= data_bytes + _tails(packed)
    limited = _ls(url, "--limit", "7", "--cache-dir", str(tmp_path / "cache2"))
    assert [e["key"] for e in limited] == [e["key"] for e in _ls(str(packed))[:7]]


@pytest.fixture(autouse=True)
def _no_user_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SHARDIO_CACHE_DIR", str(tmp_path / "default-cache"))
