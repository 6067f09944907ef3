"""Inflated columns are written into reused buffers (``shardio.format.codecs.inflate``):
a buffer is reused only once no view of it is left, so samples a user keeps from one
epoch keep their bytes while later epochs inflate into the same pages.

Through real ``shardio.loader`` DataLoaders (views of inflated columns) and
``IndexedDataset`` (its block cache) on a pack of compressible records.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import zstandard

from shardio import ShardWriter, WriteOptions
from shardio.format import codecs
from shardio.torch.dataset import StreamingDataset
from shardio.torch.indexed import IndexedDataset
from shardio.torch.loader import loader

NUM_SAMPLES = 600


def payload(i: int) -> bytes:
    return (f"sample {i}; ".encode() * (40 + i % 90))[: 300 + 7 * (i % 200)]


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("inflated") / "ds"
    with ShardWriter(out, WriteOptions(max_shard_samples=200)) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"k{i:05d}", "txt": payload(i), "n": i})
    return out


def test_the_columns_are_stored_compressed(pack: Path) -> None:
    data = sum(p.stat().st_size for p in pack.glob("*.rec"))
    assert data < sum(len(payload(i)) for i in range(NUM_SAMPLES)) / 4


def test_batches_kept_from_an_epoch_keep_their_bytes_through_later_epochs(pack: Path) -> None:
    run = loader(StreamingDataset(pack, decode="raw", seed=3), batch_size=32, num_workers=0)
    kept: list[Any] = []
    for epoch in range(3):
        seen = []
        for batch in run:
            if epoch == 0:
                kept.append(batch)
            numbers = batch["n"].tolist()
            assert [bytes(v) for v in batch.bytes("txt")] == [payload(i) for i in numbers]
            seen += numbers
        assert sorted(seen) == list(range(NUM_SAMPLES))
        gc.collect()
    for batch in kept:  # inflated in the first epoch, read after two more
        assert [bytes(v) for v in batch.bytes("txt")] == [payload(i) for i in
                                                         batch["n"].tolist()]


def test_random_reads_stay_right_while_the_block_cache_evicts(pack: Path) -> None:
    ds = IndexedDataset(pack, decode="raw", block_cache_bytes=1)  # every block evicted at once
    first = [ds[i] for i in range(0, NUM_SAMPLES, 7)]
    for i in range(NUM_SAMPLES - 1, -1, -1):
        assert ds[i]["txt"] == payload(i)
    assert [s["txt"] for s in first] == [payload(i) for i in range(0, NUM_SAMPLES, 7)]


def test_a_buffer_is_reused_only_once_every_view_of_it_is_gone() -> None:
    one, two = b"a" * 70_000, b"b" * 70_000
    frame = zstandard.ZstdCompressor(write_content_size=True).compress
    view = codecs.inflate(frame(one), len(one))
    part = view[100:200]
    del view
    gc.collect()
    for _ in range(20):  # inflations of the same size, each buffer dropped at once
        assert bytes(codecs.inflate(frame(two), len(two))) == two
    assert bytes(part) == one[100:200]
    del part
    gc.collect()
    capacity = 1 << (len(one) - 1).bit_length()
    idle = len(codecs._Idle.by_capacity.get(capacity, []))
    for _ in range(20):
        assert bytes(codecs.inflate(frame(one), len(one))) == one
    assert len(codecs._Idle.by_capacity[capacity]) == idle  # reused, not one more each time


def test_a_frame_holding_more_than_its_stated_size_is_refused() -> None:
    data = b"x" * 5000
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(data)
    with pytest.raises(zstandard.ZstdError, match="more than 4999 bytes"):
        codecs.inflate(frame, len(data) - 1)
    assert len(codecs.inflate(frame[:-3], len(data))) < len(data)  # the caller refuses it
