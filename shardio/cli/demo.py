"""``shardio demo``: the whole path on generated data, as a first check of a fresh install.

Generates a small ImageFolder of photo-like JPEGs, packs it with
``shardio.pack``, verifies it with ``shardio.verify`` and streams one epoch:
through ``shardio.StreamingDataset`` and a two-worker torch ``DataLoader``
when torch is installed, else through ``shardio.open_dataset``. torch is
imported only inside the streaming step, so the demo runs without it. The
functions are imported from their modules: ``shardio.pack`` and
``shardio.verify`` name modules as well as functions, and whichever was
imported first wins the package attribute.
"""

from __future__ import annotations

import importlib.util
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import click
import numpy as np

import shardio
from shardio.cli.inspect import dataset_errors, format_size
from shardio.cli.options import LocalPath
from shardio.ops.verify import verify
from shardio.reading.reader import open_dataset
from shardio.synth import make_imagefolder

NUM_CLASSES: Final = 5
BATCH_SIZE: Final = 32
NUM_WORKERS: Final = 2
IMAGE_SIDE: Final = 224


def imaging_backend() -> str:
    """Which library decodes images (``shardio.pil_backend``), or Pillow's version without it."""
    try:
        return str(shardio.pil_backend())
    except (ImportError, AttributeError):
        import PIL

        return f"Pillow {PIL.__version__}"


def to_tensor(image: Any) -> Any:
    """PIL image → uint8 CHW tensor of a fixed size, so a batch stacks (no torchvision needed)."""
    import torch

    pixels = np.asarray(image.convert("RGB").resize((IMAGE_SIDE, IMAGE_SIDE)))
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1)


@dataclass(frozen=True)
class StreamStats:
    """One epoch as the demo read it."""

    samples: int
    seconds: float
    startup_s: float
    """Until the first batch arrived: worker start-up and the first reads."""
    how: str
    steady_samples: int
    """Samples after the first batch, which ``samples_per_s`` is measured on."""

    @property
    def samples_per_s(self) -> float:
        """Throughput once streaming, or over the whole epoch when it was one batch."""
        if self.steady_samples == 0:
            return self.samples / max(self.seconds, 1e-9)
        return self.steady_samples / max(self.seconds - self.startup_s, 1e-9)


def _timed(batches: Iterable[Any], size: Callable[[Any], int], how: str) -> StreamStats:
    start = time.perf_counter()
    first_at: float | None = None
    first = count = 0
    for batch in batches:
        count += size(batch)
        if first_at is None:
            first_at, first = time.perf_counter(), count
    end = time.perf_counter()
    startup = (first_at if first_at is not None else end) - start
    return StreamStats(count, end - start, startup, how, count - first)


def torch_available() -> bool:
    """Whether torch can be imported here (checked without importing it)."""
    return importlib.util.find_spec("torch") is not None


def stream_epoch(out: Path) -> StreamStats:
    """Read every sample of ``out`` once, with torch's DataLoader when torch is installed."""
    if torch_available():
        try:
            dataset_class = shardio.StreamingDataset
        except (ImportError, AttributeError):
            dataset_class = None
        if dataset_class is not None:
            from torch.utils.data import DataLoader

            dataset = dataset_class(out, transform=to_tensor)
            loader = DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=NUM_WORKERS)
            how = (f"StreamingDataset + DataLoader(num_workers={NUM_WORKERS}, "
                   f"batch_size={BATCH_SIZE})")
            return _timed(loader, lambda batch: len(batch[1]), how)
    with open_dataset(out) as reader:
        return _timed(reader, lambda _sample: 1, "open_dataset (torch not installed)")


def _run(base: Path, num_images: int) -> None:
    from shardio.packing.pack import pack  # the packer's worker pool is only needed by this command

    src, out = base / "images", base / "dataset"
    per_class = max(1, num_images // NUM_CLASSES)
    start = time.perf_counter()
    stats = make_imagefolder(src, num_classes=NUM_CLASSES, per_class=per_class, seed=0,
                             long_side=(400, 500))
    click.echo(f"generated  {stats.num_files} photo-like JPEGs in {NUM_CLASSES} classes, "
               f"{format_size(stats.num_bytes)}, in {time.perf_counter() - start:.1f} s ({src})")
    packed = pack(src, out, seed=0)
    click.echo(f"packed     {packed.samples} samples into {packed.shards} shard(s): "
               f"{format_size(packed.input_bytes)} -> {format_size(packed.output_bytes)} "
               f"(ratio {packed.ratio:.3f}) in {packed.seconds:.2f} s, "
               f"{packed.files_per_s:,.0f} files/s ({out})")
    report = verify(out)
    verdict = "OK" if report.ok else f"{len(report.faults)} fault(s)"
    click.echo(f"verified   {report.num_records} records in {report.num_shards} shard(s), "
               f"{format_size(report.num_bytes)}, in {report.seconds:.2f} s: {verdict}")
    for fault in report.faults:
        click.echo(f"  FAULT {fault.message}", err=True)
    streamed = stream_epoch(out)
    click.echo(f"streamed   {streamed.samples} samples in {streamed.seconds:.2f} s "
               f"(start-up {streamed.startup_s:.2f} s, then {streamed.samples_per_s:,.0f} "
               f"samples/s) via {streamed.how}")
    click.echo(f"imaging    {imaging_backend()}")
    if not report.ok or streamed.samples != packed.samples:
        raise click.ClickException("the demo dataset did not check out; see the lines above")


@click.command()
@click.option("--images", "num_images", type=click.IntRange(min=NUM_CLASSES), default=200,
              show_default=True, help=f"Images to generate, spread over {NUM_CLASSES} classes.")
@click.option("--keep", type=LocalPath("demo folder", file_okay=False), default=None,
              help="Keep the images (DIR/images) and the dataset (DIR/dataset) in DIR "
                   "instead of a temporary folder.")
def demo(num_images: int, keep: Path | None) -> None:
    """Generate, pack, verify and stream a small demo dataset.

    Makes an ImageFolder of photo-like JPEGs, packs it, verifies it and
    streams one epoch. A quick check that shardio works on this machine; it prints the pack
    statistics, the verify result, the streaming speed and the imaging library.
    """
    with dataset_errors():
        if keep is not None:
            if keep.exists() and any(keep.iterdir()):
                raise click.ClickException(f"{keep}: not empty; --keep needs an empty folder")
            _run(keep, num_images)
            return
        with tempfile.TemporaryDirectory(prefix="shardio-demo-") as tmp:
            _run(Path(tmp), num_images)


COMMANDS = [demo]
