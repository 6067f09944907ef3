"""Lanes: workers that take a rank's order in whole batches each read whole blocks.

``shardio.order.plan.arrange_lanes`` arranges each shuffle window so that batch ``k``
draws from lane ``k % lanes``, a contiguous part of the window's stream positions.
With as many lanes as workers, worker ``j`` reads one lane of every window: whole
blocks, not a scattered share of each. The window's samples, the batches' sizes and
exactly-once are unchanged; a resume continues in the lanes its epoch was read in.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from shardio import ShardWriter, WriteOptions, merge_states
from shardio.errors import ResumeError
from shardio.order.plan import (
    IndexArray,
    PlanConfig,
    Progress,
    Split,
    arrange_lanes,
    cut_blocks,
    epoch_samples,
    interleave_batches,
    seeded_rng,
    stage_order,
)
from shardio.order.resume import plan_stage, progress_from_state, progress_to_state
from shardio.torch.dataset import StreamingDataset
from shardio.torch.loader import ShardLoader, loader

NUM_SAMPLES = 400
WINDOW = 80
BLOCK = 8
BATCH = 10


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("lanes") / "ds"
    with ShardWriter(out, WriteOptions(max_shard_samples=100)) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"s/{i:04d}", "n": i})
    return out


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 300), first=st.integers(0, 500), lanes=st.integers(1, 5),
    batch=st.integers(1, 20), seed=st.integers(0, 2**31),
)
def test_each_lane_takes_a_contiguous_part_of_the_window(
    size: int, first: int, lanes: int, batch: int, seed: int
) -> None:
    window = np.arange(1000, 1000 + size, dtype=np.int64)
    out = arrange_lanes(window, first, lanes, batch, seeded_rng(seed))
    assert sorted(out.tolist()) == window.tolist()
    lane = (np.arange(first, first + size) // batch) % lanes
    parts = [np.sort(out[lane == j]) for j in range(lanes)]
    joined = np.concatenate(parts)  # lane 0's part, then lane 1's, ...: the window in order
    assert joined.tolist() == window.tolist()


def blocks_touched(positions: np.ndarray, block: int) -> int:
    return len(np.unique(positions // block))


@pytest.mark.parametrize("workers", [2, 4])
def test_a_worker_reads_whole_blocks_of_its_lanes(workers: int) -> None:
    """Per window, each worker touches about 1/W of the window's blocks; in one lane, all."""
    config = PlanConfig(shard_sizes=(160, 160, 80), seed=3, window=WINDOW, block_size=BLOCK)
    shared = {"epoch": 0, "resume": None, "generation": 1}
    touched = {}
    for lanes in (workers, 1):
        counts = []
        for worker in range(workers):
            split = Split(0, 1, worker, workers)
            stage = plan_stage(config, BATCH, shared, None, split, lanes)
            positions = positions_of(config, stage.order)
            share = WINDOW // workers
            counts += [blocks_touched(positions[lo:lo + share], BLOCK)
                       for lo in range(0, len(positions) - share + 1, share)]
        touched[lanes] = max(counts)
    # a lane of a window: WINDOW / W samples, whole blocks but where a lane's part starts
    assert touched[workers] <= WINDOW // workers // BLOCK + 1
    assert touched[1] >= WINDOW // BLOCK - 1  # one lane: every worker touches nearly all


def positions_of(config: PlanConfig, samples: IndexArray) -> IndexArray:
    """Each sample's position in epoch 0's stream (blocks are what the stream is cut in)."""
    stream = epoch_samples(config, 0, np.arange(config.num_samples, dtype=np.int64))
    where = np.empty(config.num_samples, np.int64)
    where[stream] = np.arange(config.num_samples)
    found: IndexArray = where[samples]
    return found


def test_lanes_keep_windows_batches_and_exactly_once() -> None:
    config = PlanConfig(shard_sizes=(123, 77, 50), seed=1, window=WINDOW, block_size=BLOCK)
    plain = stage_order(config, 2, Split(0, 1), None)
    laned = stage_order(config, 2, Split(0, 1, lanes=3, batch=BATCH), None)
    assert sorted(laned.tolist()) == list(range(config.num_samples))
    for lo in range(0, config.num_samples, WINDOW):  # each window: the same samples
        assert sorted(laned[lo:lo + WINDOW].tolist()) == sorted(plain[lo:lo + WINDOW].tolist())
    shares = [interleave_batches(laned, BATCH, w, 3) for w in range(3)]
    assert sorted(np.concatenate(shares).tolist()) == list(range(config.num_samples))


def test_a_state_without_lanes_reads_as_one_lane() -> None:
    """States written before lanes (and of a plain shuffle) carry no ``lanes``."""
    old = {"epoch": 1, "world_size": 1, "num_workers": 1, "consumed": {"0": [20]}, "prior": None}
    progress = progress_from_state(old)
    assert (progress.lanes, progress.batch) == (1, 1)
    assert progress_to_state(progress) == old
    laned = Progress(1, 1, 1, {0: (20,)}, lanes=2, batch=BATCH)
    assert progress_from_state(progress_to_state(laned)) == laned


@pytest.mark.parametrize(("lanes", "batch"), [(0, BATCH), (2, 0), (-3, -1)])
def test_a_state_with_crafted_lanes_is_refused_on_load(pack: Path, lanes: int,
                                                       batch: int) -> None:
    ds = StreamingDataset(pack, decode="raw", shuffle_buffer=WINDOW, block_size=BLOCK)
    state = ds.state_dict()
    with pytest.raises(ValueError, match="lanes and batch must be >= 1"):
        ds.load_state_dict({**state, "consumed": {"0": [20]}, "lanes": lanes, "batch": batch})


def batches(run: Iterable[Any]) -> list[list[int]]:
    return [b.indices.tolist() for b in run]


def test_two_workers_deliver_the_order_of_one_process_in_two_lanes(pack: Path) -> None:
    def ds(lanes: int | None = None) -> StreamingDataset:
        return StreamingDataset(pack, decode="raw", shuffle_buffer=WINDOW, block_size=BLOCK,
                                seed=2, lanes=lanes)

    two = batches(loader(ds(), batch_size=BATCH, num_workers=2))
    assert two == batches(loader(ds(lanes=2), batch_size=BATCH, num_workers=0))
    assert two != batches(loader(ds(), batch_size=BATCH, num_workers=0))  # one lane there
    assert sorted(i for b in two for i in b) == list(range(NUM_SAMPLES))
    assert all(len(b) == BATCH for b in two)
    # a plain DataLoader over a dataset with batch_size: the same arrangement
    plain = StreamingDataset(pack, decode="raw", shuffle_buffer=WINDOW, block_size=BLOCK, seed=2,
                             batch_size=BATCH)
    got = [b["__index__"].tolist() for b in DataLoader(plain, batch_size=BATCH, num_workers=2)]
    assert got == two


@pytest.mark.parametrize("then", [0, 3])
def test_a_resume_continues_the_lanes_its_epoch_was_read_in(pack: Path, then: int) -> None:
    def run(workers: int) -> ShardLoader:
        return loader(StreamingDataset(pack, decode="raw", shuffle_buffer=WINDOW,
                                       block_size=BLOCK, seed=2), batch_size=BATCH,
                      num_workers=workers)

    full = batches(run(2))
    first = run(2)
    taken = []
    for batch in first:
        taken.append(batch.indices.tolist())
        if len(taken) == 7:
            break
    state = first.state_dict()
    assert (state["lanes"], state["batch"]) == (2, BATCH)
    resumed = run(then)
    resumed.load_state_dict(state)
    assert taken + batches(resumed) == full
    # the next epoch is arranged for the workers reading it now
    reference = StreamingDataset(pack, decode="raw", shuffle_buffer=WINDOW, block_size=BLOCK,
                                 seed=2, lanes=max(1, then))
    reference.set_epoch(1)
    assert batches(resumed) == batches(loader(reference, batch_size=BATCH, num_workers=0))


def test_merge_refuses_ranks_that_read_in_other_lanes() -> None:
    def state(rank: int, consumed: int, lanes: int) -> dict[str, object]:
        progress = Progress(0, 2, 1, {rank: (consumed,)}, lanes=lanes, batch=BATCH)
        return {"shardio": 1, "seed": 0, **progress_to_state(progress)}

    merged = merge_states([state(0, 30, 2), state(1, 30, 2)])
    assert (merged["lanes"], merged["batch"]) == (2, BATCH)
    # a rank that read nothing planned its own lanes: they arranged nothing
    assert merge_states([state(0, 0, 1), state(1, 30, 2)])["lanes"] == 2
    assert "lanes" not in merge_states([state(0, 0, 3), state(1, 0, 2)])
    with pytest.raises(ResumeError, match="num_workers"):
        merge_states([state(0, 30, 1), state(1, 30, 2)])


def test_blocks_of_the_plan_are_whole_reads() -> None:
    """The premise: a block is consecutive records of one shard."""
    starts, lengths = cut_blocks((20, 13), 0, BLOCK)
    assert starts.tolist() == [0, 8, 16, 20, 28] and lengths.tolist() == [8, 8, 4, 8, 5]


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=5).filter(lambda s: sum(s) > 0),
    window=st.integers(1, 40), block=st.integers(1, 12), batch=st.integers(1, 9),
    old_world=st.integers(1, 3), old_lanes=st.integers(1, 4),
    new_world=st.integers(1, 3), new_lanes=st.integers(1, 4), data=st.data(),
)
def test_a_resume_under_another_world_size_replays_the_lanes_read(
    sizes: list[int], window: int, block: int, batch: int, old_world: int, old_lanes: int,
    new_world: int, new_lanes: int, data: st.DataObject,
) -> None:
    """Ranks that read in lanes, resumed by another world size in other lanes (and again):
    every sample not yet read arrives exactly once (where no rank's part was padded by
    repeating samples: then a sample read is not a position read)."""
    config = PlanConfig(shard_sizes=tuple(sizes), seed=5, window=window, block_size=block)
    assume(config.num_samples % old_world == 0)
    old = [stage_order(config, 1, Split(r, old_world, lanes=old_lanes, batch=batch), None)
           for r in range(old_world)]
    done = [data.draw(st.integers(0, len(o))) for o in old]
    progress = Progress(1, old_world, 1, {r: (d,) for r, d in enumerate(done)},
                        lanes=old_lanes, batch=batch)
    seen = {int(i) for o, d in zip(old, done, strict=True) for i in o[:d]}
    new = [stage_order(config, 1, Split(r, new_world, lanes=new_lanes, batch=batch), progress)
           for r in range(new_world)]
    unseen = set(range(config.num_samples)) - seen
    assert {int(i) for o in new for i in o} == unseen
    if new_world > 1:
        return
    assert len(new[0]) == len(unseen)
    # read part of the resumed stage, then resume once more under the first split
    more = [data.draw(st.integers(0, len(o))) for o in new]
    again = Progress(1, new_world, 1, {r: (m,) for r, m in enumerate(more)}, prior=progress,
                     lanes=new_lanes, batch=batch)
    read = seen | {int(i) for o, m in zip(new, more, strict=True) for i in o[:m]}
    last = stage_order(config, 1, Split(0, 1, lanes=old_lanes, batch=batch), again)
    assert {int(i) for i in last} == set(range(config.num_samples)) - read
    assert len(last) == config.num_samples - len(read)
