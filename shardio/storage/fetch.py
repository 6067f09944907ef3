"""Ranges in flight: open the planned ranges a few ahead of the reader, in background threads.

A remote reader knows its order of ranges in advance (the plan). While it
decodes one range, the next ``max_in_flight`` are downloaded into the node
cache (or found there), so the first batch waits for one range and later
ones for none, as long as the network keeps up. Ranges come back in the
planned order; the caller closes each when done with it. A process holds at
most ``max_in_flight + 1`` ranges at once, which is what ``min_cache_bytes``
says the budget must cover. Threads, not processes: downloads wait on the
network with the GIL released. Imports only the storage modules.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType

from shardio.storage.cache import RangeCache, RangeCheck
from shardio.storage.cachedrange import CachedRange
from shardio.storage.store import Store

DEFAULT_IN_FLIGHT = 16
"""Ranges a reading process keeps downloading ahead, at most (one thread each)."""
DEFAULT_IN_FLIGHT_BYTES = 64 << 20
"""...and bytes: ranges of one plan block (about 2 MB) are small, and 3 of them in flight
left a 100 MB/s link with 20 ms a request half idle (a GET's round trip is 2 MB of
bandwidth); four 16 MiB ranges (blocks joined where the budget holds the dataset) fit,
and two of them left the link idle between ranges (bench_remote's images, 100 MB/s:
1,030 against 1,070 samples/s with four). ``ReadAhead`` starts a range while the
downloads ahead of it hold less than this, or fewer than two ranges."""
MIN_IN_FLIGHT = 2
PREFETCH_IN_FLIGHT = 3
"""``RangePrefetcher``'s ranges ahead (whole-order readers: ``verify``-like scans)."""


@dataclass(frozen=True)
class RangeRequest:
    """Bytes ``start..stop`` of object ``name``, with the check a fresh download must pass."""

    name: str
    start: int
    stop: int
    check: RangeCheck | None = None
    parts: tuple[tuple[int, int], ...] = ()
    """Spans of this range the node cache may hold as ranges of their own (a first batch's
    records read on their own, ``RemoteRecordsReader.will_need_exact``): a download copies
    them from there and fetches only the rest (``RangeCache.open_range``)."""

    @property
    def slot(self) -> tuple[str, int, int]:
        """``(name, start, stop)``: what identifies a range (its check does not)."""
        return self.name, self.start, self.stop


def in_flight_bytes(max_range_bytes: int, *, max_in_flight: int = DEFAULT_IN_FLIGHT,
                    max_in_flight_bytes: int = DEFAULT_IN_FLIGHT_BYTES) -> int:
    """Bytes one reader's ranges downloading ahead may hold at most (ranges up to
    ``max_range_bytes``): ``max_in_flight`` ranges, or ``max_in_flight_bytes`` and at
    least ``MIN_IN_FLIGHT`` ranges, whichever is less."""
    floor = min(max_in_flight, MIN_IN_FLIGHT) * max_range_bytes
    return min(max_in_flight * max_range_bytes, max(max_in_flight_bytes, floor))


def min_cache_bytes(max_range_bytes: int, *, max_in_flight: int = DEFAULT_IN_FLIGHT,
                    max_in_flight_bytes: int = DEFAULT_IN_FLIGHT_BYTES,
                    num_processes: int = 1) -> int:
    """The budget that ``num_processes`` readers on a node need at least: each holds the range
    it reads plus what it has downloading (``in_flight_bytes``)."""
    ahead = in_flight_bytes(max_range_bytes, max_in_flight=max_in_flight,
                            max_in_flight_bytes=max_in_flight_bytes)
    return num_processes * (ahead + max_range_bytes)


class RangePrefetcher:
    """Iterate ``CachedRange`` objects in request order, keeping a few downloads ahead.

    Use it as a context manager, so that stopping early releases what was
    fetched ahead, and close each range it yields when done with it.
    """

    def __init__(self, cache: RangeCache, store: Store, requests: Iterable[RangeRequest], *,
                 version: str, max_in_flight: int = PREFETCH_IN_FLIGHT) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self._cache = cache
        self._store = store
        self._requests = iter(requests)
        self._version = version
        self._max = max_in_flight
        self._pending: deque[Future[CachedRange]] = deque()
        self._pool: ThreadPoolExecutor | None = None

    def _submit(self) -> bool:
        request = next(self._requests, None)
        if request is None:
            return False
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._max, thread_name_prefix="shardio-fetch")
        self._pending.append(self._pool.submit(
            self._cache.open_range, self._store, request.name, request.start, request.stop,
            version=self._version, check=request.check))
        return True

    def __iter__(self) -> Iterator[CachedRange]:
        try:
            while len(self._pending) < self._max and self._submit():
                pass
            while self._pending:
                cached = self._pending.popleft().result()  # a failed download raises here
                self._submit()
                yield cached
        finally:
            self.close()

    def close(self) -> None:
        """Cancel what has not started, wait for what has, and release ranges never handed out."""
        for future in self._pending:
            future.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        while self._pending:
            future = self._pending.popleft()
            if not future.cancelled() and future.exception() is None:
                future.result().close()

    def __enter__(self) -> RangePrefetcher:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
