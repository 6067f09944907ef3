"""Seeded synthetic data: photo-like JPEG ImageFolders and trees of tiny files.

Used by ``shardio demo``, the tests and every benchmark, so that all of them
measure the same kind of data. The images are smooth colour fields with
mid-frequency texture and grain, which JPEG compresses like photographs
(60–110 KB at 400–500 px and quality 92), unlike flat or pure-noise images.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image


@dataclass(frozen=True)
class TreeStats:
    """What a generator wrote."""

    num_files: int
    num_bytes: int


def make_photo(
    rng: np.random.Generator, width: int, height: int, *, quality: int = 92, fmt: str = "JPEG"
) -> bytes:
    """Encode one photo-like image of ``width`` × ``height`` pixels."""
    small = rng.integers(
        0, 256, size=(max(2, height // 64), max(2, width // 64), 3), dtype=np.uint8
    )
    base = np.asarray(
        Image.fromarray(small).resize((width, height), Image.Resampling.BICUBIC), np.float32
    )
    texture = rng.normal(128, 40, size=(height // 8 + 1, width // 8 + 1)).clip(0, 255)
    mid = (
        np.asarray(
            Image.fromarray(texture.astype(np.uint8)).resize(
                (width, height), Image.Resampling.BILINEAR
            ),
            np.float32,
        )[..., None]
        - 128
    )
    grain = rng.normal(0, 14, size=(height, width, 1)).astype(np.float32)
    pixels = (base + mid + grain).clip(0, 255).astype(np.uint8)
    out = io.BytesIO()
    if fmt == "JPEG":
        Image.fromarray(pixels).save(out, fmt, quality=quality)
    else:
        Image.fromarray(pixels).save(out, fmt)
    return out.getvalue()


def make_imagefolder(
    root: str | os.PathLike[str],
    *,
    num_classes: int = 10,
    per_class: int = 100,
    seed: int = 0,
    long_side: tuple[int, int] = (400, 500),
    quality: int = 92,
) -> TreeStats:
    """Write ``root/class_XX/img_XXXXX.jpg``, files created in class order.

    Args:
        root: folder to create (parents too).
        num_classes: number of class folders.
        per_class: images per class.
        seed: the same seed writes the same bytes.
        long_side: inclusive range of the longer image side in pixels.
        quality: JPEG quality.
    """
    rng = np.random.default_rng(seed)
    root = Path(root)
    total = 0
    for c in range(num_classes):
        folder = root / f"class_{c:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            width = int(rng.integers(long_side[0], long_side[1] + 1))
            height = max(1, int(width * rng.uniform(0.66, 0.8)))
            data = make_photo(rng, width, height, quality=quality)
            (folder / f"img_{c * per_class + i:06d}.jpg").write_bytes(data)
            total += len(data)
    return TreeStats(num_classes * per_class, total)


def make_tiny_tree(
    root: str | os.PathLike[str],
    *,
    num_files: int = 1000,
    seed: int = 0,
    min_bytes: int = 1024,
    max_bytes: int = 4096,
    fanout: int = 10,
    files_per_folder: int = 100,
) -> TreeStats:
    """Write ``num_files`` small files in nested folders ``dXX/dYY/file_N.bin``.

    Half of the content is random and half repeats a per-file pattern, so zstd
    finds something to gain without the data being trivially compressible.
    """
    rng = np.random.default_rng(seed)
    root = Path(root)
    total = 0
    for i in range(num_files):
        folder_no = i // files_per_folder
        folder = root / f"d{folder_no // fanout % fanout:02d}" / f"d{folder_no % fanout:02d}"
        if folder_no >= fanout * fanout:
            folder = root / f"d{folder_no // (fanout * fanout):02d}" / folder.relative_to(root)
        folder.mkdir(parents=True, exist_ok=True)
        size = int(rng.integers(min_bytes, max_bytes + 1))
        noise = rng.integers(0, 256, size=size // 2, dtype=np.uint8).tobytes()
        pattern = (f"record {i} of {num_files}; ".encode() * (size // 16 + 1))[: size - len(noise)]
        data = noise + pattern
        (folder / f"file_{i:07d}.bin").write_bytes(data)
        total += len(data)
    return TreeStats(num_files, total)
