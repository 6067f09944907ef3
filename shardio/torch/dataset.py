"""``StreamingDataset``: the iterable torch dataset, and the window and rank settings it resolves.

Wiring only: the order comes from ``shardio.order.plan`` (pure), the I/O from
``shardio.reading.stream`` and ``shardio.reading.reader``, the decoding from
``shardio.decode.image``/``shardio.torch.collate``. What lives here is what needs torch:
worker and rank discovery, the epoch and resume state shared with persistent
DataLoader workers, and the per-sample output format.
"""

from __future__ import annotations

import itertools
import operator
import os
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from shardio.decode.crop import Crop
from shardio.decode.fields import FieldDecoder, Fields
from shardio.errors import DecodeError, ResumeError
from shardio.format.record import KEY_FIELD
from shardio.order.mix import Source
from shardio.order.plan import PlanConfig, Split, batch_span, samples_per_rank, whole_blocks
from shardio.order.resume import (
    Stage,
    check_same_order,
    order_settings,
    plan_stage,
    position_after_batches,
    progress_from_state,
    progress_to_state,
    rank_state,
    stage_split,
)
from shardio.reading import telemetry
from shardio.reading.classes import ClassAttributes
from shardio.reading.mixture import MixtureReader, open_reader
from shardio.reading.reader import DatasetReader
from shardio.reading.stream import iter_chunks, iter_samples
from shardio.storage.options import RemoteOptions
from shardio.torch.badimage import OnBadImage, Skipped, SkippedImages, check_on_bad_image
from shardio.torch.decoders import (
    Decode,
    SampleDecoder,
    make_cropper,
    make_decoder,
    resolve_decode,
)
from shardio.torch.distributed import check_rank, env_rank
from shardio.torch.state import SharedState, pass_state

DEFAULT_WINDOW_BYTES = 256 << 20
MAX_WINDOW = 16384
MIN_WINDOW = 256
BLOCKS_PER_WINDOW = 128
SHARED_GROUP = 32
"""Samples whose images a DataLoader worker decodes into one block of shared memory
(``decode="tensor"``): a block crosses to the main process once for each batch that holds
some of its images; a tensor kept alive keeps its block."""


def resolve_rank(rank: int | None, world_size: int | None, where: str = "StreamingDataset"
                 ) -> tuple[int, int]:
    """Explicit ``rank``/``world_size``, else torch.distributed's, else the launcher's.

    The launcher's are ``RANK``/``WORLD_SIZE`` (torchrun exports them before
    ``init_process_group``; ``shardio.torch.distributed.env_rank``); without them, ``(0, 1)``.

    Raises:
        TypeError: an explicit one is not an integer.
        ValueError: only one is given, or the rank is not in ``0 .. world_size - 1``
            (explicit or from the environment); ``where`` names who was given them.
    """
    if rank is not None or world_size is not None:
        if rank is None or world_size is None:
            raise ValueError(f"{where}: pass both rank and world_size, or neither")
        try:
            if isinstance(rank, bool) or isinstance(world_size, bool):
                raise TypeError  # an int to Python, but never a rank
            rank, world_size = operator.index(rank), operator.index(world_size)
        except TypeError:
            raise TypeError(f"{where}: rank and world_size must be integers, got rank={rank!r} "
                            f"and world_size={world_size!r}") from None
        return check_rank(
            rank, world_size, f"{where}: rank={rank} and world_size={world_size}",
            "world_size is the number of processes and rank this one's: pass e.g. rank=0, "
            "world_size=2, or neither to take them from torch.distributed or RANK/WORLD_SIZE")
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return env_rank() or (0, 1)


def read_window(window: int, num_workers: int, by_batches: bool) -> int:
    """Samples of its own order a DataLoader worker reads and holds at a time.

    Workers that take the rank's order in whole batches in turn each take about
    ``1 / num_workers`` of every shuffle window, so reading ``window // num_workers``
    of its own order at a time covers one window of the rank's order: the order
    (the plan's) is unchanged and the loader holds one window in all, not one per
    worker. A worker with a contiguous part shuffles its own windows and reads them whole.
    """
    return max(1, window // num_workers) if by_batches else window


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def local_roots(reader: object) -> tuple[str, ...]:
    """The dataset's local folder (resolved), whose shard files samples and batches may
    cross to the main process as places in; none for a remote or mixed dataset."""
    root = getattr(reader, "root", None)
    return (str(root.resolve()),) if isinstance(root, Path) else ()


def default_window(mean_sample_bytes: float) -> int:
    """Shuffle window in samples: about 256 MB of records, between 256 and 16,384 samples."""
    fit = int(DEFAULT_WINDOW_BYTES / max(mean_sample_bytes, 1.0))
    return max(MIN_WINDOW, min(MAX_WINDOW, fit))


def check_batch_size(batch_size: object, where: str) -> int:
    """``batch_size`` as an int of 1 or more, or an error naming ``where`` it was passed.

    Raises:
        TypeError: not a whole number (None, a float, a string).
        ValueError: below 1.
    """
    try:
        if isinstance(batch_size, bool):
            raise TypeError
        size = operator.index(batch_size)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{where}: batch_size must be a whole number of samples per batch, e.g. "
            f"batch_size=64; got {batch_size!r}") from None
    if size < 1:
        raise ValueError(f"{where}: batch_size must be 1 or more, got {size}")
    return int(size)


def loader_batch_size(dataset: object, frame: Any) -> int | None:
    """The ``batch_size`` of the DataLoader whose fetcher called ``next()`` on an iterator of
    ``dataset`` from ``frame``; None when it is not such a fetcher or does not batch.

    Torch tells a dataset nothing of its DataLoader; the fetcher that takes a batch's
    samples one ``next()`` at a time holds the dataset and the batch's indices. Read by
    identity and attribute only: another caller, or another torch, gives None.
    """
    owner = frame.f_locals.get("self") if frame is not None else None
    if getattr(owner, "dataset", None) is not dataset or not getattr(
            owner, "auto_collation", False):
        return None
    indices = frame.f_locals.get("possibly_batched_index")
    return len(indices) if hasattr(indices, "__len__") else None


class StreamingDataset(ClassAttributes, IterableDataset[Any]):
    """Stream a shardio dataset: shuffled, split over ranks and workers, exactly resumable.

    On an ImageFolder pack it yields ``(image, label)`` like
    ``torchvision.datasets.ImageFolder`` (a PIL RGB image after ``transform``,
    an int after ``target_transform``) and has its ``classes``, ``class_to_idx``
    and ``targets`` (``shardio.reading.classes``), so a training script changes one line;
    ``fields=`` yields chosen fields of any pack, decoded by name.
    It shuffles itself, a new order each epoch: give the DataLoader no ``shuffle=``
    (torch refuses ``shuffle=True`` for every iterable dataset, in ``DataLoader()``,
    before the dataset sees it). Each new pass (an ``iter()`` of the DataLoader)
    reads the next epoch by itself; ``set_epoch`` chooses one instead.
    Each epoch's order is a pure function of ``(seed, epoch)`` and the split;
    every rank yields ``len(ds)`` samples per epoch (tail padded by repeating
    samples, or dropped with ``drop_last``), and with one rank every sample
    arrives exactly once per epoch, whatever ``num_workers`` is. With
    ``batch_size``, DataLoader workers take the rank's order in whole batches,
    so a ``DataLoader(batch_size=batch_size)`` delivers that order, every batch
    full but the last, and ``state_dict(num_batches=n)`` resumes it exactly;
    each window is then arranged so every worker reads whole blocks (``lanes``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | Source | Sequence[Source],
        *,
        decode: Decode = "auto",
        fields: Fields | Sequence[str] | None = None,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int | None = None,
        block_size: int | None = None,
        batch_size: int | None = None,
        lanes: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        draft_size: tuple[int, int] | None = None,
        crop: Crop | None = None,
        verify: bool = True,
        remote: RemoteOptions | None = None,
        epoch_size: int | None = None,
        on_bad_image: OnBadImage = "raise",
    ) -> None:
        """Open the dataset at ``path`` (its manifest is read now; shards when iterating).

        Args:
            path: a folder written by ``shardio pack`` / ``ShardWriter``, or its URL
                (``s3://bucket/train``, ``https://host/train``, any fsspec protocol);
                or a list of ``shardio.Source`` to mix (see ``shardio.order.mix``): raw
                samples then say which one they came from in ``__source__``.
            decode: ``"auto"`` (``"pil"`` on ImageFolder packs, else ``"raw"``),
                ``"raw"`` (sample dicts with ``__key__`` and ``__index__``), ``"pil"``
                or ``"tensor"`` (uint8 CHW; in a DataLoader worker, views of one block
                of shared memory per ``SHARED_GROUP`` samples). With ``fields``, the
                mode of image fields (``"auto"`` is ``"pil"``, ``"raw"`` keeps their
                bytes).
            fields: yield a tuple of these fields, each decoded by its name
                (``("jpg", "cls", "json")`` → PIL image, int, parsed JSON; see
                ``shardio.Fields`` for per-field decoders and transforms, and
                ``missing=``). Without it an ImageFolder pack yields ``(image, label)``.
            transform: applied to the image (or to the sample dict with ``raw``, to
                the tuple with ``fields``).
            target_transform: applied to the label.
            shuffle: permute blocks and windows each epoch; False keeps stored order.
            seed: with the epoch, the only input of the order.
            shuffle_buffer: samples per shuffle window; default: about 256 MB of
                records. The loader holds about one window of records in all: workers
                that take whole batches in turn (``batch_size``, ``shardio.loader``)
                each read and hold their share of a window (``read_window``).
            block_size: records per contiguous read; default ``shuffle_buffer / 128``.
            batch_size: the ``batch_size`` of the plain ``DataLoader`` that reads
                this dataset: its workers then take whole batches in turn, so every
                batch is full but the epoch's last and ``len(loader)`` is exact
                (see ``lanes``). Default: each worker takes a contiguous part (its
                last batch may be short).
            lanes: with ``batch_size`` and shuffling, each window is arranged so that
                batch ``k`` draws from lane ``k % lanes``, a ``1/lanes`` of the
                window's blocks; worker ``j`` of ``W`` then reads whole blocks of
                its lanes instead of a scattered share of every block (``W`` a
                divisor of ``lanes``). Default: the number of workers reading, so
                the order depends on ``num_workers``; a fixed value (1: a plain
                shuffle) gives the same order whatever ``num_workers`` is. A
                resume keeps the lanes its epoch was read in.
            rank: this process's rank; default from ``torch.distributed``, read
                when iterating (so the dataset may be built before
                ``init_process_group``).
            world_size: number of ranks; default from ``torch.distributed``.
            drop_last: drop the tail instead of padding it so all ranks are equal.
            draft_size: decode JPEGs at reduced size no smaller than this ``(w, h)``.
            crop: with ``decode="pil"`` or ``"tensor"``, every image cropped and resized
                to one size as it is decoded, at the smallest JPEG scale that covers
                the box (``shardio.RandomResizedCrop``, ``shardio.CenterCrop``); a
                sample's random box depends only on ``(seed, epoch, index)``. With
                ``fields=``, every image field without a custom decoder is cropped,
                the fields of one sample by one draw. Batches of ``shardio.loader``
                then hold one ``(B, 3, H, W)`` tensor per image field.
            verify: check each record's CRC-32 as it is read.
            remote: how a URL is reached and cached (``shardio.RemoteOptions``:
                ``storage_options``, ``cache_dir``, ``max_cache_bytes``); ignored for
                local paths.
            epoch_size: samples each epoch draws from the sources (default: their
                total); with a single path, draws that many of its samples.
            on_bad_image: a sample that raises ``DecodeError`` (an image that does not
                decode, or claims too many pixels; with ``fields``, any field) ends the
                epoch with that error naming it (``"raise"``), or is left out and counted
                (``"skip"``): the process that ends the epoch warns with the count and
                the first keys (``shardio.torch.badimage.BadImageWarning``; under a plain
                DataLoader each worker warns for its share), and ``skipped_images``
                counts them over all processes.
        """
        where = f"StreamingDataset({str(path)!r})"
        if rank is not None or world_size is not None:  # refused now, not at len() or iteration
            rank, world_size = resolve_rank(rank, world_size, where)
        if batch_size is not None:
            batch_size = check_batch_size(batch_size, where)
        if lanes is not None and lanes < 1:
            raise ValueError(f"lanes must be >= 1, got {lanes}")
        self.reader = open_reader(path, epoch_size=epoch_size, verify=verify, remote=remote)
        self.path = str(self.reader.root)
        self.manifest = self.reader.manifest
        self._rank_arg, self._world_arg = rank, world_size
        mode = resolve_decode(decode, self.manifest.is_imagefolder or fields is not None, self.path)
        cropper = make_cropper(self.path, crop, seed, mode, draft_size)
        self._cropper = cropper
        self.decoder: SampleDecoder | FieldDecoder = make_decoder(
            mode, fields, manifest=self.manifest, path=self.path, transform=transform,
            target_transform=target_transform, draft_size=draft_size, cropper=cropper)
        mean = self.manifest.num_bytes / max(self.manifest.num_samples, 1)
        window = shuffle_buffer if shuffle_buffer is not None else default_window(mean)
        block = whole_blocks(block_size or max(1, window // BLOCKS_PER_WINDOW),
                             self.manifest.block_records)
        self.config = PlanConfig(
            shard_sizes=self.manifest.shard_sizes,
            seed=seed,
            shuffle=shuffle,
            window=window,
            block_size=block,
            drop_last=drop_last,
            # a first batch from a few blocks: mixed only where the pack shuffled its records
            head=block if self.manifest.shuffle else 0,
        )
        if isinstance(self.reader, MixtureReader):
            self.config = self.reader.mix_config(self.config)
        self.verify = verify
        self.on_bad_image = check_on_bad_image(on_bad_image)
        self._skipped = SkippedImages() if self.on_bad_image == "skip" else None
        self.warn_skipped = True
        """Whether an iteration that skipped samples warns at its end (``shardio.loader``
        warns once for its workers instead)."""
        self.batch_size = batch_size
        self.lanes = lanes
        self.collate: Callable[[list[Any]], Any] | None = None
        self.zero_copy = False
        self.drop_last_batch = False
        self._shared = SharedState()
        self.count_passes = True
        """Whether each iteration that starts reads the next epoch (``SharedState.begin_pass``);
        ``shardio.loader`` chooses the epoch of each of its iterations itself."""
        self._worker_state: dict[str, Any] | None = None
        self._position = 0
        self._split = Split()
        self._stage: Stage | None = None
        """The stage the last iteration in this process read (with ``_position``)."""
        self._stage_in_main = False

    @property
    def skipped_images(self) -> Skipped:
        """Samples left out since the dataset was made (``on_bad_image="skip"``), over
        every process that read it, with the first keys."""
        return Skipped(0, ()) if self._skipped is None else self._skipped.read()

    @property
    def rank(self) -> int:
        """This process's rank: ``rank=``, else torch.distributed's now, else 0."""
        return resolve_rank(self._rank_arg, self._world_arg)[0]

    @property
    def world_size(self) -> int:
        """Number of ranks: ``world_size=``, else torch.distributed's now, else 1."""
        return resolve_rank(self._rank_arg, self._world_arg)[1]

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a ``spawn``/``forkserver`` DataLoader worker): with rank and world size as now.

        Such a worker has no process group of its own, so it takes the rank
        the parent has when iteration starts.
        """
        state = dict(self.__dict__)
        state["_rank_arg"], state["_world_arg"] = resolve_rank(self._rank_arg, self._world_arg)
        state["_stage"] = None  # what this process read (a whole order, maybe): not the worker's
        return state

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will yield (with the worker count of the last one)."""
        return int(self._pass_shared(ahead=True)["epoch"])

    def _pass_shared(self, *, ahead: bool) -> dict[str, Any]:
        """The shared epoch and resume as the pass started last (``ahead``: the next one)
        reads them; before any pass of the generation, as its first pass reads them."""
        shared = self._shared.read()
        last = self._shared.last_pass(int(shared["generation"])) if self.count_passes else None
        return shared if last is None else pass_state(shared, last + ahead)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (and so the order) of the next iteration, also in persistent workers.

        Without it each new pass over the dataset (an ``iter()`` of the DataLoader, with
        workers or without, persistent or not) reads the epoch after the last one; after
        it the next pass reads ``epoch`` and the passes after it count on from there. A
        resume loaded for this same epoch is kept; ``shardio.loader`` follows the epoch
        set here instead of counting on by itself.
        """
        current = self._shared.read()
        resume = current.get("resume") if int(current["epoch"]) == epoch else None
        self._shared.write({"epoch": epoch, "resume": resume})

    def __len__(self) -> int:
        """Samples this rank yields per epoch."""
        return samples_per_rank(self.config.num_samples, self.world_size, self.config.drop_last)

    def batched(
        self,
        batch_size: int,
        collate: Callable[[list[Any]], Any],
        *,
        zero_copy: bool = False,
        drop_last: bool = False,
    ) -> StreamingDataset:
        """A view for ``shardio.loader`` that yields ``(batch, first, stop, pid, times)``.

        Workers take the rank's order in whole batches in turn; ``first`` and
        ``stop`` are the batch's positions in the rank's order, ``pid`` the
        worker's process, ``times`` its read, decode and collate seconds.
        ``zero_copy``: raw samples' large bytes values may be
        views of the blocks read, because the collate (``RecordBatch``) holds them
        only as long as the batch lives and joins them when the batch crosses to
        another process; the collate then gets a ``shardio.reading.gather.Chunk`` (a
        sequence of sample dicts that builds its ``RecordBatch`` by field) instead of
        a list. ``drop_last``: leave out the epoch's last batch if short.
        """
        view = object.__new__(StreamingDataset)
        view.__dict__.update(self.__dict__)
        view.batch_size = batch_size
        view.collate = collate
        view.zero_copy = zero_copy
        view.drop_last_batch = drop_last
        view.count_passes = False  # the loader sets each iteration's epoch (``set_epoch``)
        return view

    def _current_split(self) -> Split:
        rank, world_size = resolve_rank(self._rank_arg, self._world_arg)
        info = get_worker_info()
        if info is None:
            return Split(rank, world_size)
        return Split(rank, world_size, info.id, info.num_workers)

    def plan_stage(self, split: Split | None = None, shared: Mapping[str, Any] | None = None
                   ) -> Stage:
        """What the given (default: current) split reads next, and where it starts;
        ``shared``: the epoch and resume of the pass (default: the next pass's)."""
        return plan_stage(
            self.config, self.batch_size,
            self._pass_shared(ahead=True) if shared is None else shared, self._worker_state,
            split or self._current_split(), self.lanes,
        )

    def __iter__(self) -> Iterator[Any]:
        split = self._current_split()
        if self.batch_size is not None and self.collate is None and split.num_workers > 1:
            # (the body runs at the first next(): frame 1 is the one that called it)
            self._check_loader_batch_size(loader_batch_size(self, sys._getframe(1)),
                                          split.num_workers)
        shared = self._shared.read()
        if self.count_passes:  # each pass reads the next epoch, unless set_epoch chose one
            done = self._shared.begin_pass(int(shared["generation"]), split.worker,
                                           split.num_workers)
            if done is None:
                warnings.warn(
                    f"{self.path}: with {split.num_workers} DataLoader workers (more than "
                    f"{SharedState.MAX_PASS_WORKERS}) the epoch does not advance by itself: "
                    "every pass reads the same order; call dataset.set_epoch(epoch) before "
                    "each epoch", stacklevel=2)
            shared = pass_state(shared, done or 0)
        stage = self.plan_stage(split, shared)
        info = get_worker_info()
        if info is not None:
            self._shared.mark_workers(stage.generation, info.num_workers, stage.split.lanes,
                                      stage.split.batch)
        self._worker_state = None
        self._split, self._stage, self._stage_in_main = split, stage, info is None
        if self._cropper is not None:  # this epoch's boxes, for whichever decoder crops
            self._cropper.epoch = stage.epoch
        self._position = stage.skip
        skipped_before = 0 if self._skipped is None else self._skipped.mine()
        # the manifest read when the dataset was built, not again: every worker and epoch
        # reads the dataset version the order was planned on
        # ranges of whole blocks when shuffled: each is then wanted by one window only,
        # not evicted and fetched again between windows under a small cache budget
        reader = self.reader.reopened(
            num_processes=info.num_workers if info is not None else 1,
            block_records=self.config.block_size if self.config.shuffle else None)
        decoder = self.decoder
        # raw samples as read: no call per sample (the stream hands out fresh dicts)
        identity = isinstance(decoder, SampleDecoder) and decoder.mode == "raw" and (
            decoder.transform is None) and not isinstance(reader, MixtureReader)
        workers = info.num_workers if info is not None else 1
        window = read_window(self.config.window, workers, self.batch_size is not None)
        # a checker thread beside each reading process pays only where a core is free for it
        ahead = workers < available_cpus()
        block = self.config.block_size
        try:
            if self.collate is not None:
                assert self.batch_size is not None
                chunks = iter_chunks(reader, stage.order, window=window, max_run=block,
                                     size=self.batch_size, skip=stage.skip,
                                     zero_copy=self.zero_copy, check_ahead=ahead,
                                     drop_decoded=self.zero_copy and info is not None)
                yield from self._batches(chunks, split, stage, reader, identity)
                self._report_skipped(stage, skipped_before)
                return
            # the first batch a plain DataLoader(batch_size=) makes is what a remote head
            # reads on its own; without a batch size the stream's default head stands in
            head = {} if self.batch_size is None else {"head": self.batch_size}
            # a worker's samples cross to the main process pickled: their bytes values as
            # places in the shard files, not their contents (``shardio.reading.filebytes``)
            roots = local_roots(self.reader) if info is not None else ()
            if roots and not self.zero_copy:
                from shardio.torch.handover import ring as shmring
                shmring.place_file_bytes(roots)
            samples: Iterator[dict[str, Any]] = iter_samples(
                reader, stage.order, window=window, max_run=block, skip=stage.skip,
                zero_copy=self.zero_copy, check_ahead=ahead, placed=bool(roots), **head)
            if isinstance(reader, MixtureReader):
                samples = reader.tagged(samples)
            if identity:
                for sample in samples:
                    self._position += 1
                    yield sample
            elif info is not None and decoder.shares_memory:
                yield from self._decoded_in_groups(samples, decoder)
            else:
                for sample in samples:
                    self._position += 1
                    yield from self._decoded(decoder, sample)
            self._report_skipped(stage, skipped_before)
        finally:
            reader.close()

    def _check_loader_batch_size(self, size: int | None, num_workers: int) -> None:
        """Refuse a DataLoader whose ``batch_size`` is not the dataset's: its workers take
        whole batches of the dataset's size in turn, so the loader's batches would be cut
        short and out of order mid-epoch."""
        if size is None or size == self.batch_size:
            return
        raise ValueError(
            f"{self.path}: StreamingDataset(batch_size={self.batch_size}) is read by a "
            f"DataLoader(batch_size={size}) with {num_workers} workers: each worker takes "
            f"whole batches of {self.batch_size} samples in turn, so batches of {size} would "
            f"come short mid-epoch: give the dataset the DataLoader's size, "
            f"StreamingDataset(..., batch_size={size})")

    def _decoded(self, decode: Callable[..., Any], sample: dict[str, Any], *parts: Any
                 ) -> list[Any]:
        """``[decode(sample, *parts)]``, or ``[]`` for a sample skipped (``on_bad_image``)."""
        try:
            return [decode(sample, *parts)]
        except DecodeError:
            if self._skipped is None:
                raise
            self._skipped.record(sample.get(KEY_FIELD))
            return []

    def _report_skipped(self, stage: Stage, before: int) -> None:
        if self._skipped is not None and self.warn_skipped:
            self._skipped.warn(self.path, stage.epoch, self._skipped.mine() - before)

    def _decoded_in_groups(
        self, samples: Iterator[dict[str, Any]], decoder: SampleDecoder | FieldDecoder,
    ) -> Iterator[Any]:
        """``decoder(sample)`` for each sample, the images of every ``SHARED_GROUP``
        samples decoded into one block of shared memory (a DataLoader worker's)."""
        while group := list(itertools.islice(samples, SHARED_GROUP)):
            try:
                parts = decoder.decode_group(group)
            except DecodeError:  # one by one, so that the error comes with its sample
                for sample in group:
                    self._position += 1
                    yield from self._decoded(decoder, sample)
                continue
            for sample, part in zip(group, parts, strict=True):
                self._position += 1  # completing may refuse a sample too (a field, a label)
                yield from self._decoded(decoder.complete, sample, part)

    def _batches(
        self, chunks: Iterator[Sequence[dict[str, Any]]], split: Split, stage: Stage,
        reader: DatasetReader | MixtureReader, identity: bool,
    ) -> Iterator[tuple[Any, int, int, int, tuple[float, float, float]]]:
        """The view's collated batches, with their positions in the rank's order and their
        seconds spent reading, decoding and collating (``shardio.reading.telemetry``)."""
        assert self.batch_size is not None and self.collate is not None
        size, pid, decoder = self.batch_size, os.getpid(), self.decoder
        now = telemetry.clock()  # a few reads a batch: (read, decode, collate) seconds
        began = now()
        for chunk in chunks:
            read = now()
            if isinstance(reader, MixtureReader):
                chunk = list(reader.tagged(iter(chunk)))
            if len(chunk) < size and self.drop_last_batch:
                return
            # a Chunk reaches only shardio's own collates (zero_copy), which take any sequence
            batch: Any = chunk if identity else [
                out for sample in chunk for out in self._decoded(decoder, sample)]
            lo, hi = batch_span(
                stage.count - stage.offset, size, split.worker, split.num_workers,
                self._position // size,
            )
            self._position += len(chunk)
            decoded = now()
            # every sample skipped (on_bad_image): the positions still pass, with no batch
            collated = self.collate(batch) if len(batch) else None
            done = now()
            yield (collated, stage.offset + lo, stage.offset + hi, pid,
                   (read - began, decoded - read, done - decoded))
            began = now()

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
        ``DataLoader`` with workers, the main process cannot see how far the
        workers got: pass ``num_batches``, the batches the training loop took
        from the loader since it started (or resumed) this epoch. That fixes the
        position exactly when the dataset has ``batch_size`` (the loader's) or
        the loader had at most one worker, also after earlier resumes.

        Raises:
            ResumeError: the position cannot be known exactly: after a
                DataLoader with workers and no ``num_batches``, or with several
                workers and no ``batch_size`` on the dataset. The message says
                what to use instead.
        """
        if get_worker_info() is not None:
            if self._worker_state is not None:  # loaded, not yet iterated: still the position
                return dict(self._worker_state)
            split, stage = self._split, self._stage
            return {
                "epoch": stage.epoch if stage is not None else self.epoch,
                "split": [split.rank, split.world_size, split.worker, split.num_workers],
                "position": self._position,
                "base": stage.base if stage is not None else None,
            }
        generation = int(self._shared.read()["generation"])
        workers = self._shared.workers_read(generation)
        if num_batches is None:
            if workers:
                raise ResumeError(
                    f"{self.path}: {workers} DataLoader worker(s) read this epoch, so the main "
                    "process cannot see how far they got: pass num_batches= (the batches your "
                    "loop took this epoch) with StreamingDataset(batch_size=...), or iterate "
                    "with shardio.loader or torchdata's StatefulDataLoader, which track it"
                )
            stage = self._stage
            if stage is not None and self._stage_in_main and stage.generation == generation:
                return self.progress_state(stage.epoch, 1, [stage.offset + self._position])
            return self.start_state()
        readers = max(workers, num_workers or 0)
        stage = self.plan_stage(Split(self.rank, self.world_size), self._pass_shared(ahead=False))
        position = position_after_batches(
            stage, num_batches, loader_batch_size=batch_size, dataset_batch_size=self.batch_size,
            workers=readers, path=self.path,
        )
        return self.progress_state(stage.epoch, 1, [position], workers=readers)

    def start_state(self) -> dict[str, Any]:
        """Where the next iteration of this rank starts: a loaded state, or the epoch's start."""
        stage = self.plan_stage(Split(self.rank, self.world_size))
        return self.progress_state(stage.epoch, 1, [stage.offset + stage.skip])

    def progress_state(
        self, epoch: int, num_workers: int, consumed: Sequence[int], *, workers: int | None = None
    ) -> dict[str, Any]:
        """The resumable state of this rank after its workers consumed ``consumed`` samples.

        ``consumed[k]`` counts from the start of worker ``k``'s order in this
        epoch (samples skipped by an exact resume included); by batches, and
        with one worker, it is the position in the rank's order, which counts in
        the lanes the DataLoader workers marked they read (``workers``: how many
        read, where none marked).
        """
        shared = self._shared.read()
        split = Split(self.rank, self.world_size, 0, num_workers)
        # the generation's passes read its epoch and the next ones, all in the lanes marked
        last = self._shared.last_pass(int(shared["generation"])) if self.count_passes else None
        if num_workers == 1 and 0 <= epoch - int(shared["epoch"]) <= (last or 0):
            marked = self._shared.lanes_read(int(shared["generation"]))
            if marked is None:
                reading = Split(self.rank, self.world_size, 0, max(1, workers or 1))
                unit = stage_split(self.config, self.batch_size, shared, reading, self.lanes)
                marked = unit.lanes, unit.batch
            split = Split(self.rank, self.world_size, 0, 1, *marked)
        return rank_state(
            self.config, shared.get("resume"), epoch=epoch, split=split, consumed=consumed,
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state_dict()``: the next iteration yields the rest of that epoch.

        A worker-local state (from ``StatefulDataLoader``) applies to that worker.
        A rank state resumes this rank exactly when world size and worker count
        are unchanged (by batches: whatever the worker count); under another
        split, pass the merged states of all ranks (``shardio.merge_states``)
        and each unseen sample arrives exactly once.

        Raises:
            ResumeError: the state was saved with another seed or order
                settings, or under another world size without every rank's part.
        """
        if isinstance(state, Mapping) and "position" in state:
            position = state["position"]
            if isinstance(position, bool) or not isinstance(position, int) or not (
                    0 <= position <= self.config.num_samples):
                raise ResumeError(
                    f"{self.path}: a worker's state holds position {position!r}, not a count "
                    f"of at most {self.config.num_samples} samples; resume from the state "
                    "the DataLoader saved")
            self._worker_state = dict(state)
            return
        check_same_order(state, self.config.seed, order_settings(self.config))
        progress = progress_from_state(state, self.config, where=f"{self.path}: the state")
        if progress.world_size != self.world_size and not progress.complete:
            raise ResumeError(
                f"{self.path}: the state was saved by rank(s) {sorted(progress.consumed)} of "
                f"{progress.world_size}; to resume under world size {self.world_size}, gather "
                "every rank's state_dict() and load shardio.merge_states(states) on every rank"
            )
        self._shared.write({"epoch": progress.epoch, "resume": progress_to_state(progress)})
