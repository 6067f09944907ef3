"""``benchmarks/bench_cold.py`` on a small pack: what it replays is what the epoch reads,
and its README table renders from what it measured (no duration is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import shardio
from benchmarks.bench_cold import cold_block, measure_packed, record_hints
from shardio.backends.records import RecordsShardReader
from shardio.synth import make_tiny_tree


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    make_tiny_tree(src, num_files=400)
    out = tmp_path_factory.mktemp("packed") / "ds"
    shardio.pack(src, out, options=shardio.WriteOptions(max_shard_samples=50, version=2), seed=1)
    return out


def test_the_replayed_spans_cover_every_record_and_nothing_else(packed: Path) -> None:
    windows = record_hints(packed, seed=0)
    assert len(windows) >= 1
    manifest = shardio.read_manifest(packed)
    for info in manifest.shards:
        reader = RecordsShardReader(packed / info.name)
        try:
            covered = np.zeros(info.num_bytes, bool)
            for name, lo, n in (span for window in windows for span in window):
                if name == info.name:
                    covered[lo : lo + n] = True
            # every record's bytes, and neither header nor index
            first, end = reader.offset(0), reader.offset(reader.num_records)
            assert covered[first:end].all()
            assert not covered[:first].any() and not covered[end:].any()
        finally:
            reader.close()


def test_the_table_renders_from_the_measurements(packed: Path, tmp_path: Path) -> None:
    tree = measure_packed(packed, "bin", rounds=1, kind="tiny")
    assert tree["num_files"] == 400
    # one measurement of each kind a round (their values are timings: not asserted)
    rounds_measured = {name: len(v) for name, v in tree["seconds"].items()}
    assert rounds_measured == dict.fromkeys(
        ("cat", "blocks", "epoch", "first batch", "warm epoch"), 1)
    results = tmp_path / "cold.json"
    results.write_text(json.dumps({"date": "d", "command": "c", "git": "g",
                                   "load_avg_1min": [0.5, 0.5], "trees": [tree]}))
    table = cold_block(results)
    assert "| tiny (400, " in table and table.count("\n") == 5
