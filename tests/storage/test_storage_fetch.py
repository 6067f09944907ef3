"""Ranges in flight: planned order, bounded holdings (in ranges and in bytes), prompt release,
errors at their turn."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from storage_servers import FAST_RETRY, S3Endpoint

from shardio.storage import RangeCache, ReadAhead, Store, open_store
from shardio.storage.fetch import RangePrefetcher, RangeRequest, in_flight_bytes, min_cache_bytes

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

RANGE = 128 << 10
DATA = os.urandom(8 * RANGE)


@pytest.fixture
def store(s3: S3Endpoint) -> Store:
    """An 8-range object in a fresh bucket."""
    store = open_store(s3.url, retry=FAST_RETRY)
    store.put_bytes("shard-00000.rec", DATA)
    s3.plan.reset()
    return store


def requests(order: list[int], name: str = "shard-00000.rec") -> list[RangeRequest]:
    return [RangeRequest(name, i * RANGE, (i + 1) * RANGE) for i in order]


def test_ranges_come_in_planned_order_with_a_bounded_few_in_flight(
        store: Store, s3: S3Endpoint, tmp_path: Path) -> None:
    order = [5, 0, 7, 2, 2, 6, 1, 3, 4]
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=min_cache_bytes(RANGE, max_in_flight=2))
    s3.plan.reset(latency_s=0.01)
    got = []
    with RangePrefetcher(cache, store, requests(order), version="v1", max_in_flight=2) as ranges:
        for position, cached in enumerate(ranges):
            with cached:
                if position == 0:  # while the reader holds the first, the next two download
                    deadline = time.monotonic() + 30
                    while s3.plan.ranged_gets < 3 and time.monotonic() < deadline:
                        time.sleep(0.005)
                    assert s3.plan.ranged_gets == 3
                assert cache.held_bytes <= 3 * RANGE  # the one read + at most 2 in flight
                got.append(bytes(cached.view()))
    assert got == [DATA[i * RANGE : (i + 1) * RANGE] for i in order]
    assert cache.held_bytes == 0


def test_stopping_early_releases_every_range(store: Store, tmp_path: Path) -> None:
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=8 * RANGE)
    prefetcher = RangePrefetcher(cache, store, requests(list(range(8))), version="v1",
                                 max_in_flight=3)
    for position, cached in enumerate(prefetcher):
        cached.close()
        if position == 1:
            break
    prefetcher.close()
    assert cache.held_bytes == 0  # nothing left held: all of it evictable


def test_a_failed_range_raises_at_its_turn(store: Store, tmp_path: Path) -> None:
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=8 * RANGE)
    plan = [*requests([0, 1]), RangeRequest("missing.rec", 0, RANGE), *requests([2, 3])]
    got = []
    with pytest.raises(FileNotFoundError, match=r"missing\.rec"):
        for cached in RangePrefetcher(cache, store, plan, version="v1", max_in_flight=3):
            with cached:
                got.append(cached.read())
    assert got == [DATA[:RANGE], DATA[RANGE : 2 * RANGE]]
    assert cache.held_bytes == 0
    assert min_cache_bytes(RANGE, max_in_flight=3, num_processes=4) == 16 * RANGE


def _settle(s3: S3Endpoint, gets: int) -> None:
    """Wait until the proxy has seen ``gets`` ranged GETs (then a little longer for more)."""
    deadline = time.monotonic() + 30
    while s3.plan.ranged_gets < gets and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.2)  # room for a GET the limit should have held back to show up


@pytest.mark.parametrize(("max_in_flight", "max_bytes", "ahead"), [
    (8, int(2.5 * RANGE), 2),   # the bytes limit holds the third back
    (8, 4 * RANGE, 4),          # four ranges fit in the bytes
    (3, 64 * RANGE, 3),         # the count limit holds the fourth back
    (8, RANGE // 2, 2),         # two ranges always go, whatever the bytes
])
def test_read_ahead_keeps_ranges_and_bytes_in_flight_under_both_limits(
        max_in_flight: int, max_bytes: int, ahead: int, store: Store, s3: S3Endpoint,
        tmp_path: Path) -> None:
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=16 * RANGE)
    s3.plan.reset(latency_s=0.01)
    with ReadAhead(cache, store, version="v1", max_in_flight=max_in_flight,
                   max_in_flight_bytes=max_bytes) as read_ahead:
        plan = requests([3, 1, 4, 0, 5, 2, 6, 7])
        read_ahead.plan(plan)
        _settle(s3, ahead)
        assert s3.plan.ranged_gets == ahead
        assert read_ahead.num_pending == ahead
        with read_ahead.take(plan[0]) as first:  # one taken: one more starts
            assert first.read() == DATA[3 * RANGE : 4 * RANGE]
            _settle(s3, ahead + 1)
            assert s3.plan.ranged_gets == ahead + 1
            assert cache.held_bytes <= (ahead + 1) * RANGE
        got = []
        for request in plan[1:]:
            with read_ahead.take(request) as cached:
                got.append(cached.read())
    assert got == [DATA[i * RANGE : (i + 1) * RANGE] for i in [1, 4, 0, 5, 2, 6, 7]]
    assert s3.plan.ranged_gets == 8  # each planned range downloaded once
    assert cache.held_bytes == 0


def test_in_flight_bytes_and_the_minimum_budget_follow_both_limits() -> None:
    assert in_flight_bytes(RANGE, max_in_flight=16, max_in_flight_bytes=4 * RANGE) == 4 * RANGE
    assert in_flight_bytes(RANGE, max_in_flight=3, max_in_flight_bytes=64 * RANGE) == 3 * RANGE
    assert in_flight_bytes(8 * RANGE, max_in_flight=16, max_in_flight_bytes=RANGE) == 16 * RANGE
    assert in_flight_bytes(8 * RANGE, max_in_flight=1, max_in_flight_bytes=RANGE) == 8 * RANGE
    assert min_cache_bytes(RANGE, max_in_flight=16, max_in_flight_bytes=4 * RANGE,
                           num_processes=2) == 10 * RANGE
