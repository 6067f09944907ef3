"""``shardio bench``: how fast this machine reads a dataset, and which ``num_workers`` to use.

Reads the dataset through ``shardio.loader`` with 0, 1, 2, … workers up to the
core count, raw and (on ImageFolder packs) decoded, and measures samples/s,
MB/s and CPU use per setting. Each setting is read for at least ``min_seconds``
and ``MIN_BATCHES`` batches, repeating epochs when the dataset is small, so a
figure is never the timing of a few milliseconds; settings cut short (by
``max_samples``) are reported as not measured and no ``num_workers`` is
recommended from them. Imports torch.
"""

from __future__ import annotations

import gc
import os
import resource
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from shardio.format.manifest import Manifest
from shardio.reading.batch import RecordBatch
from shardio.storage.options import RemoteOptions
from shardio.torch.dataset import StreamingDataset, default_window
from shardio.torch.loader import ShardLoader, loader

RECOMMEND_WITHIN = 0.95
"""Recommend the fewest workers reaching this fraction of the best throughput."""
MIN_SECONDS = 2.0
"""Default time each setting is read for (after its first batch)."""
MIN_BATCHES = 10
"""Fewest timed batches for a setting to count as measured."""


@dataclass(frozen=True)
class BenchRow:
    """One setting: throughput from its first batch on, CPU over the whole run.

    ``cpu_percent`` is the CPU time of this process and its workers over the wall
    time from building the loader to the workers' exit (start-up included), so it
    is at most 100 × the cores in use. ``measured`` is false when the setting was
    read for less than ``min_seconds`` or ``MIN_BATCHES`` batches: its figures are
    noise.
    """

    mode: str
    num_workers: int
    samples: int
    batches: int
    epochs: int
    seconds: float
    samples_per_s: float
    mb_per_s: float
    cpu_percent: float
    measured: bool


@dataclass(frozen=True)
class BenchReport:
    """All settings measured on one dataset, and what to use (``None``: could not tell)."""

    path: str
    num_samples: int
    cores: int
    rows: tuple[BenchRow, ...]
    recommended_num_workers: int | None
    recommended_shuffle_buffer: int
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return asdict(self)


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # workers count once joined
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _batch_bytes(batch: Any) -> int:
    if isinstance(batch, RecordBatch):
        return batch.nbytes
    images = batch[0]
    if isinstance(images, list):
        return sum(int(t.numel()) for t in images)
    return int(images.numel())


def _epochs(run: ShardLoader) -> Iterator[Any]:
    """Batches of epoch after epoch; stops only if an epoch yields nothing."""
    while True:
        empty = True
        for batch in run:
            empty = False
            yield batch
        if empty:
            return


def measure(
    path: str,
    mode: str,
    num_workers: int,
    *,
    batch_size: int,
    min_seconds: float = MIN_SECONDS,
    max_samples: int | None = None,
    remote: RemoteOptions | None = None,
) -> BenchRow:
    """Read one setting for ``min_seconds`` and ``MIN_BATCHES`` batches after the first batch.

    Epochs repeat (in the same persistent workers) until both are reached, or until
    ``max_samples`` samples were timed, which leaves the row not ``measured``.
    """
    cpu0, start = _cpu_seconds(), time.perf_counter()
    run = loader(StreamingDataset(path, decode=mode, remote=remote),  # type: ignore[arg-type]
                 batch_size, num_workers=num_workers)
    first_epoch = run.epoch
    batches = _epochs(run)
    samples = nbytes = timed = 0
    t0 = elapsed = 0.0
    for i, batch in enumerate(batches):
        if i == 0:  # the clock starts at the first batch: worker start-up is not throughput
            t0 = time.perf_counter()
            continue
        samples += len(batch) if isinstance(batch, RecordBatch) else len(batch[1])
        nbytes += _batch_bytes(batch)
        timed += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds and timed >= MIN_BATCHES:
            break
        if max_samples is not None and samples >= max_samples:
            break
    epochs = run.epoch - first_epoch + 1
    del batches, run
    gc.collect()  # the loader's workers exit and are joined here, so their CPU is counted
    cpu, wall = _cpu_seconds() - cpu0, time.perf_counter() - start
    seconds = max(elapsed, 1e-9)
    return BenchRow(
        mode, num_workers, samples, timed, epochs, elapsed, samples / seconds,
        nbytes / seconds / 1e6, 100.0 * cpu / max(wall, 1e-9),
        elapsed >= min_seconds and timed >= MIN_BATCHES,
    )


def recommend(rows: Sequence[BenchRow], mode: str) -> int | None:
    """Fewest workers within ``RECOMMEND_WITHIN`` of the best rate of ``mode``.

    ``None`` unless every setting of ``mode`` was measured: a comparison with a
    setting read for a few milliseconds is a comparison with noise.
    """
    candidates = [r for r in rows if r.mode == mode]
    if not candidates or not all(r.measured for r in candidates):
        return None
    best = max(r.samples_per_s for r in candidates)
    return min(r.num_workers for r in candidates if r.samples_per_s >= RECOMMEND_WITHIN * best)


def bench_modes(manifest: Manifest, modes: Sequence[str] | None) -> list[str]:
    """The modes to measure: ``modes``, or by default raw and (on ImageFolder packs) tensor.

    Raises:
        ValueError: ``"tensor"`` on a pack that is not an ImageFolder (checked before any
            setting is read, not after the raw ones), or an unknown mode.
    """
    chosen = list(modes or (["raw", "tensor"] if manifest.is_imagefolder else ["raw"]))
    unknown = sorted(set(chosen) - {"raw", "tensor"})
    if unknown:
        raise ValueError(f"unknown mode(s) {unknown}: the modes are 'raw' and 'tensor'")
    if "tensor" in chosen and not manifest.is_imagefolder:
        raise ValueError(f"mode 'tensor' decodes the images of an ImageFolder pack, and this "
                         f"pack is not one (fields: {', '.join(manifest.fields)}): measure "
                         "mode 'raw' (--mode raw)")
    return chosen


def bench(
    path: str | os.PathLike[str],
    *,
    max_workers: int | None = None,
    min_seconds: float = MIN_SECONDS,
    max_samples: int | None = None,
    batch_size: int = 64,
    modes: Sequence[str] | None = None,
    on_row: Callable[[BenchRow], None] | None = None,
    remote: RemoteOptions | None = None,
) -> BenchReport:
    """Measure read throughput of the dataset at ``path`` per mode and worker count.

    Args:
        path: a dataset written by ``shardio pack``, a folder or a URL (a remote
            dataset's first setting includes its downloads; later ones read the cache
            when the budget holds the dataset).
        max_workers: highest ``num_workers`` tried (default: the core count).
        min_seconds: each setting is timed for at least this long, repeating epochs.
        max_samples: stop a setting after this many samples even if ``min_seconds``
            has not passed (quick look; such rows are not measured, and nothing is
            recommended from them).
        batch_size: samples per batch, as in training.
        modes: ``"raw"`` and/or ``"tensor"`` (``bench_modes``; default: both on ImageFolder
            packs).
        on_row: called with each row as it is measured (progress display).
        remote: how a URL is reached and cached (``RemoteOptions``).
    """
    first = StreamingDataset(path, decode="raw", remote=remote)
    manifest, remote = first.manifest, first.reader.remote  # one budget for every setting
    cores = os.cpu_count() or 1
    top = cores if max_workers is None else max_workers
    chosen = bench_modes(manifest, modes)
    rows: list[BenchRow] = []
    for mode in chosen:
        for workers in range(top + 1):
            row = measure(str(path), mode, workers, batch_size=batch_size,
                          min_seconds=min_seconds, max_samples=max_samples, remote=remote)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    target_mode = "tensor" if "tensor" in chosen else chosen[0]
    recommended = recommend(rows, target_mode)
    mean = manifest.num_bytes / max(manifest.num_samples, 1)
    # a window beyond the dataset holds nothing more: it is the whole dataset, shuffled
    window = max(1, min(default_window(mean), manifest.num_samples))
    notes = [f"shuffle_buffer {window} holds about {window * mean / 1e6:.0f} MB of records "
             "per worker" + (f" (the whole dataset: {manifest.num_samples:,} samples)"
                             if window == manifest.num_samples else "")]
    short = [r for r in rows if not r.measured]
    if short:
        notes.append(
            f"{len(short)} setting(s) were read for less than {min_seconds:g} s or "
            f"{MIN_BATCHES} batches (--max-samples stopped them, or the dataset is empty): "
            "their figures are noise" + ("" if recommended is not None else
                                         ", so no num_workers is recommended")
        )
    repeated = max((r.epochs for r in rows), default=1)
    if repeated > 1:
        notes.append(f"the dataset holds {manifest.num_samples:,} samples: epochs were repeated "
                     f"(up to {repeated} per setting), so the rates include each epoch's start")
    return BenchReport(str(path), manifest.num_samples, cores, tuple(rows), recommended,
                       window, tuple(notes))
