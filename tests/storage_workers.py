"""What the storage tests run in child processes (importable by spawn and forkserver children).

Each function exits with status 0 when every byte it read was right; tests
check exit codes, so a child that hangs, crashes or reads wrong bytes fails them.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from shardio.storage import RangeCache, Store

WRONG_BYTES = 3


def read_ranges(store: Store, name: str, expected_file: str, ranges: list[tuple[int, int]],
                report: str) -> None:
    """Read ``ranges`` of ``name`` straight from ``store``; compare with ``expected_file``."""
    expected = Path(expected_file).read_bytes()
    inherited_pid = getattr(store, "_pid", None)
    for start, stop in ranges:
        if store.read_range(name, start, stop) != expected[start:stop]:
            os._exit(WRONG_BYTES)
    Path(report).write_text(json.dumps({
        "pid": os.getpid(), "inherited_pid": inherited_pid,
        "client_pid": getattr(store, "_pid", None),
    }))


def read_cached(store: Store, cache: RangeCache | str, max_cache_bytes: int, name: str,
                expected_file: str, range_bytes: int, num_reads: int, seed: int,
                report: str | None = None) -> None:
    """Read ``num_reads`` ranges in a seeded order through a node cache; compare each.

    ``num_reads`` of 0 reads every range once, in a seeded order.
    """
    if not isinstance(cache, RangeCache):
        cache = RangeCache(cache, max_cache_bytes=max_cache_bytes, wait_s=30)
    expected = Path(expected_file).read_bytes()
    count = len(expected) // range_bytes
    rng = random.Random(seed)
    order = rng.sample(range(count), count) if num_reads == 0 else [
        rng.randrange(count) for _ in range(num_reads)]
    for i in order:
        start, stop = i * range_bytes, (i + 1) * range_bytes
        with cache.open_range(store, name, start, stop, version="v1") as cached:
            if bytes(cached.view()) != expected[start:stop]:
                os._exit(WRONG_BYTES)
    if report is not None:
        Path(report).write_text(json.dumps({
            "downloads": cache.stats.downloads, "hits": cache.stats.hits,
            "evictions": cache.evictions}))
