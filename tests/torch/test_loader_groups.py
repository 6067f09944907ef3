"""Workers hand raw batches over a few per DataLoader item (``shardio.torch.loader._Grouped``).

Through real ``shardio.loader`` DataLoaders: grouped, the batches, their order and a
resume mid-group are exactly those of the same loader handing one batch per item, for
several worker counts and prefetch factors (which bound the group size).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shardio import ShardWriter, WriteOptions
from shardio.torch import loader as dataloader
from shardio.torch.dataset import StreamingDataset
from shardio.torch.loader import loader

NUM_SAMPLES = 203  # a short last batch


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("groups") / "ds"
    with ShardWriter(out, WriteOptions(max_shard_samples=40)) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"g/{i:04d}", "bin": bytes([i % 251]) * (100 + i)})
    return out


def epochs(pack: Path, workers: int, prefetch: int, count: int = 2) -> list[list[list[int]]]:
    run = loader(StreamingDataset(pack, decode="raw", seed=7, shuffle_buffer=50),
                 batch_size=6, num_workers=workers, prefetch_factor=prefetch)
    out = []
    for _ in range(count):
        batches = []
        for batch in run:
            for key, view in zip(batch.keys, batch.bytes("bin"), strict=True):
                i = int(key[2:])
                assert view is not None and view.tobytes() == bytes([i % 251]) * (100 + i)
            batches.append(batch.indices.tolist())
        out.append(batches)
    return out


@pytest.mark.parametrize(("workers", "prefetch"), [(2, 4), (3, 3), (2, 1), (1, 8)])
def test_grouped_batches_are_the_batches_one_an_item_gives(
    pack: Path, workers: int, prefetch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    grouped = epochs(pack, workers, prefetch)
    for batches in grouped:
        assert sorted(i for b in batches for i in b) == list(range(NUM_SAMPLES))
    monkeypatch.setattr(dataloader, "GROUP_BATCHES", 1)
    assert grouped == epochs(pack, workers, prefetch)


def test_resume_in_the_middle_of_a_group(pack: Path) -> None:
    def make() -> dataloader.ShardLoader:
        return loader(StreamingDataset(pack, decode="raw", seed=7, shuffle_buffer=50),
                      batch_size=6, num_workers=2)

    full = [b.indices.tolist() for b in make()]
    for stop in (1, 6, 13):  # in the first groups (one, then two batches) and a later one
        interrupted = make()
        for k, _batch in enumerate(interrupted):
            if k == stop:
                break
        resumed = make()
        resumed.load_state_dict(interrupted.state_dict())
        assert [b.indices.tolist() for b in resumed] == full[stop + 1:]
