"""The ``records`` backend read from a remote store: the tail once, records by ranges.

Opening a remote ``.rec`` shard costs one ranged GET of its tail (footer,
offset index and key block; a second GET of the whole tail only when they are
longer than the first guess), through the node cache, so a node fetches it
once; the footer and the CRC-32 over index and keys are checked exactly as the
local reader checks them, before the range enters the cache (checked after,
one bad reply was served to every later reader of the node). Records are
fetched as *ranges* of consecutive records cut from the offset index
(``partition``): about ``range_bytes`` each, the same cut in every process, so
each range is one cache entry and is downloaded once per node. A range's check
is its records' frame CRCs (and, for the first range, the shard header); a
range that fails it is downloaded once more, then the ``ChecksumError`` stands;
a cached range that fails it (the node's disk) is discarded and downloaded.
``will_need`` adds ranges to the process's ``ReadAhead`` queue in the order the
stream will read them, so a few download while earlier ones are decoded;
``will_need_exact`` queues a few records on their own instead (a shuffled
stream's first batch, which wants a record or two of many ranges); ``read_run``
hands out a run's records as a view of its range's map
(a copy where a run spans two ranges) and releases the range at once, so cache
holdings stay bounded; the view keeps the pages, not the hold. Messages name the
shard's URL. Imports ``format``, ``backends`` and ``storage``; no fsspec, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import msgpack
import numpy as np
import numpy.typing as npt

from shardio.errors import ShardCorruptError
from shardio.format.blockfile import VERSION as VERSION3
from shardio.format.blockfile import BlockIndex, ShardIndex3, parse_footer, parse_tail, tail_size
from shardio.format.blockfile import check_header as check_header3
from shardio.format.checksum import CRC32C
from shardio.format.frames import (
    HEADER_SIZES,
    Footer,
    RunBytes,
    check_frames,
    check_header,
    parse_index,
    tail_bytes,
    unpack_footer,
)
from shardio.storage.cachedrange import CachedRange
from shardio.storage.fetch import RangeRequest
from shardio.storage.readahead import ReadAhead

MIN_TAIL_BYTES = 64 << 10
"""The least the first GET of a shard's tail asks for (a round trip costs more than bytes)."""
V3_KEY_BYTES = 24
"""Key data bytes a record the first GET of a v3 tail allows for. Keys are stored compressed
where that pays (docs/format.md, §8.4): paths of 30-40 characters take 8-12 bytes; keys
longer than this on average cost a second GET, one round trip."""
JOIN_RANGE_BYTES = 16 << 20
"""Where the budget holds the dataset, plan blocks are joined into one range until it holds
this much (and at most ``range_bytes``): every GET costs a round trip and the server's and
the client's work per request. Measured on bench_remote's images (40 shards of 16 MB, 20 ms
a request, no bandwidth cap, 0 workers): ranges of at most 1 MiB (blocks of ~1.6 MB: 422
GETs) gave 2,300 samples/s; 4 MiB 2,600; 16 MiB (a range a shard: 145 GETs with the tails
and the first batch's records) 3,200, at three quarters of the reader's CPU."""
JOIN_SPARE = 8
"""Blocks are joined only where the budget holds the dataset and an eighth more
(``join_bytes``): the shards' tails and the first batches' records are cached beside the
ranges (tiny of bench_remote: 148.2 MB for 144.4 MB stored)."""
EXACT_SHARE = 8
"""Records are read on their own (``will_need_exact``) only where they are at most 1/8 of the
range holding them; more, and the whole range is read first instead. The range, when
downloaded later, copies them from the cache, but a range whose records a first batch
took nearly all of may not be needed again by that reader, and the next reader would
download it whole (``tests/reading/test_remote_read.py``: a cached epoch downloads
nothing)."""


def _equal_cuts(offsets: npt.NDArray[np.uint64], range_bytes: int) -> list[int]:
    """Cuts ``[0, …, n]`` of ``offsets``' records into ``ceil(total / range_bytes)`` equal parts."""
    n = len(offsets) - 1
    if n <= 0:
        return [0, 0]
    base, total = int(offsets[0]), int(offsets[-1]) - int(offsets[0])
    parts = max(1, -(-total // range_bytes))
    targets = base + (np.arange(1, parts, dtype=np.float64) * total) / parts
    cuts = np.searchsorted(offsets.astype(np.float64), targets, side="right") - 1
    return sorted({0, n, *(int(c) for c in cuts if 0 < c < n)})


def join_bytes(max_cache_bytes: int, dataset_bytes: int) -> int:
    """How far ``partition`` joins plan blocks into one range, under a budget of
    ``max_cache_bytes`` for a dataset of ``dataset_bytes``.

    Up to ``JOIN_RANGE_BYTES`` where the budget holds the dataset (with ``JOIN_SPARE``):
    each range is then downloaded once whichever windows read its blocks. Below that not at
    all: the blocks of a joined range are read by different shuffle windows, the first
    window's reads fill the budget with ranges, and least-recently-used eviction drops
    ranges a later window still needs. Measured on bench_remote's tiny (blocks of ~190 KB,
    ranges of ~1 MB read by 3-5 of the epoch's 6 windows each) under a budget of 128 MB
    for 144 MB stored: 50 ranges downloaded twice, 190 MB in epoch 1 (1.31x).
    """
    if max_cache_bytes >= dataset_bytes + dataset_bytes // JOIN_SPARE:
        return JOIN_RANGE_BYTES
    return 0


def partition(offsets: npt.NDArray[np.uint64], range_bytes: int,
              block_records: int | None = None, *,
              max_join_bytes: int = JOIN_RANGE_BYTES) -> list[int]:
    """Record boundaries ``[0, …, n]`` cutting a shard into ranges of about ``range_bytes``.

    Without ``block_records`` the record area is split into
    ``ceil(total / range_bytes)`` equal parts, each cut at the last record
    boundary before its end. With it (the plan's block size, ``shardio.order.plan``:
    blocks are records ``0, b, 2b, …`` of each shard) every range is made of
    whole blocks: one block each, since a shuffle reads the blocks of a shard in
    different windows and a range shared by several would be needed (and, under
    a small budget, downloaded) once per window; consecutive blocks are joined
    only while together at most ``min(range_bytes, max_join_bytes)`` (a GET
    costs a round trip; ``join_bytes`` says how far a budget allows), and a
    block over ``range_bytes`` is split into
    equal parts. Either way a part may exceed ``range_bytes`` by less than one
    record, and a record larger than it is a range of its own. A pure function
    of the index and the block size, so every process of a dataset cuts alike.
    """
    n = len(offsets) - 1
    if block_records is None or n <= 0:
        return _equal_cuts(offsets, range_bytes)
    offs = offsets.tolist()
    joined = min(range_bytes, max_join_bytes)
    cuts = [0]
    for lo in range(0, n, block_records):
        hi = min(n, lo + block_records)
        if cuts[-1] != lo and offs[hi] - offs[cuts[-1]] > joined:
            cuts.append(lo)  # joining this block would pass ``joined``
        if offs[hi] - offs[lo] > range_bytes:  # too large for one range (and cut at lo above)
            cuts += [lo + c for c in _equal_cuts(offsets[lo : hi + 1], range_bytes)[1:-1]]
            cuts.append(hi)
    if cuts[-1] != n:
        cuts.append(n)
    return cuts


def tail_guess(size: int, num_records: int, block_records: int | None = None) -> int:
    """Bytes at the end of a shard the first GET asks for: footer, index and keys, usually.

    ``block_records``: a v3 dataset's (its manifest's), which gives a shard's blocks and so
    its index's size; its keys are allowed ``V3_KEY_BYTES`` a record. Without, 64 key
    bytes a record and a v2 index: for ``bench_remote``'s tiny v3 shards (6,000 records,
    59 KB tails) that was 462 KB a tail, whose extra bytes are the last blocks, downloaded
    again with their range: the first epoch downloaded 1.05x the stored bytes, 1.01x with
    this guess (``python -m benchmarks.bench_remote --datasets images,tiny``,
    ``benchmarks/results/remote.json``; the run before: ``git show 4086b53:`` of that file).
    """
    if block_records is None:
        return tail_bytes(size, num_records, MIN_TAIL_BYTES)
    blocks = -(-num_records // block_records)
    want = tail_size(num_records, blocks, V3_KEY_BYTES * num_records)
    return min(size, max(MIN_TAIL_BYTES, want))


@dataclass(frozen=True)
class ShardTail:
    """What a reader needs of a shard before reading records: its index and key block."""

    offsets: npt.NDArray[np.uint64]
    key_block: bytes
    checksum: str
    """The records' checksum, as the footer names it (``crc32`` for format v1)."""
    chain: npt.NDArray[np.uint32] | None = None
    """Format v2: the checksum of the shard up to each record (``shardio.format.frames``)."""
    index3: ShardIndex3 | None = None
    """Format v3: the block index and keys (``offsets`` then holds the block offsets)."""


def read_tail(fetch: Callable[[RangeRequest], bytes], name: str, *, url: str, size: int,
              num_records: int, block_records: int | None = None) -> ShardTail:
    """Fetch and check the footer, index and key block of remote shard ``name`` of ``size`` bytes.

    ``fetch`` reads one range through the node cache (thread-safe: tails of
    several shards are fetched at once), which caches it only once its check
    passed. ``num_records`` and ``block_records`` (the manifest's) only size the first
    GET; where the index and keys are longer, the whole tail is fetched as a second range,
    checked whole (the first one's check, which cannot see all of the index,
    is its footer's, and only its footer is used).

    Raises:
        ShardCorruptError: bad footer or index; ``ChecksumError`` when index and key block
            fail their CRC-32 (the local reader's check).
        StorageError, FileNotFoundError: the store could not deliver.
    """
    at = size - tail_guess(size, num_records, block_records)

    def check_guess(view: memoryview) -> None:
        if _is_v3(view):
            footer3 = parse_footer(view, size, path=url)
            if size - footer3.tail_bytes >= at:
                parse_tail(view, size, path=url)
            return
        footer = unpack_footer(view, path=url, size=size)
        if footer.index_offset >= at:
            _parse_tail(view, at, footer, url=url)

    tail = fetch(RangeRequest(name, at, size, check_guess))
    if _is_v3(tail):
        if size - parse_footer(tail, size, path=url).tail_bytes < at:  # longer than the guess
            at = size - parse_footer(tail, size, path=url).tail_bytes
            tail = fetch(RangeRequest(name, at, size,
                                      lambda view: _ignore(parse_tail(view, size, path=url))))
        index3 = parse_tail(tail, size, path=url)
        assert index3.block_offsets is not None
        return ShardTail(index3.block_offsets.astype(np.uint64), b"", CRC32C, None, index3)
    footer = unpack_footer(tail, path=url, size=size)
    if footer.index_offset < at:  # index and keys are longer than the guess
        at = footer.index_offset

        def check_whole(view: memoryview) -> None:
            _parse_tail(view, at, unpack_footer(view, path=url, size=size), url=url)

        tail = fetch(RangeRequest(name, at, size, check_whole))
        footer = unpack_footer(tail, path=url, size=size)
    return _parse_tail(tail, at, footer, url=url)


def _is_v3(tail: bytes | memoryview) -> bool:
    """Whether ``tail`` (a shard's last bytes) ends with a v3 footer: its version sits where
    v1's and v2's does, before the magic."""
    return len(tail) >= 12 and int.from_bytes(bytes(tail[-12:-8]), "little") == VERSION3


def _ignore(_value: object) -> None:
    """A range check whose checks are what computing its argument raises."""


def _parse_tail(tail: bytes | memoryview, at: int, footer: Footer, *, url: str) -> ShardTail:
    """Check and copy the index and key block out of ``tail``, the shard's bytes from ``at``."""
    if footer.index_offset < at:
        raise ShardCorruptError(
            f"{url}: the footer places the index at byte {footer.index_offset}, before the "
            f"tail fetched from byte {at}; the shard is damaged: restore it or re-pack",
            path=url, offset=footer.index_offset)
    body = memoryview(tail)[footer.index_offset - at : len(tail) - footer.size]
    index = parse_index(body, footer, path=url)  # the local reader's checks (format.frames)
    if bool(np.any(np.diff(index.offsets.astype(np.int64)) <= 0)):
        raise ShardCorruptError(
            f"{url}: record index does not span the record area in order; re-pack it",
            path=url, offset=footer.index_offset,
        )
    chain = None if index.chain is None else index.chain.copy()
    return ShardTail(index.offsets.copy(), bytes(index.key_block), footer.checksum, chain)


class RemoteRecordsReader:
    """One remote ``.rec`` shard, read by ranges through the node cache; the local reader's API."""

    def __init__(self, ahead: ReadAhead, name: str, tail: ShardTail, *, url: str,
                 range_bytes: int, block_records: int | None = None,
                 max_join_bytes: int = JOIN_RANGE_BYTES) -> None:
        """A reader over ``tail`` (from ``read_tail``); records are fetched when asked for.

        Args:
            ahead: this process's read-ahead queue (shared by the dataset's shards).
            name: the shard's object name in the store.
            tail: its checked index and key block.
            url: the shard's URL, named in messages.
            range_bytes: the largest fetch range (``partition``).
            block_records: the reading plan's block size: ranges are then whole blocks
                (``partition``); ``None`` cuts equal parts of about ``range_bytes``.
            max_join_bytes: how far consecutive blocks are joined into one range
                (``join_bytes``: not at all under a budget below the dataset).
        """
        self.path = url
        self.name = name
        self._ahead = ahead
        self._offsets: list[int] = tail.offsets.tolist()
        self.num_records = len(self._offsets) - 1
        self.block_index = None if tail.index3 is None else BlockIndex(tail.index3)
        if self.block_index is None:
            self._cuts = partition(tail.offsets, range_bytes, block_records,
                                   max_join_bytes=max_join_bytes)
        else:  # v3: ranges of whole blocks, about as many records as the plan's blocks
            index = self.block_index
            self.num_records = index.index.num_records
            blocks = len(index.firsts) - 1
            # stored blocks of R records (``WriteOptions.block_records``): the plan's blocks
            # are whole ones (``plan.whole_blocks``), k each; else about as many records
            sizes = np.diff(index.index.first_records)
            per = None if block_records is None or blocks == 0 else (
                block_records // int(sizes[0])
                if not block_records % int(sizes[0]) and bool((sizes[:-1] == sizes[0]).all())
                else max(1, round(block_records * blocks / max(self.num_records, 1))))
            self._cuts = [index.firsts[c] for c in partition(
                tail.offsets, range_bytes, per, max_join_bytes=max_join_bytes)]
        self._checksum = tail.checksum
        self._chain = tail.chain
        self._key_block = tail.key_block
        self._keys: list[str] | None = None
        self._current: tuple[int, CachedRange] | None = None
        """The range ``frame`` read last, kept for its neighbours (random access)."""
        self._exact: dict[tuple[int, int], list[RangeRequest]] = {}
        """What ``will_need_exact`` queued, by records, for ``read_run_exact`` to take."""
        self._parts: dict[int, set[tuple[int, int]]] = {}
        """Per range, the byte spans ``will_need_exact`` downloaded on their own: its
        download copies them from the cache (``RangeRequest.parts``)."""

    @property
    def max_range_bytes(self) -> int:
        """The largest range of this shard: what each range in flight reserves in the cache."""
        return max((self._byte_span(j)[1] - self._byte_span(j)[0]
                    for j in range(len(self._cuts) - 1)), default=0)

    def _byte_span(self, j: int) -> tuple[int, int]:
        """Bytes of range ``j``; the first also holds the shard header, which it checks."""
        lo, hi = self._span(self._cuts[j], self._cuts[j + 1])
        return (0 if j == 0 else lo), hi

    def _span(self, start: int, stop: int) -> tuple[int, int]:
        """The bytes holding records ``start..stop`` (v3: their whole blocks)."""
        if self.block_index is not None and stop > start:
            return self.block_index.byte_span(start, stop)
        return self._offsets[start], self._offsets[stop]

    def _request(self, j: int) -> RangeRequest:
        start, stop = self._byte_span(j)
        lo, hi = self._cuts[j], self._cuts[j + 1]
        offs, url = self._offsets, self.path

        def check(view: memoryview) -> None:
            if lo == 0 and self.block_index is not None:
                check_header3(view[: HEADER_SIZES[2]], path=url)
            elif lo == 0:
                header = check_header(view[: HEADER_SIZES[2]], path=url)
                if header.checksum != self._checksum or header.size != offs[0]:
                    raise ShardCorruptError(
                        f"{url}: the header says {header.checksum} and records from byte "
                        f"{header.size}, the footer {self._checksum} and byte {offs[0]}; the "
                        "shard is damaged: restore it from a copy or re-pack", path=url, offset=0)
            check_frames(self._run(view, start, lo, hi), path=url, first_record=lo)

        return RangeRequest(self.name, start, stop, check, tuple(self._parts.get(j, ())))

    def _ranges(self, start: int, stop: int) -> range:
        """Range numbers holding records ``start..stop``."""
        if not 0 <= start < stop <= self.num_records:
            raise IndexError(f"{self.path}: records {start}..{stop} out of range "
                             f"0..{self.num_records}")
        first = int(np.searchsorted(self._cuts, start, side="right")) - 1
        last = int(np.searchsorted(self._cuts, stop, side="left"))
        return range(first, last)

    def frame(self, index: int) -> memoryview:
        """Framed bytes of record ``index`` (a copy; its range stays held for the next ones)."""
        self._check_framed()
        if not 0 <= index < self.num_records:
            raise IndexError(f"{self.path}: record {index} out of range 0..{self.num_records - 1}")
        j = self._ranges(index, index + 1)[0]
        if self._current is None or self._current[0] != j:
            self._release_current()
            self._current = (j, self._ahead.take(self._request(j)))
        base = self._byte_span(j)[0]
        return memoryview(self._current[1].read(self._offsets[index] - base,
                                                self._offsets[index + 1] - self._offsets[index]))

    def _check_framed(self) -> None:
        if self.block_index is not None:
            raise TypeError(f"{self.path}: a format v3 shard holds blocks, not one frame a "
                            "record: read records with read_run and shardio.format.runs")

    def offset(self, index: int) -> int:
        """Byte offset of record ``index`` in the shard (v3: of its block)."""
        if self.block_index is not None:
            return self.block_index.byte_span(index, index + 1)[0]
        return self._offsets[index]

    def will_need(self, start: int, stop: int) -> None:
        """Queue the ranges of records ``start..stop``: the stream reads them in this order."""
        self._ahead.plan(self._request(j) for j in self._ranges(start, stop))

    def _records_request(self, start: int, stop: int) -> RangeRequest:
        """Exactly the bytes of records ``start..stop`` (one range's), checked by their frames."""
        url = self.path
        lo, hi = self._span(start, stop)

        def check(view: memoryview) -> None:
            check_frames(self._run(view, lo, start, stop), path=url, first_record=start)

        return RangeRequest(self.name, lo, hi, check)

    def _exact_requests(self, runs: Sequence[tuple[int, int]]
                        ) -> dict[tuple[int, int], list[RangeRequest]]:
        """For each of ``runs`` (records ``start..stop``), one request per range holding some:
        that whole range where it is in the cache already (reading it costs no download) or
        where the records are more than 1/``EXACT_SHARE`` of it, else the records on their
        own. Runs of one range whose bytes overlap or touch share one request: two runs
        wanting records of one v3 block downloaded it twice (a first batch of
        ``bench_remote``'s images: 2 MB of 6.7)."""
        spans: dict[int, list[list[int]]] = {}
        """Per range, its records wanted: spans whose bytes overlap or touch joined."""
        for start, stop in sorted(runs):
            for j in self._ranges(start, stop):
                lo, hi = max(start, self._cuts[j]), min(stop, self._cuts[j + 1])
                joined = spans.setdefault(j, [])
                if joined and self._span(*joined[-1])[1] >= self._span(lo, hi)[0]:
                    joined[-1][1] = max(joined[-1][1], hi)
                else:
                    joined.append([lo, hi])
        made: dict[tuple[int, int, int], RangeRequest] = {}

        def request(j: int, lo: int, hi: int) -> RangeRequest:
            whole = self._request(j)
            span = next(sp for sp in spans[j] if sp[0] <= lo and hi <= sp[1])
            first, last = self._span(span[0], span[1])
            range_lo, range_hi = self._byte_span(j)
            if self._ahead.cached(whole) or (last - first) * EXACT_SHARE > range_hi - range_lo:
                return whole
            key = (j, span[0], span[1])
            if key not in made:
                made[key] = part = self._records_request(span[0], span[1])
                self._parts.setdefault(j, set()).add((part.start, part.stop))
            return made[key]

        return {(start, stop): [request(j, max(start, self._cuts[j]), min(stop, self._cuts[j + 1]))
                                for j in self._ranges(start, stop)] for start, stop in runs}

    def will_need_exact(self, runs: Sequence[tuple[int, int]]) -> bool:
        """Queue the records of each of ``runs`` on their own for ``read_run_exact``: samples
        due before their ranges could be downloaded whole (a stream's first batch). Their
        ranges, when asked for, copy those bytes from the cache and download the rest
        (``RangeRequest.parts``). Returns whether every byte of them is in the cache now."""
        planned = self._exact_requests(runs)
        self._exact.update(planned)
        requests = list({r.slot: r for reqs in planned.values() for r in reqs}.values())
        cached = all(self._ahead.cached(r) for r in requests)
        if not self._ahead.fetch_first(requests):  # they would not fit the budget's share
            self._ahead.plan(requests)
        return cached

    def read_frames(self, start: int, stop: int) -> list[memoryview]:
        """Records ``start..stop``, copied out of their ranges, which are released at once."""
        self._check_framed()
        offs = self._offsets
        frames: list[memoryview] = []
        for j in self._ranges(start, stop):
            lo, hi = max(start, self._cuts[j]), min(stop, self._cuts[j + 1])
            base = self._byte_span(j)[0]
            with self._ahead.take(self._request(j)) as cached:
                chunk = memoryview(cached.read(offs[lo] - base, offs[hi] - offs[lo]))
            frames.extend(chunk[offs[i] - offs[lo] : offs[i + 1] - offs[lo]] for i in range(lo, hi))
        return frames

    def _run(self, buf: memoryview | bytes, at: int, start: int, stop: int) -> RunBytes:
        """Records ``start..stop`` in ``buf``, which holds the shard's bytes from ``at``."""
        if self.block_index is not None:
            return self.block_index.run(memoryview(buf), start, stop, at)
        offs = self._offsets
        base = offs[start]
        bounds = np.asarray(offs[start : stop + 1], np.int64) - base
        chain = None if self._chain is None else self._chain[start : stop + 1]
        view = memoryview(buf)[base - at : offs[stop] - at]
        return RunBytes(view, bounds, self._checksum, chain, base)

    def read_run(self, start: int, stop: int) -> RunBytes:
        """Records ``start..stop`` as one buffer (a view of their range's map, or a copy where
        they span two), their ranges released at once."""
        if start == stop:
            return self._run(b"", self._span(start, stop)[0], start, stop)
        return self._read_parts(start, stop, [self._request(j) for j in self._ranges(start, stop)])

    def cached_runs(self, runs: Sequence[tuple[int, int]]) -> list[RunBytes | None]:
        """Records ``start..stop`` of each of ``runs`` as ``read_run`` gives them, where their
        range is in the node cache now; None for the others (not cached, spanning two
        ranges, or a budget below the dataset). Each range is opened once, so the runs of
        one range are views of one map (``columnar`` parses them in place); nothing is
        downloaded and the read-ahead plan is untouched (a stream looking at a window
        before its turn)."""
        out: list[RunBytes | None] = [None] * len(runs)
        if not self._ahead.skip_cached:
            # under a budget below the dataset the queue holds each planned range in its
            # slot until it is taken: a run decoded from a look-ahead view never takes it
            return out
        by_range: dict[int, list[int]] = {}
        for i, (start, stop) in enumerate(runs):
            ranges = self._ranges(start, stop) if start < stop else range(0)
            if len(ranges) == 1:
                by_range.setdefault(ranges[0], []).append(i)
        for j, members in by_range.items():
            cached = self._ahead.open_cached(self._request(j))
            if cached is None:
                continue
            with cached:  # the views keep the map's pages, not the hold (as read_run)
                view = cached.view()
                at = self._byte_span(j)[0]
                for i in members:
                    start, stop = runs[i]
                    out[i] = self._run(view, at, start, stop)
        return out

    def read_run_exact(self, start: int, stop: int) -> RunBytes:
        """Records ``start..stop`` as ``read_run`` gives them, through the requests that
        ``will_need_exact`` queued for them (worked out afresh if it was not called)."""
        if start == stop:
            return self._run(b"", self._span(start, stop)[0], start, stop)
        requests = (self._exact.pop((start, stop), None)
                    or self._exact_requests([(start, stop)])[start, stop])
        return self._read_parts(start, stop, requests)

    def _read_parts(self, start: int, stop: int, requests: list[RangeRequest]) -> RunBytes:
        """Records ``start..stop`` out of ``requests``, one for each range holding some."""
        parts: list[bytes | memoryview] = []
        single = len(requests) == 1
        for j, request in zip(self._ranges(start, stop), requests, strict=True):
            lo, hi = max(start, self._cuts[j]), min(stop, self._cuts[j + 1])
            first, last = self._span(lo, hi)
            at, size = first - request.start, last - first
            with self._ahead.take(request) as cached:
                # one range: a view of its map, no copy (the map outlives the hold while its
                # views do; an evicted file's pages stay valid, never truncated)
                parts.append(cached.view()[at : at + size] if single else cached.read(at, size))
        return self._run(parts[0] if single else b"".join(parts), self._span(start, stop)[0],
                         start, stop)

    def scan(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, memoryview]]:
        """Yield ``(index, framed bytes)`` front to back, range by range, reading ahead."""
        self._check_framed()
        stop = self.num_records if stop is None else stop
        if start >= stop:
            return
        ranges = self._ranges(start, stop)
        self._ahead.plan(self._request(j) for j in ranges)
        for j in ranges:
            lo, hi = max(start, self._cuts[j]), min(stop, self._cuts[j + 1])
            yield from enumerate(self.read_frames(lo, hi), start=lo)

    def keys(self) -> Sequence[str]:
        """Every record's ``__key__``, decoded from the key block on first use."""
        if self.block_index is not None:
            return self.block_index.index.keys
        if self._keys is None:
            try:
                keys = msgpack.unpackb(self._key_block, raw=False)
            except Exception:  # msgpack raises several unrelated types on bad input
                keys = None
            # the block passed its CRC on open, so only a broken writer gets here
            if not isinstance(keys, list) or len(keys) != self.num_records or not (
                set(map(type, keys)) <= {str}
            ):
                raise ShardCorruptError(
                    f"{self.path}: the key block is not a list of {self.num_records} str keys; "
                    "the shard was written by a broken writer: re-pack it",
                    path=self.path,
                )
            self._keys = keys
        return self._keys

    def _release_current(self) -> None:
        if self._current is not None:
            self._current[1].close()
            self._current = None

    def forget(self) -> None:
        """In a forked child: drop the parent's held range without touching the cache's locks."""
        if self._current is not None:
            self._current[1].forget()
            self._current = None

    def close(self) -> None:
        """Release the range ``frame`` kept; the reader must not be used afterwards."""
        self._release_current()
