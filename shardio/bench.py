"""``shardio bench``: how fast this machine reads a dataset, and which ``num_workers`` to use.

Reads (a sample of) the dataset through ``shardio.loader`` with 0, 1, 2, …
workers up to the core count, raw and (on ImageFolder packs) decoded, and
measures samples/s, MB/s and CPU use per setting. Imports torch.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from shardio.batch import RecordBatch
from shardio.dataloader import loader
from shardio.dataset import StreamingDataset, default_window

RECOMMEND_WITHIN = 0.95
"""Recommend the fewest workers reaching this fraction of the best throughput."""


@dataclass(frozen=True)
class BenchRow:
    """One measured setting."""

    mode: str
    num_workers: int
    samples: int
    seconds: float
    samples_per_s: float
    mb_per_s: float
    cpu_percent: float


@dataclass(frozen=True)
class BenchReport:
    """All settings measured on one dataset, and what to use."""

    path: str
    num_samples: int
    cores: int
    rows: tuple[BenchRow, ...]
    recommended_num_workers: int
    recommended_shuffle_buffer: int
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        return asdict(self)


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _batch_bytes(batch: Any) -> int:
    if isinstance(batch, RecordBatch):
        return batch.nbytes
    images = batch[0]
    if isinstance(images, list):
        return sum(int(t.numel()) for t in images)
    return int(images.numel())


def measure(
    path: str, mode: str, num_workers: int, *, max_samples: int, batch_size: int
) -> BenchRow:
    """Read up to ``max_samples`` samples with one setting; the clock starts at the first batch."""
    dataset = StreamingDataset(path, decode=mode)  # type: ignore[arg-type]
    run = loader(dataset, batch_size, num_workers=num_workers, persistent_workers=False)
    batches = iter(run)
    first = next(batches)
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    samples, nbytes = 0, 0
    for batch in batches:
        samples += len(batch) if isinstance(batch, RecordBatch) else len(batch[1])
        nbytes += _batch_bytes(batch)
        if samples >= max_samples:
            break
    seconds = time.perf_counter() - t0
    del batches, first
    cpu = _cpu_seconds() - cpu0
    seconds = max(seconds, 1e-9)
    return BenchRow(
        mode,
        num_workers,
        samples,
        seconds,
        samples / seconds,
        nbytes / seconds / 1e6,
        100.0 * cpu / seconds,
    )


def bench(
    path: str | os.PathLike[str],
    *,
    max_workers: int | None = None,
    max_samples: int | None = None,
    batch_size: int = 64,
    modes: Sequence[str] | None = None,
    on_row: Callable[[BenchRow], None] | None = None,
) -> BenchReport:
    """Measure read throughput of the dataset at ``path`` per mode and worker count.

    Args:
        path: a dataset written by ``shardio pack``.
        max_workers: highest ``num_workers`` tried (default: the core count).
        max_samples: samples read per setting (default: up to 20,000 raw, 2,000 decoded).
        batch_size: samples per batch, as in training.
        modes: ``"raw"`` and/or ``"tensor"`` (default: both on ImageFolder packs).
        on_row: called with each row as it is measured (progress display).
    """
    probe = StreamingDataset(path, decode="raw")
    manifest = probe.manifest
    cores = os.cpu_count() or 1
    top = cores if max_workers is None else max_workers
    chosen = list(modes or (["raw", "tensor"] if manifest.is_labelled else ["raw"]))
    rows: list[BenchRow] = []
    for mode in chosen:
        limit = max_samples or (20_000 if mode == "raw" else 2_000)
        limit = min(limit, max(1, manifest.num_samples - batch_size * (top + 1)))
        for workers in range(top + 1):
            row = measure(str(path), mode, workers, max_samples=limit, batch_size=batch_size)
            rows.append(row)
            if on_row is not None:
                on_row(row)
    target_mode = "tensor" if "tensor" in chosen else chosen[0]
    candidates = [r for r in rows if r.mode == target_mode]
    best = max(r.samples_per_s for r in candidates)
    recommended = min(
        r.num_workers for r in candidates if r.samples_per_s >= RECOMMEND_WITHIN * best
    )
    mean = manifest.num_bytes / max(manifest.num_samples, 1)
    window = default_window(mean)
    notes = (
        f"shuffle_buffer {window} holds about {window * mean / 1e6:.0f} MB of records per worker",
    )
    return BenchReport(
        str(path), manifest.num_samples, cores, tuple(rows), recommended, window, notes
    )
