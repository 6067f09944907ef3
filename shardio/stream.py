"""Read a planned order of samples window by window, one sequential read per run of records.

The plan (``shardio.plan``) says which samples come in which order; this module
turns that into I/O. For each shuffle window it sorts the window's samples and
cuts them into *runs*: consecutive records of one shard, at most ``max_run``
long (a block, mostly). A run is read with one sequential read and decoded in
one tight loop the first time one of its samples is due, so the first sample
arrives after one run, not one window; the reader is told the window's runs
and the next window's ahead, in the order they will be read (the kernel reads
a local shard ahead; a remote reader keeps a few ranges downloading in that
order). Memory is at most one window of records; no syscall is made per
sample. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from shardio.backends import ShardFileReader
from shardio.manifest import Manifest
from shardio.plan import IndexArray
from shardio.record import decode_frames

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

    def prefetch(self, shards: Iterable[int]) -> None: ...


def window_runs(unique: IndexArray, firsts: IndexArray, max_run: int) -> list[Run]:
    """Runs covering the sorted, unique global ``indices``, in order, each at most ``max_run``."""
    if len(unique) == 0:
        return []
    shards = np.searchsorted(firsts, unique, side="right") - 1
    breaks = np.flatnonzero((np.diff(unique) != 1) | (np.diff(shards) != 0)) + 1
    lo = np.concatenate(([0], breaks)).tolist()
    hi = np.concatenate((breaks, [len(unique)])).tolist()
    runs = []
    for a, b in zip(lo, hi, strict=True):
        shard = int(shards[a])
        first = int(unique[a]) - int(firsts[shard])
        for start in range(first, first + (b - a), max_run):
            runs.append((shard, start, min(start + max_run, first + (b - a))))
    return runs


def iter_samples(
    reader: RunReader,
    order: IndexArray,
    *,
    window: int,
    max_run: int,
    skip: int = 0,
    zero_copy: bool = False,
) -> Iterator[dict[str, Any]]:
    """Yield the decoded samples of ``order[skip:]``, each with its ``__index__``.

    Args:
        reader: the open dataset; shards are opened once and kept until it closes.
        order: global sample indices in yield order (from ``shardio.plan``).
        window: samples per read group: the plan's shuffle window.
        max_run: most records per read: the plan's block size.
        skip: samples of ``order`` already consumed (exact resume).
        zero_copy: large bytes values as views of the blocks read (see ``decode_frames``).
    """
    firsts = np.asarray([s.first_index for s in reader.manifest.shards], dtype=np.int64)
    starts = list(range(skip - skip % window, len(order), window))
    if not starts:
        return
    current = _plan_window(order, starts[0], max(starts[0], skip), window, firsts, max_run)
    advise(reader, current.due)
    for w_lo in starts:
        upcoming = _plan_window(order, w_lo + window, w_lo + window, window, firsts, max_run)
        advise(reader, upcoming.due)
        runs, ranks = current.runs, current.ranks
        lengths = [stop - start for _shard, start, stop in runs]
        run_of = np.repeat(np.arange(len(runs)), lengths).tolist()
        run_base = np.concatenate(([0], np.cumsum(lengths)[:-1])).tolist() if runs else []
        decoded: list[list[dict[str, Any]] | None] = [None] * len(runs)
        for rank in ranks.tolist():
            r = run_of[rank]
            samples = decoded[r]
            if samples is None:
                samples = decoded[r] = read_run(reader, runs[r], firsts, zero_copy)
            yield samples[rank - run_base[r]]
        current = upcoming


@dataclass(frozen=True)
class _Window:
    """One window's runs, the rank in its sorted samples of each sample to yield, and the
    runs in the order they will be read (when their first sample is due)."""

    runs: list[Run]
    ranks: IndexArray
    due: list[Run]


def _plan_window(order: IndexArray, w_lo: int, first: int, window: int, firsts: IndexArray,
                 max_run: int) -> _Window:
    """The window of ``order`` starting at ``w_lo``, yielded from position ``first`` on."""
    unique = np.unique(order[w_lo : w_lo + window])
    runs = window_runs(unique, firsts, max_run)
    ranks = np.searchsorted(unique, order[first : w_lo + window])
    if not runs or len(ranks) == 0:
        return _Window(runs, ranks, [])
    lengths = [stop - start for _shard, start, stop in runs]
    run_of = np.repeat(np.arange(len(runs)), lengths)[ranks]
    _values, first_due = np.unique(run_of, return_index=True)
    return _Window(runs, ranks, [runs[r] for r in run_of[np.sort(first_due)].tolist()])


def read_run(
    reader: RunReader, run: Run, firsts: IndexArray, zero_copy: bool = False
) -> list[dict[str, Any]]:
    """Read and decode one run of records."""
    shard, start, stop = run
    shard_reader = reader.shard(shard)
    return decode_frames(
        shard_reader.read_frames(start, stop),
        path=shard_reader.path,
        first_record=start,
        offset_of=shard_reader.offset,
        verify=reader.verify,
        first_index=int(firsts[shard]) + start,
        zero_copy=zero_copy,
        keys=shard_reader.keys(),
    )


def advise(reader: RunReader, runs: list[Run]) -> None:
    """Start reading ``runs`` (in this order) while earlier samples are decoded and used."""
    reader.prefetch(dict.fromkeys(shard for shard, _start, _stop in runs))
    for shard, start, stop in runs:
        reader.shard(shard).will_need(start, stop)
