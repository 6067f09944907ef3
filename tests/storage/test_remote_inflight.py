"""What a remote reader keeps in flight across shards of different range sizes.

A shard whose largest range is a large record (one range of its own) must not keep
the read-ahead of every other shard to two ranges: the bytes limit governs, and the
count drops to one only when two of the largest ranges would not fit the budget.
Through moto and the fault proxy, with latency so that GETs in flight can be counted.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from storage_servers import FAST_RETRY, S3Endpoint

import shardio
from shardio.reading.shards import ShardSource
from shardio.storage import open_store
from shardio.storage.options import MIN_RANGE_BYTES, RemoteOptions

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

SMALL = 30_000
"""Two records of this size make a 64 KiB range."""


def _pack(tmp_path: Path) -> Path:
    out = tmp_path / "packed"
    options = shardio.WriteOptions(codec="none", max_shard_samples=41)
    with shardio.ShardWriter(out, options) as writer:
        writer.write({"__key__": "big", "bin": os.urandom(600_000)})  # shard 0's own range
        for i in range(81):
            writer.write({"__key__": f"s{i:03d}", "bin": os.urandom(SMALL)})
    return out


def test_a_large_range_in_one_shard_does_not_hold_back_the_others(
        s3: S3Endpoint, tmp_path: Path) -> None:
    packed = _pack(tmp_path)
    store = open_store(s3.url, retry=FAST_RETRY)
    for path in sorted(packed.iterdir()):
        store.put_file(path.name, path)
    opts = RemoteOptions(cache_dir=tmp_path / "cache", max_cache_bytes=64 << 20,
                         range_bytes=MIN_RANGE_BYTES, max_in_flight=16,
                         max_in_flight_bytes=1 << 20, retry=FAST_RETRY)
    source = ShardSource(s3.url, remote=opts)
    try:
        source.open_shard(0)  # its largest range: the 600 KB record, two per MiB
        second = source.open_shard(1)
        s3.plan.reset(latency_s=0.3)
        second.will_need(0, second.num_records)  # 41 records of 30 KB: ~20 ranges of 64 KiB
        deadline = time.monotonic() + 20
        while s3.plan.ranged_gets < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        # 1 MiB ahead is 16 ranges of 64 KiB: the count limit is 16, not the 2 of shard 0
        assert 12 <= s3.plan.ranged_gets <= 16
    finally:
        source.close()
