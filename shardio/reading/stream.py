"""Read a planned order of samples window by window, one sequential read per run of records.

The plan (``shardio.order.plan``) says which samples come in which order; this module
turns that into I/O. For each shuffle window it sorts the window's samples and
cuts them into *runs*: consecutive records of one shard, at most ``max_run``
long (a block, mostly). A run is one buffer (a view of a mapped local shard,
no copy; a downloaded range) checked as a whole and decoded in one tight loop
the first time one of its samples is due, so the first sample arrives after
one run, not one window; the reader is told the window's runs and the next
window's ahead, in the order they will be read (the kernel reads a local shard
ahead; a remote reader keeps a few ranges downloading in that order). A remote
reader reads the first batch's records on their own, ahead of their ranges
(``advise_first``): a shuffled first batch wants a record or two of many blocks. Memory
is at most two windows of records: a finished window's mapped pages are dropped, and
with check-ahead the next window's runs are mapped while this one is read, by the
checker thread checking them; no syscall is made per sample, and batching readers take samples a
chunk at a time (``iter_chunks``). Torch-free.
"""

from __future__ import annotations

import atexit
import contextlib
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, cast

import numpy as np

from shardio.backends import ShardFileReader
from shardio.backends.records import RecordsShardReader
from shardio.backends.remoterecords import RemoteRecordsReader
from shardio.format import runs as rundecode
from shardio.format.frames import RunBytes
from shardio.format.manifest import Manifest
from shardio.order.plan import IndexArray, whole_blocks
from shardio.reading.checkahead import Check, checker
from shardio.reading.gather import Chunk, ViewedSample, WindowColumns

Run = tuple[int, int, int]
"""``(shard, first record, stop record)``."""


class RunReader(Protocol):
    """What samples are read through: a ``DatasetReader``, or a ``MixtureReader`` (the shards
    of several datasets numbered one after another)."""

    @property
    def manifest(self) -> Manifest: ...

    @property
    def verify(self) -> bool: ...

    def shard(self, shard: int) -> ShardFileReader: ...

    def opened(self, shard: int) -> ShardFileReader | None: ...

    def prefetch(self, shards: Iterable[int]) -> None: ...


class ExactReads(Protocol):
    """A shard that can read records on their own instead of their whole ranges (a remote
    ``.rec`` shard, ``backends.remoterecords``)."""

    def will_need_exact(self, runs: Sequence[tuple[int, int]]) -> bool: ...

    def read_run_exact(self, start: int, stop: int) -> RunBytes: ...


def _exact_reads(shard_reader: ShardFileReader) -> ExactReads | None:
    return cast(ExactReads, shard_reader) if hasattr(shard_reader, "will_need_exact") else None


GAP_BYTES = 64 << 10
"""Records a reader does not want are read through (not decoded) when a gap between wanted
ones holds about this many bytes or less. DataLoader workers that take whole batches in
turn each want a scattered part of every block: with 2 workers and 1-4 KB records, runs
of about two records cost a worker 10.6 us a sample against 2.0 us for one reader, and
reading through gaps brings it back to the one reader's cost (benchmarks/README.md,
"Hand-over"); a gap of one 80 KB image costs more to check than a run saves."""


HEAD_SAMPLES = 64
"""Samples at the start of an iteration that a remote reader reads record by record (where
their ranges are much larger, see ``remoterecords.EXACT_SHARE``) when no batch size says
how many the first batch needs: a shuffled first batch wants a record or two of every
block, and waiting for all of those blocks whole took a second on bench_remote's link."""


LOCAL_RUN = 128
"""Records a local run holds at most (whole stored blocks of v3): a shuffled first batch
wants a run for each of its samples, and runs of the plan's blocks (``window / 128``)
took a window of 100,000 samples 0.45 s to its first batch, where runs of one stored
block cost a warm tiny epoch about 0.8 us a sample more in per-run work (a loaded 2-core
machine; ``StreamingDataset(shuffle_buffer=100_000)`` timed to its first batch)."""


def gap_records(manifest: Manifest, max_run: int) -> int:
    """The widest gap of unwanted records a run reads through, from the mean record size."""
    mean = manifest.num_bytes / max(manifest.num_samples, 1)
    return max(0, min(max_run - 1, int(GAP_BYTES // max(mean, 1.0))))


def window_runs(
    unique: IndexArray, firsts: IndexArray, max_run: int, max_gap: int = 0
) -> list[Run]:
    """Runs covering the sorted, unique global ``indices``, in order, each at most ``max_run``.

    Wanted records at most ``max_gap`` records apart share a run (the records between
    are read, not decoded).
    """
    if len(unique) == 0:
        return []
    shards = np.searchsorted(firsts, unique, side="right") - 1
    breaks = np.flatnonzero((np.diff(unique) > 1 + max_gap) | (np.diff(shards) != 0)) + 1
    lo = np.concatenate(([0], breaks)).tolist()
    hi = np.concatenate((breaks, [len(unique)])).tolist()
    runs = []
    for a, b in zip(lo, hi, strict=True):
        shard = int(shards[a])
        first = int(unique[a]) - int(firsts[shard])
        stop = int(unique[b - 1]) - int(firsts[shard]) + 1
        for start in range(first, stop, max_run):
            runs.append((shard, start, min(start + max_run, stop)))
    return runs


def iter_samples(
    reader: RunReader,
    order: IndexArray,
    *,
    window: int,
    max_run: int,
    skip: int = 0,
    zero_copy: bool = False,
    check_ahead: bool = True,
    head: int = HEAD_SAMPLES,
    placed: bool = False,
) -> Generator[dict[str, Any], None, None]:
    """Yield the decoded samples of ``order[skip:]``, each with its ``__index__``.

    Args:
        reader: the open dataset; shards are opened once and kept until it closes.
        order: global sample indices in yield order (from ``shardio.order.plan``).
        window: samples per read group: the plan's shuffle window.
        max_run: most records per read: the plan's block size.
        skip: samples of ``order`` already consumed (exact resume).
        zero_copy: large bytes values as views of the runs read (see ``decode_run``);
            otherwise each sample's large values are copied into ``bytes`` as it is
            handed out (runs are decoded with views either way), so the copies live as
            long as the consumer keeps them, not for the whole window.
        check_ahead: hand local runs' checksums to this process's checker thread
            (``shardio.reading.checkahead``); worth it where a core is free for it.
        head: samples at the start that a remote reader may read record by record
            instead of waiting for their whole ranges (see ``HEAD_SAMPLES``).
        placed: copied bytes values of mapped local shards as ``FileBytes``, which
            cross to another process as their places in the files (a DataLoader worker).
    """
    for open_window in _tracked(_windows(reader, order, window, max_run, skip,
                                         check_ahead=check_ahead, head=head)):
        columns = open_window.columns
        if columns is not None:
            columns.placed = placed and not zero_copy
        # local: a few dozen samples at a time are made by one ``gather``, not by half a
        # dozen calls a sample. Not a window's worth: copies all alive at once took fresh
        # pages for each (up to 256 MB, 20+ us an 80 KB image), where a copy the consumer
        # freed is reused. Remote: one at a time, so that a sample never waits for a later
        # sample's download. Either way each run is decoded as its first sample is due
        step = _SAMPLES_GATHERED if open_window.local else 1
        ranks = open_window.ranks
        for at in range(0, len(ranks), step):
            yield from open_window.gather(ranks[at : at + step].tolist(), owned=not zero_copy)


_SAMPLES_GATHERED = 32
"""Samples ``iter_samples`` makes per call of ``_OpenWindow.gather``."""


def iter_chunks(
    reader: RunReader,
    order: IndexArray,
    *,
    window: int,
    max_run: int,
    size: int,
    skip: int = 0,
    zero_copy: bool = False,
    check_ahead: bool = True,
    drop_decoded: bool = False,
) -> Iterator[Chunk | list[dict[str, Any]]]:
    """The samples of ``iter_samples``, ``size`` at a time (the last chunk may be shorter).

    With ``zero_copy``, a chunk is a ``Chunk``: the ranks of its samples in their
    windows' columns (each run is filed field by field when decoded), from which
    it builds its ``RecordBatch`` without a sample dict (``shardio.reading.gather``).
    Otherwise it is a list of sample dicts, gathered with one C call per window it
    spans, their bytes values copied into ``bytes`` as the chunk is handed out.
    ``check_ahead`` as in ``iter_samples``. ``drop_decoded``: drop a local shard's pages
    from this process as soon as its runs of a window are decoded, for a caller that does
    not read the samples' bytes itself (a DataLoader worker whose batches cross as places
    in the shard files); other callers keep them mapped until the window closes. A
    remote reader reads the first chunk's records on their own where their ranges are
    much larger (``HEAD_SAMPLES``).
    """
    pending: Chunk | list[dict[str, Any]] = Chunk() if zero_copy else []
    for open_window in _tracked(_windows(reader, order, window, max_run, skip,
                                         columns=zero_copy, check_ahead=check_ahead,
                                         drop_decoded=drop_decoded, head=size)):
        ranks = open_window.ranks
        at = 0
        while at < len(ranks):
            take = ranks[at : at + size - len(pending)].tolist()
            at += len(take)
            if isinstance(pending, Chunk):
                open_window.ensure(take)
                assert open_window.columns is not None
                pending.add(open_window.columns, take)
            else:
                pending.extend(open_window.gather(take, owned=True))
            if len(pending) == size:
                yield pending
                pending = Chunk() if zero_copy else []
    if pending:
        yield pending


class _OpenWindow:
    """One window being read: its samples by rank, each run decoded when first due.

    Each run is decoded when its first sample is due (``format.runs``; v3 runs filed field
    by field), its checksums taken from the checker thread where it got there first.
    """

    def __init__(self, reader: RunReader, plan: _Window, firsts: IndexArray,
                 columns: bool = False, checks: dict[Run, tuple[RunBytes, Check]] | None = None,
                 drop_decoded: bool = False, head: list[Run] | None = None,
                 defer_drops: bool = False) -> None:
        self.ranks = plan.ranks
        self._reader, self._runs, self._firsts = reader, plan.runs, firsts
        self._unique = plan.unique
        self.run_of: list[int] = np.repeat(np.arange(len(plan.counts)), plan.counts).tolist()
        self._base = np.concatenate(([0], np.cumsum(plan.counts))).astype(np.int64).tolist()
        self.samples: list[dict[str, Any] | None] = [None] * self._base[-1]
        self._loaded: list[bool] = [False] * len(plan.counts)
        self._due = plan.due
        self._checks: dict[Run, tuple[RunBytes, Check]] = checks if checks is not None else {}
        """The runs' checks handed to the checker thread (``_check_ahead``), until taken."""
        self.local = bool(plan.due) and (not getattr(reader, "is_remote", False) or all(
            type(reader.shard(run[0])) is RecordsShardReader or run in self._checks
            for run in plan.due))
        """Whether no due run waits for a download (a local shard's, or a remote one's whose
        range was cached when the window was planned, its check queued): samples are then
        gathered a few dozen at a time (``gather``), not one at a time."""
        self._left = len(plan.due)
        """Due runs not loaded yet."""
        self._blocks = reader.manifest.version >= 3
        """Format v3: runs are filed field by field from their blocks (``rundecode``)."""
        self._in_files = self.local and not getattr(reader, "is_remote", False)
        """Every run is read from a local file (``ensure`` takes a batch's runs in file order)."""
        self.columns = (WindowColumns(plan.unique) if columns or self.local or self._blocks
                        else None)
        self.complete = False
        self._drop_decoded = drop_decoded
        self._defer_drops = defer_drops and bool(self._checks)
        """Drop the window's pages on the checker thread when it closes (a core is free), where
        checks were handed to it: closing never starts the thread (at interpreter exit,
        starting one waits forever)."""
        number = {run: r for r, run in enumerate(self._runs)}
        self._head_of: dict[int, Run] = {}
        """The head run read on its own (``advise_first``) of each rank it holds, until loaded."""
        for run in head or ():
            shard, start, stop = run
            at = int(np.searchsorted(plan.unique, int(firsts[shard]) + start))
            self._head_of.update(dict.fromkeys(range(at, at + stop - start), run))
        self._headed: set[int] = set()
        """Ranks filed from their head run (v3 files them in ``columns``, not ``samples``)."""
        self._order: list[int] | None = None
        """With a head: the runs in the order ``advise_first`` queued them, which ``load_rank``
        keeps (samples read with the head run put some runs' first use later)."""
        if self._head_of:
            served = _served_runs(plan, firsts, head or [])
            self._order = [number[run] for run in plan.due if number[run] not in served]
        self._next = 0
        self._head_read = False
        """Whether the head runs were all read by an ``ensure`` before this one."""
        self.after_load: Callable[[], None] | None = None
        """Called once every due run is decoded (``_windows``: the next window's advice)."""
        self.after_first: Callable[[], None] | None = None
        """Called once the first samples' runs are decoded (``_windows``: the next window's
        plan and checks)."""
        self.keep: list[Run] = []
        """Runs whose pages ``close`` leaves mapped: the next window's, queued on the checker
        thread, which may have mapped them already (dropped, they were faulted in again)."""

    def load_rank(self, rank: int) -> None:
        """Load the sample at ``rank``: from its head run if it has one, else its run (after
        the runs queued before it, with a head)."""
        head = self._head_of.get(rank)
        r = self.run_of[rank]
        if head is not None and not self._loaded[r]:
            self._load_head(head)
        elif self._order is None:
            self.load(r)
        elif not self._loaded[r]:  # taken out of the queue's order, those before it were dropped
            order, at = self._order, self._next
            while not self._loaded[r] and at < len(order):
                if not self._loaded[order[at]]:
                    self.load(order[at])
                at += 1
            self._next = at
            if not self._loaded[r]:
                self.load(r)

    def _load_head(self, run: Run) -> None:
        """Read a head run on its own (``advise_first`` queued it so) and file its samples; their
        own run, if a later sample loads it, files them again."""
        shard, start, stop = run
        exact = _exact_reads(self._reader.shard(shard))
        assert exact is not None  # advise_first chose it for that
        run_bytes = exact.read_run_exact(start, stop)
        at = int(np.searchsorted(self._unique, int(self._firsts[shard]) + start))
        if self._blocks:
            end = self._put_blocks(at, self._reader.shard(shard), run_bytes, False, None)
        else:
            decoded = read_run(self._reader, run, self._firsts, True, ahead=run_bytes)
            self.samples[at : at + len(decoded)] = decoded
            if self.columns is not None:
                self.columns.put(at, decoded)
            end = at + len(decoded)
        for rank in range(at, end):
            del self._head_of[rank]
        self._headed.update(range(at, end))

    def load(self, r: int) -> None:
        """Read and decode run ``r`` (its wanted records), once."""
        if self._loaded[r]:
            return
        lo, hi = self._base[r], self._base[r + 1]
        ahead = self._checks.pop(self._runs[r], None)
        if self._blocks:
            shard, start, stop = self._runs[r]
            shard_reader = self._reader.shard(shard)
            self._put_blocks(lo, shard_reader,
                             ahead[0] if ahead is not None else shard_reader.read_run(start, stop),
                             ahead is not None and ahead[1].passed(), self._only(r))
        else:
            decoded = read_run(self._reader, self._runs[r], self._firsts, True, self._only(r),
                               ahead=None if ahead is None else ahead[0],
                               checked=ahead is not None and ahead[1].passed())
            self.samples[lo:hi] = decoded
            if self.columns is not None:
                self.columns.put(lo, decoded)
        self._loaded[r] = True
        self._left -= 1
        if self._left == 0:
            self._finish()

    def _put_blocks(self, lo: int, shard_reader: ShardFileReader, run: RunBytes, checked: bool,
                    only: list[int] | None) -> int:
        """File a v3 run's wanted records field by field at ranks from ``lo``; how many."""
        assert self.columns is not None
        for got in rundecode.run_columns(run, path=shard_reader.path, keys=shard_reader.keys(),
                                         verify=self._reader.verify and not checked, only=only):
            self.columns.put_columns(lo, got)
            lo += len(got.keys)
        return lo

    def _only(self, r: int) -> list[int] | None:
        """Positions of run ``r``'s wanted records when it reads through gaps, else None."""
        return _wanted(self._runs[r], self._unique, self._base[r], self._base[r + 1],
                       self._firsts)

    def _finish(self) -> None:
        """Every due run is decoded: a worker's local pages go (``drop_decoded``), the next
        window is advised (``after_load``)."""
        if self._drop_decoded and self.local:  # their bytes are not read here again
            spans: dict[int, tuple[int, int]] = {}
            for shard, start, stop in self._due:
                lo, hi = spans.get(shard, (start, stop))
                spans[shard] = min(lo, start), max(hi, stop)
            keep: dict[int, list[tuple[int, int]]] = {}
            for shard, start, stop in self.keep:  # the next window's, mapped by the checker
                keep.setdefault(shard, []).append((start, stop))
            for shard, (start, stop) in spans.items():
                drop = getattr(self._reader.shard(shard), "drop_pages", None)
                if drop is not None:
                    drop(start, stop, keep.get(shard, ()))
        self.complete = True  # every run a sample of the window is yielded from
        if self.after_load is not None:
            self.after_load()

    def ensure(self, wanted: list[int]) -> None:
        """Load the runs of the samples at ranks ``wanted``."""
        if self.complete:
            return
        if self._order is not None:  # a head was read: ranks in yield order
            if self._head_read:
                # the window's other runs are advised once the samples of its head are out
                # (``advise_first``): before, the first batch waited for every shard's tail
                self._run_after_first()
            loaded, run_of, headed = self._loaded, self.run_of, self._headed
            for rank in wanted:
                if not loaded[run_of[rank]] and rank not in headed:
                    if rank not in self._head_of:
                        self._run_after_first()  # its run is advised there
                    self.load_rank(rank)
            self._head_read = not self._head_of
            return
        loaded, run_of = self._loaded, self.run_of
        # in yield order, which is the order the runs were announced in (``due``): a remote
        # reader's read-ahead hands out its ranges in that order, and a run taken out of
        # turn dropped the downloads in flight and was fetched on the spot, one at a time
        todo = [r for r in dict.fromkeys(run_of[rank] for rank in wanted) if not loaded[r]]
        # the checker thread works through the checks in due order: the reader takes those it
        # has not started from the other end, so the two meet once, where taken one by one
        # the reader waited for each run the thread was in
        claims = reversed(todo)
        if self._in_files:
            # in file order, which is the order the disk delivers what was advised: taken in
            # yield order, a cold batch waited for each run while the ones after it came in
            # (cold mixed sizes, one process: 4,000 samples 57 -> 47 ms, 20,000 270 -> 251 ms,
            # medians of 4 alternated runs; ``python -m benchmarks.bench_cold --trees mixed``)
            todo.sort(key=self._runs.__getitem__)
            claims = iter(todo)
        for r in claims:
            found = self._checks.get(self._runs[r])
            if found is not None:
                found[1].run_if_pending()
        for r in todo:
            self.load(r)
        self._run_after_first()

    def _run_after_first(self) -> None:
        if self.after_first is not None:
            after_first, self.after_first = self.after_first, None
            after_first()

    def gather(self, wanted: list[int], *, owned: bool = False) -> list[dict[str, Any]]:
        """The samples at ranks ``wanted``, loading the runs they need first (``owned``:
        bytes values copied out of the runs read, see ``WindowColumns.sample``)."""
        if not wanted:
            return []
        self.ensure(wanted)
        if self.columns is not None:
            return self.columns.samples(wanted, owned=owned)
        got = cast(list[dict[str, Any]], [self.samples[rank] for rank in wanted])  # loaded
        return [s.owned() if owned and type(s) is ViewedSample else s for s in got]

    def close(self) -> None:
        """Let go of the window: its samples and its runs' pages in this process."""
        self.samples = []
        self.columns = None
        for _run, check in self._checks.values():
            check.cancel()
        self._checks = {}
        spans: dict[int, tuple[int, int]] = {}  # one system call a shard, not one a run
        for (shard, start, stop), loaded in zip(self._runs, self._loaded, strict=True):
            if loaded:
                lo, hi = spans.get(shard, (start, stop))
                spans[shard] = min(lo, start), max(hi, stop)
        keep: dict[int, list[tuple[int, int]]] = {}
        for shard, start, stop in self.keep:
            keep.setdefault(shard, []).append((start, stop))
        # only through shards still open: one closed since (the iteration ended first) has
        # no pages left to drop, and opened again its file may be gone (interpreter exit)
        drops = [(shard, drop) for shard in spans
                 if (drop := getattr(self._reader.opened(shard), "drop_pages", None))]
        # on the checker thread, before the checks queued there, so the reader does not
        # wait for it: unmapping a window took about a fifth of a warm image epoch here
        later = checker().later if self._defer_drops and drops else None
        for shard, drop in drops:
            # kept: the next window's runs of this shard (only a records shard's are checked
            # ahead, so only it has any)
            drop(*spans[shard], keep.get(shard, ()), later=later)


_STREAMS: weakref.WeakSet[Generator[_OpenWindow, None, None]] = weakref.WeakSet()
"""The window streams of this process not yet finished or collected."""


def _tracked(windows: Generator[_OpenWindow, None, None]) -> Generator[_OpenWindow, None, None]:
    _STREAMS.add(windows)
    return windows


@atexit.register
def _close_streams_at_exit() -> None:
    """Close the streams a script stopped reading early while modules are still there.

    Left to the collector, one held until exit is closed after the modules its window's
    ``close`` calls into are cleared, which printed ``Exception ignored in: <generator
    object _windows …>`` (``tests/torch/test_review_quiet_exit.py``).
    """
    for windows in list(_STREAMS):
        with contextlib.suppress(ValueError):  # running in another thread: it ends with it
            windows.close()


def _windows(reader: RunReader, order: IndexArray, window: int, max_run: int, skip: int,
             columns: bool = False, check_ahead: bool = True, drop_decoded: bool = False,
             head: int = 0) -> Generator[_OpenWindow, None, None]:
    """The windows of ``order[skip:]`` in turn; the next window's runs are advised ahead.

    A remote reader reads the records of the first ``head`` samples on their own where
    their ranges are much larger (``advise_first``).
    """
    firsts = np.asarray([s.first_index for s in reader.manifest.shards], dtype=np.int64)
    starts = list(range(skip - skip % window, len(order), window))
    if not starts:
        return
    # a remote range is downloaded whole anyway: a worker wanting a scattered part of a
    # block reads it as one run, taking the range once a window, not once a record
    # (between takes, a budget smaller than the dataset evicted it)
    if getattr(reader, "is_remote", False):
        gap = max_run - 1
    else:
        max_run = min(max_run, whole_blocks(LOCAL_RUN, reader.manifest.block_records))
        gap = gap_records(reader.manifest, max_run)
    current = _plan_window(order, starts[0], max(starts[0], skip), window, firsts, max_run, gap)
    if getattr(reader, "is_remote", False):
        first_runs, after_head = advise_first(reader, current, firsts, head)
    else:
        first_runs, after_head = [], []
        advise(reader, current.due)
    # deferred with the advice: nothing of a window whose head is downloading is cached
    checks = _check_ahead(reader, current.due) if check_ahead and not after_head else {}
    remote = getattr(reader, "is_remote", False)
    upcoming: _Window | None = None

    def read_ahead(w_lo: int, open_window: _OpenWindow) -> None:
        """Plan the next window and queue its checks behind this one's: the checker thread
        works through them while this window is handed out. Done once this window's first
        samples are out (``after_first``): planned before, a window of 100,000 samples
        took 0.05 s more to its first batch."""
        nonlocal upcoming, checks
        if upcoming is not None:
            return
        upcoming = _plan_window(order, w_lo + window, w_lo + window, window, firsts, max_run,
                                gap)
        checks = _check_ahead(reader, upcoming.due) if check_ahead else {}
        open_window.keep = list(checks)
        if open_window.local and not remote and not open_window.complete:
            # advised at once, the next window's reads were sorted by the block layer
            # among this one's, which the first batch waits for: on a cold page cache
            # that batch came 0.37-0.45 s into the epoch instead of 0.27-0.32 s (8,000
            # images); once this window is in, they overlap its use. A remote window's
            # advice starts downloads, which should start as early as they can
            open_window.after_load = partial(advise, reader, upcoming.due)
        else:
            advise(reader, upcoming.due)

    try:
        for w_lo in starts:
            open_window = _OpenWindow(reader, current, firsts, columns, checks, drop_decoded,
                                      first_runs, defer_drops=check_ahead)
            first_runs, checks, upcoming = [], {}, None
            if open_window.local and not remote:
                open_window.after_first = partial(read_ahead, w_lo, open_window)
            elif after_head:
                open_window.after_first = partial(_after_head, reader, after_head,
                                                  partial(read_ahead, w_lo, open_window))
                after_head = []
            else:
                read_ahead(w_lo, open_window)
            try:
                yield open_window
            finally:
                open_window.close()
            read_ahead(w_lo, open_window)  # a window none of whose samples was due
            assert upcoming is not None
            current = upcoming
    finally:
        for _run, check in checks.values():
            check.cancel()


@dataclass(frozen=True)
class _Window:
    """One window's runs, the rank in its sorted samples of each sample to yield, and the
    runs in the order they will be read (when their first sample is due)."""

    runs: list[Run]
    ranks: IndexArray
    due: list[Run]
    unique: IndexArray
    """The window's samples, sorted: ``ranks`` index it; run ``r`` holds ``counts[r]`` of them."""
    counts: list[int]


def _plan_window(order: IndexArray, w_lo: int, first: int, window: int, firsts: IndexArray,
                 max_run: int, max_gap: int = 0) -> _Window:
    """The window of ``order`` starting at ``w_lo``, yielded from position ``first`` on."""
    unique = _sorted_unique(order[w_lo : w_lo + window])
    runs = window_runs(unique, firsts, max_run, max_gap)
    ranks = np.searchsorted(unique, order[first : w_lo + window])
    ends = np.asarray([int(firsts[shard]) + stop for shard, _start, stop in runs], np.int64)
    counts = np.diff(np.searchsorted(unique, ends), prepend=0).tolist()
    if not runs or len(ranks) == 0:
        return _Window(runs, ranks, [], unique, counts)
    run_of = np.repeat(np.arange(len(runs)), counts)[ranks]
    # first time each run is due, in yield order
    first_due = np.full(len(runs), len(run_of), np.int64)
    np.minimum.at(first_due, run_of, np.arange(len(run_of)))
    due = np.flatnonzero(first_due < len(run_of))
    return _Window(runs, ranks, [runs[r] for r in due[np.argsort(first_due[due])].tolist()],
                   unique, counts)


def head_runs(plan: _Window, firsts: IndexArray, head: int,
              block_records: int | None = None) -> list[Run]:
    """The records of the first ``head`` samples ``plan`` yields, as runs of consecutive records
    (each within one of the window's runs), in the order they are due.

    With ``block_records`` (format v3), the window's records between two of them in one
    stored block join their run: that block is read and inflated whole for either, so
    the run files all of them with one decode. Without, the 64 samples of a first batch
    drawn from one block of 2-4 KB records were 44 runs, each reading and inflating the
    block again: from the iteration to the first batch 0.155 s, 0.09 s with them joined
    (``python -m benchmarks.remote_trace --dataset tiny --workers 0 --batches 1``); with
    the tail guess of ``remoterecords.tail_guess``, bench_remote's tiny first batch went
    from 0.42 to 0.34 s with 0 workers (``benchmarks/results/remote.json``).
    """
    yielded = plan.ranks[:head]
    ranks = _sorted_unique(yielded)
    if len(ranks) == 0:
        return []
    if block_records:
        ranks = _fill_blocks(ranks, plan.unique, firsts, block_records)
    runs = window_runs(plan.unique[ranks], firsts, max_run=len(ranks))
    ends = np.asarray(plan.counts, np.int64).cumsum()
    first_due = np.full(len(plan.unique), len(yielded), np.int64)
    np.minimum.at(first_due, yielded, np.arange(len(yielded)))
    # a head run must not span two of the window's runs: its records would be filed at
    # ranks of both, and ``load_rank`` loads one run or one head run per rank
    due: list[tuple[int, Run]] = []
    for shard, start, stop in runs:
        at = int(np.searchsorted(plan.unique, int(firsts[shard]) + start))
        while start < stop:
            edge = int(ends[np.searchsorted(ends, at, side="right")])
            take = min(stop - start, edge - at)
            when = int(first_due[at : at + take].min())
            if when < len(yielded):  # not a part of a filled block holding none of them
                due.append((when, (shard, start, start + take)))
            start, at = start + take, at + take
    return [run for _when, run in sorted(due)]


def _fill_blocks(ranks: IndexArray, unique: IndexArray, firsts: IndexArray,
                 block_records: int) -> IndexArray:
    """``ranks`` (sorted) with the ranks between two of them whose records are consecutive
    records of the window in one stored block."""
    records = unique[ranks]
    shards = np.searchsorted(firsts, records, side="right") - 1
    blocks = (records - firsts[shards]) // block_records
    gaps = np.diff(ranks)
    fill = np.flatnonzero((gaps > 1) & (gaps == np.diff(records)) & (np.diff(shards) == 0)
                          & (np.diff(blocks) == 0))
    if len(fill) == 0:
        return ranks
    pieces = [np.arange(int(ranks[i]) + 1, int(ranks[i + 1]), dtype=np.int64)
              for i in fill.tolist()]
    return np.sort(np.concatenate([ranks, *pieces]))


def _sorted_unique(values: IndexArray) -> IndexArray:
    """``np.unique(values)`` without its import of ``numpy.ma`` (60-90 ms on the first batch)."""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def _wanted(run: Run, unique: IndexArray, lo: int, hi: int, firsts: IndexArray,
            ) -> list[int] | None:
    """Positions in ``run`` of its wanted records ``unique[lo:hi]`` when it reads through
    gaps, else None (every record of it is wanted)."""
    shard, start, stop = run
    if hi - lo == stop - start:
        return None
    wanted: list[int] = (unique[lo:hi] - (int(firsts[shard]) + start)).tolist()
    return wanted


def _check_ahead(reader: RunReader, due: list[Run]) -> dict[Run, tuple[RunBytes, Check]]:
    """Hand the checksums of a window's runs to this process's checker thread, in due order.

    Only runs already in memory, where reading them is taking a view: those of mapped
    local shards, and those of remote ``.rec`` shards whose range is in the node cache now
    (``cached_runs``; a later epoch's, or a later window's once its ranges have come).
    Other remote runs are downloaded when read, and an LMDB run is copied out of its map.
    """
    if not reader.verify or not due:
        return {}
    found: dict[Run, RunBytes] = {}
    remote: dict[int, list[Run]] = {}
    for run in due:
        shard, start, stop = run
        shard_reader = reader.shard(shard)
        if type(shard_reader) is RecordsShardReader:
            found[run] = shard_reader.read_run(start, stop)
        elif type(shard_reader) is RemoteRecordsReader:
            remote.setdefault(shard, []).append(run)
    for shard, runs in remote.items():
        shard_reader = cast(RemoteRecordsReader, reader.shard(shard))
        got = shard_reader.cached_runs([(start, stop) for _s, start, stop in runs])
        found.update((run, b) for run, b in zip(runs, got, strict=True) if b is not None)
    if not found:
        return {}
    thread = checker()  # submitted in due order, the order the thread works through them
    return {run: (found[run], thread.submit(found[run])) for run in due if run in found}


def read_run(
    reader: RunReader, run: Run, firsts: IndexArray, zero_copy: bool = False,
    only: list[int] | None = None, *, ahead: RunBytes | None = None, checked: bool = False,
) -> list[dict[str, Any]]:
    """Read and decode one run of records (of it, the positions ``only``).

    ``ahead``: the run's bytes, already read; ``checked``: their checksums passed on the
    checker thread (``shardio.reading.checkahead``), so they are not computed again.
    """
    shard, start, stop = run
    shard_reader = reader.shard(shard)
    return rundecode.decode_run(
        ahead if ahead is not None else shard_reader.read_run(start, stop),
        path=shard_reader.path,
        first_record=start,
        offset_of=shard_reader.offset,
        verify=reader.verify and not checked,
        first_index=int(firsts[shard]) + start,
        zero_copy=zero_copy,
        keys=shard_reader.keys(),
        only=only,
    )


def advise_first(reader: RunReader, plan: _Window, firsts: IndexArray,
                 head: int) -> tuple[list[Run], list[Run]]:
    """Advise the first window of an iteration, its first ``head`` samples' records first and on
    their own where every shard can read them so (remote ``.rec`` shards); returns those head
    runs (none where one cannot), and the window's runs left to advise once the head is
    read (``_after_head``).

    The window's runs follow in their usual order, less those the head runs hold every
    wanted sample of; ``_OpenWindow.load_rank`` takes them in that order. Where the head
    downloads anything, only the tails of the window's other shards are fetched beside it:
    advised at once, the window's whole ranges shared the link with the head, and the
    first batch waited for every tail (``python -m benchmarks.remote_trace --workers 0``,
    8,000 images: the first batch 0.34-0.40 s after the iteration began, 0.20-0.26 s with
    the advice after it). Its records are downloaded once: their ranges copy them from the
    cache (``RangeCache.open_range``'s ``parts``).
    """
    heads = head_runs(plan, firsts, head, reader.manifest.block_records)
    reader.prefetch(dict.fromkeys(shard for shard, _start, _stop in heads))
    by_shard: dict[int, list[tuple[int, int]]] = {}
    for shard, start, stop in heads:
        if _exact_reads(reader.shard(shard)) is None:
            by_shard = {}
            break
        by_shard.setdefault(shard, []).append((start, stop))
    exact = [run for run in heads if run[0] in by_shard]
    cached = True
    for shard, runs in by_shard.items():
        cached = cast(ExactReads, reader.shard(shard)).will_need_exact(runs) and cached
    served = _served_runs(plan, firsts, exact)
    number = {run: r for r, run in enumerate(plan.runs)}
    rest = [run for run in plan.due if number[run] not in served]
    if not cached:
        reader.prefetch(dict.fromkeys(shard for shard, _start, _stop in rest))
        return exact, rest
    advise(reader, rest)
    return exact, []


def _after_head(reader: RunReader, rest: list[Run], then: Callable[[], None]) -> None:
    """Advise the first window's runs once its head is read, then ``then`` (the next
    window's plan)."""
    advise(reader, rest)
    then()


def _served_runs(plan: _Window, firsts: IndexArray, exact: list[Run]) -> set[int]:
    """The runs of ``plan`` every wanted sample of which the ``exact`` head runs hold."""
    counts = np.zeros(len(plan.runs), np.int64)
    ends = np.asarray(plan.counts, np.int64).cumsum()
    for shard, start, stop in exact:
        at = int(np.searchsorted(plan.unique, int(firsts[shard]) + start))
        counts[int(np.searchsorted(ends, at, side="right"))] += stop - start
    return {r for r in np.flatnonzero(counts).tolist() if counts[r] == plan.counts[r]}


def advise(reader: RunReader, runs: list[Run]) -> None:
    """Start reading ``runs`` (in this order) while earlier samples are decoded and used."""
    reader.prefetch(dict.fromkeys(shard for shard, _start, _stop in runs))
    for shard, start, stop in runs:
        reader.shard(shard).will_need(start, stop)
