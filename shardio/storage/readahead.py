"""``ReadAhead``: one reading process's queue of planned ranges, a few always downloading.

``RangePrefetcher`` (``fetch.py``) serves a reader that knows its whole
order up front. A dataset reader learns its order a window at a time (the
stream announces the runs of this window and the next one as it goes) and
takes ranges from several shards in between, so its queue grows while it is
read: ``plan`` appends ranges, ``take`` hands out the one the reader needs
now. Planned ranges downloading or waiting to be taken are at most
``max_in_flight`` and hold at most ``max_in_flight_bytes`` (at least
``MIN_IN_FLIGHT`` ranges), whatever the length of the plan: a count alone
either starves a link with small ranges or holds too much with large ones. So
a process holds at most ``in_flight_bytes`` plus the range it reads of the
cache (``min_cache_bytes``), and the first sample waits for one range, not one
shard.

``fetch_first`` starts a few small ranges at once beside the queue (the records
of a stream's first batch), which ``take`` hands out in any order.

With ``skip_cached`` (a budget that holds the dataset), a planned range already in
the node cache takes no slot: it is marked used (so least-recently-used eviction
keeps it) and opened only when taken. Holding cached ranges ahead in the slots kept
the downloads behind them waiting: late in a cold epoch most of the next ranges are
cached, and the link then had 4 GETs in flight. Under a smaller budget they are held
in their slots as before: unheld, one was evicted before its turn and downloaded
again (2 workers at half a budget, ``tests/reading/test_remote_head.py``).

``take`` tolerates a reader that leaves the plan: planned ranges it skips
(an exact resume starts mid-window) are released, and a range it never
planned (random access) is opened on the spot, next to the queue. A range
planned again later (a stream plans one a run) and in the cache when taken is
opened from there, the queue left as it is: read as a jump to its later
entry, it dropped the downloads in between. One thread
reads; downloads run in ``max_in_flight`` threads that wait on the network
with the GIL released.

Read-ahead is a guest in a cache other jobs may share, each sizing its own
read-ahead to the whole budget (``sharing.py``): a download ahead takes no space
while another download waits for some, waits for room with no deadline until
``take`` wants it (its ``AheadTicket``), and gives up once the reader passes it
over. Ranges held ahead are given back (``give_back``, the furthest ahead first)
when a download of this process must wait for space; ``take`` then opens them
again, from the cache while they are still there. Imports only the storage
modules.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

from shardio.errors import CacheBudgetError
from shardio.storage.cache import RangeCache
from shardio.storage.cachedrange import CachedRange
from shardio.storage.fetch import (
    DEFAULT_IN_FLIGHT,
    DEFAULT_IN_FLIGHT_BYTES,
    MIN_IN_FLIGHT,
    RangeRequest,
)
from shardio.storage.sharing import AheadTicket, held_ahead, hold_ahead, reading_ahead
from shardio.storage.store import Store

_Slot = tuple[str, int, int]
"""``(name, start, stop)``: what identifies a range (its check does not)."""


class ReadAhead:
    """Planned ranges of one store, downloaded into the node cache ahead of one reader."""

    def __init__(self, cache: RangeCache, store: Store, *, version: str,
                 max_in_flight: int = DEFAULT_IN_FLIGHT,
                 max_in_flight_bytes: int = DEFAULT_IN_FLIGHT_BYTES,
                 skip_cached: bool = False) -> None:
        """Nothing starts until ``plan``.

        Args:
            cache: the node cache the ranges go through.
            store: where they are downloaded from.
            version: the dataset version (its manifest's checksum) naming the cache entries.
            max_in_flight: planned ranges downloading or waiting to be taken, at most.
            max_in_flight_bytes: their bytes, at most (``MIN_IN_FLIGHT`` ranges may hold more).
            skip_cached: planned ranges found in the cache take no slot and are opened
                when taken (for a budget that holds the dataset, so rarely evicted).
        """
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        self.cache = cache
        self.store = store
        self.version = version
        self.max_in_flight = max_in_flight
        self.max_in_flight_bytes = max_in_flight_bytes
        self.skip_cached = skip_cached
        self._planned: deque[RangeRequest] = deque()
        self._planned_slots: Counter[_Slot] = Counter()
        """How often each slot is in ``_planned``, so that ``take`` knows in one step whether
        the reader jumped ahead (a list of a window's planned slots per take was quadratic
        once cached ranges at the queue's head stopped being kept, below)."""
        self._pending: deque[tuple[_Slot, Future[CachedRange | None] | None]] = deque()
        """Planned ranges in the reader's order: downloading or downloaded (a future), or
        found in the cache when planned (``None``: opened when taken). ``None`` entries at
        the head are dropped (``_fill``): ``take`` opens such a range all the same, and a
        reader that decodes runs from look-ahead views (``open_cached``) never takes them,
        so in an epoch read from the cache they would pile up for the queue's life."""
        self._pending_count = 0
        """Entries of ``_pending`` with a future: what ``max_in_flight`` counts."""
        self._pending_bytes = 0
        self._pool: ThreadPoolExecutor | None = None
        self._first: dict[_Slot, Future[CachedRange | None]] = {}
        """Ranges ``fetch_first`` started beside the queue, by slot, until taken."""
        self._first_bytes = 0
        self._first_pool: ThreadPoolExecutor | None = None
        self._fetched: list[tuple[int, CachedRange]] = []
        """``(order, range)`` fetched ahead and not taken (nor given back): what
        ``give_back`` releases, the latest ``order`` (furthest ahead) first, and a forked
        child must let go of (readable after a fork without the lock, which a parent
        thread may have held)."""
        self._lock = threading.Lock()
        """Guards ``_fetched``: ``give_back`` runs in whichever thread waits for space."""
        self._tickets: dict[Future[CachedRange | None], AheadTicket] = {}
        """The standing of each download ahead not yet taken or passed over."""
        self._submitted = 0
        self._took_at = time.monotonic()
        self._pid = os.getpid()
        hold_ahead(cache.root, self)

    def plan(self, requests: Iterable[RangeRequest]) -> None:
        """Append ``requests`` to the order in which the reader will ``take`` them."""
        requests = list(requests)
        self._planned.extend(requests)
        self._planned_slots.update(r.slot for r in requests)
        self._fill()

    def _open(self, request: RangeRequest) -> CachedRange:
        return self.cache.open_range(self.store, request.name, request.start, request.stop,
                                     version=self.version, check=request.check,
                                     parts=request.parts)

    def _submit(self, pool: ThreadPoolExecutor,
                request: RangeRequest) -> Future[CachedRange | None]:
        ticket = AheadTicket()
        future = pool.submit(self._open_ahead, request, ticket, self._submitted)
        self._submitted += 1
        self._tickets[future] = ticket
        return future

    def _open_ahead(self, request: RangeRequest, ticket: AheadTicket,
                    order: int) -> CachedRange | None:
        """The range of ``request`` held ahead of the reader; None if the reader passed it
        over while it waited for room."""
        try:
            with reading_ahead(ticket):
                cached = self._open(request)
        except CacheBudgetError:
            if ticket.dropped:
                return None
            raise
        with self._lock:
            self._fetched.append((order, cached))
        held_ahead(self.cache.root)
        return cached

    def _claim(self, future: Future[CachedRange | None], *, want: bool) -> CachedRange | None:
        """What ``future`` fetched ahead, now the caller's (``want``: the reader waits for it;
        else it is passed over); None if it fetched nothing or its range was given back."""
        ticket = self._tickets.pop(future, None)
        if ticket is not None:
            if want:
                ticket.want()
            else:
                ticket.drop()
        cached = future.result()
        with self._lock:
            for i, (_order, held) in enumerate(self._fetched):
                if held is cached:
                    del self._fetched[i]
                    return cached
        return None

    def _taken(self, future: Future[CachedRange | None], request: RangeRequest) -> CachedRange:
        cached = self._claim(future, want=True)
        return self._open(request) if cached is None else cached

    @property
    def held_ahead(self) -> int:
        """Bytes of the ranges fetched ahead and not taken yet."""
        if self._pid != os.getpid():
            return 0
        with self._lock:
            return sum(cached.size for _order, cached in self._fetched)

    @property
    def idle_s(self) -> float:
        """Seconds since the reader last took a range (or since this queue was made)."""
        return time.monotonic() - self._took_at

    def give_back(self, num_bytes: int) -> int:
        """Release ranges fetched ahead and not taken yet, the furthest ahead first, until
        ``num_bytes`` are released (a download of this process waits for space they hold);
        ``take`` opens them again. Returns the bytes released."""
        if self._pid != os.getpid():
            return 0  # a forked child's copy: it holds nothing of its parent's
        given: list[CachedRange] = []
        released = 0
        with self._lock:
            self._fetched.sort(key=lambda entry: entry[0])
            while self._fetched and released < num_bytes:
                cached = self._fetched.pop()[1]
                given.append(cached)
                released += cached.size
        for cached in given:
            cached.close()
        return released

    def cached(self, request: RangeRequest) -> bool:
        """Whether the range of ``request`` is in the node cache now (a hint: see ``holds``)."""
        return self.cache.holds(self.store, request.name, request.start, request.stop,
                                version=self.version)

    def open_cached(self, request: RangeRequest) -> CachedRange | None:
        """The range of ``request`` if the node cache holds it now (held for the caller, who
        closes it), else None; nothing is downloaded and the plan is left as it is (a reader
        looking ahead of its turn: a planned download of the range, if any, is taken or
        passed over in turn as before)."""
        return self.cache.open_cached(self.store, request.name, request.start, request.stop,
                                      version=self.version, check=request.check)

    def limit(self, *, max_in_flight: int, max_in_flight_bytes: int) -> None:
        """Lower the limits (never raise them): a shard with larger ranges was opened."""
        self.max_in_flight = max(1, min(self.max_in_flight, max_in_flight))
        self.max_in_flight_bytes = min(self.max_in_flight_bytes, max_in_flight_bytes)

    def _room_for(self, request: RangeRequest) -> bool:
        count = self._pending_count
        held = self._pending_bytes + self._first_bytes + request.stop - request.start
        return count < self.max_in_flight and (
            count < MIN_IN_FLIGHT or held <= self.max_in_flight_bytes)

    def fetch_first(self, requests: Iterable[RangeRequest]) -> bool:
        """Start downloading ``requests`` now, beside the queue, if they fit its byte limit.

        For a few small ranges wanted before anything queued (a stream's first batch):
        they do not wait for a slot of ``max_in_flight``, so the queue's ranges download
        beside them, not after them (which left the link nearly idle while they came),
        and ``take`` finds them whatever the queue's order. Their bytes count against
        ``max_in_flight_bytes`` until taken, so what is in flight still fits the budget.
        Returns False, starting nothing, when they do not fit it: then ``plan`` them.
        """
        fresh = {r.slot: r for r in requests if r.slot not in self._first}
        size = sum(r.stop - r.start for r in fresh.values())
        if self._pending_bytes + self._first_bytes + size > self.max_in_flight_bytes:
            return False
        if self._first_pool is None:
            # as many as the queue's threads: with twice as many, the extra connections
            # opened at once were refused by bench_remote's link (a listen queue of 5) and
            # retried after 1 s, which a first batch waiting for every range then waited
            self._first_pool = ThreadPoolExecutor(self.max_in_flight,
                                                  thread_name_prefix="shardio-first")
        for slot, request in fresh.items():  # a slot asked twice: the second take opens it
            self._first[slot] = self._submit(self._first_pool, request)
        self._first_bytes += size
        return True

    def _unplan(self) -> RangeRequest:
        """Take the first planned request off the plan."""
        request = self._planned.popleft()
        slot = request.slot
        self._planned_slots[slot] -= 1
        if not self._planned_slots[slot]:
            del self._planned_slots[slot]
        return request

    def _pop(self) -> Future[CachedRange | None] | None:
        (_name, start, stop), future = self._pending.popleft()
        if future is not None:
            self._pending_count -= 1
            self._pending_bytes -= stop - start
        return future

    def _fill(self) -> None:
        while self._planned:
            request = self._planned[0]
            if self.skip_cached and self.cache.mark_used(
                    self.store, request.name, request.start, request.stop, version=self.version):
                self._pending.append((self._unplan().slot, None))
                continue
            if not self._room_for(request):
                break
            self._unplan()
            self._pending_count += 1
            self._pending_bytes += request.stop - request.start
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_in_flight,
                                                thread_name_prefix="shardio-readahead")
            self._pending.append((request.slot, self._submit(self._pool, request)))
        while self._pending and self._pending[0][1] is None:
            self._pending.popleft()  # nothing before it to pass over: take opens it anyway

    def take(self, request: RangeRequest) -> CachedRange:
        """The range of ``request``, held for the caller, who closes it when done.

        The next planned range comes from the queue; planned ranges before it
        that the reader skipped are released; an unplanned range is opened now.

        Raises:
            CacheBudgetError, ShardCorruptError, StorageError: its download failed.
        """
        self._took_at = time.monotonic()
        slot = request.slot
        first = self._first.pop(slot, None)
        if first is not None:
            self._first_bytes -= request.stop - request.start
            self._fill()
            return self._taken(first, request)
        for position, (pending, future) in enumerate(self._pending):
            if pending == slot:
                if position and future is None:
                    # a later plan entry of a range cached when planned: this take is an
                    # earlier entry's, dropped at the queue's head (a range planned once a
                    # run, several times a window); the downloads before it stay
                    return self._open(request)
                for _ in range(position):
                    self._discard(self._pop())
                future = self._pop()
                self._fill()
                # in the cache when planned: opened now (downloaded if evicted since)
                return self._open(request) if future is None else self._taken(future, request)
        if self._planned_slots[slot]:
            cached = self.open_cached(request)
            if cached is not None:  # as above, its later entry not queued yet
                return cached
            # the reader jumped ahead of everything downloading
            self._drop_pending()
            while self._unplan().slot != slot:
                pass
            self._fill()
        return self._open(request)

    def _drop_pending(self) -> None:
        while self._pending:
            self._discard(self._pop())

    def _discard(self, future: Future[CachedRange | None] | None) -> None:
        """Release a range fetched ahead and never taken (its error, if any, matters no more)."""
        if future is None:
            return
        if future.cancel():
            self._tickets.pop(future, None)
            return
        with contextlib.suppress(Exception):  # a skipped range's failure is nobody's to report
            cached = self._claim(future, want=False)
            if cached is not None:
                cached.close()

    def forget(self) -> None:
        """In a forked child: drop the parent's ranges fetched ahead, touching no lock."""
        for _order, cached in self._fetched:
            cached.forget()
        self._fetched = []
        self._tickets = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @property
    def num_pending(self) -> int:
        """Planned ranges downloading or downloaded and not yet taken."""
        return self._pending_count

    def close(self) -> None:
        """Forget the plan, release what was fetched ahead, stop the download threads."""
        self._planned.clear()
        self._planned_slots.clear()
        for _pending_slot, future in self._pending:
            if future is not None:
                future.cancel()
        firsts, self._first, self._first_bytes = list(self._first.values()), {}, 0
        for future in firsts:
            future.cancel()
        for ticket in self._tickets.values():
            ticket.drop()  # downloads still waiting for room give up: the pools can stop
        for pool in (self._pool, self._first_pool):
            if pool is not None:
                pool.shutdown(wait=True)
        self._pool = self._first_pool = None
        self._drop_pending()
        for future in firsts:
            self._discard(future)

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

