"""The shuffle window is a budget for the whole loader, not one per worker.

Workers that take whole batches in turn each read ``window // num_workers`` of their
own order at a time; the order itself (the plan's, in fixed ``lanes``) does not
change, so the batches a ``shardio.loader`` delivers are those of one process,
whatever ``num_workers`` is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import shardio.torch.dataset
from shardio import ShardWriter, WriteOptions
from shardio.torch.dataset import StreamingDataset, read_window
from shardio.torch.loader import loader

NUM_SAMPLES = 600
WINDOW = 96


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("window") / "ds"
    with ShardWriter(out, WriteOptions(max_shard_samples=150)) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"c{i % 4}/{i:04d}", "bin": bytes([i % 256]) * 50, "n": i})
    return out


def test_read_window_divides_only_what_workers_share() -> None:
    assert read_window(16384, 1, True) == 16384
    assert read_window(16384, 2, True) == 8192
    assert read_window(16384, 3, True) == 5461
    assert read_window(5, 8, True) == 1
    assert read_window(16384, 2, False) == 16384  # contiguous parts: each its own windows


@pytest.mark.parametrize("num_workers", [0, 2])
def test_workers_read_their_share_of_a_window_and_the_order_stays(
    pack: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, num_workers: int
) -> None:
    reference = [b.indices.tolist() for b in loader(
        StreamingDataset(pack, decode="raw", shuffle_buffer=WINDOW, seed=4, lanes=2),
        batch_size=8, num_workers=0)]

    def spy(real: Any) -> Any:
        def read(*args: Any, window: int, **kwargs: Any) -> Any:
            # forked workers inherit the patch; each notes the window it read with
            (tmp_path / f"window-{window}").touch()
            return real(*args, window=window, **kwargs)

        return read

    for name in ("iter_samples", "iter_chunks"):  # whichever the dataset reads through
        if hasattr(shardio.torch.dataset, name):
            module = shardio.torch.dataset
            monkeypatch.setattr(module, name, spy(getattr(module, name)))
    run = loader(StreamingDataset(pack, decode="raw", shuffle_buffer=WINDOW, seed=4, lanes=2),
                 batch_size=8, num_workers=num_workers, multiprocessing_context="fork")
    assert [b.indices.tolist() for b in run] == reference
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"window-{WINDOW // max(1, num_workers)}"]
