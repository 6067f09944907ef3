"""A cut-short image is caught by ``shardio pack`` and ``shardio verify`` (issue 28, item 16).

A real ImageFolder of Pillow-made JPEGs and PNGs, one JPEG cut short: without
``--check-images`` pack used to take it and verify said OK, and training died on it
mid-epoch. Now pack refuses it (or leaves it out with ``--skip-bad``) by a check that
decodes nothing, verify finds such images in a dataset written without that check, and
``verify --images`` decodes every image, naming shard, record and key of each failure.
Everything runs through the command line in a real process.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import shardio


def encode(fmt: str, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (40, 48, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, fmt)
    return out.getvalue()


def shardio_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardio", *map(str, args)],
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """``cat/`` of 4 JPEGs and ``dog/`` of 3 PNGs, all whole: decoded by Pillow here."""
    root = tmp_path / "src"
    for name, fmt, count in (("cat", "JPEG", 4), ("dog", "PNG", 3)):
        (root / name).mkdir(parents=True)
        for i in range(count):
            (root / name / f"{i}.{fmt.lower().replace('jpeg', 'jpg')}").write_bytes(
                encode(fmt, i))
    for path in root.rglob("*.*"):
        with Image.open(path) as image:
            image.load()
    return root


def test_pack_refuses_a_cut_jpeg_without_check_images(tree: Path, tmp_path: Path) -> None:
    victim = tree / "cat" / "2.jpg"
    victim.write_bytes(victim.read_bytes()[:-200])
    done = shardio_cli("pack", tree, tmp_path / "out", "--num-workers", "1")
    assert done.returncode == 1, done.stdout
    assert "Traceback" not in done.stderr
    error = done.stderr.strip()  # one error: what is bad, then what to do
    assert error.startswith("Error: ") and "cat/2.jpg" in error and "cut short" in error
    assert "--skip-bad" in error


def test_skip_bad_leaves_cut_images_out_and_lists_them(tree: Path, tmp_path: Path) -> None:
    jpeg, png = tree / "cat" / "0.jpg", tree / "dog" / "1.png"
    jpeg.write_bytes(jpeg.read_bytes()[: len(jpeg.read_bytes()) // 2])
    png.write_bytes(png.read_bytes()[:-40])  # IEND and the last IDAT bytes gone
    out = tmp_path / "out"
    done = shardio_cli("pack", tree, out, "--num-workers", "1", "--skip-bad", "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["samples"] == 5
    skipped = {entry["path"]: entry["reason"] for entry in summary["skipped"]}
    assert set(skipped) == {"cat/0.jpg", "dog/1.png"}
    assert "JPEG" in skipped["cat/0.jpg"] and "IEND" in skipped["dog/1.png"]
    assert shardio_cli("verify", out).returncode == 0
    keys = {sample["__key__"] for sample in shardio.open_dataset(out)}
    assert not keys & {"cat/0.jpg", "dog/1.png"} and len(keys) == 5


def write_dataset(out: Path, images: dict[str, bytes]) -> None:
    """A labelled dataset holding ``images`` as they are: the writer checks no image."""
    with shardio.ShardWriter(out, classes=["cat", "dog"], max_shard_samples=3) as writer:
        for key, data in images.items():
            writer.write({"__key__": key, "image": data, "label": int(key.startswith("dog"))})


def test_verify_finds_a_cut_image_packed_before_the_check(tmp_path: Path) -> None:
    images = {f"cat/{i}.jpg": encode("JPEG", i) for i in range(4)}
    images |= {f"dog/{i}.png": encode("PNG", i) for i in range(3)}
    images["cat/3.jpg"] = images["cat/3.jpg"][:-2]  # only the end marker gone
    out = tmp_path / "ds"
    write_dataset(out, images)
    done = shardio_cli("verify", out)
    assert done.returncode == 1
    faults = [line for line in done.stderr.splitlines() if line.startswith("FAULT")]
    assert len(faults) == 1 and "'cat/3.jpg'" in faults[0] and "end marker" in faults[0]
    assert faults[0].startswith("FAULT shard-")
    report = json.loads(shardio_cli("verify", out, "--json").stdout)
    assert [(f["key"], f["shard"].startswith("shard-")) for f in report["faults"]] == [
        ("cat/3.jpg", True)]


def test_verify_images_decodes_and_names_each_failure(tmp_path: Path) -> None:
    """A PNG whole to the IEND chunk but with a damaged IDAT passes the cheap check."""
    from shardio.packing.build import image_problem
    images = {f"cat/{i}.jpg": encode("JPEG", i) for i in range(3)}
    images |= {f"dog/{i}.png": encode("PNG", i) for i in range(3)}
    broken = bytearray(images["dog/1.png"])
    broken[len(broken) // 2] ^= 0xFF  # inside the image data: its chunk CRC fails
    images["dog/1.png"] = bytes(broken)
    assert image_problem(images["dog/1.png"]) is None
    out = tmp_path / "ds"
    write_dataset(out, images)
    plain = shardio_cli("verify", out)
    assert plain.returncode == 0 and "images complete" in plain.stdout
    done = shardio_cli("verify", out, "--images", "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["images"] is True
    assert [(f["key"], f["record"] is not None) for f in report["faults"]] == [
        ("dog/1.png", True)]
    assert "does not decode" in report["faults"][0]["message"]
    text = shardio_cli("verify", out, "--images")
    assert text.returncode == 1 and "'dog/1.png'" in text.stderr
    assert "images decoded" in text.stdout


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_the_cheap_check_takes_whole_images_and_trailing_bytes(fmt: str) -> None:
    """What decoders accept passes: whole files, and bytes after the end; cuts do not."""
    from shardio.packing.build import image_problem
    data = encode(fmt, 7)
    assert image_problem(data) is None
    assert image_problem(data + b"\0" * 64) is None
    for cut in (len(data) // 3, len(data) - 30, 20):
        assert image_problem(data[:cut]) is not None
