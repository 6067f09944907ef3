"""Invariants of the pure mixing planner: counts per source, draws, split, determinism, resume."""

from __future__ import annotations

import collections
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio.order.mix import MixConfig, Source, check_sources, resolve_counts, split_by_weight
from shardio.order.plan import (
    Progress,
    Split,
    epoch_samples,
    plan_epoch,
    plan_resume,
    samples_per_rank,
)

source_shards = st.lists(st.integers(0, 30), min_size=1, max_size=3).filter(lambda s: sum(s) > 0)
specs = st.one_of(
    st.builds(lambda w: {"weight": w}, st.integers(1, 5)),
    st.builds(lambda k: {"num_samples": k}, st.integers(1, 90)),
    st.just({}),
)


@st.composite
def mixtures(draw: st.DrawFn) -> MixConfig:
    """A MixConfig over 1-3 sources with weights, fixed counts or defaults, and an epoch size."""
    shards = draw(st.lists(source_shards, min_size=1, max_size=3))
    sources = [Source(f"s{n}", **draw(specs)) for n in range(len(shards))]
    fixed = sum(s.num_samples or 0 for s in sources)
    weighted = any(s.num_samples is None for s in sources)
    epoch_size = draw(st.one_of(st.none(), st.integers(max(fixed, 1), fixed + 150)))
    if not weighted:
        epoch_size = None
    counts = resolve_counts([sum(s) for s in shards], sources, epoch_size)
    return MixConfig(
        shard_sizes=tuple(n for s in shards for n in s),
        seed=draw(st.integers(0, 2**32 - 1)),
        shuffle=draw(st.booleans()),
        block_size=draw(st.integers(1, 12)),
        window=draw(st.integers(1, 40)),
        drop_last=draw(st.booleans()),
        source_shards=tuple(len(s) for s in shards),
        counts=counts,
    )


def source_of(config: MixConfig, index: int) -> int:
    return int(np.searchsorted(np.cumsum(config.source_sizes), index, side="right"))


def stream(config: MixConfig, epoch: int) -> list[int]:
    return epoch_samples(config, epoch, np.arange(config.num_samples, dtype=np.int64)).tolist()


@settings(max_examples=150, deadline=None)
@given(config=mixtures(), epoch=st.integers(0, 4))
def test_each_source_gives_its_count_and_draws_evenly(config: MixConfig, epoch: int) -> None:
    drawn = collections.Counter(stream(config, epoch))
    per_source = collections.Counter()
    for index, times in drawn.items():
        per_source[source_of(config, index)] += times
    assert [per_source[n] for n in range(len(config.counts))] == list(config.counts)
    firsts = np.cumsum((0, *config.source_sizes)).tolist()
    for n, (count, size) in enumerate(zip(config.counts, config.source_sizes, strict=True)):
        times = [drawn[i] for i in range(firsts[n], firsts[n] + size)]
        if count <= size:
            assert max(times, default=0) <= 1  # no repeats unless upsampled
        else:  # repeated whole, then drawn without replacement for the rest
            assert set(times) <= {count // size, -(-count // size)}


@settings(max_examples=100, deadline=None)
@given(config=mixtures(), epoch=st.integers(0, 4), world=st.integers(1, 3),
       workers=st.integers(1, 3))
def test_ranks_and_workers_take_the_stream_once(
    config: MixConfig, epoch: int, world: int, workers: int
) -> None:
    orders = [
        [i for k in range(workers) for i in plan_epoch(config, epoch, Split(r, world, k, workers))]
        for r in range(world)
    ]
    per_rank = samples_per_rank(config.num_samples, world, config.drop_last)
    assert all(len(o) == per_rank for o in orders)
    got = collections.Counter(i for o in orders for i in o)
    whole = collections.Counter(stream(config, epoch))
    if config.drop_last:
        assert not got - whole  # a sub-multiset: nothing beyond the draws
    else:
        assert not whole - got  # every draw, plus at most world - 1 of padding
        assert sum((got - whole).values()) == per_rank * world - config.num_samples


@settings(max_examples=60, deadline=None)
@given(config=mixtures(), epoch=st.integers(0, 3))
def test_same_seed_same_order(config: MixConfig, epoch: int) -> None:
    split = Split(0, 1)
    assert np.array_equal(plan_epoch(config, epoch, split), plan_epoch(config, epoch, split))


@settings(max_examples=60, deadline=None)
@given(config=mixtures().filter(lambda c: not c.drop_last), epoch=st.integers(0, 3),
       new_world=st.integers(1, 3), new_workers=st.integers(1, 3), data=st.data())
def test_resume_yields_the_rest_exactly(
    config: MixConfig, epoch: int, new_world: int, new_workers: int, data: st.DataObject
) -> None:
    full = plan_epoch(config, epoch, Split(0, 1))
    done = data.draw(st.integers(0, len(full)))
    progress = Progress(epoch, 1, 1, {0: (done,)})
    assert np.array_equal(plan_resume(config, progress, Split(0, 1)), full[done:])
    rest = [
        i
        for r in range(new_world)
        for k in range(new_workers)
        for i in plan_resume(config, progress, Split(r, new_world, k, new_workers))
    ]
    unseen = collections.Counter(full[done:].tolist())
    got = collections.Counter(rest)
    assert not unseen - got  # every draw not yet yielded, a repeated sample as often as drawn
    assert sum((got - unseen).values()) < new_world  # plus padding across ranks only


def test_epochs_and_seeds_change_the_draw() -> None:
    config = MixConfig(shard_sizes=(300, 200, 40), seed=5, block_size=8, window=64,
                       source_shards=(2, 1), counts=(150, 90))
    first = plan_epoch(config, 0, Split())
    assert not np.array_equal(first, plan_epoch(config, 1, Split()))
    assert set(first.tolist()) != set(plan_epoch(config, 1, Split()).tolist())  # other draws
    other = MixConfig(shard_sizes=(300, 200, 40), seed=6, block_size=8, window=64,
                      source_shards=(2, 1), counts=(150, 90))
    assert not np.array_equal(first, plan_epoch(other, 0, Split()))


def test_a_draw_reads_whole_blocks() -> None:
    config = MixConfig(shard_sizes=(1000,), seed=1, block_size=50, window=200,
                       source_shards=(1,), counts=(300,))
    per_block = collections.Counter(i // 50 for i in stream(config, 0))
    # one contiguous range over the permuted blocks: whole blocks, and a cut one at each end
    assert sum(per_block.values()) == 300
    assert sum(1 for n in per_block.values() if n < 50) <= 2
    assert len(per_block) <= 300 // 50 + 1


@settings(max_examples=200, deadline=None)
@given(total=st.integers(0, 10_000),
       weights=st.lists(st.floats(0.01, 100, allow_nan=False), min_size=1, max_size=6))
def test_split_by_weight_is_largest_remainder(total: int, weights: list[float]) -> None:
    counts = split_by_weight(total, weights)
    assert sum(counts) == total
    whole = sum(Fraction(w) for w in weights)
    quotas = [total * Fraction(w) / whole for w in weights]
    assert all(q - 1 < c < q + 1 for c, q in zip(counts, quotas, strict=True))


def test_counts_weights_fixed_and_default_epoch_size() -> None:
    a, b = Source("a", weight=3), Source("b", weight=1)
    assert resolve_counts([1000, 100], [a, b], 400) == (300, 100)
    assert resolve_counts([1000, 100], [a, b], None) == (825, 275)  # default: 1,100 in all
    assert resolve_counts([1000], [Source("a", num_samples=10)], None) == (10,)
    # fixed counts first, weights share the rest
    with_fixed = [a, b, Source("c", num_samples=40)]
    assert resolve_counts([1000, 100, 50], with_fixed, 440) == (300, 100, 40)
    assert split_by_weight(10, [1, 1, 1]) == [4, 3, 3]  # ties go to the earlier source


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Source("a", weight=0), "weight must be a finite number > 0, got 0"),
        (lambda: Source("a", weight=-2.5), "got -2.5"),
        (lambda: Source("a", weight=float("nan")), "got nan"),
        (lambda: Source("a", weight=2, num_samples=5), "give one"),
        (lambda: Source("a", num_samples=0), "num_samples must be an int >= 1, got 0"),
        (lambda: check_sources([]), "no sources"),
        (lambda: check_sources([Source("a", name="x"), Source("b", name="x")]), "'x'"),
        (lambda: check_sources([Source("a", name="x"), Source("b")]), "name every source or none"),
        (lambda: resolve_counts([10, 10], [Source("a", num_samples=30), Source("b")], 20),
         "add up to 30, more than epoch_size=20"),
        (lambda: resolve_counts([10], [Source("a", num_samples=5)], 8), "no source has a weight"),
        (lambda: resolve_counts([0, 10], [Source("a"), Source("b")], 8), "holds no samples"),
        (lambda: resolve_counts([10], [Source("a")], 0), "epoch_size must be an int >= 1"),
    ],
)
def test_bad_specs_say_what_to_do(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        make()  # type: ignore[operator]


def test_a_path_where_a_source_belongs_names_the_fix() -> None:
    with pytest.raises(TypeError, match=r"shardio.Source\('data/a', weight=1\)"):
        check_sources([Source("b"), "data/a"])
