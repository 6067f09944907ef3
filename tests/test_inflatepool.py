"""Reused buffers of inflated payloads (shardio.inflatepool), through real epochs."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

import shardio
from shardio import inflatepool
from shardio.dataset import StreamingDataset
from shardio.writer import ShardWriter, WriteOptions

SHARDS = 4


def payload(i: int) -> bytes:
    # compressible, and different in every record: a refilled buffer shows in the bytes
    return (f"record {i:05d} ".encode() * (40 + i % 23))[: 300 + i % 211]


def write(out: Path, num: int = 1200) -> Path:
    options = WriteOptions(codec="zstd", max_shard_samples=num // SHARDS)
    with ShardWriter(out, options) as writer:
        for i in range(num):
            writer.write({"__key__": f"k/{i:05d}", "bin": payload(i), "n": i})
    return out


def epoch(root: Path) -> shardio.RecordBatch:
    dataset = StreamingDataset(root, shuffle=True, shuffle_buffer=200, seed=1)
    return shardio.loader(dataset, batch_size=32, num_workers=0)


def test_batches_kept_by_their_consumer_keep_their_bytes(tmp_path: Path) -> None:
    # every batch kept: each views its window's buffer, which no later window may refill
    root = write(tmp_path / "ds")
    batches = list(epoch(root))
    assert any(isinstance(v, memoryview) for b in batches for v in b.bytes("bin"))
    got = {key: bytes(value) for b in batches
           for key, value in zip(b.keys, b.bytes("bin"), strict=True)}
    assert got == {f"k/{i:05d}": payload(i) for i in range(1200)}


def test_a_samples_view_keeps_its_buffer_from_the_pool(tmp_path: Path) -> None:
    root = write(tmp_path / "ds")
    batch = next(iter(epoch(root)))
    kept = batch.bytes("bin")[0]
    key, expected = batch.keys[0], payload(int(batch.keys[0][2:]))
    del batch
    gc.collect()
    for _ in epoch(root):  # every window refills what the pool holds
        pass
    assert bytes(kept) == expected, key


def test_later_epochs_refill_the_first_epochs_buffers(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # each window's last chunk is copied out of its buffers (``Chunk.detach``): without
    # that, the batch its consumer still holds kept them all viewed while the next window
    # was decoded, and every window took a second window's worth of fresh buffers
    monkeypatch.setattr(inflatepool, "_idle", type(inflatepool._idle)())
    root = write(tmp_path / "ds")
    before = inflatepool.created
    for b in epoch(root):
        b.bytes("bin")
    first = inflatepool.created - before
    assert 0 < first <= SHARDS  # one buffer a shard of a window, one window's worth
    for _ in range(2):
        for b in epoch(root):
            b.bytes("bin")
    assert inflatepool.created - before == first
