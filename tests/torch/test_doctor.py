"""``shardio.doctor`` on pipelines whose bottleneck is known: it names it, and its first
recommendation, applied in the same run, raises steps/s. Cases are extreme (a 1,600 px
JPEG decoded for a 128 px model, a step 100x the read, workers that sleep 40 ms a batch
for a 2 ms step, a remote dataset whose every request waits 50 ms for a 1 ms step) so
the answers hold on a loaded machine; no duration is asserted. Plain DataLoaders over
files are told whether packing would help (large JPEGs: no; small files: yes, by a
figure from the rates measured), and a rebuilt loader keeps the user's options."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from PIL import Image
from storage_servers import HttpEndpoint

import shardio
from shardio.cli import main
from shardio.synth import make_imagefolder, make_tiny_tree
from shardio.torch.doctor import _rebuilt, find_period, format_report

pytest_plugins = ("storage_plugin",)


BATCH = 8
TICK_S = 0.04
_calls: dict[int, int] = {}


def slow_transform(sample: dict[str, Any]) -> int:
    """A transform that waits (like a remote lookup: workers, not cores), a process's every
    ``BATCH``-th call until the wall clock's next ``TICK_S`` boundary: each worker then
    finishes a batch a tick, all workers at the same instants whenever each started and
    however loaded the machine, as workers started together and equally fast would. A
    fixed sleep a sample let workers drift apart under load, and their waits stop being
    periodic (the doctor then rightly finds no period)."""
    pid = os.getpid()
    _calls[pid] = _calls.get(pid, 0) + 1
    if _calls[pid] % BATCH == 0:
        time.sleep(TICK_S - time.time() % TICK_S)
    return int(sample["__index__"])


@pytest.fixture(scope="module")
def tiny_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("doctor-tiny")
    make_tiny_tree(root / "tree", num_files=400)
    shardio.pack(root / "tree", root / "pack", num_workers=1, progress=False)
    return root / "pack"


@pytest.mark.slow
def test_large_jpegs_without_workers_are_decode_bound(tmp_path: Path) -> None:
    # quality 20: less entropy coding, which no scale skips, so what the draft saves
    # (about 2.5x of decode here; 1.5x at quality 92) stands clear of a loaded machine
    make_imagefolder(tmp_path / "imgs", num_classes=1, per_class=8, long_side=(1600, 1700),
                     quality=20)
    shardio.pack_imagefolder(tmp_path / "imgs", tmp_path / "pack", num_workers=1,
                             progress=False)
    report = shardio.doctor(tmp_path / "pack", step_ms=1, num_steps=16, batch_size=4,
                            num_workers=0, decode="tensor", image_size=128)
    assert report["bound"] == "decode"
    first = report["recommendations"][0]
    assert first["change"] == {"draft_size": (128, 128)}
    # the expected effect is what the doctor measured decoding the same images both ways
    assert report["draft_speedup"] >= 1.1 and report["probe_samples"] > 0
    assert first["expected"].startswith(f"decode {report['draft_speedup']:.1f}x faster")
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
    loader = shardio.loader(dataset, BATCH, num_workers=3)
    report = shardio.doctor(loader, step_ms=2, num_steps=31)
    # the loader counts the transform in its decode seconds: the doctor's probe tells
    # them apart, so a transform that waits is not named decode (nor sent to the GPU)
    assert report["bound"] == "transform", format_report(report)
    assert report["stages_s"]["transform"] > report["stages_s"]["decode"]
    assert not any("DeviceDecoder" in r["text"] for r in report["recommendations"])
    assert report["stall_every"] == 3, format_report(report)
    first = report["recommendations"][0]
    assert first["change"]["num_workers"] > 3
    assert first["measured_ratio"] > 1


def test_find_period_needs_a_repeating_gap() -> None:
    assert find_period([0.05, 0, 0] * 6) == 3
    assert find_period([0.01] * 18) is None  # every step waits: no stall, a slow pipeline
    assert find_period([0.0] * 18) is None


@pytest.mark.servers
def test_a_remote_dataset_behind_a_slow_link_is_io_bound(http: HttpEndpoint,
                                                           tmp_path: Path) -> None:
    # 2,000 samples in 100 shards: the two runs (before, after) read 16 shards each, so
    # the second finds little of the first's in the node cache: what it gains is the
    # workers' requests in parallel, not the cache. 40 steps, not fewer: the stream reads
    # a window of shards at a time, so a dozen steps hold two or three waits, and the
    # four workers' start-up (each with its own requests) decided the ratio (1.2-1.3x,
    # once 0.97x on a loaded machine); over 40 steps it is 3.7-4.1x, also under load
    make_tiny_tree(tmp_path / "tree", num_files=2000)
    shardio.pack(tmp_path / "tree", http.root / "ds", num_workers=1, progress=False,
                 options=shardio.WriteOptions(max_shard_samples=20))
    remote = shardio.RemoteOptions(cache_dir=tmp_path / "cache", max_in_flight=1)
    dataset = shardio.StreamingDataset(f"{http.url}/ds", decode="raw", remote=remote)
    http.plan.reset(latency_s=0.05)  # every request: 50 ms before it is forwarded
    report = shardio.doctor(shardio.loader(dataset, 8, num_workers=0), step_ms=1,
                            num_steps=40)
    print(format_report(report))
    assert report["bound"] == "io"
    assert 0 < report["files_per_sample"] <= 0.2  # a shard opened per 20 samples
    first = report["recommendations"][0]
    assert first["change"]["num_workers"] > 0
    assert first["measured_ratio"] > 1
    assert any("max_shard_bytes" in r["text"] for r in report["recommendations"])


class FolderDataset:
    """An ImageFolder as torchvision builds it: ``samples`` of (path, class), each
    ``__getitem__`` opening its file with PIL and converting it to RGB."""

    def __init__(self, root: Path) -> None:
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.samples = [(str(path), i) for i, name in enumerate(classes)
                        for path in sorted((root / name).iterdir())]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, target = self.samples[index]
        with open(path, "rb") as f:
            image = Image.open(f).convert("RGB")
        return image.resize((32, 32)), target


def test_a_plain_dataloader_over_large_jpegs_says_packing_would_not_help(
        tmp_path: Path) -> None:
    import torch

    make_imagefolder(tmp_path / "imgs", num_classes=2, per_class=6, long_side=(1600, 1700))
    loader = torch.utils.data.DataLoader(FolderDataset(tmp_path / "imgs"), batch_size=4,
                                         collate_fn=lambda batch: batch)
    report = shardio.doctor(loader, step_ms=1, num_steps=6)
    assert report["files_per_sample"] == 1
    assert report["files_per_s"] > 0 and report["samples_per_s_needed"] > 0
    # reading a file is a small part of decoding a 1,600 px JPEG: packing saves little
    assert report["read_share"] < 0.5
    assert report["bound"] == "decode"
    assert report["packing_gain"] < 1.1
    assert any("would not help" in r["text"] for r in report["recommendations"])


class FilesDataset:
    """Small files on disk, one a sample, listed in ``samples`` as ImageFolder lists
    them; a sample is its file read whole (its length: nothing else to do)."""

    def __init__(self, root: Path) -> None:
        self.samples = [(str(path), 0) for path in sorted(root.rglob("*.bin"))]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[int, int]:
        path, target = self.samples[index]
        with open(path, "rb") as f:
            return len(f.read()), target


def test_a_plain_dataloader_over_small_files_says_packing_would_help(tmp_path: Path) -> None:
    import torch

    make_tiny_tree(tmp_path / "tree", num_files=400)
    loader = torch.utils.data.DataLoader(FilesDataset(tmp_path / "tree"), batch_size=16)
    report = shardio.doctor(loader, step_ms=0, num_steps=10)
    assert report["files_per_sample"] == 1
    # opening and reading a file is nearly all of such a sample's time
    assert report["read_share"] >= 0.5
    assert report["bound"] == "io"
    first = report["recommendations"][0]
    assert "would help" in first["text"]
    assert f"{report['files_per_s']:.0f} files/s" in first["text"]
    # the figure: what removing the reading part would give, never past the headspace
    assert 1.1 <= report["packing_gain"] <= (report["headspace_steps_per_s"]
                                             / report["steps_per_s"])
    assert first["expected"] == f"up to {report['packing_gain']:.1f}x steps/s"


def image_side(image: Any) -> int:
    """The long side of a CHW image tensor."""
    return int(max(image.shape[-2:]))


def shift_label(label: int) -> int:
    return label + 100


def test_a_rebuilt_loader_keeps_the_options_of_its_dataset_and_loader(tmp_path: Path
                                                                      ) -> None:
    make_imagefolder(tmp_path / "imgs", num_classes=3, per_class=6, long_side=(300, 320))
    shardio.pack_imagefolder(tmp_path / "imgs", tmp_path / "pack", num_workers=1,
                             progress=False)

    def loader(seed: int = 7) -> Any:
        dataset = shardio.StreamingDataset(
            tmp_path / "pack", decode="tensor", seed=seed, transform=image_side,
            target_transform=shift_label, epoch_size=14)
        return shardio.loader(dataset, 4, num_workers=0, drop_last=True)

    rebuilt = _rebuilt(loader(), {"draft_size": (64, 64)}, tmp_path / "cold")
    batches = list(rebuilt)
    expected = [labels.tolist() for _sides, labels in loader()]
    # seed, transforms and epoch_size of the dataset, drop_last of the loader: 14
    # samples, 3 full batches of 4, labels shifted, in the order of seed 7
    assert [labels.tolist() for _sides, labels in batches] == expected
    assert expected != [labels.tolist() for _sides, labels in loader(seed=0)]
    assert len(expected) == 3 and all(label >= 100 for b in expected for label in b)
    # and the change: decoded at a reduced scale, no smaller than asked
    assert all(64 <= side < 300 for sides, _labels in batches for side in sides.tolist())


def test_the_cli_says_a_damaged_shard_in_one_line_and_a_missing_dataset_as_any_command(
        tmp_path: Path) -> None:
    # a worker's error came back with the worker's traceback in its text, and any shardio
    # error was called unexpected: doctor now reports as ls and verify do
    make_tiny_tree(tmp_path / "tree", num_files=200)
    shardio.pack(tmp_path / "tree", tmp_path / "ds", num_workers=1, progress=False)
    shard = tmp_path / "ds" / "shard-00000.rec"
    data = bytearray(shard.read_bytes())
    data[40] ^= 0xFF  # inside block 0
    shard.write_bytes(bytes(data))
    for target, words in ((tmp_path / "ds", "checksum"), (tmp_path / "nosuch", "does not exist")):
        result = CliRunner().invoke(main, ["doctor", str(target), "--steps", "2",
                                           "--num-workers", "1", "--no-verify"])
        assert result.exit_code == 1, result.output
        assert result.output.startswith("Error: ") and words in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert "unexpected" not in result.output and "Traceback" not in result.output
