"""Messages a new user meets in the first hour point the right way (issue 31, item 4).

A folder of images, a missing path or a shard file given as the dataset; a
resume with changed options; Ctrl-C during a pack; bad inputs found by the walk
and by reading; a dataset given as SRC. Through the CLI in real processes and
through the public API, as a user calls them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

import shardio
from shardio.errors import BadInputError, ManifestNotFoundError, PackError
from shardio.packing.journal import load_journal
from shardio.packing.pack import pack
from shardio.packing.writer import JOURNAL_NAME, WriteOptions


def _shardio(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardio", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


def _images(root: Path, count: int = 6) -> Path:
    for i in range(count):
        folder = root / ("cat" if i % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (i * 30, 0, 0)).save(folder / f"{i}.jpg")
    return root


@pytest.fixture
def packed(tmp_path: Path) -> Path:
    pack(_images(tmp_path / "src"), tmp_path / "ds", num_workers=1)
    return tmp_path / "ds"


@pytest.mark.parametrize("open_it", [shardio.DatasetReader, shardio.StreamingDataset,
                                     shardio.IndexedDataset, shardio.read_manifest])
def test_a_folder_of_images_is_named_a_source_to_pack(tmp_path: Path, open_it: object) -> None:
    src = _images(tmp_path / "photos", 6)
    with pytest.raises(ManifestNotFoundError) as caught:
        open_it(src)  # type: ignore[operator]
    message = str(caught.value)
    assert "a source folder of 6 images" in message
    assert f"`shardio pack {src} OUT`" in message and "then read OUT" in message
    assert f"pack SRC {src}" not in message  # never: pack into the folder of images


@pytest.mark.parametrize("command", ["ls", "verify", "info"])
def test_cli_on_a_folder_of_images(tmp_path: Path, command: str) -> None:
    _images(tmp_path / "photos", 4)
    result = _shardio(command, "photos", cwd=tmp_path)
    assert result.returncode == 1
    assert "photos: a source folder of 4 images" in result.stderr
    assert "`shardio pack photos OUT`" in result.stderr


def test_a_missing_path_is_said_not_to_exist(tmp_path: Path) -> None:
    with pytest.raises(ManifestNotFoundError, match="nothere: does not exist"):
        shardio.StreamingDataset(tmp_path / "nothere")
    result = _shardio("ls", "nothere", cwd=tmp_path)
    assert result.returncode == 1 and "nothere: does not exist" in result.stderr
    assert "pack SRC nothere" not in result.stderr


def test_a_shard_file_names_the_dataset_folder(packed: Path) -> None:
    shard = next(packed.glob("shard-*"))
    with pytest.raises(ManifestNotFoundError) as caught:
        shardio.DatasetReader(shard)
    assert f"a file of the dataset in {packed}" in str(caught.value)
    assert f"pass the folder {packed} instead" in str(caught.value)
    result = _shardio("verify", shard.relative_to(packed.parent), cwd=packed.parent)
    assert result.returncode == 1 and "pass the folder ds instead" in result.stderr
    assert "Not a directory" not in result.stderr


def _big_tree(root: Path) -> Path:
    """Enough incompressible files at a slow level that a pack is mid-way when interrupted."""
    for d in range(4):
        (root / f"d{d}").mkdir(parents=True)
        for i in range(400):
            (root / f"d{d}" / f"{i:04d}.bin").write_bytes(os.urandom(16_000))
    return root


def _interrupt_pack(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """Start `shardio pack big out …`, send SIGINT once a shard is journaled, wait for it."""
    out = tmp_path / "out"
    args = [sys.executable, "-m", "shardio", "pack", "big", "out", "--no-progress", "--level",
            "19", "--max-shard-samples", "10", *flags]
    process = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        while process.poll() is None:
            try:
                if load_journal((out / JOURNAL_NAME).read_bytes())["shards"]:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_says_what_was_kept_and_how_to_resume(tmp_path: Path, workers: str) -> None:
    _big_tree(tmp_path / "big")
    result = _interrupt_pack(tmp_path, "--num-workers", workers, "--exclude", "*.tmp")
    assert result.returncode == 130, result.stderr
    assert "Aborted!" not in result.stderr
    assert "Interrupted: " in result.stderr and "of 160 shards" in result.stderr
    assert "samples) are finished and kept in out" in result.stderr
    command = (f"shardio pack big out --level 19 --max-shard-samples 10 --exclude '*.tmp' "
               f"--num-workers {workers} --no-progress --resume")
    assert f"Finish the pack with:\n  {command}\n" in result.stderr
    finished = _shardio(*command.replace("'", "").split()[1:], cwd=tmp_path)
    assert finished.returncode == 0, finished.stderr
    assert "resumed " in finished.stdout
    assert shardio.read_manifest(tmp_path / "out").num_samples == 1600


def test_resume_with_changed_options_names_each_change(tmp_path: Path) -> None:
    _big_tree(tmp_path / "big")
    result = _interrupt_pack(tmp_path, "--num-workers", "1")
    assert result.returncode == 130, result.stderr
    again = _shardio("pack", "big", "out", "--level", "5", "--seed", "4", "--max-shard-samples",
                     "10", "--resume", cwd=tmp_path)
    assert again.returncode == 1
    line = again.stderr.strip()
    assert "level was 19, now 5; seed was 0, now 4." in line
    assert "'identity'" not in line and "'write'" not in line and len(line) < 250


def test_resume_after_src_changed_says_so(tmp_path: Path) -> None:
    src = _images(tmp_path / "src", 40)
    options = WriteOptions(max_shard_samples=4)
    pack(src, tmp_path / "out", options=options, num_workers=1)
    (tmp_path / "out" / "manifest.json").unlink()  # as if interrupted before the manifest
    journal = {"identity": {"write": {}, "source": "0" * 64}, "shards": []}
    (tmp_path / "out" / JOURNAL_NAME).write_text(json.dumps(journal))
    with pytest.raises(PackError, match="the files in SRC changed since it began"):
        pack(src, tmp_path / "out", options=options, num_workers=1, resume=True)


def test_bad_inputs_are_reported_together(tmp_path: Path) -> None:
    src = _images(tmp_path / "src", 6)
    (src / "cat" / "empty.jpg").write_bytes(b"")  # found by the walk
    whole = (src / "dog" / "0.jpg").read_bytes()
    (src / "dog" / "cut.jpg").write_bytes(whole[:100])  # found only by reading it
    with pytest.raises(BadInputError) as caught:
        pack(src, tmp_path / "out", num_workers=1)
    message = str(caught.value)
    assert "2 input(s)" in message
    assert "cat/empty.jpg: empty file" in message and "dog/cut.jpg: is cut short" in message
    result = _shardio("pack", "src", "out2", "--no-progress", cwd=tmp_path)
    assert result.returncode == 1
    assert "cat/empty.jpg" in result.stderr and "dog/cut.jpg" in result.stderr


def test_cut_images_in_several_shards_are_reported_together(tmp_path: Path) -> None:
    src = _images(tmp_path / "src", 12)
    whole = (src / "dog" / "0.jpg").read_bytes()
    for name in ("cat/cut1.jpg", "dog/cut2.jpg"):
        (src / name).write_bytes(whole[:150])
    with pytest.raises(BadInputError) as caught:
        pack(src, tmp_path / "out", options=WriteOptions(max_shard_samples=1), num_workers=1,
             shuffle=False)
    message = str(caught.value)
    assert "cat/cut1.jpg: is cut short" in message and "dog/cut2.jpg: is cut short" in message
    assert "--skip-bad --resume" in message


def test_a_dataset_as_src_is_refused(packed: Path, tmp_path: Path) -> None:
    with pytest.raises(PackError, match="the source is a shardio dataset") as caught:
        pack(packed, tmp_path / "again", num_workers=1)
    assert "would store its shard files as samples" in str(caught.value)
    assert not (tmp_path / "again").exists()
    result = _shardio("pack", "ds", "again", "--no-progress", cwd=tmp_path)
    assert result.returncode == 1 and "--force" in result.stderr
    forced = _shardio("pack", "ds", "again", "--no-progress", "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    with shardio.DatasetReader(tmp_path / "again") as reader:
        assert {sample["__key__"] for sample in reader} == {"manifest", "shard-00000"}
