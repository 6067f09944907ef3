"""``benchmarks/bench_warm.py`` on a small pack: every way it times (random access and the
single LMDB file written from the pack too) delivers every sample in every round, and its
README table renders from what it measured (no duration asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

import shardio
from benchmarks.bench_warm import LMDB_FILE, WAYS, measure_pack, warm_block, write_lmdb_file
from benchmarks.resultsfile import write_results
from shardio.synth import make_tiny_tree


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    make_tiny_tree(src, num_files=300)
    out = tmp_path_factory.mktemp("packed") / "ds"
    shardio.pack(src, out, options=shardio.WriteOptions(max_shard_samples=64), seed=1,
                 progress=False)
    write_lmdb_file(out)
    return out


def test_each_way_and_verify_setting_is_timed_once_a_round(packed: Path) -> None:
    times = measure_pack(packed, rounds=2)
    names = {f"{way} verify={verify}" for way in WAYS for verify in (True, False)}
    names.add(f"{LMDB_FILE} verify=True")  # it has no checks to turn off
    assert set(times["seconds"]) == set(times["first_batch_s"]) == names
    assert all(len(v) == 2 for v in times["seconds"].values())
    assert all(len(v) == 2 for v in times["first_batch_s"].values())


def test_an_epoch_that_loses_samples_is_an_error(packed: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import benchmarks.bench_warm as bench_warm

    real = bench_warm._batches
    monkeypatch.setattr(bench_warm, "_batches",
                        lambda *a, **k: list(real(*a, **k))[1:])
    with pytest.raises(RuntimeError, match="samples, not 300"):
        measure_pack(packed, rounds=0)


def test_the_table_renders_one_row_a_tree_and_way(packed: Path, tmp_path: Path) -> None:
    tree = {"kind": "tiny", "num_files": 300, **measure_pack(packed, rounds=1)}
    path = write_results(tmp_path / "warm.json", {
        "rounds": 1, "batch_size": 64, "load_avg_1min": [0.5, 0.6], "trees": [tree]})
    block = warm_block(path)
    rows = [line for line in block.splitlines() if line.startswith("| tiny (300) |")]
    assert [row.split(" | ")[1] for row in rows] == [f"`{way}`" for way in (*WAYS, LMDB_FILE)]
    assert rows[-1].endswith("| 1.00× |")  # the baseline against itself
