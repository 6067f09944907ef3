"""``shardio.loader`` with no workers takes its batches without the DataLoader's machinery.

What a user sees must not change with it: the same batches in the same order as a
torch ``DataLoader`` over the same batched view, numpy arrays from a user's collate
converted to tensors as the DataLoader converts them, torch's random stream drawn
from as the DataLoader draws from it, resume and errors as before. With pinning on,
the DataLoader (which pins) is kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shardio import ShardWriter, WriteOptions
from shardio.errors import ShardioError
from shardio.torch.dataset import StreamingDataset
from shardio.torch.loader import loader

NUM_SAMPLES = 203


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("inproc") / "ds"
    with ShardWriter(out, WriteOptions(max_shard_samples=40)) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"s/{i:04d}", "bin": bytes([i % 251]) * (20 + i),
                          "label": i % 7})
    return out


def dataset(pack: Path) -> StreamingDataset:
    return StreamingDataset(pack, decode="raw", seed=5, shuffle_buffer=50)


def epochs(pack: Path, in_process: bool) -> list[list[tuple[Any, ...]]]:
    run = loader(dataset(pack), batch_size=16, num_workers=0)
    assert run._in_process
    run._in_process = in_process
    return [[(b.keys, [bytes(v) for v in b.bytes("bin")], b.labels.tolist()) for b in run]
            for _ in range(2)]


def test_batches_match_the_dataloader_path(pack: Path) -> None:
    got = epochs(pack, True)
    assert got == epochs(pack, False)
    assert got[0] != got[1]  # epochs advance by themselves
    for epoch in got:
        assert sorted(k for keys, _, _ in epoch for k in keys) == [
            f"s/{i:04d}" for i in range(NUM_SAMPLES)]
        for keys, payloads, labels in epoch:
            for key, payload, label in zip(keys, payloads, labels, strict=True):
                i = int(key[2:])
                assert payload == bytes([i % 251]) * (20 + i)
                assert label == i % 7


def test_numpy_from_a_user_collate_becomes_tensors(pack: Path) -> None:
    def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
        return {"label": np.array([s["label"] for s in samples]),
                "keys": [s["__key__"] for s in samples]}

    batches = list(loader(dataset(pack), batch_size=32, num_workers=0, collate_fn=collate))
    assert all(isinstance(b["label"], torch.Tensor) for b in batches)
    assert all(isinstance(b["keys"], list) for b in batches)
    assert sum(len(b["keys"]) for b in batches) == NUM_SAMPLES


def test_draws_from_torch_rng_as_the_dataloader_does(pack: Path) -> None:
    def after_epoch(in_process: bool) -> float:
        run = loader(dataset(pack), batch_size=64, num_workers=0)
        run._in_process = in_process
        torch.manual_seed(11)
        for _ in run:
            pass
        return float(torch.rand(()))

    assert after_epoch(True) == after_epoch(False)


def test_resume_continues_where_it_stopped(pack: Path) -> None:
    whole = [b.keys for b in loader(dataset(pack), batch_size=16, num_workers=0)]
    first = loader(dataset(pack), batch_size=16, num_workers=0)
    taken = []
    for batch in first:
        taken.append(batch.keys)
        if len(taken) == 5:
            break
    state = first.state_dict()
    second = loader(dataset(pack), batch_size=16, num_workers=0)
    second.load_state_dict(state)
    assert taken + [b.keys for b in second] == whole


def test_a_damaged_record_raises_and_the_next_iter_goes_on(pack: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "ds"
    shutil.copytree(pack, copy)
    shard = sorted(copy.glob("*.rec"))[1]
    data = bytearray(shard.read_bytes())
    data[200] ^= 0xFF  # inside the shard's first record
    shard.write_bytes(bytes(data))
    run = loader(dataset(copy), batch_size=16, num_workers=0)
    with pytest.raises(ShardioError, match=shard.name):
        for _ in run:
            pass


def test_pinning_keeps_the_dataloader(pack: Path) -> None:
    run = loader(dataset(pack), batch_size=16, num_workers=0, pin_memory=True)
    assert not run._in_process
