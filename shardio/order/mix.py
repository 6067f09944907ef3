"""Mixing datasets, pure: how many samples each source gives an epoch, and which blocks.

A mixture is a list of ``Source`` specs. Each epoch draws ``epoch_size``
samples: sources with ``num_samples`` give exactly that many, the rest is
shared by weight (largest-remainder rounding, ties to the earlier source). A
source asked for more than it holds gives all its samples ``⌊count / size⌋``
times and a draw without replacement for the remainder; one asked for less
gives a draw without replacement. Draws are contiguous stream ranges over the
source's permuted blocks, so reads stay sequential; each sample's chance of
being drawn is exactly ``remainder / size``.

The sources' shards are numbered one after another (source 0's samples first,
then source 1's, …) into one index space, and ``MixConfig.stream_blocks``
gives the epoch's blocks in it, permuted together; ``shardio.order.plan`` splits,
shuffles and resumes that stream exactly as one dataset's. Everything here is
a function of its arguments; it must not import torch or do I/O.
"""

from __future__ import annotations

import itertools
import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass
from fractions import Fraction

import numpy as np

from shardio.format.record import SOURCE_FIELD as SOURCE_FIELD  # reserved there: writers refuse it
from shardio.order.plan import IndexArray, PlanConfig, cut_blocks, seeded_rng

_DRAW = 3  # rng purposes after plan's blocks (0), windows (1) and resume (2)
_MIX = 4


@dataclass(frozen=True)
class Source:
    """One dataset of a mixture: where it is and how much of each epoch it gives.

    Give ``weight`` (a share of what the fixed counts leave; default 1) or
    ``num_samples`` (exactly this many per epoch), not both. ``name`` is what
    its samples' ``__source__`` says (default: the source's index in the list).
    """

    path: str | os.PathLike[str]
    _: KW_ONLY
    weight: float | None = None
    num_samples: int | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        where = f"Source({os.fspath(self.path)!r})"
        if self.weight is not None and self.num_samples is not None:
            raise ValueError(
                f"{where}: got weight={self.weight!r} and num_samples={self.num_samples!r}; "
                "give one: num_samples fixes the source's count per epoch, weight shares "
                "what the fixed counts leave of epoch_size"
            )
        if self.weight is not None and (
            isinstance(self.weight, bool)
            or not isinstance(self.weight, numbers.Real)
            or not math.isfinite(self.weight)
            or self.weight <= 0
        ):
            raise ValueError(
                f"{where}: weight must be a finite number > 0, got {self.weight!r}; "
                "leave a source out of the list to draw nothing from it"
            )
        if self.num_samples is not None and (
            isinstance(self.num_samples, bool)
            or not isinstance(self.num_samples, numbers.Integral)
            or self.num_samples < 1
        ):
            raise ValueError(
                f"{where}: num_samples must be an int >= 1, got {self.num_samples!r}; "
                "leave a source out of the list to draw nothing from it"
            )
        if self.name is not None and not isinstance(self.name, str):
            raise ValueError(f"{where}: name must be a str, got {self.name!r}")


def check_sources(sources: Sequence[object]) -> tuple[Source, ...]:
    """The sources of a mixture, refused when empty, not ``Source``, or badly named.

    Raises:
        ValueError: an empty list, some sources named and others not, or two
            sources with the same name.
        TypeError: an item that is not a ``shardio.Source``.
    """
    if len(sources) == 0:
        raise ValueError(
            "no sources: pass a dataset path, or a non-empty list of "
            "shardio.Source(path, weight=... or num_samples=...)"
        )
    for n, source in enumerate(sources):
        if not isinstance(source, Source):
            raise TypeError(
                f"source {n} is a {type(source).__name__} ({source!r}), not a shardio.Source: "
                f"write shardio.Source({source!r}, weight=1)"
            )
    names = [s.name for s in sources if isinstance(s, Source) and s.name is not None]
    if names and len(names) != len(sources):
        raise ValueError(
            f"{len(names)} of {len(sources)} sources have a name: name every source or none "
            "(__source__ is then each one's index), so that a batch's __source__ is all str or "
            "all int"
        )
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(
            f"source names {twice} are given to several sources; __source__ must tell them "
            "apart: give each a different name"
        )
    return tuple(s for s in sources if isinstance(s, Source))


def source_labels(sources: Sequence[Source]) -> tuple[str | int, ...]:
    """What each source's samples carry as ``__source__``: its name, else its index."""
    return tuple(s.name if s.name is not None else n for n, s in enumerate(sources))


def split_by_weight(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights``, rounded by largest remainder.

    Exact (rational arithmetic), so every process gets the same counts; a tie
    in the remainders goes to the earlier weight.
    """
    shares = [Fraction(w) for w in weights]
    whole = sum(shares, Fraction(0))
    quotas = [total * share / whole for share in shares]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda i: (counts[i] - quotas[i], i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


def resolve_counts(
    sizes: Sequence[int], sources: Sequence[Source], epoch_size: int | None
) -> tuple[int, ...]:
    """Samples each source gives per epoch.

    Args:
        sizes: samples each source holds.
        sources: the specs, in the same order.
        epoch_size: samples per epoch; default: each fixed count plus the
            whole size of each weighted source.

    Raises:
        ValueError: ``epoch_size`` below 1 or below the fixed counts; fixed
            counts that do not fill ``epoch_size`` and no weight to take the
            rest; a source that holds no samples but should give some.
    """
    fixed = sum(s.num_samples or 0 for s in sources)
    weighted = [n for n, s in enumerate(sources) if s.num_samples is None]
    if epoch_size is None:
        epoch_size = fixed + sum(sizes[n] for n in weighted)
    if isinstance(epoch_size, bool) or not isinstance(epoch_size, int) or epoch_size < 1:
        raise ValueError(f"epoch_size must be an int >= 1, got {epoch_size!r}")
    rest = epoch_size - fixed
    if rest < 0:
        raise ValueError(
            f"the sources' num_samples add up to {fixed}, more than epoch_size={epoch_size}: "
            "raise epoch_size or lower num_samples"
        )
    if rest and not weighted:
        raise ValueError(
            f"epoch_size={epoch_size} but the sources' num_samples add up to {fixed} and no "
            f"source has a weight to give the other {rest}: give a source a weight, or leave "
            "epoch_size out"
        )
    counts = [s.num_samples or 0 for s in sources]
    shares = split_by_weight(rest, [sources[n].weight or 1.0 for n in weighted])
    for n, share in zip(weighted, shares, strict=True):
        counts[n] = share
    for n, (count, size) in enumerate(zip(counts, sizes, strict=True)):
        if count and not size:
            raise ValueError(
                f"source {n} ({os.fspath(sources[n].path)!r}) holds no samples but is to give "
                f"{count} per epoch: leave it out of the mixture"
            )
    return tuple(counts)


def cut_range(
    starts: IndexArray, lengths: IndexArray, lo: int, hi: int
) -> tuple[IndexArray, IndexArray]:
    """The pieces ``(start, length)`` of the blocks at stream positions ``lo..hi``.

    ``0 <= lo`` and ``hi - lo`` at most the blocks' total; past the end the
    range wraps to the start once. Blocks cut by the range's ends give a part.
    """
    total = int(lengths.sum())
    spans = [(lo, min(hi, total))] + ([(0, hi - total)] if hi > total else [])
    ends = np.cumsum(lengths)
    begins = ends - lengths
    out_starts, out_lengths = [], []
    for a, b in spans:
        keep = (ends > a) & (begins < b)
        first = np.maximum(begins[keep], a)
        out_starts.append(starts[keep] + (first - begins[keep]))
        out_lengths.append(np.minimum(ends[keep], b) - first)
    return np.concatenate(out_starts), np.concatenate(out_lengths)


@dataclass(frozen=True)
class MixConfig(PlanConfig):
    """A ``PlanConfig`` whose stream draws ``counts[s]`` samples from each source ``s``.

    ``shard_sizes`` lists every source's shards, source after source;
    ``source_shards[s]`` says how many of them are source ``s``'s.
    """

    source_shards: tuple[int, ...] = ()
    counts: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if len(self.source_shards) != len(self.counts) or sum(self.source_shards) != len(
            self.shard_sizes
        ):
            raise ValueError(
                f"a mixture needs one count per source and source_shards adding up to the "
                f"{len(self.shard_sizes)} shards, got {self.source_shards} and {self.counts}"
            )
        if any(c < 0 for c in self.counts):
            raise ValueError(f"counts must be >= 0, got {self.counts}")
        for n, (count, size) in enumerate(zip(self.counts, self.source_sizes, strict=True)):
            if count and not size:
                raise ValueError(f"source {n} holds no samples but is to give {count}")

    @property
    def num_samples(self) -> int:
        """Samples in an epoch: the mixture's ``epoch_size``."""
        return sum(self.counts)

    @property
    def source_sizes(self) -> tuple[int, ...]:
        """Samples each source holds."""
        bounds = np.cumsum((0, *self.source_shards)).tolist()
        return tuple(sum(self.shard_sizes[a:b]) for a, b in itertools.pairwise(bounds))

    def stream_blocks(self, epoch: int) -> tuple[IndexArray, IndexArray]:
        """The blocks drawn from every source for ``epoch``, permuted together."""
        return mix_blocks(self, epoch)


def mix_blocks(config: MixConfig, epoch: int) -> tuple[IndexArray, IndexArray]:
    """``(global start, length)`` of the pieces of ``epoch``'s stream, in stream order.

    Per source: its blocks ``⌊count / size⌋`` times, then a contiguous range
    of ``count % size`` samples at a random offset in its blocks permuted (the
    first ones in stored order with ``shuffle=False``). All pieces are then
    permuted together, so the shuffle windows mix the sources.
    """
    pieces: list[tuple[IndexArray, IndexArray]] = []
    shard, first = 0, 0
    for n, (num_shards, count) in enumerate(zip(config.source_shards, config.counts, strict=True)):
        sizes = config.shard_sizes[shard : shard + num_shards]
        starts, lengths = cut_blocks(sizes, first, config.block_size)
        size = sum(sizes)
        shard, first = shard + num_shards, first + size
        if not count:
            continue
        whole, rest = divmod(count, size)
        pieces += [(starts, lengths)] * whole
        if rest and config.shuffle:
            rng = seeded_rng(config.seed, epoch, _DRAW, n)
            order = rng.permutation(len(starts))
            offset = int(rng.integers(size))
            pieces.append(cut_range(starts[order], lengths[order], offset, offset + rest))
        elif rest:
            pieces.append(cut_range(starts, lengths, 0, rest))
    all_starts = np.concatenate([s for s, _ in pieces]) if pieces else np.zeros(0, np.int64)
    all_lengths = np.concatenate([c for _, c in pieces]) if pieces else np.zeros(0, np.int64)
    if config.shuffle and len(all_starts) > 1:
        order = seeded_rng(config.seed, epoch, _MIX).permutation(len(all_starts))
        all_starts, all_lengths = all_starts[order], all_lengths[order]
    return all_starts, all_lengths
