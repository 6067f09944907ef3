"""``shardio bench``: measures every setting it claims to and recommends one of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import shardio
from shardio.bench import bench
from shardio.cli import main


@pytest.fixture(scope="module")
def packed(imagefolder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "ds"
    shardio.pack(imagefolder, out, num_workers=1, progress=False)
    return out


def test_bench_measures_raw_and_decoded_per_worker_count(packed: Path) -> None:
    seen = []
    report = bench(packed, max_workers=1, max_samples=8, batch_size=4, on_row=seen.append)
    assert [(r.mode, r.num_workers) for r in report.rows] == [
        ("raw", 0), ("raw", 1), ("tensor", 0), ("tensor", 1)
    ]
    assert list(report.rows) == seen
    assert all(r.samples >= 8 and r.samples_per_s > 0 and r.mb_per_s > 0 for r in report.rows)
    assert report.recommended_num_workers in (0, 1)
    assert report.recommended_shuffle_buffer >= 256
    assert report.num_samples == 48


def test_bench_cli_json(packed: Path) -> None:
    result = CliRunner().invoke(
        main, ["bench", str(packed), "--max-workers", "0", "--max-samples", "8",
               "--batch-size", "4", "--mode", "raw", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert [row["mode"] for row in report["rows"]] == ["raw"]
    assert report["recommended_num_workers"] == 0


def test_bench_cli_on_a_folder_without_manifest(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["bench", str(tmp_path)])
    assert result.exit_code != 0
    assert "manifest.json" in result.output
