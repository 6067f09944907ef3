"""Pure epoch planning: which global samples a (rank, worker) yields, in which order.

Everything here is a function of its arguments alone (no I/O, no torch, no
global state), so every process computes the same plan without talking to the
others, and a resumed run recomputes exactly the order it was interrupted in.

The plan for an epoch:

1. Each shard is cut into *blocks* of ``block_size`` consecutive records; the
   blocks of all shards are permuted with ``(seed, epoch)``. Concatenated, they
   form the epoch's global *stream*. Blocks are a few MB, so reading a block is
   one sequential read, and mixing does not depend on the number of shards.
   (A mixture of datasets, ``shardio.order.mix.MixConfig``, draws its stream's
   blocks from each source; everything below is the same for it.)
2. The stream is split into ``world_size`` contiguous, equal parts (the tail
   padded by wrapping around to the stream's start, or dropped with
   ``drop_last``).
3. A part is cut into *windows* of ``window`` samples (the shuffle buffer);
   each window is permuted with ``(seed, epoch, rank, worker, n)``. A window
   holds about ``window / block_size`` blocks from random places in the
   dataset, which is what mixes classes within a batch. With a ``head`` (a pack
   shuffled when written, whose blocks are mixed already), the first window is
   shuffled in growing parts (``head`` samples, twice as many, the rest:
   ``head_first``), so that the first batch waits for a few blocks' reads, not
   one of every block of the window.
4. The rank's samples go to its ``num_workers`` DataLoader workers in one of
   two ways. *By batches* (``interleave_batches``): the rank's order is planned
   as one worker's, and worker ``k`` takes its batches ``k, k + W, k + 2W, …``;
   a DataLoader takes one batch from each worker in turn, so it delivers the
   rank's order itself, every batch full but the last, and a position in that
   order is all a resume needs. So that each worker reads whole blocks, not a
   scattered ``1/W`` of every block, the rank's windows are arranged in
   ``lanes`` (``W`` by default, ``Split.lanes``): batch ``k`` draws from lane
   ``k % lanes``, a contiguous ``1/lanes`` of the window's stream positions,
   shuffled on its own. A window still holds the same samples; only which
   batch of the window a sample lands in depends on ``lanes``, and a resume
   keeps the lanes its epoch started with. *By samples*
   (``plan_epoch`` with a worker split): each worker takes a contiguous part
   that differs from the others by at most one sample and shuffles it in its
   own windows; reads stay more sequential, but each worker's last batch may
   be short and the DataLoader's order depends on ``W``.

With ``shuffle=False`` neither blocks nor windows are permuted.

Steps 2-4 and resuming work on *positions* in the stream, mapped to sample
indices last: in a mixture a sample can occur at several positions (a source
upsampled), and what an interrupted epoch has yielded is a set of positions.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.random  # numpy loads it on first use: see below
import numpy.typing as npt

# ``numpy.random`` is imported here, not on the first ``seeded_rng`` call: every epoch's
# plan needs it, the import took 5.7 ms, and DataLoader workers forked before the main
# process planned an epoch each paid it again

IndexArray = npt.NDArray[np.int64]

HEAD_GROWTH = 2
"""The first window's second part is this many times its head (``head_first``)."""

_BLOCKS = 0
_WINDOWS = 1
_RESUME = 2


@dataclass(frozen=True)
class PlanConfig:
    """Everything that determines an epoch's order, except the epoch number and the split."""

    shard_sizes: tuple[int, ...]
    seed: int = 0
    shuffle: bool = True
    block_size: int = 128
    window: int = 16384
    drop_last: bool = False
    head: int = 0
    """Samples the first window yields first (``head_first``); 0: it is shuffled whole.
    Worth it where consecutive records are already mixed: a pack shuffled when written."""

    def __post_init__(self) -> None:
        if self.head < 0:
            raise ValueError(f"head must be >= 0, got {self.head}")
        if self.block_size < 1 or self.window < 1:
            raise ValueError(
                f"block_size and window must be >= 1, got {self.block_size}, {self.window}"
            )
        if any(n < 0 for n in self.shard_sizes):
            raise ValueError("shard sizes must be non-negative")

    @property
    def num_samples(self) -> int:
        """Samples in an epoch's stream: the dataset's (a mixture's ``epoch_size``)."""
        return sum(self.shard_sizes)

    def stream_blocks(self, epoch: int) -> tuple[IndexArray, IndexArray]:
        """``(global start, length)`` of the blocks of ``epoch``'s stream, in stream order."""
        return epoch_blocks(self, epoch)


@dataclass(frozen=True)
class Split:
    """Where a reader sits: its rank among ``world_size`` and worker among ``num_workers``.

    ``lanes`` and ``batch`` arrange each shuffle window of this split's order for
    workers that take it in whole batches of ``batch`` in turn (``shuffle_windows``);
    ``lanes=1`` is a plain shuffle.
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1
    lanes: int = 1
    batch: int = 1

    def __post_init__(self) -> None:
        if not (0 <= self.rank < self.world_size and 0 <= self.worker < self.num_workers):
            raise ValueError(f"invalid split {self}")
        if self.lanes < 1 or self.batch < 1:
            raise ValueError(f"lanes and batch must be >= 1, got {self.lanes}, {self.batch}")


def whole_blocks(block_size: int, block_records: int | None) -> int:
    """``block_size`` rounded to a multiple of the dataset's ``block_records`` (format v3:
    records a stored block), so that each block of the plan is whole stored blocks, each
    read, checked and inflated once an epoch; as it is where that is not known."""
    if block_records is None:
        return block_size
    return block_records * max(1, round(block_size / block_records))


def seeded_rng(*words: int) -> np.random.Generator:
    """A generator that is a pure function of ``words`` (seed, epoch, purpose, …)."""
    return np.random.default_rng(np.random.SeedSequence([w & 0xFFFFFFFF for w in words]))


def cut_blocks(
    shard_sizes: tuple[int, ...], first: int, block_size: int
) -> tuple[IndexArray, IndexArray]:
    """``(global start, length)`` of the blocks of shards holding samples ``first, first + 1, …``.

    A block never crosses a shard's end, so it is one sequential read.
    """
    ends = first + np.cumsum(shard_sizes, dtype=np.int64)
    starts = [
        np.arange(end - size, end, block_size, dtype=np.int64)
        for size, end in zip(shard_sizes, ends.tolist(), strict=True)
    ]
    block_starts = np.concatenate(starts) if starts else np.zeros(0, np.int64)
    shard_ends = np.repeat(ends, [len(s) for s in starts])
    lengths = np.minimum(block_starts + block_size, shard_ends) - block_starts
    return block_starts, lengths.astype(np.int64)


def epoch_blocks(config: PlanConfig, epoch: int) -> tuple[IndexArray, IndexArray]:
    """``(global start, length)`` of every block, in the epoch's stream order."""
    block_starts, lengths = cut_blocks(config.shard_sizes, 0, config.block_size)
    if config.shuffle and len(block_starts) > 1:
        order = seeded_rng(config.seed, epoch, _BLOCKS).permutation(len(block_starts))
        block_starts, lengths = block_starts[order], lengths[order]
    return block_starts, lengths


def stream_positions(total: int, lo: int, hi: int) -> IndexArray:
    """Positions ``lo..hi`` in a stream of ``total`` samples, wrapping past the end (padding)."""
    if hi <= lo:
        return np.zeros(0, np.int64)
    if total == 0:
        raise ValueError("cannot plan an epoch over an empty dataset")
    return np.arange(lo, hi, dtype=np.int64) % total


def stream_samples(starts: IndexArray, lengths: IndexArray, positions: IndexArray) -> IndexArray:
    """Global sample indices at stream ``positions`` (each below the stream's length)."""
    ends = np.cumsum(lengths)
    block = np.searchsorted(ends, positions, side="right")
    samples: IndexArray = starts[block] + (positions - (ends[block] - lengths[block]))
    return samples


def epoch_samples(config: PlanConfig, epoch: int, positions: IndexArray) -> IndexArray:
    """Global sample indices at ``positions`` of ``epoch``'s stream."""
    starts, lengths = config.stream_blocks(epoch)
    return stream_samples(starts, lengths, positions)


def samples_per_rank(num_samples: int, world_size: int, drop_last: bool) -> int:
    """Samples every rank yields per epoch: equal on all ranks, so DDP never hangs."""
    if drop_last:
        return num_samples // world_size
    return -(-num_samples // world_size)


def worker_range(count: int, worker: int, num_workers: int) -> tuple[int, int]:
    """The contiguous part ``[lo, hi)`` of ``count`` items that ``worker`` takes."""
    return count * worker // num_workers, count * (worker + 1) // num_workers


def shuffle_windows(
    order: IndexArray, config: PlanConfig, epoch: int, split: Split, salt: int = 0
) -> IndexArray:
    """Permute ``order`` within consecutive windows of ``config.window`` samples.

    With ``split.lanes > 1`` each window is arranged in lanes (``arrange_lanes``).
    """
    if not config.shuffle or len(order) < 2:
        return order
    out = order.copy()
    for n, lo in enumerate(range(0, len(order), config.window)):
        rng = seeded_rng(config.seed, epoch, _WINDOWS, split.rank, split.worker, n, salt)
        window = out[lo : lo + config.window]
        head = config.head if n == 0 else 0
        if split.lanes > 1:
            out[lo : lo + config.window] = arrange_lanes(window, lo, split.lanes, split.batch, rng,
                                                         head)
        else:
            out[lo : lo + config.window] = window[head_first(len(window), head, rng)]
    return out


def head_first(count: int, head: int, rng: np.random.Generator) -> IndexArray:
    """A permutation of ``range(count)`` in three parts, each shuffled on its own: the first
    ``head`` items, the next ``HEAD_GROWTH * head``, the rest. A window's items are in
    stream order (whole blocks), so its first ``b`` samples need about ``b / head`` blocks
    read for a batch up to ``3 * head`` (the batch size is not known here), not one of
    every block of the window.

    What it buys, streaming ``bench_remote``'s quick images from s3rver (20 ms a request,
    100 MB/s) with a budget that fits: the first batch after 1.2 s instead of 2.2 with 0
    workers (``python -m benchmarks.bench_remote --quick``, ``benchmarks/results/
    remote-quick.json``, the run before: ``git show f7be519:`` of that file). Its cost is
    a first batch drawn from a few blocks: nothing where the pack shuffled its records
    (the dataset sets ``head`` only there); on a class-ordered pack whose every sample is in
    the first window, per-batch class entropy fell to 0.93-0.96 of a full shuffle's
    (``shuffle quality`` of ``shardio-records-unshuffled`` in
    ``benchmarks/results/quick-shapes-head-on-every-pack.json``, a quick harness run with a
    head on every pack), which is why such a pack gets none.
    """
    if head <= 0 or head >= count:
        return rng.permutation(count)
    cuts = [0, head, min(count, head * (1 + HEAD_GROWTH)), count]
    return np.concatenate([lo + rng.permutation(hi - lo)
                           for lo, hi in itertools.pairwise(cuts) if hi > lo])


def arrange_lanes(
    window: IndexArray, first: int, lanes: int, batch: int, rng: np.random.Generator,
    head: int = 0,
) -> IndexArray:
    """``window`` (order positions ``first, …``) shuffled so batch ``k`` draws from lane k % lanes.

    The window's items, in the order given (stream order: whole blocks), are cut
    into ``lanes`` contiguous parts, one per lane, each as large as that lane's
    slots in the window; each part is permuted and fills its lane's slots. The
    worker that takes batches ``k ≡ j (mod lanes)`` so reads whole blocks of
    ``1/lanes`` of the window instead of a scattered share of all of them. ``head``: each
    lane yields the first ``head`` items of its part first (``head_first``).
    """
    lane = (np.arange(first, first + len(window), dtype=np.int64) // batch) % lanes
    counts = np.bincount(lane, minlength=lanes)
    starts = np.cumsum(counts) - counts
    picks = np.concatenate([
        s + head_first(c, head, rng) for s, c in zip(starts.tolist(), counts.tolist(), strict=True)
    ])
    out = np.empty_like(window)
    out[np.argsort(lane, kind="stable")] = window[picks]
    return out


def epoch_positions(config: PlanConfig, epoch: int, split: Split) -> IndexArray:
    """Stream positions that ``split`` yields in ``epoch``, in yield order."""
    per_rank = samples_per_rank(config.num_samples, split.world_size, config.drop_last)
    w_lo, w_hi = worker_range(per_rank, split.worker, split.num_workers)
    base = split.rank * per_rank
    positions = stream_positions(config.num_samples, base + w_lo, base + w_hi)
    return shuffle_windows(positions, config, epoch, split)


def plan_epoch(config: PlanConfig, epoch: int, split: Split) -> IndexArray:
    """Global sample indices that ``split`` yields in ``epoch``, in yield order."""
    return epoch_samples(config, epoch, epoch_positions(config, epoch, split))


@dataclass(frozen=True)
class Progress:
    """How far an interrupted epoch got: samples consumed per (rank, worker) of its split.

    A rank whose workers split its order by batches (``interleave_batches``)
    records one count, its position in that order, as ``num_workers=1``.

    ``prior`` is set when that epoch was itself resumed under another split:
    its order then came from ``plan_resume(config, prior, split)``. ``lanes``
    and ``batch`` are the ``Split``'s that arranged the epoch's order.
    """

    epoch: int
    world_size: int
    num_workers: int
    consumed: Mapping[int, tuple[int, ...]]
    """``consumed[rank][worker]``: samples that worker of that rank had yielded."""
    prior: Progress | None = None
    lanes: int = 1
    batch: int = 1

    def split(self, rank: int, worker: int = 0) -> Split:
        """The split whose order ``consumed[rank][worker]`` counts in."""
        return Split(rank, self.world_size, worker, self.num_workers, self.lanes, self.batch)

    def __post_init__(self) -> None:
        if self.epoch < 0 or self.world_size < 1 or self.num_workers < 1:
            raise ValueError(
                f"a state's epoch must be >= 0 and its world size and worker count >= 1, got "
                f"{self.epoch}, {self.world_size}, {self.num_workers}")
        if self.lanes < 1 or self.batch < 1:
            raise ValueError(
                f"a state's lanes and batch must be >= 1, got {self.lanes}, {self.batch}: the "
                "state was not written by shardio's state_dict(); resume from one that was"
            )
        for rank, counts in self.consumed.items():
            if (not 0 <= rank < self.world_size or len(counts) != self.num_workers
                    or any(count < 0 for count in counts)):
                raise ValueError(
                    f"consumed[{rank}] must list {self.num_workers} worker counts, none "
                    f"negative, for a rank below {self.world_size}, got {counts}"
                )

    @property
    def complete(self) -> bool:
        """Whether every rank's counts are known (needed to resume under another split)."""
        return len(self.consumed) == self.world_size


def stage_positions(
    config: PlanConfig, epoch: int, split: Split, prior: Progress | None
) -> IndexArray:
    """The stream positions ``split`` yields in ``epoch``: fresh, or re-planned after ``prior``."""
    if prior is None:
        return epoch_positions(config, epoch, split)
    return resume_positions(config, prior, split)


def stage_order(config: PlanConfig, epoch: int, split: Split, prior: Progress | None) -> IndexArray:
    """The full order of ``split`` in ``epoch``: fresh, or re-planned after ``prior``."""
    return epoch_samples(config, epoch, stage_positions(config, epoch, split, prior))


def seen_mask(config: PlanConfig, progress: Progress) -> npt.NDArray[np.bool_]:
    """Which stream positions an interrupted epoch had already yielded (on any rank)."""
    if not progress.complete:
        raise ValueError(
            f"resuming under another world size needs every rank's progress; got ranks "
            f"{sorted(progress.consumed)} of {progress.world_size}. Gather the ranks' states "
            "and merge them with shardio.merge_states"
        )
    seen = (
        seen_mask(config, progress.prior)
        if progress.prior is not None
        else np.zeros(config.num_samples, dtype=bool)
    )
    for rank, counts in progress.consumed.items():
        for worker, count in enumerate(counts):
            split = progress.split(rank, worker)
            seen[stage_positions(config, progress.epoch, split, progress.prior)[:count]] = True
    return seen


def same_split(progress: Progress, split: Split) -> bool:
    """Whether ``progress`` was made under the same world size and worker count as ``split``."""
    return (progress.world_size, progress.num_workers) == (split.world_size, split.num_workers)


def resume_positions(config: PlanConfig, progress: Progress, split: Split) -> IndexArray:
    """The stream positions of ``plan_resume``, in yield order."""
    if same_split(progress, split) and split.rank in progress.consumed:
        done = progress.consumed[split.rank][split.worker]
        own = progress.split(split.rank, split.worker)  # the lanes the epoch was arranged in
        return stage_positions(config, progress.epoch, own, progress.prior)[done:]
    remaining = np.flatnonzero(~seen_mask(config, progress)).astype(np.int64)
    if len(remaining) == 0:
        return remaining
    per_rank = samples_per_rank(len(remaining), split.world_size, config.drop_last)
    w_lo, w_hi = worker_range(per_rank, split.worker, split.num_workers)
    base = split.rank * per_rank
    picked = remaining[stream_positions(len(remaining), base + w_lo, base + w_hi)]
    return shuffle_windows(picked, config, progress.epoch, split, salt=_RESUME)


def plan_resume(config: PlanConfig, progress: Progress, split: Split) -> IndexArray:
    """Order for ``split`` over the samples an interrupted epoch had not yet yielded.

    With the same world size and worker count this is exactly the tail of the
    uninterrupted order (arranged in the lanes it was). Otherwise the unseen
    positions keep their stream order, are split again over the new ranks and
    workers (equal per rank, padded or dropped like a fresh epoch) and shuffled
    within windows again (in ``split``'s lanes), so each not-yet-seen sample
    arrives exactly once (plus padding).
    """
    return epoch_samples(config, progress.epoch, resume_positions(config, progress, split))


def interleave_batches(
    order: IndexArray, batch_size: int, worker: int, num_workers: int
) -> IndexArray:
    """Worker ``worker``'s share of ``order``: its batches ``worker, worker + W, …``.

    A DataLoader over an iterable dataset takes one batch from each worker in
    turn (0, 1, …, W-1, 0, …, skipping workers that ran out), so with this split
    it delivers ``order`` itself, cut into batches of ``batch_size``: only the
    last batch can be short, and ``len(order) / batch_size`` rounded up is the
    number of batches whatever ``num_workers`` is. An order arranged in
    ``num_workers`` lanes of ``batch_size`` (``arrange_lanes``) gives each worker
    one lane of each window.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not 0 <= worker < num_workers:
        raise ValueError(f"worker {worker} is not one of {num_workers} workers")
    firsts = np.arange(worker * batch_size, len(order), num_workers * batch_size, dtype=np.int64)
    positions = (firsts[:, None] + np.arange(batch_size, dtype=np.int64)).ravel()
    share: IndexArray = order[positions[positions < len(order)]]
    return share


def batch_span(
    count: int, batch_size: int, worker: int, num_workers: int, batch: int
) -> tuple[int, int]:
    """Positions ``[lo, hi)`` in the interleaved order of ``worker``'s ``batch``-th batch."""
    lo = (worker + batch * num_workers) * batch_size
    return min(lo, count), min(lo + batch_size, count)
