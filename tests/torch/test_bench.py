"""``shardio bench``: measures every setting long enough, and recommends only from measurements."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardio
from shardio.cli import main
from shardio.torch.bench import MIN_BATCHES, BenchRow, bench, recommend

MIN_S = 0.3  # long enough for MIN_BATCHES batches of 4 here, short enough for the suite


@pytest.fixture(scope="module")
def packed(imagefolder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "ds"
    shardio.pack(imagefolder, out, num_workers=1, progress=False)
    return out


def _row(workers: int, rate: float, *, measured: bool = True) -> BenchRow:
    return BenchRow("raw", workers, 100, 10, 1, 1.0, rate, 1.0, 50.0, measured)


def test_recommend_takes_the_fewest_workers_near_the_best() -> None:
    rows = [_row(0, 100.0), _row(1, 300.0), _row(2, 310.0), _row(3, 200.0)]
    assert recommend(rows, "raw") == 1
    assert recommend([_row(0, 500.0), _row(1, 300.0)], "raw") == 0
    assert recommend(rows, "tensor") is None


def test_recommend_nothing_from_a_setting_that_was_not_measured() -> None:
    rows = [_row(0, 100.0), _row(1, 300.0, measured=False)]
    assert recommend(rows, "raw") is None


def test_bench_repeats_epochs_of_a_small_dataset_until_measured(packed: Path) -> None:
    seen: list[BenchRow] = []
    report = bench(packed, max_workers=1, min_seconds=MIN_S, batch_size=4, on_row=seen.append)
    assert [(r.mode, r.num_workers) for r in report.rows] == [
        ("raw", 0), ("raw", 1), ("tensor", 0), ("tensor", 1)
    ]
    assert list(report.rows) == seen
    assert report.num_samples == 48
    cores = os.cpu_count() or 1
    for r in report.rows:
        assert r.measured and r.seconds >= MIN_S and r.batches >= MIN_BATCHES, r
        assert r.samples > report.num_samples and r.epochs >= 2, r  # 48 samples: epochs repeat
        assert r.samples_per_s > 0 and r.mb_per_s > 0, r
        assert 0 < r.cpu_percent <= 100 * cores * 1.05, r  # CPU time over the same wall time
    assert report.recommended_num_workers == recommend(report.rows, "tensor")
    assert report.recommended_num_workers is not None
    assert report.recommended_shuffle_buffer == 48  # never more than the dataset holds
    assert any("epochs were repeated" in note for note in report.notes)


def test_bench_cut_short_recommends_nothing_and_says_why(packed: Path) -> None:
    report = bench(packed, max_workers=0, max_samples=8, batch_size=4, modes=["raw"])
    (row,) = report.rows
    assert not row.measured and row.samples == 8
    assert report.recommended_num_workers is None
    assert any("no num_workers is recommended" in note for note in report.notes)


def test_bench_cli_json(packed: Path) -> None:
    result = CliRunner().invoke(
        main, ["bench", str(packed), "--max-workers", "0", "--min-seconds", str(MIN_S),
               "--batch-size", "4", "--mode", "raw", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [(row["mode"], row["measured"]) for row in report["rows"]] == [("raw", True)]
    assert report["recommended_num_workers"] == 0


def test_bench_cli_says_when_too_short_to_recommend(packed: Path) -> None:
    result = CliRunner().invoke(
        main, ["bench", str(packed), "--max-workers", "0", "--max-samples", "8",
               "--batch-size", "4", "--mode", "raw"]
    )
    assert result.exit_code == 0, result.output
    assert "too short to measure" in result.output
    assert "recommended: num_workers=none" in result.output


def test_bench_cli_on_a_folder_without_manifest(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["bench", str(tmp_path)])
    assert result.exit_code != 0
    assert "manifest.json" in result.output
