"""``loader.stats()`` and ``DevicePrefetcher.stats()``: stable names, one entry per batch
handed over, resettable, and a ``log_every`` hook (``shardio.reading.telemetry``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import shardio

KEYS = {"steps", "data_wait_s", "data_wait_pct", "data_wait_p50_s", "data_wait_p90_s",
        "data_wait_p99_s", "data_wait_max_s", "step_s", "first_batch_s", "read_s",
        "decode_s", "collate_s", "handover_s", "shard_opens", "num_workers", "batch_size"}


@pytest.mark.parametrize(("num_workers", "decode"), [(0, "tensor"), (2, "tensor"), (2, "raw")])
def test_loader_stats_count_every_batch(imagefolder_pack: Path, num_workers: int,
                                        decode: str) -> None:
    logged: list[dict[str, Any]] = []
    loader = shardio.loader(shardio.StreamingDataset(imagefolder_pack, decode=decode), 5,
                            num_workers=num_workers, log_every=3, log_fn=logged.append)
    batches = sum(1 for _ in loader)
    stats = loader.stats()
    assert set(stats) == KEYS
    assert stats["steps"] == batches == len(loader) == 10
    assert 0 <= stats["data_wait_pct"] <= 100
    assert stats["data_wait_p50_s"] <= stats["data_wait_p90_s"] <= stats["data_wait_p99_s"] \
        <= stats["data_wait_max_s"] <= stats["data_wait_s"]
    assert stats["read_s"] > 0  # every batch was read by someone, whose clock moved
    # 50 samples in shards of 10: each of the 5 opened (by one worker or both), and counted
    # in the workers' processes too
    assert 5 <= stats["shard_opens"] <= 5 * max(1, num_workers)
    if decode == "tensor":
        assert stats["decode_s"] > 0
    # the hook saw each full window of 3 batches, with that window's own counts
    assert [entry["steps"] for entry in logged] == [3, 3, 3]
    assert all(set(entry) >= KEYS - {"num_workers", "batch_size"} for entry in logged)
    series = loader.step_series()
    assert len(series["wait"]) == len(series["read"]) == 10
    loader.reset_stats()
    assert loader.stats()["steps"] == 0
    assert sum(1 for _ in loader) == 10  # the next epoch counts afresh
    assert loader.stats()["steps"] == 10


def test_prefetcher_stats_nest_the_loaders(imagefolder_pack: Path) -> None:
    loader = shardio.loader(shardio.StreamingDataset(imagefolder_pack, decode="tensor"), 8,
                            num_workers=0)
    prefetcher = shardio.DevicePrefetcher(loader, "cpu", convert_float=True)
    assert sum(1 for _ in prefetcher) == len(loader)
    stats = prefetcher.stats()
    assert stats["steps"] == len(loader)
    assert {"h2d_s", "device_decode_s", "data_wait_s", "data_wait_pct"} <= set(stats)
    assert stats["h2d_s"] > 0  # the float conversion is the CPU's "copy"
    assert stats["loader"]["steps"] == len(loader)
    prefetcher.reset_stats()
    assert prefetcher.stats()["steps"] == 0 and prefetcher.stats()["loader"]["steps"] == 0


def test_log_every_must_count_steps(imagefolder_pack: Path) -> None:
    with pytest.raises(ValueError, match="log_every"):
        shardio.loader(shardio.StreamingDataset(imagefolder_pack), 8, num_workers=0,
                       log_every=0)
