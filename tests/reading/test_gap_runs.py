"""Runs read through small gaps of unwanted records (``stream.window_runs(max_gap=)``).

Workers that take whole batches in turn each want a scattered part of every block; a
run then spans the gaps between wanted records up to ``gap_records`` (about 64 KB of
records), every record of it checked and only the wanted ones decoded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardio import ShardWriter, WriteOptions
from shardio.reading.reader import DatasetReader
from shardio.reading.stream import gap_records, iter_samples, window_runs


def test_window_runs_span_gaps_up_to_max_gap_within_a_shard_and_max_run() -> None:
    firsts = np.array([0, 100], np.int64)
    unique = np.array([1, 2, 4, 9, 10, 98, 99, 100, 102], np.int64)
    assert window_runs(unique, firsts, 128) == [
        (0, 1, 3), (0, 4, 5), (0, 9, 11), (0, 98, 100), (1, 0, 1), (1, 2, 3)]
    assert window_runs(unique, firsts, 128, max_gap=1) == [
        (0, 1, 5), (0, 9, 11), (0, 98, 100), (1, 0, 3)]  # never across shards
    assert window_runs(unique, firsts, 4, max_gap=5) == [
        (0, 1, 5), (0, 5, 9), (0, 9, 11), (0, 98, 100), (1, 0, 3)]


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gaps") / "ds"
    with ShardWriter(out, WriteOptions(max_shard_samples=40)) as writer:
        for i in range(100):
            writer.write({"__key__": f"k/{i:03d}", "bin": bytes([i]) * (100 + i), "n": i})
    return out


def test_scattered_samples_come_back_exactly_decoded_through_gap_runs(
    pack: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardio.reading.stream

    partial: list[int] = []
    real = shardio.reading.stream._wanted

    def spy(run: Any, *args: Any) -> Any:
        wanted = real(run, *args)
        if wanted is not None:  # records read (and checked), not decoded
            partial.append(run[2] - run[1] - len(wanted))
        return wanted

    monkeypatch.setattr(shardio.reading.stream, "_wanted", spy)
    reader = DatasetReader(pack)
    assert gap_records(reader.manifest, 16) == 15  # small records: gaps up to the block
    order = np.random.default_rng(0).permutation(100)[:37].astype(np.int64)  # a scattered part
    read = list(iter_samples(reader, order, window=37, max_run=16))
    assert [s["__index__"] for s in read] == order.tolist()
    assert all(s["n"] == s["__index__"] and s["bin"] == bytes([s["n"]]) * (100 + s["n"])
               for s in read)
    assert partial and sum(partial) > 0, "no run read through a gap"
    reader.close()
