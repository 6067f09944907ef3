"""Read a planned order of samples window by window, with one read per contiguous run.

The plan (``shardio.plan``) says which samples come in which order; this module
turns that into I/O. For each shuffle window it sorts the window's samples,
cuts them into runs of consecutive records of one shard (whole blocks, mostly),
reads each run with one sequential read, and then hands the samples out in the
planned order. Memory is one window of records; no syscall is made per sample.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from shardio.plan import IndexArray
from shardio.reader import DatasetReader
from shardio.record import decode_frames


def window_runs(indices: IndexArray, firsts: IndexArray) -> list[tuple[int, int, int]]:
    """``(shard, first record, stop record)`` runs covering the unique ``indices``."""
    unique = np.unique(indices)
    if len(unique) == 0:
        return []
    shards = np.searchsorted(firsts, unique, side="right") - 1
    breaks = np.flatnonzero((np.diff(unique) != 1) | (np.diff(shards) != 0)) + 1
    lo = np.concatenate(([0], breaks))
    hi = np.concatenate((breaks, [len(unique)]))
    runs = []
    for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
        shard = int(shards[a])
        base = int(firsts[shard])
        runs.append((shard, int(unique[a]) - base, int(unique[b - 1]) - base + 1))
    return runs


def iter_samples(
    reader: DatasetReader, order: IndexArray, *, window: int, skip: int = 0
) -> Iterator[dict[str, Any]]:
    """Yield the decoded samples of ``order[skip:]``, each with its ``__index__``.

    Args:
        reader: the open dataset; shards are opened once and kept until it closes.
        order: global sample indices in yield order (from ``shardio.plan``).
        window: samples per read group: the plan's shuffle window.
        skip: samples of ``order`` already consumed (exact resume).
    """
    firsts = np.asarray([s.first_index for s in reader.manifest.shards], dtype=np.int64)
    starts = range(skip - skip % window, len(order), window)
    runs = window_runs(order[starts[0] : starts[0] + window], firsts) if starts else []
    advise(reader, runs)
    for w_lo in starts:
        indices = order[w_lo : w_lo + window]
        upcoming = window_runs(order[w_lo + window : w_lo + 2 * window], firsts)
        advise(reader, upcoming)
        decoded: list[dict[str, Any]] = []
        for shard, start, stop in runs:
            shard_reader = reader.shard(shard)
            decoded += decode_frames(
                shard_reader.read_frames(start, stop),
                path=shard_reader.path,
                first_record=start,
                offset_of=shard_reader.offset,
                verify=reader.verify,
                first_index=int(firsts[shard]) + start,
            )
        # runs cover the window's unique indices in sorted order, so ``decoded`` lines up
        # with ``np.unique(indices)``; look each planned index up by its rank there
        unique = np.unique(indices)
        ranks = np.searchsorted(unique, indices[max(skip - w_lo, 0) :])
        for rank in ranks.tolist():
            yield decoded[rank]
        runs = upcoming


def advise(reader: DatasetReader, runs: list[tuple[int, int, int]]) -> None:
    """Start the kernel reading ``runs`` while the current window is decoded."""
    for shard, start, stop in runs:
        reader.shard(shard).will_need(start, stop)
