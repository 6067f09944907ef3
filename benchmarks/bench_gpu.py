"""Question: does shardio keep a GPU fed with decoded images, on a machine with many cores?

Decoded JPEG batches all the way onto the GPU, normalised there (float, ImageNet mean and
std, ``channels_last``), at several worker counts, against what a user would write
instead, on the same files, the systems alternated within each round:

* ``shardio``: a records pack, ``shardio.loader(decode="tensor")`` (each worker decodes
  a batch straight into its shared-memory slot; ``pin_memory`` on with CUDA) and
  ``shardio.DevicePrefetcher`` (the copy of the next batch on a side stream).
* ``torchvision``: ``torchvision.datasets.ImageFolder`` over the source files with
  ``PILToTensor``, a ``DataLoader`` with ``pin_memory=True`` and persistent workers, and
  ``.to(device, non_blocking=True)`` then the same arithmetic in the loop.
* ``shardio-nvjpeg``: the same pack read raw (``RecordBatch``) and decoded on the GPU by
  ``shardio.DeviceDecoder`` (nvJPEG through ``torchvision.io.decode_jpeg``, one call a
  batch); ``shardio-nvjpeg-crop`` crops there too (``RandomResizedCrop(224)``, against
  ``torchvision-crop``); only with CUDA.
* ``shardio-crop`` against ``torchvision-crop``: training's ``RandomResizedCrop(224)`` and
  flip, ``StreamingDataset(crop=shardio.RandomResizedCrop(224))`` (the box decoded at
  the smallest JPEG scale covering it) against the transforms on the full decode.

Beside them, the CPU decode limit: ``P`` processes decoding the same JPEG bytes from
memory with the decoder shardio uses, no loader, for each worker count ``P``. Every
measurement is a fresh process: one epoch from building the loader (workers' start and
first batch included), then ``--epochs`` timed epochs through the same loader; images/s
of the timed epochs, the first batch's wait, and every image counted. The images are all
one size (``--size``), so every system's batches stack. Writes ``results/gpu.json``
(``--out`` elsewhere).

    python -m benchmarks.bench_gpu [--images 8000] [--workers 4 8 14] [--repeats 2]

Without CUDA the same loaders run to the CPU (``--device cpu``), which checks the script
and nothing else; the committed results name the device they ran on.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.machine import source_id
from benchmarks.resultsfile import command_line, write_results

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
SYSTEMS = ("shardio", "torchvision", "shardio-nvjpeg", "shardio-crop", "torchvision-crop",
           "shardio-nvjpeg-crop")
PEER = {"shardio": "torchvision", "shardio-nvjpeg": "torchvision",
        "shardio-crop": "torchvision-crop", "shardio-nvjpeg-crop": "torchvision-crop"}
ON_GPU = ("shardio-nvjpeg", "shardio-nvjpeg-crop")
"""Systems that decode on the GPU: run only with CUDA."""
"""The system each is compared with (the ``x torchvision`` column)."""
CROP = 224


def _write_images(args: tuple[Path, int, int, int, int]) -> int:
    """Class folder ``root/class_CC`` with images ``start..stop`` (seeded by index)."""
    from shardio.synth import make_photo

    root, start, stop, width, height = args
    total = 0
    for i in range(start, stop):
        folder = root / f"class_{i % 10:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        data = make_photo(np.random.default_rng(i), width, height, quality=90)
        (folder / f"img_{i:06d}.jpg").write_bytes(data)
        total += len(data)
    return total


def make_data(work: Path, images: int, size: tuple[int, int]) -> dict[str, Any]:
    """The tree (all images ``size``) and its records pack, made once per parameters."""
    import shardio

    tree = work / f"tree-{images}-{size[0]}x{size[1]}"
    done = tree.with_suffix(".json")
    if not done.exists():
        chunks = [(tree, a, min(a + 250, images), *size) for a in range(0, images, 250)]
        with multiprocessing.get_context("fork").Pool(os.cpu_count()) as pool:
            total = sum(pool.map(_write_images, chunks))
        done.write_text(json.dumps({"images": images, "bytes": total}))
    pack = work / f"pack-{images}-{size[0]}x{size[1]}"
    if not (pack / "manifest.json").exists():
        shardio.pack_imagefolder(tree, pack, overwrite=True, progress=False)
    return {"tree": str(tree), "pack": str(pack), **json.loads(done.read_text())}


# ---------------------------------------------------------------- children


def _decode_all(payload: tuple[list[bytes], float]) -> float:
    """Decode every image once after ``start`` (all processes begin together); seconds."""
    from shardio.torch.collate import decode_tensor

    blobs, start = payload
    while time.time() < start:
        time.sleep(0.001)
    began = time.perf_counter()
    for blob in blobs:
        decode_tensor(blob)
    return time.perf_counter() - began


def decode_limit(tree: Path, processes: int, limit: int) -> dict[str, Any]:
    """Images/s of ``processes`` processes decoding the same in-memory JPEGs at once.

    The better of two tries: the slowest process sets a try's figure, and one process
    held up by anything else (the page cache still writing the data out, another job)
    put the limit at 0.6x its value in one round on the 16-core device.
    """
    blobs = [p.read_bytes() for p in sorted(tree.rglob("*.jpg"))[:limit]]
    ctx = multiprocessing.get_context("fork")
    slowest = []
    with ctx.Pool(processes) as pool:
        for _ in range(2):
            start = time.time() + 1.0
            slowest.append(max(pool.map(_decode_all, [(blobs, start)] * processes,
                                        chunksize=1)))
    return {"processes": processes, "images_per_s": round(processes * len(blobs) / min(slowest))}


def _normalise(images: Any, device: Any) -> Any:
    """What the prefetcher's conversion does, written in a training loop."""
    import torch

    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255
    x = images.contiguous(memory_format=torch.channels_last).float()
    return x.sub_(mean).div_(std)


def run_child(system: str, data: dict[str, Any], workers: int, epochs: int, batch: int,
              device_name: str) -> dict[str, Any]:
    """One system: an untimed first epoch, then ``epochs`` timed ones; per-image checks."""
    import torch

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    if cuda:  # a training script has its model on the device before the loader starts
        torch.zeros(1, device=device)
        torch.cuda.synchronize()
    built = time.perf_counter()
    if system in ("shardio", "shardio-crop"):
        import shardio

        crop = shardio.RandomResizedCrop(CROP) if system == "shardio-crop" else None
        dataset = shardio.StreamingDataset(data["pack"], decode="tensor", crop=crop)
        loader: Any = shardio.DevicePrefetcher(
            shardio.loader(dataset, batch_size=batch, num_workers=workers), device,
            convert_float=True, mean=MEAN, std=STD, channels_last=True)

        def step(item: Any) -> Any:
            return item
    elif system in ("torchvision", "torchvision-crop"):
        from torch.utils.data import DataLoader
        from torchvision import datasets, transforms

        steps = [transforms.RandomResizedCrop(CROP), transforms.RandomHorizontalFlip()] if (
            system == "torchvision-crop") else []
        folder = datasets.ImageFolder(data["tree"], transform=transforms.Compose(
            [*steps, transforms.PILToTensor()]))
        loader = DataLoader(folder, batch_size=batch, shuffle=True, num_workers=workers,
                            pin_memory=cuda, persistent_workers=workers > 0,
                            prefetch_factor=4 if workers > 0 else None)

        def step(item: Any) -> Any:
            images, labels = item
            images = images.to(device, non_blocking=True)
            return _normalise(images, device), labels.to(device, non_blocking=True)
    elif system in ON_GPU:
        import shardio

        dataset = shardio.StreamingDataset(data["pack"], decode="raw")
        raw = shardio.loader(dataset, batch_size=batch, num_workers=workers)
        loader = raw
        decoder = shardio.DeviceDecoder(device, crop=shardio.RandomResizedCrop(CROP) if (
            system == "shardio-nvjpeg-crop") else None)
        if not decoder.gpu:
            raise RuntimeError(f"{system}: {decoder.describe()}")

        def step(item: Any) -> Any:
            images, labels = decoder(item, epoch=raw.epoch)
            return _normalise(images, device), labels
    else:
        raise ValueError(f"unknown system {system!r}")

    def epoch() -> tuple[int, float, float]:
        count, checksum, first = 0, torch.zeros((), device=device), None
        began = time.perf_counter()
        for item in loader:
            images, labels = step(item)
            if first is None:
                first = time.perf_counter() - began
            # a use of every pixel on the device, as a training step would make
            checksum += images.float().mean()
            count += len(labels)
        if cuda:
            torch.cuda.synchronize()
        assert torch.isfinite(checksum).item(), "non-finite pixels"
        return count, time.perf_counter() - began, first or 0.0

    first_count, first_s, first_batch = epoch()
    build_s = time.perf_counter() - built - first_s
    timed = [epoch() for _ in range(epochs)]
    counts = [c for c, _, _ in timed]
    if any(c != data["images"] for c in [first_count, *counts]):
        raise AssertionError(f"{system}: epochs of {[first_count, *counts]} images, "
                             f"not {data['images']}")
    seconds = sum(t for _, t, _ in timed)
    return {"system": system, "workers": workers,
            "images_per_s": round(sum(counts) / seconds),
            "first_epoch_images_per_s": round(first_count / (first_s + build_s)),
            "first_batch_s": round(first_batch + build_s, 3),
            "decoder": _decoder_name(system)}


def _decoder_name(system: str) -> str:
    if system in ON_GPU:
        import shardio

        return shardio.DeviceDecoder("cuda").describe()
    if system.startswith("torchvision"):
        return "Pillow (ImageFolder)"
    from shardio.decode.image import jpeg_decoder

    if system == "shardio-crop":
        from shardio.decode.crop import Cropper, RandomResizedCrop
        from shardio.torch.resize import resize_box

        return Cropper(RandomResizedCrop(CROP), 0, resize=resize_box).describe()

    return jpeg_decoder()


# ---------------------------------------------------------------- driver


def _child(args: list[str], timeout: float) -> dict[str, Any]:
    """Run ``--child`` in a fresh interpreter; its last stdout line is its JSON result."""
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_gpu", "--child", *args],
                          capture_output=True, text=True, cwd=HERE.parent, timeout=timeout,
                          check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": " | ".join(tail)}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _gpu_name(device: str) -> str | None:
    import torch

    return torch.cuda.get_device_name(0) if device == "cuda" else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=8000)
    parser.add_argument("--size", type=int, nargs=2, default=(500, 375), metavar=("W", "H"))
    parser.add_argument("--workers", type=int, nargs="+", default=[4, 8, 14])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs after the first")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--device", default=None, help="default: cuda where available, else cpu")
    parser.add_argument("--work", type=Path, default=HERE / "work" / "gpu")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu.json")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per child")
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        system, data, workers, epochs, batch, device = args.child
        print(json.dumps(run_child(system, json.loads(data), int(workers), int(epochs),
                                   int(batch), device)))
        return
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    systems = [s for s in args.systems.split(",") if s not in ON_GPU or device == "cuda"]
    args.work.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    data = make_data(args.work, args.images, tuple(args.size))
    print(f"data: {data['images']} images, {data['bytes'] / 1e6:.0f} MB, "
          f"{time.perf_counter() - began:.0f} s", flush=True)
    limits: dict[int, list[float]] = {p: [] for p in args.workers}
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in range(args.repeats):
        for p in args.workers:
            limits[p].append(decode_limit(Path(data["tree"]), p, 2000)["images_per_s"])
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for workers in args.workers:
            for system in order:
                got = _child([system, json.dumps(data), str(workers), str(args.epochs),
                              str(args.batch), device], args.timeout)
                runs.setdefault((system, workers), []).append(got)
                print(f"round {r}: {system} workers={workers}: {got}", flush=True)
                # written after every run, so a run cut by a time limit keeps what finished
                _write(args, argv, device, data, limits, runs, complete=False)
    _write(args, argv, device, data, limits, runs, complete=True)
    print(gpu_block(args.out))


def _write(args: argparse.Namespace, argv: list[str] | None, device: str,
           data: dict[str, Any], limits: dict[int, list[float]],
           runs: dict[tuple[str, int], list[dict[str, Any]]], complete: bool) -> None:
    """Write the medians of the runs so far to ``--out``."""
    import torch

    rows = []
    for (system, workers), got in runs.items():
        ok = [g for g in got if "error" not in g]
        row: dict[str, Any] = {"system": system, "workers": workers, "runs": len(got),
                               "errors": [g["error"] for g in got if "error" in g]}
        if ok:
            row.update({key: statistics.median(g[key] for g in ok) for key in (
                "images_per_s", "first_epoch_images_per_s", "first_batch_s")})
            row["decoder"] = ok[0]["decoder"]
        rows.append(row)
    result = {
        "question": "decoded, normalised image batches on the GPU: images/s per worker count",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": command_line("benchmarks.bench_gpu", argv or sys.argv[1:]),
        "complete": complete,
        "device": device,
        "gpu": _gpu_name(device),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "load_avg_1min": os.getloadavg()[0],
        "shardio_source": source_id(HERE.parent / "shardio"),
        "dataset": {"images": data["images"], "bytes": data["bytes"],
                    "size": list(args.size)},
        "batch_size": args.batch,
        "epochs_timed": args.epochs,
        "repeats": args.repeats,
        "decode_limit": [{"processes": p, "images_per_s": statistics.median(v)}
                         for p, v in limits.items() if v],
        "rows": rows,
    }
    write_results(args.out, result, command=result["command"])


def gpu_block(path: Path | None = None) -> str:
    """The table of decoded images/s on the device per system and worker count."""
    result = json.loads((path or RESULTS / "gpu.json").read_text(encoding="utf-8"))
    limit = {row["processes"]: row["images_per_s"] for row in result["decode_limit"]}
    data = result["dataset"]
    where = result["gpu"] or result["device"]
    lines = [
        f"Measured {result['date']} on {result['machine']['cores']} cores and {where} "
        f"(torch {result['machine']['torch']}), shardio at git "
        f"{result['shardio_source']['git_head']}, 1-minute load "
        f"{result['load_avg_1min']:.1f} (`{result['command'].strip()}`); "
        f"{data['images']:,} JPEGs of {data['size'][0]}x{data['size'][1]}, "
        f"{data['bytes'] / 1e6:,.0f} MB, batches of {result['batch_size']}, medians of "
        f"{result['repeats']} rounds; images/s over {result['epochs_timed']} epochs after "
        "the first, decoded and normalised on the device; *x its torchvision*: against "
        "`torchvision`, or `torchvision-crop` for the crops"
        + ("" if result.get("complete", True) else
           " (**the run reached its time limit**: the rows below are those that finished)")
        + ":", "",
        "| workers | CPU decode limit | system | decoder | images/s | x decode limit "
        "| x its torchvision | first epoch, images/s | first batch, s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    by = {(row["system"], row["workers"]): row for row in result["rows"]}
    for row in result["rows"]:
        workers = row["workers"]
        if "images_per_s" not in row:
            lines.append(f"| {workers} | {limit[workers]:,.0f} | {row['system']} | | failed: "
                         f"{row['errors'][0][:80]} | | | | |")
            continue
        peer = by.get((PEER.get(row["system"], ""), workers), {}).get("images_per_s")
        versus = f"{row['images_per_s'] / peer:.2f}x" if peer else ""
        lines.append(
            f"| {workers} | {limit[workers]:,.0f} | {row['system']} | {row['decoder']} | "
            f"{row['images_per_s']:,.0f} | {row['images_per_s'] / limit[workers]:.2f}x | "
            f"{versus} | {row['first_epoch_images_per_s']:,.0f} | "
            f"{row['first_batch_s']:.2f} |")
    lines += ["", _summary(result, limit, by)]
    if result.get("note"):
        lines += ["", f"Note in the results file: {result['note']}."]
    return "\n".join(lines) + "\n"


def _summary(result: dict[str, Any], limit: dict[int, float],
             by: dict[tuple[str, int], dict[str, Any]]) -> str:
    """One line: each system's range of ratios to the decode limit and to torchvision."""
    parts = []
    for system in SYSTEMS:
        rows = [row for row in result["rows"]
                if row["system"] == system and "images_per_s" in row]
        if not rows:
            continue
        to_limit = [row["images_per_s"] / limit[row["workers"]] for row in rows]
        said = f"{system}: {min(to_limit):.2f}-{max(to_limit):.2f}x the decode limit"
        peer = PEER.get(system, "")
        peers = [row["images_per_s"] / by[(peer, row["workers"])]["images_per_s"]
                 for row in rows if "images_per_s" in by.get((peer, row["workers"]), {})]
        if peers:
            said += f", {min(peers):.2f}-{max(peers):.2f}x {peer}"
        parts.append(said)
    workers = ", ".join(str(w) for w in sorted(limit))
    return f"Over {workers} workers: " + "; ".join(parts) + "."


if __name__ == "__main__":
    main()
