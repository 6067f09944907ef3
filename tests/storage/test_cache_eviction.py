"""The node cache's budget counting and eviction under a full budget of small ranges.

Every download reserves its bytes under the budget lock; with one-block ranges (~190 KB
on bench_remote's tiny) under a budget below the dataset there are hundreds of ranges
and a full budget, so the count is taken from the ranges' names (no ``stat`` each) and an
eviction frees a little more than one download needs (``EVICT_SLACK``), least recently
used first. Through moto: what is evicted, that the budget holds, and that a dead
process's partial download is still reclaimed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from storage_servers import FAST_RETRY, S3Endpoint

from shardio.storage import RangeCache, Store, open_store
from shardio.storage.budget import EVICT_SLACK, PARTIAL, RANGES

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

RANGE = 16 << 10
NUM = 2 * EVICT_SLACK + 8
DATA = os.urandom(RANGE * NUM)


@pytest.fixture
def store(s3: S3Endpoint) -> Store:
    store = open_store(s3.url, retry=FAST_RETRY)
    store.put_bytes("shard-00000.rec", DATA)
    return store


def _read(cache: RangeCache, store: Store, i: int) -> None:
    with cache.open_range(store, "shard-00000.rec", i * RANGE, (i + 1) * RANGE,
                          version="v1") as got:
        assert got.read() == DATA[i * RANGE : (i + 1) * RANGE]


def _cached(root: Path) -> list[int]:
    return sorted(int(p.name.rsplit("@", 1)[1].split("-")[0]) // RANGE
                  for p in (root / RANGES).iterdir())


def test_a_full_budget_evicts_the_oldest_ranges_with_a_little_to_spare(
        store: Store, tmp_path: Path) -> None:
    budget = 2 * EVICT_SLACK * RANGE  # 64 ranges; 1/32 of it is two ranges
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=budget)
    full = 2 * EVICT_SLACK
    for i in range(full):
        _read(cache, store, i)
    _read(cache, store, 0)  # now range 1 is the least recently used
    assert cache.evictions == 0 and cache.usage().total_bytes == budget
    _read(cache, store, full)  # frees its own range and two more: 1, 2, 3
    assert cache.evictions == 3
    assert _cached(tmp_path / "cache") == [0, *range(4, full + 1)]
    for i in range(full + 1, full + 3):  # fit in what was freed: no eviction
        _read(cache, store, i)
    assert cache.evictions == 3
    usage = cache.usage()
    assert usage.total_bytes == budget and usage.num_ranges == full
    assert cache.stats.downloads == full + 3


def test_the_count_takes_each_range_at_its_size_and_reclaims_dead_partials(
        store: Store, tmp_path: Path) -> None:
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=4 * RANGE)
    for i in range(3):
        _read(cache, store, i)
    # a download of a process that died: its name reserves a range, nobody holds its lock
    dead = tmp_path / "cache" / PARTIAL / f"v1~shard-00000.rec@0-{RANGE}.{RANGE}.1-dead"
    dead.write_bytes(b"x" * 10)
    usage = cache.usage()
    assert (usage.range_bytes, usage.num_ranges) == (3 * RANGE, 3)
    assert usage.partial_bytes == 0 and not dead.exists()  # reclaimed by the count
    assert cache.reclaimed == 1
    _read(cache, store, 3)
    _read(cache, store, 4)  # the budget holds 4: the oldest goes
    assert _cached(tmp_path / "cache") == [1, 2, 3, 4]
