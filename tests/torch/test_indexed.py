"""IndexedDataset's batched fetch takes indices the way ``ds[i]`` does: negative ones too."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardio import ShardWriter, WriteOptions
from shardio.torch.indexed import IndexedDataset

NUM_SAMPLES = 30


@pytest.fixture(scope="module", params=["records", "lmdb"])
def indexed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[IndexedDataset]:
    path = tmp_path_factory.mktemp(request.param) / "ds"
    with ShardWriter(path, WriteOptions(backend=request.param, max_shard_samples=8)) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"s/{i:02d}", "bin": bytes([i]) * 3})
    dataset = IndexedDataset(path, decode="raw")
    yield dataset
    dataset.close()


def test_getitems_counts_negative_indices_from_the_end(indexed: IndexedDataset) -> None:
    asked = [-1, 0, -NUM_SAMPLES, 3, -1, 29, -8]
    got = indexed.__getitems__(asked)
    expected = [i % NUM_SAMPLES for i in asked]
    assert [s["__key__"] for s in got] == [f"s/{i:02d}" for i in expected]
    assert [s["bin"] for s in got] == [bytes([i]) * 3 for i in expected]
    assert [s["__key__"] for s in got] == [indexed[i]["__key__"] for i in asked]


@pytest.mark.parametrize("bad", [NUM_SAMPLES, -NUM_SAMPLES - 1])
def test_out_of_range_raises_index_error_from_both_paths(
    indexed: IndexedDataset, bad: int
) -> None:
    with pytest.raises(IndexError, match=f"sample {bad} out of range.*{NUM_SAMPLES} samples"):
        indexed[bad]
    with pytest.raises(IndexError, match=f"sample {bad} out of range"):
        indexed.__getitems__([0, bad])


def test_a_dataloader_batch_sampler_with_negative_indices(indexed: IndexedDataset) -> None:
    loader = DataLoader(indexed, batch_sampler=[[-2, -1], [0, -30]], collate_fn=list)
    assert [[s["__key__"] for s in batch] for batch in loader] == [
        ["s/28", "s/29"], ["s/00", "s/00"]
    ]


@pytest.mark.parametrize("bad", [slice(1, 3), 2.0, "2", True, torch.tensor(True),
                                 torch.tensor([2])])
def test_an_index_that_is_no_int_is_refused_not_read_as_a_position(
    indexed: IndexedDataset, bad: object
) -> None:
    with pytest.raises(TypeError, match=f"takes one int index.*got {type(bad).__name__}"):
        indexed[bad]  # type: ignore[index]
    with pytest.raises(TypeError, match="takes one int index"):
        indexed.__getitems__([0, bad])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="takes one int index"):  # a sampler of such
        list(DataLoader(indexed, batch_size=2, sampler=[0, bad], collate_fn=list))


def test_numpy_and_torch_integers_index_like_ints(indexed: IndexedDataset) -> None:
    for index in (np.int64(-1), np.uint8(2), torch.tensor(3), torch.tensor(-2)):
        assert indexed[index]["__key__"] == indexed[int(index)]["__key__"]  # type: ignore[index]
    loader = DataLoader(indexed, batch_size=3, sampler=np.array([4, -1, 0]), collate_fn=list)
    assert [[s["__key__"] for s in batch] for batch in loader] == [["s/04", "s/29", "s/00"]]
