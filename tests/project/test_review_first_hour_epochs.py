"""A script ported from ImageFolder: epochs advance without ``set_epoch``, batch sizes agree.

Through real ``DataLoader``s (no workers, two workers, persistent or not): each new pass
over a ``StreamingDataset`` reads the next epoch, exactly as ``set_epoch`` would have
chosen it; ``set_epoch`` still overrides the count and an exact resume still continues
the epoch it saved. A DataLoader whose ``batch_size`` is not the dataset's is refused by
name, and so is a ``shardio.loader`` batch size that is not a whole number.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from shardio import ShardWriter, WriteOptions
from shardio.torch.dataset import StreamingDataset
from shardio.torch.loader import loader

NUM_SAMPLES = 96
BATCH = 8
CASES = [(0, False), (2, False), (2, True)]


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("epochs") / "ds"
    with ShardWriter(out, WriteOptions(max_shard_samples=24)) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"s/{i:03d}", "n": i})
    return out


def dataset(pack: Path, batch_size: int | None = None) -> StreamingDataset:
    return StreamingDataset(pack, decode="raw", shuffle_buffer=32, block_size=4,
                            batch_size=batch_size)


def make_loader(ds: StreamingDataset, workers: int, persistent: bool,
                batch_size: int | None = None) -> DataLoader[Any]:
    return DataLoader(ds, batch_size=batch_size, num_workers=workers,
                      persistent_workers=persistent)


def indices(items: Any) -> list[int]:
    return [int(s["__index__"]) for s in items]


def batch_indices(batches: Any) -> list[list[int]]:
    return [[int(i) for i in b["__index__"]] for b in batches]


def epoch_order(pack: Path, epoch: int, workers: int) -> list[int]:
    """The order a fresh dataset gives for ``epoch`` chosen with ``set_epoch``."""
    ds = dataset(pack)
    ds.set_epoch(epoch)
    return indices(make_loader(ds, workers, False))


@pytest.mark.parametrize(("workers", "persistent"), CASES)
def test_each_pass_reads_the_next_epoch(pack: Path, workers: int, persistent: bool) -> None:
    ds = dataset(pack)
    dl = make_loader(ds, workers, persistent)
    passes = [indices(dl) for _ in range(3)]
    for k, order in enumerate(passes):
        assert sorted(order) == list(range(NUM_SAMPLES))  # every sample once per pass
        assert order == epoch_order(pack, k, workers)
    assert passes[0] != passes[1] != passes[2]
    assert ds.epoch == 3


@pytest.mark.parametrize(("workers", "persistent"), CASES)
def test_set_epoch_overrides_the_count(pack: Path, workers: int, persistent: bool) -> None:
    ds = dataset(pack)
    dl = make_loader(ds, workers, persistent)
    first = indices(dl)
    indices(dl)
    ds.set_epoch(0)
    assert ds.epoch == 0
    assert indices(dl) == first
    assert indices(dl) == epoch_order(pack, 1, workers)


@pytest.mark.parametrize(("workers", "persistent"), CASES)
def test_a_pass_cut_short_still_advances(pack: Path, workers: int, persistent: bool) -> None:
    ds = dataset(pack)
    dl = make_loader(ds, workers, persistent)
    it = iter(dl)
    head = [int(next(it)["__index__"]) for _ in range(5)]
    del it
    assert head == epoch_order(pack, 0, workers)[:5]
    assert indices(dl) == epoch_order(pack, 1, workers)


@pytest.mark.parametrize(("workers", "persistent"), CASES)
def test_resume_of_an_epoch_counted_by_passes(pack: Path, workers: int, persistent: bool
                                              ) -> None:
    """Cut in the second pass (epoch 1, never set): the state names epoch 1, a fresh
    dataset continues it exactly, and its next pass is epoch 2."""
    def whole(epoch: int) -> list[list[int]]:
        ds = dataset(pack, BATCH)
        ds.set_epoch(epoch)
        return batch_indices(make_loader(ds, workers, False, BATCH))

    ds = dataset(pack, BATCH)
    dl = make_loader(ds, workers, persistent, BATCH)
    batch_indices(dl)
    it = iter(dl)
    taken = [[int(i) for i in next(it)["__index__"]] for _ in range(5)]
    state = ds.state_dict(num_batches=5)
    del it
    assert state["epoch"] == 1
    resumed = dataset(pack, BATCH)
    resumed.load_state_dict(state)
    dl2 = make_loader(resumed, workers, persistent, BATCH)
    assert taken + batch_indices(dl2) == whole(1)
    assert batch_indices(dl2) == whole(2)


def test_dataloader_batch_size_other_than_the_datasets_is_refused(pack: Path) -> None:
    dl = DataLoader(dataset(pack, 20), batch_size=16, num_workers=2)
    with pytest.raises(ValueError, match=r"StreamingDataset\(\.\.\., batch_size=16\)"):
        list(dl)
    # the same sizes, or no workers (one stream, nothing cut short), read as before
    assert sum(len(b["__index__"]) for b in DataLoader(
        dataset(pack, 16), batch_size=16, num_workers=2)) == NUM_SAMPLES
    assert sum(len(b["__index__"]) for b in DataLoader(
        dataset(pack, 20), batch_size=16)) == NUM_SAMPLES


@pytest.mark.parametrize(("value", "error"), [
    (None, TypeError), ("16", TypeError), (2.5, TypeError), (True, TypeError),
    (0, ValueError), (-3, ValueError),
])
def test_batch_size_that_is_not_a_count_is_refused_by_name(
        pack: Path, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"shardio\.loader: batch_size must be"):
        loader(dataset(pack), value, num_workers=0)
    if value is not None:  # None is the dataset's default: each worker a contiguous part
        with pytest.raises(error, match=r"StreamingDataset\(.*\): batch_size must be"):
            dataset(pack, value)


@pytest.mark.slow
def test_shardio_loader_after_a_pass_of_the_dataset_reads_the_next_epoch(pack: Path) -> None:
    """A look at a sample (one pass, epoch 0) before training: ``shardio.loader`` reads
    epoch 1 and says so, as a plain DataLoader would."""
    ds = dataset(pack)
    next(iter(ds))
    run = loader(ds, BATCH, num_workers=0)
    got = [int(i) for b in run for i in b.indices]
    fresh = dataset(pack)
    fresh.set_epoch(1)
    assert run.epoch == 1
    assert got == [int(i) for b in loader(fresh, BATCH, num_workers=0) for i in b.indices]
