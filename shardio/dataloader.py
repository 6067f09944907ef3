"""``shardio.loader``: a DataLoader over a ``StreamingDataset`` with defaults that work.

Workers batch their own samples and hand over few, large objects (a
``RecordBatch`` of contiguous tensors for raw samples, stacked uint8 tensors
for decoded ones). Workers are persistent, ``pin_memory`` is on only when CUDA
is present, epochs advance by themselves, and the loader knows every worker's
position, so ``state_dict()`` resumes mid-epoch exactly.
"""

from __future__ import annotations

import os
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate

from shardio.batch import RecordBatch
from shardio.dataset import StreamingDataset
from shardio.plan import Split, same_split
from shardio.state import progress_from_state


def collate_items(items: list[Any]) -> Any:
    """Default collation where it applies; lists where it does not (e.g. PIL images)."""
    try:
        return default_collate(items)
    except TypeError:
        columns = list(zip(*items, strict=True)) if isinstance(items[0], tuple) else None
        if columns is None:
            return items
        return tuple(
            default_collate(list(c)) if all(isinstance(v, int) for v in c) else list(c)
            for c in columns
        )


def collate_for(dataset: StreamingDataset) -> Callable[[list[Any]], Any]:
    """The collate function that suits the dataset's decode mode."""
    mode = dataset.decoder.mode
    if mode == "raw" and dataset.decoder.transform is None:
        return RecordBatch.from_samples
    if mode == "tensor" and dataset.decoder.transform is None:
        from shardio.collate import collate_tensor

        return collate_tensor
    return collate_items


class ShardLoader:
    """Iterates batches of a ``StreamingDataset`` epoch after epoch; resumable.

    Each ``iter(loader)`` is one epoch; the next one starts at the next epoch.
    """

    def __init__(
        self,
        dataset: StreamingDataset,
        batch_size: int,
        *,
        num_workers: int | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool | None = None,
        prefetch_factor: int = 4,
        persistent_workers: bool = True,
        multiprocessing_context: str | None = None,
    ) -> None:
        """See ``shardio.loader``."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = min(os.cpu_count() or 1, 8) if num_workers is None else num_workers
        collate = collate_fn or collate_for(dataset)
        self._view = dataset.batched(
            batch_size, collate, zero_copy=collate is RecordBatch.from_samples
        )
        workers = self.num_workers
        self._loader = DataLoader(
            self._view,
            batch_size=None,
            num_workers=workers,
            pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
            prefetch_factor=prefetch_factor if workers > 0 else None,
            persistent_workers=persistent_workers and workers > 0,
            multiprocessing_context=multiprocessing_context if workers > 0 else None,
        )
        self._epoch = dataset.epoch
        self._fresh = True
        """Whether the next ``iter()`` reads ``_epoch`` itself (start, or just resumed)."""
        self._loaded: dict[str, Any] | None = None
        self._positions: list[int] = [0] * max(1, workers)
        self._running = False

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        split_sizes = self._worker_sizes()
        return sum(-(-n // self.batch_size) for n in split_sizes)

    def _worker_sizes(self) -> list[int]:
        ds = self.dataset
        workers = max(1, self.num_workers)
        return [
            len(ds.worker_order(Split(ds.rank, ds.world_size, k, workers))[1])
            for k in range(workers)
        ]

    def _start_positions(self) -> list[int]:
        """Where each worker starts: non-zero only when resuming under the same split."""
        workers = max(1, self.num_workers)
        resume = self.dataset._shared.read().get("resume")
        if resume is not None:
            progress = progress_from_state(resume)
            split = Split(self.dataset.rank, self.dataset.world_size, 0, workers)
            if progress.epoch == self._epoch and same_split(progress, split):
                counts = progress.consumed.get(self.dataset.rank)
                if counts is not None:
                    return list(counts)
        return [0] * workers

    def _schedule(self, starts: list[int]) -> Iterator[int]:
        """Worker of each remaining batch, in the order a DataLoader takes them from the start.

        A DataLoader takes batches from workers 0, 1, …, 0, 1, … skipping workers
        that ran out; a resumed DataLoader starts again at worker 0, so the loader
        re-orders batches to continue the interrupted round exactly.
        """
        sizes = self._worker_sizes()
        totals = [-(-n // self.batch_size) for n in sizes]
        done = [-(-p // self.batch_size) for p in starts]
        for round_no in range(max(totals, default=0)):
            for worker, total in enumerate(totals):
                if done[worker] <= round_no < total:
                    yield worker

    def __iter__(self) -> Iterator[Any]:
        if not self._fresh:
            self._epoch += 1
        self._fresh = False
        self._loaded = None
        self.dataset.set_epoch(self._epoch)
        self._positions = self._start_positions()
        self._running = True
        schedule = self._schedule(self._positions)
        pending: dict[int, deque[tuple[Any, int]]] = defaultdict(deque)
        expected = next(schedule, None)
        for batch, worker, position in self._loader:
            pending[worker].append((batch, position))
            while expected is not None and pending[expected]:
                ready, self._positions[expected] = pending[expected].popleft()
                yield ready
                expected = next(schedule, None)
        for worker in sorted(pending):
            while pending[worker]:
                ready, self._positions[worker] = pending[worker].popleft()
                yield ready
        self._running = False

    @property
    def epoch(self) -> int:
        """The epoch being read, or last read."""
        return self._epoch

    def state_dict(self) -> dict[str, Any]:
        """Resumable position of this rank: epoch and every worker's count.

        Mid-epoch (also after breaking out of the loop) it is the position
        reached; after a finished epoch it is the start of the next one.
        """
        workers = max(1, self.num_workers)
        if self._running:
            return self.dataset.progress_state(self._epoch, workers, self._positions)
        if self._fresh and self._loaded is not None:
            return dict(self._loaded)
        epoch = self._epoch if self._fresh else self._epoch + 1
        return self.dataset.progress_state(epoch, workers, [0] * workers)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``: the next ``iter()`` yields the rest of that epoch."""
        self.dataset.load_state_dict(state)
        self._epoch = int(state["epoch"])
        self._fresh = True
        self._running = False
        self._loaded = dict(state)


def loader(
    dataset: StreamingDataset,
    batch_size: int,
    *,
    num_workers: int | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    pin_memory: bool | None = None,
    prefetch_factor: int = 4,
    persistent_workers: bool = True,
    multiprocessing_context: str | None = None,
) -> ShardLoader:
    """A resumable DataLoader over ``dataset`` with defaults that work.

    Args:
        dataset: the ``StreamingDataset`` to read.
        batch_size: samples per batch; each worker batches its own samples.
        num_workers: worker processes (default: the core count, at most 8).
        collate_fn: override the batch format (default: ``RecordBatch`` for raw
            samples, stacked uint8 tensors for ``decode="tensor"``, default
            collation otherwise).
        pin_memory: default: only when CUDA is available.
        prefetch_factor: batches each worker keeps ready.
        persistent_workers: keep workers between epochs (they read the epoch
            from shared memory).
        multiprocessing_context: e.g. ``"spawn"``; default: the platform's.
    """
    return ShardLoader(
        dataset,
        batch_size,
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers,
        multiprocessing_context=multiprocessing_context,
    )
