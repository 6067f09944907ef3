"""``shardio.doctor`` on pipelines whose bottleneck is known: it names it, and its first
recommendation, applied in the same run, raises steps/s. Cases are extreme (a 1,600 px
JPEG decoded for a 128 px model, a step 100x the read, workers that sleep 40 ms a batch
for a 2 ms step) so the answers hold on a loaded machine; no duration is asserted."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import shardio
from shardio.cli import main
from shardio.doctor import find_period
from shardio.synth import make_imagefolder, make_tiny_tree


def slow_transform(sample: dict[str, Any]) -> int:
    """A transform that waits 5 ms a sample (like a remote lookup): workers, not cores."""
    time.sleep(0.005)
    return int(sample["__index__"])


@pytest.fixture(scope="module")
def tiny_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("doctor-tiny")
    make_tiny_tree(root / "tree", num_files=400)
    shardio.pack(root / "tree", root / "pack", num_workers=1, progress=False)
    return root / "pack"


def test_large_jpegs_without_workers_are_decode_bound(tmp_path: Path) -> None:
    make_imagefolder(tmp_path / "imgs", num_classes=1, per_class=8, long_side=(1600, 1700))
    shardio.pack_imagefolder(tmp_path / "imgs", tmp_path / "pack", num_workers=1,
                             progress=False)
    report = shardio.doctor(tmp_path / "pack", step_ms=1, num_steps=10, batch_size=4,
                            num_workers=0, decode="tensor", image_size=128)
    assert report["bound"] == "decode"
    first = report["recommendations"][0]
    assert first["change"] == {"draft_size": (128, 128)}
    assert first["measured_ratio"] > 1


def test_a_long_step_is_not_bound_by_data(tiny_pack: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["doctor", str(tiny_pack), "--step-ms", "100",
                                       "--steps", "8", "--batch-size", "8",
                                       "--num-workers", "0", "--json",
                                       "--plot", str(tmp_path / "wait.png")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["bound"] == "step"
    assert report["recommendations"][0]["change"] == {}
    assert (tmp_path / "wait.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_too_few_workers_stall_every_num_workers_batches(tiny_pack: Path) -> None:
    dataset = shardio.StreamingDataset(tiny_pack, decode="raw", transform=slow_transform)
    loader = shardio.loader(dataset, 8, num_workers=3)
    report = shardio.doctor(loader, step_ms=2, num_steps=31)
    assert report["bound"] != "step"
    assert report["stall_every"] == 3
    first = report["recommendations"][0]
    assert first["change"]["num_workers"] > 3
    assert first["measured_ratio"] > 1


def test_find_period_needs_a_repeating_gap() -> None:
    assert find_period([0.05, 0, 0] * 6) == 3
    assert find_period([0.01] * 18) is None  # every step waits: no stall, a slow pipeline
    assert find_period([0.0] * 18) is None
