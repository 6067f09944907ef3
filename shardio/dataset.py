"""The torch datasets: ``StreamingDataset`` (iterable) and ``IndexedDataset`` (map-style).

Wiring only: the order comes from ``shardio.plan`` (pure), the I/O from
``shardio.stream`` and ``shardio.reader``, the decoding from
``shardio.decode``/``shardio.collate``. What lives here is what needs torch:
worker and rank discovery, the epoch and resume state shared with persistent
DataLoader workers, and the per-sample output format.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from shardio.plan import (
    PlanConfig,
    Progress,
    Split,
    consumed_per_worker,
    same_split,
    samples_per_rank,
    stage_order,
)
from shardio.reader import DatasetReader
from shardio.record import KEY_FIELD
from shardio.state import SharedState, progress_from_state, progress_to_state
from shardio.stream import iter_samples

Decode = Literal["auto", "raw", "pil", "tensor"]
DEFAULT_WINDOW_BYTES = 256 << 20
MAX_WINDOW = 16384
MIN_WINDOW = 256
BLOCKS_PER_WINDOW = 128


def resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit ``rank``/``world_size``, else torch.distributed's, else ``(0, 1)``."""
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError("pass both rank and world_size, or neither")
        return rank, world_size
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def default_window(mean_sample_bytes: float) -> int:
    """Shuffle window in samples: about 256 MB of records, between 256 and 16,384 samples."""
    fit = int(DEFAULT_WINDOW_BYTES / max(mean_sample_bytes, 1.0))
    return max(MIN_WINDOW, min(MAX_WINDOW, fit))


class SampleDecoder:
    """Turns a raw sample dict into what the dataset yields, per ``decode`` mode.

    ``raw``: the dict (``transform`` applied to it); ``pil``: ``(PIL RGB image,
    label)`` like ``torchvision.datasets.ImageFolder``; ``tensor``: ``(uint8 CHW
    tensor, label)``. ``pil`` and ``tensor`` need an ImageFolder pack.
    """

    def __init__(
        self,
        mode: str,
        *,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        draft_size: tuple[int, int] | None = None,
    ) -> None:
        self.mode = mode
        self.transform = transform
        self.target_transform = target_transform
        self.draft_size = draft_size

    def __call__(self, sample: dict[str, Any]) -> Any:
        if self.mode == "raw":
            return self.transform(sample) if self.transform else sample
        if self.mode == "pil":
            from shardio.decode import decode_image

            image: Any = decode_image(
                sample["image"], draft_size=self.draft_size, key=sample[KEY_FIELD]
            )
        else:
            from shardio.collate import decode_tensor

            image = decode_tensor(
                sample["image"], draft_size=self.draft_size, key=sample[KEY_FIELD]
            )
        label: Any = sample["label"]
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label


def resolve_decode(decode: str, labelled: bool, path: str) -> str:
    """The concrete decode mode: ``auto`` is ``pil`` on ImageFolder packs, else ``raw``."""
    if decode == "auto":
        return "pil" if labelled else "raw"
    if decode not in ("raw", "pil", "tensor"):
        raise ValueError(f"decode must be 'auto', 'raw', 'pil' or 'tensor', got {decode!r}")
    if decode != "raw" and not labelled:
        raise ValueError(
            f"{path}: decode={decode!r} needs an ImageFolder pack (fields 'image' and 'label'); "
            "this dataset has none: use decode='raw' and decode fields in a transform"
        )
    return decode


class StreamingDataset(IterableDataset[Any]):
    """Stream a shardio dataset: shuffled, split over ranks and workers, exactly resumable.

    On an ImageFolder pack it yields ``(image, label)`` like
    ``torchvision.datasets.ImageFolder`` (a PIL RGB image after ``transform``,
    an int after ``target_transform``), so a training script changes one line.
    Each epoch's order is a pure function of ``(seed, epoch)`` and the split;
    every rank yields ``len(ds)`` samples per epoch (tail padded by repeating
    samples, or dropped with ``drop_last``), and with one rank every sample
    arrives exactly once per epoch, whatever ``num_workers`` is.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        decode: Decode = "auto",
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int | None = None,
        block_size: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        draft_size: tuple[int, int] | None = None,
        verify: bool = True,
    ) -> None:
        """Open the dataset at ``path`` (its manifest is read now; shards when iterating).

        Args:
            path: a folder written by ``shardio pack`` / ``ShardWriter``.
            decode: ``"auto"`` (``"pil"`` on ImageFolder packs, else ``"raw"``),
                ``"raw"`` (sample dicts with ``__key__`` and ``__index__``), ``"pil"``
                or ``"tensor"`` (uint8 CHW).
            transform: applied to the image (or to the sample dict with ``raw``).
            target_transform: applied to the label.
            shuffle: permute blocks and windows each epoch; False keeps stored order.
            seed: with the epoch, the only input of the order.
            shuffle_buffer: samples per shuffle window (memory per worker is about
                this many records); default: about 256 MB of records.
            block_size: records per contiguous read; default ``shuffle_buffer / 128``.
            rank: this process's rank; default from ``torch.distributed``.
            world_size: number of ranks; default from ``torch.distributed``.
            drop_last: drop the tail instead of padding it so all ranks are equal.
            draft_size: decode JPEGs at reduced size no smaller than this ``(w, h)``.
            verify: check each record's CRC-32 as it is read.
        """
        self.reader = DatasetReader(path, verify=verify)
        self.path = str(self.reader.root)
        self.manifest = self.reader.manifest
        self.rank, self.world_size = resolve_rank(rank, world_size)
        mode = resolve_decode(decode, self.manifest.is_labelled, self.path)
        self.decoder = SampleDecoder(
            mode, transform=transform, target_transform=target_transform, draft_size=draft_size
        )
        mean = self.manifest.num_bytes / max(self.manifest.num_samples, 1)
        window = shuffle_buffer if shuffle_buffer is not None else default_window(mean)
        self.config = PlanConfig(
            shard_sizes=self.manifest.shard_sizes,
            seed=seed,
            shuffle=shuffle,
            window=window,
            block_size=block_size or max(1, window // BLOCKS_PER_WINDOW),
            drop_last=drop_last,
        )
        self.verify = verify
        self.batch_size: int | None = None
        self.collate: Callable[[list[Any]], Any] | None = None
        self.zero_copy = False
        self._shared = SharedState()
        self._worker_state: dict[str, Any] | None = None
        self._position = 0
        self._split = Split(self.rank, self.world_size)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will yield."""
        return int(self._shared.read()["epoch"])

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (and so the order) of the next iteration, also in persistent workers."""
        state = self._shared.read()
        if state["epoch"] != epoch:
            self._shared.write({"epoch": epoch, "resume": None})

    def __len__(self) -> int:
        """Samples this rank yields per epoch."""
        return samples_per_rank(self.manifest.num_samples, self.world_size, self.config.drop_last)

    def batched(
        self, batch_size: int, collate: Callable[[list[Any]], Any], *, zero_copy: bool = False
    ) -> StreamingDataset:
        """A view that yields ``(batch, worker, position)`` for ``shardio.loader``.

        ``zero_copy``: raw samples' large bytes values may be views of the blocks
        read, because the collate (``RecordBatch``) holds them only as long as
        the batch lives and joins them when the batch crosses to another process.
        """
        view = object.__new__(StreamingDataset)
        view.__dict__.update(self.__dict__)
        view.batch_size = batch_size
        view.collate = collate
        view.zero_copy = zero_copy
        return view

    def _current_split(self) -> Split:
        info = get_worker_info()
        if info is None:
            return Split(self.rank, self.world_size)
        return Split(self.rank, self.world_size, info.id, info.num_workers)

    def worker_order(self, split: Split | None = None) -> tuple[int, np.ndarray, int]:
        """``(epoch, order, skip)`` the given (default: current) split reads next."""
        split = split or self._current_split()
        state = self._shared.read()
        epoch = int(state["epoch"])
        resume = state.get("resume")
        skip = 0
        prior = None
        if resume is not None:
            progress = progress_from_state(resume)
            if same_split(progress, split) and split.rank in progress.consumed:
                skip = progress.consumed[split.rank][split.worker]
                prior = progress.prior
            else:
                prior = progress
        local = self._worker_state
        if (
            local is not None
            and local.get("epoch") == epoch
            and local.get("split")
            == [split.rank, split.world_size, split.worker, split.num_workers]
        ):
            skip = int(local["position"])
        return epoch, stage_order(self.config, epoch, split, prior), skip

    def __iter__(self) -> Iterator[Any]:
        split = self._current_split()
        self._split = split
        epoch, order, skip = self.worker_order(split)
        self._worker_state = None
        reader = DatasetReader(self.path, verify=self.verify)
        decoder = self.decoder
        self._position = skip
        self._epoch_running = epoch
        try:
            samples = iter_samples(
                reader, order, window=self.config.window, max_run=self.config.block_size,
                skip=skip, zero_copy=self.zero_copy,
            )
            if self.batch_size is None:
                for sample in samples:
                    self._position += 1
                    yield decoder(sample)
                return
            assert self.collate is not None
            batch: list[Any] = []
            for sample in samples:
                batch.append(decoder(sample))
                if len(batch) == self.batch_size:
                    self._position += len(batch)
                    yield self.collate(batch), split.worker, self._position
                    batch = []
            if batch:
                self._position += len(batch)
                yield self.collate(batch), split.worker, self._position
        finally:
            reader.close()

    def state_dict(
        self,
        *,
        num_batches: int | None = None,
        batch_size: int | None = None,
        num_workers: int | None = None,
    ) -> dict[str, Any]:
        """Where this rank is in the current epoch, to resume it exactly later.

        Inside a DataLoader worker (as torchdata's ``StatefulDataLoader`` calls
        it) this is that worker's position. In the main process after iterating
        without workers, it is the main process's position. After a plain
        ``DataLoader`` with workers, pass how many batches the training loop
        consumed and the loader's ``batch_size`` and ``num_workers``: the
        DataLoader takes batches from its workers in turn, so that fixes every
        worker's position. ``shardio.loader`` tracks all of this for you.
        """
        epoch = getattr(self, "_epoch_running", self.epoch)
        if get_worker_info() is not None:
            split = self._split
            return {
                "epoch": epoch,
                "split": [split.rank, split.world_size, split.worker, split.num_workers],
                "position": self._position,
            }
        if num_batches is None:
            return self.progress_state(epoch, 1, [self._position])
        if batch_size is None or num_workers is None:
            raise ValueError("pass batch_size and num_workers together with num_batches")
        workers = max(1, num_workers)
        sizes = [
            len(self.worker_order(Split(self.rank, self.world_size, k, workers))[1])
            for k in range(workers)
        ]
        return self.progress_state(
            epoch, workers, consumed_per_worker(num_batches, batch_size, sizes)
        )

    def progress_state(
        self, epoch: int, num_workers: int, consumed: Sequence[int]
    ) -> dict[str, Any]:
        """The resumable state of this rank after its workers consumed ``consumed`` samples.

        ``consumed[k]`` counts from the start of worker ``k``'s order in this
        epoch (samples skipped by an exact resume included).
        """
        prior = None
        resume = self._shared.read().get("resume")
        if resume is not None:
            progress = progress_from_state(resume)
            if progress.epoch == epoch:
                split = Split(self.rank, self.world_size, 0, num_workers)
                exact = same_split(progress, split) and self.rank in progress.consumed
                prior = progress.prior if exact else progress
        progress = Progress(
            epoch=epoch,
            world_size=self.world_size,
            num_workers=num_workers,
            consumed={self.rank: tuple(int(c) for c in consumed)},
            prior=prior,
        )
        return {"shardio": 1, "seed": self.config.seed, **progress_to_state(progress)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()``: the next iteration yields the rest of that epoch.

        A worker-local state (from ``StatefulDataLoader``) applies to that worker.
        A rank state resumes this rank exactly when world size and worker count
        are unchanged; under another split, pass the merged states of all ranks
        (``shardio.merge_states``) and each unseen sample arrives exactly once.
        """
        if "position" in state:
            self._worker_state = dict(state)
            return
        if int(state.get("seed", self.config.seed)) != self.config.seed:
            raise ValueError(
                f"state was saved with seed {state['seed']}, this dataset uses "
                f"{self.config.seed}; the resumed order would not match"
            )
        progress = progress_from_state(state)
        self._shared.write({"epoch": progress.epoch, "resume": progress_to_state(progress)})


class IndexedDataset(Dataset[Any]):
    """Map-style access: ``ds[i]`` in O(1) through the shard index, any Sampler works."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        decode: Decode = "auto",
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        draft_size: tuple[int, int] | None = None,
        verify: bool = True,
    ) -> None:
        """Open the dataset at ``path``; see ``StreamingDataset`` for the decode options."""
        self.path = str(path)
        self.verify = verify
        self._reader = DatasetReader(path, verify=verify)
        self._pid = os.getpid()
        self.manifest = self._reader.manifest
        self.decoder = SampleDecoder(
            resolve_decode(decode, self.manifest.is_labelled, self.path),
            transform=transform,
            target_transform=target_transform,
            draft_size=draft_size,
        )

    def _reader_here(self) -> DatasetReader:
        # A forked DataLoader worker inherits the parent's open maps and LMDB
        # environments, which must not be shared: it opens its own.
        if self._pid != os.getpid():
            self._reader = DatasetReader(self.path, verify=self.verify)
            self._pid = os.getpid()
        return self._reader

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled in a ``spawn``/``forkserver`` worker: the reader arrives closed."""
        self.__dict__.update(state)
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self.manifest.num_samples

    def _normalise(self, index: int) -> int:
        """``index`` counted from the end when negative, like a list.

        Raises:
            IndexError: ``index`` is outside ``-len(self)..len(self) - 1``.
        """
        size = len(self)
        if not -size <= index < size:
            raise IndexError(
                f"{self.path}: sample {index} out of range for a dataset of {size} samples"
            )
        return index + size if index < 0 else index

    def __getitem__(self, index: int) -> Any:
        return self.decoder(self._reader_here().get(self._normalise(index)))

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """Batched fetch for the DataLoader: read in storage order, returned in the order asked.

        Raises:
            IndexError: an index is out of range (negative ones count from the end).
        """
        reader = self._reader_here()
        wanted = [self._normalise(i) for i in indices]
        fetched = {i: reader.get(i) for i in sorted(set(wanted))}
        return [self.decoder(dict(fetched[i])) for i in wanted]

    def close(self) -> None:
        """Release the open shard files."""
        self._reader.close()
