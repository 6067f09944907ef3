"""Invariants of the pure epoch plan: coverage, balance, determinism, epochs, exact resume."""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio.order.plan import (
    HEAD_GROWTH,
    PlanConfig,
    Progress,
    Split,
    batch_span,
    interleave_batches,
    plan_epoch,
    plan_resume,
    samples_per_rank,
)

shard_lists = st.lists(st.integers(min_value=0, max_value=60), min_size=1, max_size=6).filter(
    lambda sizes: sum(sizes) > 0
)
configs = st.builds(
    PlanConfig,
    shard_sizes=shard_lists.map(tuple),
    seed=st.integers(0, 2**32 - 1),
    shuffle=st.booleans(),
    block_size=st.integers(1, 16),
    window=st.integers(1, 40),
    drop_last=st.booleans(),
)


def rank_orders(config: PlanConfig, epoch: int, world: int, workers: int) -> list[list[int]]:
    return [
        [i for k in range(workers) for i in plan_epoch(config, epoch, Split(r, world, k, workers))]
        for r in range(world)
    ]


@settings(max_examples=150, deadline=None)
@given(config=configs, epoch=st.integers(0, 5), world=st.integers(1, 4), workers=st.integers(1, 4))
def test_ranks_equal_and_cover_the_dataset(
    config: PlanConfig, epoch: int, world: int, workers: int
) -> None:
    orders = rank_orders(config, epoch, world, workers)
    n = config.num_samples
    per_rank = samples_per_rank(n, world, config.drop_last)
    assert all(len(o) == per_rank for o in orders)
    counts = collections.Counter(i for o in orders for i in o)
    assert all(0 <= i < n for i in counts)
    if config.drop_last:
        assert max(counts.values(), default=1) == 1
        assert len(counts) == per_rank * world
    else:
        assert set(counts) == set(range(n))
        assert max(counts.values()) - min(counts.values()) <= 1  # padding wraps around


@settings(max_examples=100, deadline=None)
@given(config=configs, epoch=st.integers(0, 5), workers=st.integers(1, 5))
def test_one_rank_yields_each_sample_exactly_once(
    config: PlanConfig, epoch: int, workers: int
) -> None:
    order = rank_orders(config, epoch, 1, workers)[0]
    assert sorted(order) == list(range(config.num_samples))


@settings(max_examples=50, deadline=None)
@given(config=configs, epoch=st.integers(0, 5))
def test_same_seed_same_order(config: PlanConfig, epoch: int) -> None:
    split = Split(0, 1, 0, 1)
    assert np.array_equal(plan_epoch(config, epoch, split), plan_epoch(config, epoch, split))


def test_epochs_and_seeds_change_the_order() -> None:
    config = PlanConfig(shard_sizes=(500, 300, 200), seed=7, block_size=8, window=100)
    split = Split()
    first = plan_epoch(config, 0, split)
    assert not np.array_equal(first, plan_epoch(config, 1, split))
    other_seed = PlanConfig(shard_sizes=(500, 300, 200), seed=8, block_size=8, window=100)
    assert not np.array_equal(first, plan_epoch(other_seed, 0, split))


def test_no_shuffle_is_stored_order() -> None:
    config = PlanConfig(shard_sizes=(10, 5, 7), shuffle=False, block_size=3, window=4)
    assert plan_epoch(config, 3, Split()).tolist() == list(range(22))


def test_workers_split_at_sample_granularity() -> None:
    config = PlanConfig(shard_sizes=(1000,), block_size=1000, window=1000)
    sizes = [len(plan_epoch(config, 0, Split(0, 1, k, 3))) for k in range(3)]
    assert sizes == [333, 333, 334]  # one shard, yet no worker idles


@settings(max_examples=60, deadline=None)
@given(
    config=configs,
    epoch=st.integers(0, 3),
    world=st.integers(1, 3),
    workers=st.integers(1, 3),
    data=st.data(),
)
def test_resume_at_any_position_reproduces_the_tail(
    config: PlanConfig, epoch: int, world: int, workers: int, data: st.DataObject
) -> None:
    rank = data.draw(st.integers(0, world - 1))
    full = {k: plan_epoch(config, epoch, Split(rank, world, k, workers)) for k in range(workers)}
    done = tuple(data.draw(st.integers(0, len(full[k]))) for k in range(workers))
    progress = Progress(epoch, world, workers, {rank: done})
    for k in range(workers):
        tail = plan_resume(config, progress, Split(rank, world, k, workers))
        assert np.array_equal(tail, full[k][done[k] :])


@settings(max_examples=60, deadline=None)
@given(
    config=configs.filter(lambda c: not c.drop_last),
    epoch=st.integers(0, 3),
    old_workers=st.integers(1, 4),
    new_workers=st.integers(1, 4),
    new_world=st.integers(1, 3),
    data=st.data(),
)
def test_resume_under_another_split_yields_each_unseen_sample_once(
    config: PlanConfig,
    epoch: int,
    old_workers: int,
    new_workers: int,
    new_world: int,
    data: st.DataObject,
) -> None:
    old = [plan_epoch(config, epoch, Split(0, 1, k, old_workers)) for k in range(old_workers)]
    done = tuple(data.draw(st.integers(0, len(o))) for o in old)
    seen = {int(i) for o, d in zip(old, done, strict=True) for i in o[:d]}
    progress = Progress(epoch, 1, old_workers, {0: done})
    rest = [
        int(i)
        for r in range(new_world)
        for k in range(new_workers)
        for i in plan_resume(config, progress, Split(r, new_world, k, new_workers))
    ]
    unseen = set(range(config.num_samples)) - seen
    assert set(rest) == unseen
    if new_world == 1:
        assert len(rest) == len(unseen)  # exactly once; padding only appears across ranks
    # and the resumed state can itself be resumed again (chained progress)
    again = Progress(
        epoch,
        new_world,
        new_workers,
        {r: (0,) * new_workers for r in range(new_world)},
        prior=progress,
    )
    tail = [
        int(i)
        for r in range(new_world)
        for k in range(new_workers)
        for i in plan_resume(config, again, Split(r, new_world, k, new_workers))
    ]
    assert sorted(tail) == sorted(rest)


def round_robin(shares: list[list[int]], batch_size: int) -> list[list[int]]:
    """What a DataLoader delivers: one batch from each worker in turn, skipping finished ones."""
    batches = [[s[i : i + batch_size] for i in range(0, len(s), batch_size)] for s in shares]
    out = []
    for n in range(max((len(b) for b in batches), default=0)):
        out += [b[n] for b in batches if n < len(b)]
    return out


@settings(max_examples=100, deadline=None)
@given(
    config=configs,
    epoch=st.integers(0, 3),
    world=st.integers(1, 3),
    workers=st.integers(1, 5),
    batch_size=st.integers(1, 20),
    data=st.data(),
)
def test_batches_in_turn_deliver_the_rank_order_whatever_the_workers(
    config: PlanConfig, epoch: int, world: int, workers: int, batch_size: int, data: st.DataObject
) -> None:
    rank = data.draw(st.integers(0, world - 1))
    order = plan_epoch(config, epoch, Split(rank, world))
    start = data.draw(st.integers(0, len(order)))  # a resume point: the rest splits afresh
    rest = order[start:]
    shares = [interleave_batches(rest, batch_size, k, workers).tolist() for k in range(workers)]
    delivered = round_robin(shares, batch_size)
    assert [i for b in delivered for i in b] == rest.tolist()
    assert len(delivered) == -(-len(rest) // batch_size)  # what len(DataLoader) says
    assert all(len(b) == batch_size for b in delivered[:-1])
    for k, share in enumerate(shares):
        for n in range(-(-len(share) // batch_size)):
            lo, hi = batch_span(len(rest), batch_size, k, workers, n)
            assert share[n * batch_size : (n + 1) * batch_size] == rest[lo:hi].tolist()


def test_interleave_batches_refuses_bad_arguments() -> None:
    order = np.arange(10, dtype=np.int64)
    assert interleave_batches(order, 3, 1, 2).tolist() == [3, 4, 5, 9]
    with pytest.raises(ValueError, match="batch_size"):
        interleave_batches(order, 0, 0, 1)
    with pytest.raises(ValueError, match="worker 2"):
        interleave_batches(order, 3, 2, 2)


@settings(max_examples=150, deadline=None)
@given(config=configs.filter(lambda c: c.shuffle), epoch=st.integers(0, 3),
       lanes=st.integers(1, 3), batch=st.integers(1, 8))
def test_the_first_window_yields_its_first_block_first(
    config: PlanConfig, epoch: int, lanes: int, batch: int
) -> None:
    """With a head of one block, an epoch's first ``block_size`` samples (each lane's, with
    lanes) are the first block's of the stream, the next ``HEAD_GROWTH`` blocks' follow: the
    first batch waits for a few blocks, not for every block of its window."""
    config = dataclasses.replace(config, head=config.block_size)
    split = Split(lanes=lanes, batch=batch)
    order = plan_epoch(config, epoch, split).tolist()
    starts, lengths = config.stream_blocks(epoch)
    stream = [i for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)
              for i in range(s, s + n)]
    window = stream[: config.window]
    lane_of = [(p // batch) % lanes for p in range(len(window))]
    for lane in range(lanes):
        slots = [p for p in range(len(window)) if lane_of[p] == lane]
        part = window[sum(lane_of.count(j) for j in range(lane)):][: len(slots)]
        for cut in (config.block_size, config.block_size * (1 + HEAD_GROWTH), len(slots)):
            assert sorted(order[p] for p in slots[:cut]) == sorted(part[:cut])
