"""The node cache: once per node, under budget across processes, LRU, crash-safe, checked."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import storage_workers
from storage_servers import FAST_RETRY, S3Endpoint

from shardio.errors import CacheBudgetError, ChecksumError
from shardio.storage import RangeCache, Store, open_store
from shardio.storage import budget as budget_module

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

RANGE = 256 << 10
NUM_RANGES = 16
DATA = os.urandom(RANGE * NUM_RANGES)
FORK = mp.get_context("fork")


@pytest.fixture
def remote(s3: S3Endpoint, tmp_path: Path) -> tuple[Store, Path]:
    """A 4 MB object in the bucket, and a local copy of its bytes for children to compare."""
    store = open_store(s3.url, retry=FAST_RETRY)
    store.put_bytes("shard-00000.rec", DATA)
    expected = tmp_path / "expected.bin"
    expected.write_bytes(DATA)
    s3.plan.reset()
    return store, expected


def folder_bytes(root: Path) -> int:
    """What ``du --apparent-size`` would say of the cache folder's files."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # evicted while we walked
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def run_children(targets: list[tuple[object, ...]]) -> list[int | None]:
    """Start ``storage_workers.read_cached`` once per argument tuple (forked); exit codes."""
    procs = [FORK.Process(target=storage_workers.read_cached, args=args) for args in targets]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
        if proc.is_alive():
            proc.kill()
            proc.join()
    return [proc.exitcode for proc in procs]


def test_each_range_is_downloaded_once_per_node(
        remote: tuple[Store, Path], s3: S3Endpoint, tmp_path: Path) -> None:
    store, expected = remote
    cache_dir = tmp_path / "cache"
    reports = [tmp_path / f"report-{i}.json" for i in range(4)]
    args = [(store, str(cache_dir), len(DATA), "shard-00000.rec", str(expected), RANGE, 0, seed,
             str(report)) for seed, report in enumerate(reports)]
    assert run_children(args) == [0, 0, 0, 0]  # every process read every range, right
    assert s3.plan.ranged_gets == NUM_RANGES  # ...but each range crossed the network once
    downloads = sum(json.loads(r.read_text())["downloads"] for r in reports)
    hits = sum(json.loads(r.read_text())["hits"] for r in reports)
    assert (downloads, hits) == (NUM_RANGES, 3 * NUM_RANGES)


def test_concurrent_readers_never_exceed_the_budget(
        remote: tuple[Store, Path], s3: S3Endpoint, tmp_path: Path) -> None:
    store, expected = remote
    cache_dir = tmp_path / "cache"
    budget = 5 * RANGE  # 4 processes hold at most one range each; the data is 16 ranges
    RangeCache(cache_dir, max_cache_bytes=budget)
    s3.plan.reset(latency_s=0.002)
    samples: list[int] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(folder_bytes(cache_dir))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        args = [(store, str(cache_dir), budget, "shard-00000.rec", str(expected), RANGE, 12,
                 seed) for seed in range(4)]
        codes = run_children(args)
    finally:
        done.set()
        sampler.join()
    assert codes == [0, 0, 0, 0]  # every read right, no budget error, nobody stuck
    assert len(samples) > 20
    assert max(samples) <= budget
    assert max(samples) > 2 * RANGE  # the cache was really used
    assert s3.plan.ranged_gets > NUM_RANGES // 2  # evicted ranges were fetched again
    assert RangeCache(cache_dir, max_cache_bytes=budget).usage().total_bytes <= budget


def test_a_killed_download_leaves_nothing_behind(
        remote: tuple[Store, Path], s3: S3Endpoint, tmp_path: Path) -> None:
    store, expected = remote
    cache_dir = tmp_path / "cache"
    s3.plan.reset(stall_every=1, stall_s=3.0)  # every body stops halfway for 3 s
    child = FORK.Process(target=storage_workers.read_cached, args=(
        store, str(cache_dir), 4 * RANGE, "shard-00000.rec", str(expected), RANGE, 1, 0))
    child.start()
    partial = cache_dir / "partial"
    for _ in range(1000):  # until the child has written part of the range
        files = list(partial.glob("*")) if partial.exists() else []
        if files and files[0].stat().st_size > 0:
            break
        time.sleep(0.005)
    else:
        child.kill()
        pytest.fail("the child never started writing its download")
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join()
    assert child.exitcode == -signal.SIGKILL
    assert len(list(partial.iterdir())) == 1  # its partial file and reservation are left
    s3.plan.reset()

    cache = RangeCache(cache_dir, max_cache_bytes=4 * RANGE)
    for i in range(NUM_RANGES):  # the same range first: its download lock died with the child
        with cache.open_range(store, "shard-00000.rec", i * RANGE, (i + 1) * RANGE,
                              version="v1") as got:
            assert bytes(got.view()) == DATA[i * RANGE : (i + 1) * RANGE]
    assert cache.reclaimed == 1
    assert list(partial.iterdir()) == []
    usage = cache.usage()
    assert usage.partial_bytes == 0 and usage.total_bytes <= 4 * RANGE


def test_budget_too_small_fails_at_once_saying_the_minimum(
        remote: tuple[Store, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, _expected = remote
    tiny = RangeCache(tmp_path / "tiny", max_cache_bytes=RANGE - 1)
    with pytest.raises(CacheBudgetError, match=f"the minimum is {RANGE} bytes"):
        tiny.open_range(store, "shard-00000.rec", 0, RANGE, version="v1")
    with pytest.raises(CacheBudgetError, match=f"the minimum is {3 * RANGE} bytes"):
        tiny.require(3 * RANGE)

    def no_waiting(seconds: float) -> None:
        raise AssertionError("waited for space that only this process holds")

    monkeypatch.setattr(budget_module.time, "sleep", no_waiting)
    cache = RangeCache(tmp_path / "small", max_cache_bytes=2 * RANGE + RANGE // 2, wait_s=60)
    with (cache.open_range(store, "shard-00000.rec", 0, RANGE, version="v1"),
          cache.open_range(store, "shard-00000.rec", RANGE, 2 * RANGE, version="v1"),
          pytest.raises(CacheBudgetError, match=f"the minimum is {3 * RANGE} bytes")):
        cache.open_range(store, "shard-00000.rec", 2 * RANGE, 3 * RANGE, version="v1")
    assert cache.usage().partial_bytes == 0  # the failed reservation left nothing
    with cache.open_range(store, "shard-00000.rec", 2 * RANGE, 3 * RANGE, version="v1") as got:
        assert got.read(0, 100) == DATA[2 * RANGE : 2 * RANGE + 100]  # once released, it fits


def test_lru_evicts_the_oldest_range_nobody_holds(
        remote: tuple[Store, Path], tmp_path: Path) -> None:
    store, _expected = remote
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=3 * RANGE)

    def read(i: int) -> None:
        with cache.open_range(store, "shard-00000.rec", i * RANGE, (i + 1) * RANGE,
                              version="v1") as got:
            assert got.read() == DATA[i * RANGE : (i + 1) * RANGE]

    held = cache.open_range(store, "shard-00000.rec", 0, RANGE, version="v1")  # oldest, held
    read(1)
    read(2)
    read(1)  # now 2 is the least recently used range nobody holds
    read(3)
    names = sorted(p.name.rsplit("@", 1)[1] for p in (tmp_path / "cache" / "ranges").iterdir())
    assert names == [f"{i * RANGE}-{(i + 1) * RANGE}" for i in (0, 1, 3)]
    assert cache.evictions == 1
    assert bytes(held.view()) == DATA[:RANGE]  # the held range was never touched
    held.close()
    assert (cache.stats.downloads, cache.stats.hits) == (4, 1)


def test_a_view_kept_after_close_holds_nothing_and_reads_on_after_eviction(
        remote: tuple[Store, Path], tmp_path: Path) -> None:
    # a map keeps a duplicate of its descriptor, and a flock belongs to the open file the
    # duplicates share: mapped from the hold's descriptor, a view kept the range locked
    # after close, eviction skipped it, and a budget of two ranges ran out
    store, _expected = remote
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=2 * RANGE, wait_s=0.5)
    views = []
    for i in range(4):
        with cache.open_range(store, "shard-00000.rec", i * RANGE, (i + 1) * RANGE,
                              version="v1") as got:
            views.append(got.view()[: RANGE])  # a reader's sample views outlive the hold
    assert cache.evictions == 2 and cache.held_bytes == 0
    assert [bytes(v) for v in views] == [DATA[i * RANGE : (i + 1) * RANGE] for i in range(4)]
    assert len(list((tmp_path / "cache" / "ranges").iterdir())) == 2


def test_a_failed_check_refetches_once_then_raises(
        remote: tuple[Store, Path], s3: S3Endpoint, tmp_path: Path) -> None:
    store, _expected = remote
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=4 * RANGE)
    seen: list[bytes] = []

    def flaky_check(view: memoryview) -> None:
        seen.append(bytes(view[:8]))
        if len(seen) == 1:
            raise ChecksumError("record 3 fails its CRC-32")

    with cache.open_range(store, "shard-00000.rec", 0, RANGE, version="v1",
                          check=flaky_check) as got:
        assert got.read() == DATA[:RANGE]
    assert cache.stats.refetches == 1 and s3.plan.ranged_gets == 2
    assert seen == [DATA[:8], DATA[:8]]

    def bad(view: memoryview) -> None:
        raise ChecksumError("shard-00000.rec: record 0 fails its CRC-32")

    with pytest.raises(ChecksumError, match="record 0 fails"):
        cache.open_range(store, "shard-00000.rec", RANGE, 2 * RANGE, version="v1", check=bad)
    assert s3.plan.ranged_gets == 4  # fetched twice, then given up
    usage = cache.usage()
    assert (usage.num_ranges, usage.partial_bytes) == (1, 0)  # nothing bad was kept


def test_a_new_dataset_version_never_reads_a_stale_range(
        remote: tuple[Store, Path], tmp_path: Path) -> None:
    store, _expected = remote
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=4 * RANGE)
    with cache.open_range(store, "shard-00000.rec", 0, RANGE, version="crc32:aaaa") as got:
        assert got.read() == DATA[:RANGE]
    repacked = bytes(reversed(DATA))
    store.put_bytes("shard-00000.rec", repacked)  # re-packed at the same URL
    with cache.open_range(store, "shard-00000.rec", 0, RANGE, version="crc32:bbbb") as got:
        assert got.read() == repacked[:RANGE]


def test_local_stores_are_never_cached(tmp_path: Path) -> None:
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=RANGE)
    with pytest.raises(ValueError, match="read in place"):
        cache.open_range(open_store(tmp_path), "x.rec", 0, 10, version="v1")
