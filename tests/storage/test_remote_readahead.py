"""Planned ranges already in the node cache take no read-ahead slot (``skip_cached``).

Late in a cold epoch with a budget that holds the dataset, most of the next ranges a
reader plans are cached already; held in the read-ahead's slots, they kept the ranges
that still had to be downloaded waiting (bench_remote's tiny: 4 GETs in flight of 16
allowed, the link at half its rate). Through moto and the fault proxy: what downloads
while cached ranges are planned ahead of it, what the reader gets, and that a cached
range evicted before it is taken is downloaded when taken.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from storage_servers import FAST_RETRY, S3Endpoint

from shardio.storage import RangeCache, ReadAhead, Store, open_store
from shardio.storage.fetch import RangeRequest

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

RANGE = 64 << 10
DATA = os.urandom(8 * RANGE)


@pytest.fixture
def store(s3: S3Endpoint) -> Store:
    store = open_store(s3.url, retry=FAST_RETRY)
    store.put_bytes("shard-00000.rec", DATA)
    return store


def _requests(order: list[int]) -> list[RangeRequest]:
    return [RangeRequest("shard-00000.rec", i * RANGE, (i + 1) * RANGE) for i in order]


def _settle(s3: S3Endpoint, gets: int) -> None:
    deadline = time.monotonic() + 30
    while s3.plan.ranged_gets < gets and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.1)  # room for a GET the limit should have held back to show up


def test_cached_ranges_planned_first_leave_the_slots_to_downloads(
        store: Store, s3: S3Endpoint, tmp_path: Path) -> None:
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=16 * RANGE)
    for i in range(4):  # ranges 0-3 in the cache, 4-7 not
        cache.open_range(store, "shard-00000.rec", i * RANGE, (i + 1) * RANGE,
                         version="v1").close()
    s3.plan.reset(latency_s=0.01)
    plan = _requests([0, 1, 2, 3, 4, 5, 6, 7])
    with ReadAhead(cache, store, version="v1", max_in_flight=2,
                   max_in_flight_bytes=2 * RANGE, skip_cached=True) as ahead:
        ahead.plan(plan)
        _settle(s3, 2)
        # before, the two slots held cached ranges 0 and 1 and nothing downloaded
        assert s3.plan.ranged_gets == 2 and ahead.num_pending == 2
        assert cache.held_bytes == 2 * RANGE  # the two downloads, not the cached ranges
        got = []
        for request in plan:
            with ahead.take(request) as cached:
                got.append(cached.read())
    assert got == [DATA[i * RANGE : (i + 1) * RANGE] for i in range(8)]
    assert s3.plan.ranged_gets == 4  # each range not in the cache once
    assert cache.held_bytes == 0


def test_a_cached_range_evicted_before_it_is_taken_is_downloaded_then(
        store: Store, s3: S3Endpoint, tmp_path: Path) -> None:
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=16 * RANGE)
    cache.open_range(store, "shard-00000.rec", 0, RANGE, version="v1").close()
    s3.plan.reset()
    with ReadAhead(cache, store, version="v1", max_in_flight=2, skip_cached=True) as ahead:
        plan = _requests([0, 1])
        ahead.plan(plan)
        for entry in (tmp_path / "cache" / "ranges").iterdir():
            if entry.name.endswith(f"@0-{RANGE}"):
                entry.unlink()  # as eviction by another process would
        with ahead.take(plan[0]) as cached:
            assert cached.read() == DATA[:RANGE]
        with ahead.take(plan[1]) as cached:
            assert cached.read() == DATA[RANGE : 2 * RANGE]
    assert s3.plan.ranged_gets == 2


def test_marking_a_range_used_puts_it_last_in_line_for_eviction(
        store: Store, tmp_path: Path) -> None:
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=2 * RANGE)
    for i in (0, 1):
        cache.open_range(store, "shard-00000.rec", i * RANGE, (i + 1) * RANGE,
                         version="v1").close()
    assert cache.mark_used(store, "shard-00000.rec", 0, RANGE, version="v1")
    assert not cache.mark_used(store, "shard-00000.rec", 2 * RANGE, 3 * RANGE, version="v1")
    cache.open_range(store, "shard-00000.rec", 2 * RANGE, 3 * RANGE, version="v1").close()
    assert cache.holds(store, "shard-00000.rec", 0, RANGE, version="v1")
    assert not cache.holds(store, "shard-00000.rec", RANGE, 2 * RANGE, version="v1")


def test_cached_ranges_a_reader_never_takes_leave_nothing_queued(
        store: Store, s3: S3Endpoint, tmp_path: Path) -> None:
    """A reader decoding runs from look-ahead views (``open_cached``) never takes their
    ranges: planned while cached, they leave no queue entries behind (an epoch read from
    the cache plans every run), and a range neither cached nor planned is None, no GET."""
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=16 * RANGE)
    for i in range(4):
        cache.open_range(store, "shard-00000.rec", i * RANGE, (i + 1) * RANGE,
                         version="v1").close()
    s3.plan.reset()
    with ReadAhead(cache, store, version="v1", max_in_flight=2,
                   max_in_flight_bytes=2 * RANGE, skip_cached=True) as ahead:
        for _window in range(50):
            ahead.plan(_requests([0, 1, 2, 3]))
            for request in _requests([0, 1, 2, 3]):
                with ahead.open_cached(request) as view:  # type: ignore[union-attr]
                    assert view.read() == DATA[request.start : request.stop]
        assert not ahead._pending and ahead.num_pending == 0
        assert ahead.open_cached(_requests([7])[0]) is None
        with ahead.take(_requests([2])[0]) as cached:  # a take still finds it
            assert cached.read() == DATA[2 * RANGE : 3 * RANGE]
    assert s3.plan.ranged_gets == 0 and cache.held_bytes == 0


@pytest.mark.parametrize(("order", "max_in_flight"), [
    ([4, 0, 5, 6, 0], 1),  # the later entry of range 0 not queued yet when it is taken
    ([4, 0, 5, 0], 2),  # queued, behind the download of range 5
])
def test_a_range_planned_twice_and_cached_leaves_the_downloads_between_alone(
        order: list[int], max_in_flight: int, store: Store, s3: S3Endpoint,
        tmp_path: Path) -> None:
    """A stream plans a range once a run, so several times a window; cached when planned,
    its first entry leaves the queue's head unqueued. Taken in its turn, it must not read
    as a jump ahead to its later entry: that dropped the downloads planned between and
    fetched each on the spot, one at a time (the images' first remote epoch)."""
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=16 * RANGE)
    cache.open_range(store, "shard-00000.rec", 0, RANGE, version="v1").close()
    s3.plan.reset()
    plan = _requests(order)
    downloads = len(set(order)) - 1
    with ReadAhead(cache, store, version="v1", max_in_flight=max_in_flight,
                   max_in_flight_bytes=max_in_flight * RANGE, skip_cached=True) as ahead:
        ahead.plan(plan)
        got = []
        for request in plan:
            pending = ahead.num_pending
            with ahead.take(request) as cached:
                got.append(cached.read())
            if request.start == 0 and pending:  # range 0: the queue is as it was
                assert ahead.num_pending == pending
        _settle(s3, downloads)
    assert got == [DATA[i * RANGE : (i + 1) * RANGE] for i in order]
    assert s3.plan.ranged_gets == downloads
    assert cache.held_bytes == 0
