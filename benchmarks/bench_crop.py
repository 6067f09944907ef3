"""Question: what does ``crop=`` save over a full decode then the crop, per image and per epoch?

Training decodes every image, then ``RandomResizedCrop(224)`` keeps a box of 8-100% of
its area and resizes it: torchvision does that on a full-size decode. ``crop=`` picks the
box from the header, decodes at the least JPEG scale (1/2, 1/4, 1/8) at which the box
still covers 224x224 (``shardio/decode/crop.py``; simplejpeg where installed, else Pillow's draft
mode) and resizes the box with torch's uint8 kernels (``shardio/torch/resize.py``); the results
name which decoder ran. Two trees: the harness's images
(400-500 px on the long side, where a 224 crop rarely allows a reduced scale) and photos
of 1600x1200 (where it usually does). Per tree, in one process, the same samples' boxes
(the same draws) decoded both ways, alternated within each round: images/s, median of
``--repeats`` rounds. Then an epoch through a loader with ``--workers`` workers, also
alternated: ``shardio.loader(decode="tensor", crop=RandomResizedCrop(224))`` over a
records pack against a ``DataLoader`` over the files whose dataset does what
torchvision's ``ImageFolder`` with ``RandomResizedCrop(224)`` and ``PILToTensor`` does
(torchvision itself does not import beside this torch; the operations are Pillow's, the
same calls). Writes ``results/crop.json``.

    benchmarks/.env/bin/python -m benchmarks.bench_crop [--repeats 3] [--workers 2]

The harness's environment has no simplejpeg (its decoded figures are Pillow's); to measure
``crop=`` as ``pip install shardio[jpeg]`` runs it, put simplejpeg beside it without adding
it to that environment::

    benchmarks/.env/bin/pip install --no-deps --target benchmarks/work/jpeg simplejpeg
    PYTHONPATH=benchmarks/work/jpeg benchmarks/.env/bin/python -m benchmarks.bench_crop
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.datagen import ensure_tree
from benchmarks.machine import source_id

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
WORK = HERE / "work" / "crop"
SIZE = 224


def _large_tree(count: int) -> Path:
    """``count`` photos of 1600x1200 in 10 class folders, made once."""
    from shardio.synth import make_photo

    root = WORK / f"large-{count}"
    done = root.with_suffix(".done")
    if not done.exists():
        for i in range(count):
            folder = root / f"class_{i % 10:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"img_{i:05d}.jpg").write_bytes(
                make_photo(np.random.default_rng(i), 1600, 1200))
        done.write_text("")
    return root


class FolderCrops:
    """What ``ImageFolder(root, transform=Compose([RandomResizedCrop(224), PILToTensor()]))``
    does per sample, in Pillow's calls: open, convert to RGB, crop the box, resize it."""

    def __init__(self, root: Path) -> None:
        from shardio.decode.crop import RandomResizedCrop

        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.samples = [(p, classes.index(p.parent.name)) for p in sorted(root.rglob("*.jpg"))]
        self.crop = RandomResizedCrop(SIZE, flip=False)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Any:
        import torch
        from PIL import Image

        path, label = self.samples[i]
        with Image.open(path) as img:
            rgb = img.convert("RGB")
        box, _ = self.crop.box(rgb.height, rgb.width, np.random.default_rng(i))
        pixels = np.asarray(rgb.crop(tuple(round(v) for v in box)).resize(
            (SIZE, SIZE), Image.Resampling.BILINEAR))
        return torch.from_numpy(pixels.copy()).permute(2, 0, 1), label


def per_image(root: Path, limit: int) -> dict[str, float]:
    """Images/s of both ways over the same bytes and boxes, one process, no loader."""
    from PIL import Image

    from shardio.decode.crop import Cropper, RandomResizedCrop
    from shardio.torch.resize import resize_box

    blobs = [p.read_bytes() for p in sorted(root.rglob("*.jpg"))[:limit]]
    # as StreamingDataset(crop=) builds it
    cropper = Cropper(RandomResizedCrop(SIZE, flip=False), seed=0, resize=resize_box)
    out = np.empty(cropper.shape, np.uint8)
    began = time.perf_counter()
    boxes = []
    for i, blob in enumerate(blobs):
        pending = cropper.open(blob, i)
        boxes.append(pending.box)
        pending.decode_into(out)
    crop_s = time.perf_counter() - began
    began = time.perf_counter()
    for blob, box in zip(blobs, boxes, strict=True):
        with Image.open(io.BytesIO(blob)) as img:
            rgb = img.convert("RGB")
        np.copyto(out, np.asarray(rgb.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=box)))
    full_s = time.perf_counter() - began
    return {"crop": len(blobs) / crop_s, "full": len(blobs) / full_s}


def epoch_rates(root: Path, pack: Path, workers: int) -> dict[str, float]:
    """Images/s of a second epoch through each loader (workers already running)."""
    import torch

    import shardio
    from shardio.decode.crop import RandomResizedCrop

    dataset = shardio.StreamingDataset(pack, decode="tensor", crop=RandomResizedCrop(SIZE))
    ours = shardio.loader(dataset, batch_size=64, num_workers=workers)
    theirs = torch.utils.data.DataLoader(FolderCrops(root), batch_size=64, shuffle=True,
                                         num_workers=workers, persistent_workers=workers > 0)
    rates = {}
    for name, loader in (("shardio", ours), ("folder", theirs)):
        seen = 0
        for _ in range(2):
            began, seen = time.perf_counter(), 0
            for images, _labels in loader:
                assert images.shape[1:] == (3, SIZE, SIZE)
                seen += len(images)
        rates[name] = seen / (time.perf_counter() - began)
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--images", type=int, default=2000, help="files of the images tree")
    parser.add_argument("--large", type=int, default=400, help="photos of 1600x1200")
    args = parser.parse_args(argv)
    import shardio

    trees = {"images": ensure_tree("images", args.images).root, "large": _large_tree(args.large)}
    packs = {}
    for name, root in trees.items():
        packs[name] = WORK / f"pack-{name}-{root.name}"
        if not (packs[name] / "manifest.json").exists():
            shardio.pack_imagefolder(root, packs[name], overwrite=True, progress=False)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for r in range(args.repeats):
        for name, root in trees.items():
            row = {"per_image": per_image(root, 400),
                   "epoch": epoch_rates(root, packs[name], args.workers)}
            rounds[name].append(row)
            print(f"round {r} {name}: {row}", flush=True)
    result = {
        "question": "RandomResizedCrop(224) decoded at a reduced JPEG scale against a full "
                    "decode then the crop: images/s",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(["python -m benchmarks.bench_crop", *(argv or sys.argv[1:])]),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "crop_decoder": _crop_decoder(),
        "load_avg_1min": os.getloadavg()[0],
        "shardio_source": source_id(HERE.parent / "shardio"),
        "repeats": args.repeats,
        "workers": args.workers,
        "trees": {name: {"files": len(list(root.rglob("*.jpg"))),
                         "per_image": {k: statistics.median(x["per_image"][k] for x in rows)
                                       for k in ("crop", "full")},
                         "epoch": {k: statistics.median(x["epoch"][k] for x in rows)
                                   for k in ("shardio", "folder")}}
                  for (name, root), rows in zip(trees.items(), rounds.values(), strict=True)},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "crop.json").write_text(json.dumps(result, indent=1) + "\n")
    print(crop_block())


def _crop_decoder() -> str:
    from shardio.decode.crop import Cropper, RandomResizedCrop
    from shardio.torch.resize import resize_box

    return Cropper(RandomResizedCrop(SIZE), 0, resize=resize_box).describe()


def crop_block(path: Path | None = None) -> str:
    """The table of ``crop=`` against a full decode then the crop."""
    result = json.loads((path or RESULTS / "crop.json").read_text(encoding="utf-8"))
    label = {"images": "harness images, 400-500 px", "large": "photos of 1600x1200"}
    lines = [
        f"Measured {result['date']} on {result['machine']['cores']} cores, 1-minute load "
        f"{result['load_avg_1min']:.1f}, shardio at git {result['shardio_source']['git_head']} "
        f"(`{result['command'].strip()}`); medians of {result['repeats']} rounds; images/s "
        f"to 224x224 RandomResizedCrop; `crop=` decoded baseline JPEGs with "
        f"{result.get('crop_decoder', 'Pillow (draft scale)')}:", "",
        "| tree | per image, 1 process: `crop=` | full decode, then crop | ratio | "
        f"epoch, {result['workers']} workers: `shardio.loader(crop=)` | "
        "DataLoader over the files, full decode then crop | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, tree in result["trees"].items():
        per, epoch = tree["per_image"], tree["epoch"]
        lines.append(
            f"| {label.get(name, name)} ({tree['files']:,} files) | {per['crop']:,.0f} | "
            f"{per['full']:,.0f} | {per['crop'] / per['full']:.2f}x | "
            f"{epoch['shardio']:,.0f} | {epoch['folder']:,.0f} | "
            f"{epoch['shardio'] / epoch['folder']:.2f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
