"""``shardio.loader``: a DataLoader over a ``StreamingDataset`` with defaults that work.

Workers batch their own samples (a ``RecordBatch`` for raw samples, one
uint8 buffer of decoded images for ``decode="tensor"``) and hand them over
through shared memory each worker reuses (``shardio.torch.handover.ring``): the main
process receives a small handle and wraps the worker's bytes without copying
them. A batch's memory goes back to its worker when the batch and everything
taken from it (views, tensors) are gone. Workers take the rank's order in
whole batches in turn, so batches arrive in that order, full but the last, and
a position in it is all ``state_dict()`` needs; raw batches cross a few per
DataLoader item (``GROUP_BATCHES``), which the main process puts back in turn.
Workers are persistent (and replaced when one dies), ``pin_memory`` is on only
when CUDA is present, and epochs advance by themselves unless ``set_epoch``
chose one. Without workers (and without pinning) the batches are taken from the
dataset here, converted as the DataLoader converts them: its per-item machinery is
all it would add.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import secrets
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, default_convert

from shardio.decode.fields import FieldDecoder
from shardio.reading import telemetry
from shardio.reading.batch import RecordBatch
from shardio.torch.dataset import StreamingDataset, check_batch_size, local_roots
from shardio.torch.decoders import SampleDecoder
from shardio.torch.handover import pinned
from shardio.torch.handover import ring as shmring
from shardio.torch.handover import views as shmview

GROUP_BATCHES = 4
"""Raw batches a worker hands over per DataLoader item (``_Grouped``). Each item costs
the DataLoader's own machinery about 55 CPU us in the main process (its index put on a
worker's queue by a feeder thread, the poll, read and unpickling of the item; measured
with a dataset that yields ints) and about as much in the worker: more than shardio's
hand-over of a 64-sample raw batch. Decoded and user-collated batches, which cost far
more to make, go one an item."""


class _TimedCollate:
    """A collate that keeps how long its latest call took: the rest of the view's collate
    time is the hand-over into shared memory (``shmring.RingCollate`` wraps this)."""

    def __init__(self, collate: Callable[[list[Any]], Any]) -> None:
        self.collate = collate
        self.last_s = 0.0

    def __call__(self, samples: list[Any]) -> Any:
        now = telemetry.clock()
        began = now()
        out = self.collate(samples)
        self.last_s = now() - began
        return out


class _Grouped(IterableDataset[list[Any]]):
    """A worker's batches of a ``batched`` view, up to ``most`` per DataLoader item.

    Groups start at one batch and double, so the first batch waits for no other. Each
    batch's times become ``telemetry.WORKER_STAGES`` seconds here, in the worker, and
    then the shard files opened since the batch before: ``timed`` tells the collate's
    own part from the hand-over (None: no hand-over, the collate is all); ``decodes``:
    that part decodes the batch's images (``ImageBatchDecoder``), so it counts as
    ``decode``.
    """

    def __init__(self, view: StreamingDataset, most: int, timed: _TimedCollate | None,
                 decodes: bool) -> None:
        self.view = view
        self.most = most
        self.timed = timed
        self.decodes = decodes
        self._opens = 0

    def __iter__(self) -> Iterator[list[Any]]:
        self._opens = telemetry.shard_opens
        batches = map(self._stages, iter(self.view))
        size = 1
        while group := list(itertools.islice(batches, size)):
            yield group
            size = min(2 * size, self.most)

    def _stages(self, item: tuple[Any, int, int, int, tuple[float, float, float]]
                ) -> tuple[Any, int, int, int, tuple[float, ...]]:
        batch, first, stop, pid, (read, decode, collate) = item
        opens = telemetry.shard_opens - self._opens
        self._opens += opens
        own = collate if self.timed is None else min(self.timed.last_s, collate)
        if self.decodes:
            return batch, first, stop, pid, (read, decode + own, 0.0, collate - own, opens)
        return batch, first, stop, pid, (read, decode, own, collate - own, opens)


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
    if isinstance(dataset.decoder, FieldDecoder):  # tuples of fields=, whatever the mode
        from shardio.torch.collate import collate_fields

        return collate_fields
    if mode == "raw" and dataset.decoder.transform is None:
        return RecordBatch.from_samples
    if mode == "tensor" and dataset.decoder.transform is None:
        from shardio.torch.collate import collate_tensor

        return collate_tensor
    return collate_items


def _batch_decoder(
    dataset: StreamingDataset, *, pin: bool = False
) -> Callable[[list[Any]], Any] | None:
    """The collate that decodes whole batches into one buffer, where it gives what
    ``decode="tensor"`` yields: plain ``(image, label)`` samples, no transforms; ``pin``:
    that buffer pinned (this process decodes, and the batch will be pinned)."""
    decoder = dataset.decoder
    if not isinstance(decoder, SampleDecoder) or decoder.mode != "tensor" or (
        decoder.transform is not None or decoder.target_transform is not None
    ):
        return None
    from shardio.torch.collate import ImageBatchDecoder

    return ImageBatchDecoder(draft_size=decoder.draft_size, pin_memory=pin,
                             cropper=decoder.cropper, skipped=dataset._skipped,
                             num_classes=decoder.num_classes, path=decoder.path)


class ShardLoader:
    """Iterates batches of a ``StreamingDataset`` epoch after epoch; resumable.

    Each ``iter(loader)`` is one epoch; the next one starts at the next epoch,
    or at the epoch chosen with ``dataset.set_epoch`` or ``load_state_dict``
    since. Workers take the rank's order in whole batches in turn, so batches
    arrive in the rank's order, every one full but the epoch's last. If an
    epoch stops with an error (a worker killed, a damaged record), the next
    ``iter()`` starts fresh workers and continues after the last batch delivered.
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
        drop_last: bool = False,
        log_every: int | None = None,
        log_fn: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """See ``shardio.loader``."""
        batch_size = check_batch_size(batch_size, "shardio.loader")
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.prefetch_factor = prefetch_factor
        self.num_workers = min(os.cpu_count() or 1, 8) if num_workers is None else num_workers
        workers = self.num_workers
        # pinned here: batches are built over one pinned buffer each, which the DataLoader's
        # thread then leaves as it is (handover.pinned), instead of pinning tensor by tensor
        pin = pinned.enabled(pin_memory)
        decoder = None if collate_fn is not None else _batch_decoder(
            dataset, pin=pin and workers == 0)
        collate = collate_fn or decoder or collate_for(dataset)
        # (== : a classmethod is a new bound method at every access, never the same object)
        raw = collate == RecordBatch.from_samples
        # batches per DataLoader item (``_Grouped``), and items a worker keeps ready:
        # prefetch_factor batches, and, grouped, one group more, so that a worker that sent
        # a group has the next one to build while this process has yet to take it
        self._most = min(GROUP_BATCHES, prefetch_factor) if raw and workers > 0 else 1
        items = -(-prefetch_factor // self._most) + (1 if self._most > 1 else 0)
        # the ring's names are per loader, so two loaders (or jobs) never share a segment
        self._token = f"{os.getpid()}-{secrets.token_hex(8)}"
        # grouped, a worker's batches ready, and those of its group taken apart here
        # (``__iter__``) while it builds the next
        max_slots = items * self._most + (self._most if self._most > 1 else 0) + (
            shmring.SLOTS_BEYOND_PREFETCH)
        # timed only where a hand-over follows the collate: its two clock reads tell them
        # apart, and in one process they would be the loop's own cost
        timed = None if workers == 0 or not shmring.ENABLED else _TimedCollate(collate)
        wrapped: Callable[[list[Any]], Any] = collate if timed is None else (
            shmring.RingCollate(
                timed, self._token, max_slots=max_slots,
                roots=local_roots(dataset.reader) if shmring.FILES_ENABLED else ()))
        # raw bytes may stay views of the blocks read: these collates copy or decode them
        zero_copy = raw or decoder is not None
        self._view = dataset.batched(batch_size, wrapped, zero_copy=zero_copy, drop_last=drop_last)
        if decoder is not None:  # the collate decodes: the samples reach it raw
            self._view.decoder = SampleDecoder("raw")
        # skipped samples (on_bad_image): one warning an epoch here, not one a worker
        self._view.warn_skipped = workers == 0
        self._source = _Grouped(self._view, self._most, timed, decoder is not None)
        if pin and workers > 0:
            shmview.PINNED.add(self._token)
        weakref.finalize(self, shmview.forget, self._token)
        self._persistent = persistent_workers and workers > 0
        self._settings: dict[str, Any] = {
            "num_workers": workers,
            "pin_memory": torch.cuda.is_available() if pin_memory is None else pin_memory,
            "prefetch_factor": items if workers > 0 else None,
            "persistent_workers": self._persistent,
            "multiprocessing_context": multiprocessing_context if workers > 0 else None,
        }
        self._loader = DataLoader(self._source, batch_size=None, **self._settings)
        # in one process the DataLoader adds nothing but about 40 us of its own machinery
        # per item (a profiler record, the fetcher, ``default_convert`` walking each group):
        # a tenth of a tiny-record epoch, so its groups are taken here (``_in_process``).
        # Pinning stays the DataLoader's
        self._in_process = workers == 0 and not self._settings["pin_memory"]
        self._epoch = dataset.epoch
        self._generation: int | None = None
        """The dataset's state generation this loader last set or followed; None: follow it."""
        self._position = 0
        self._running = False
        self._pids: set[int] = set()
        self._stats = telemetry.LoaderStats(telemetry.WORKER_STAGES, counts=("shard_opens",),
                                            log_every=log_every, log_fn=log_fn)

    def stats(self) -> dict[str, Any]:
        """The training loop's wait for batches and the workers' time per stage, since the
        loader was made or ``reset_stats()``: see ``shardio.reading.telemetry.LoaderStats.as_dict``
        (``data_wait_s``, ``data_wait_pct``, ``data_wait_p50_s`` … ``read_s``,
        ``decode_s``, ``collate_s``, ``handover_s``; stage seconds are summed over the
        workers; ``shard_opens``: shard files the workers opened for these batches) plus
        ``num_workers`` and ``batch_size``."""
        out = self._stats.as_dict()
        out["num_workers"] = self.num_workers
        out["batch_size"] = self.batch_size
        return out

    def reset_stats(self) -> None:
        """Start ``stats()`` afresh (e.g. after warm-up, or per epoch)."""
        self._stats.reset()

    def step_series(self) -> dict[str, list[float]]:
        """Per step since ``reset_stats()``: the wait and each stage's seconds."""
        return self._stats.series()

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        samples = len(self.dataset)
        if self.drop_last:
            return samples // self.batch_size
        return -(-samples // self.batch_size)

    def _next_epoch(self) -> None:
        """Choose this iteration's epoch: the dataset's if set since, else the next one."""
        shared = self.dataset._shared.read()
        if int(shared["generation"]) == self._generation:
            self.dataset.set_epoch(self._epoch + 1)
        elif self.dataset.epoch != int(shared["epoch"]):  # passes read outside this loader
            self.dataset.set_epoch(self.dataset.epoch)
        self._epoch = self.dataset.epoch
        self._generation = int(self.dataset._shared.read()["generation"])

    def __iter__(self) -> Iterator[Any]:
        if self._persistent and self._lost_worker():
            self._recover()
        # segments of workers that are gone (each epoch's, without persistent workers)
        alive = {p.pid for p in multiprocessing.active_children() if p.pid is not None}
        shmview.forget(self._token, keep=alive)
        self._next_epoch()
        self._position = self._start_position()
        self._running = True
        skipped = self.dataset.skipped_images.count
        # batches of the workers' groups by position; the DataLoader takes the groups from
        # the workers in turn, so at most a group a worker waits here for its turn
        pending: dict[int, tuple[Any, int, int, tuple[float, ...]]] = {}
        most = self._most * max(1, self.num_workers)
        stats, now = self._stats, telemetry.clock()
        stats.start()
        asked = now()
        try:
            for group in self._in_process_groups() if self._in_process else self._loader:
                for batch, first, stop, pid, times in group:
                    if first < self._position or first in pending:
                        self._out_of_turn(first, stop)
                    pending[first] = (batch, stop, pid, times)
                group.clear()  # the consumer's drop of a batch gives its slot back
                if len(pending) > 2 * most:
                    self._out_of_turn(min(pending), pending[min(pending)][1])
                while (entry := pending.pop(self._position, None)) is not None:
                    batch, stop, pid, times = entry
                    del entry
                    if self.num_workers > 0:
                        self._pids.add(pid)
                    self._position = stop
                    if batch is not None:  # None: every sample skipped (on_bad_image)
                        stats.record(asked, now(), times)
                        yield batch
                        asked = now()
            if pending:
                self._out_of_turn(min(pending), pending[min(pending)][1])
            if self.num_workers > 0:
                shmview.drop_pages()  # the epoch's last batches' pages: see drop_pages
                if self.dataset._skipped is not None:
                    self.dataset._skipped.warn(self.dataset.path, self._epoch,
                                               self.dataset.skipped_images.count - skipped)
        except GeneratorExit:
            # the loop stopped early; a worker killed meanwhile raised in the caller's code.
            # Only persistent workers outlive the loop: the DataLoader's iterator, dropped
            # on the way here, shuts the others down, and taken for lost they made the next
            # iter() continue this epoch instead of starting the next one
            if self._persistent and self._lost_worker():
                self._recover()
            raise
        except BaseException as exc:
            self._recover()
            note = getattr(exc, "add_note", None)
            if note is not None:
                note(
                    f"shardio.loader: the next iter() starts fresh workers and continues epoch "
                    f"{self._epoch} after the last batch delivered (position {self._position})"
                )
            raise
        self._running = False

    def _in_process_groups(self) -> Iterator[list[Any]]:
        """The groups as the DataLoader gives them without workers: each batch converted by
        ``default_convert`` (numpy arrays of a user's collate become tensors), and a base
        seed drawn from torch's generator per epoch, so a script's random stream is the
        same either way."""
        torch.empty((), dtype=torch.int64).random_()
        for group in self._source:
            for i, (batch, first, stop, pid, times) in enumerate(group):
                if not isinstance(batch, (RecordBatch, torch.Tensor)):
                    group[i] = (default_convert(batch), first, stop, pid, times)  # type: ignore[no-untyped-call]
            yield group

    def _start_position(self) -> int:
        """Where this iteration starts in the rank's order.

        A fresh epoch (no resume of it loaded, in the dataset or a worker state) starts
        at 0 without planning its order here: ``start_state`` planned the whole order
        (6 ms an epoch for 100,000 samples) in this process before the workers were
        asked for their first batch, while they waited.
        """
        shared = self.dataset._shared.read()
        resume = shared.get("resume")
        if self.dataset._worker_state is None and (
                resume is None or int(resume["epoch"]) != int(shared["epoch"])):
            return 0
        return int(self.dataset.start_state()["consumed"][str(self.dataset.rank)][0])

    def _out_of_turn(self, first: int, stop: int) -> None:
        raise RuntimeError(
            f"shardio.loader: a batch for positions {first}..{stop} arrived at "
            f"position {self._position} of epoch {self._epoch}; the DataLoader did "
            "not take batches from its workers in turn (in_order=False?)"
        )

    def _lost_worker(self) -> bool:
        """Whether a worker that delivered batches of this loader is gone."""
        if not self._pids:
            return False
        alive = {p.pid for p in multiprocessing.active_children()}
        return not self._pids <= alive

    def _recover(self) -> None:
        """Replace the workers; the next ``iter()`` continues after the last batch delivered."""
        state = self.state_dict()
        broken = getattr(self._loader, "_iterator", None)
        shutdown = getattr(broken, "_shutdown_workers", None)
        if callable(shutdown):  # stop the survivors now, and unregister the dead pid's watch
            shutdown()
        self._loader = DataLoader(self._source, batch_size=None, **self._settings)
        self._pids = set()
        shmview.forget(self._token)
        self.load_state_dict(state)

    @property
    def epoch(self) -> int:
        """The epoch being read, or last read."""
        return self._epoch

    def state_dict(self) -> dict[str, Any]:
        """Resumable position of this rank: the epoch and the batches delivered.

        Mid-epoch (also after breaking out of the loop) it is the position
        reached; after a finished epoch it is the start of the next one.
        """
        current = int(self.dataset._shared.read()["generation"])
        if current != self._generation:
            return self.dataset.start_state()
        if self._running:
            return self.dataset.progress_state(self._epoch, 1, [self._position])
        return self.dataset.progress_state(self._epoch + 1, 1, [0])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``: the next ``iter()`` yields the rest of that epoch."""
        self.dataset.load_state_dict(state)
        self._running = False
        self._generation = None


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
    drop_last: bool = False,
    log_every: int | None = None,
    log_fn: Callable[[dict[str, Any]], None] | None = None,
) -> ShardLoader:
    """A resumable DataLoader over ``dataset`` with defaults that work.

    Args:
        dataset: the ``StreamingDataset`` to read.
        batch_size: samples per batch (an int, 1 or more); every batch is full but the
            epoch's last.
        num_workers: worker processes (default: the core count, at most 8).
        collate_fn: override the batch format (default: ``RecordBatch`` for raw
            samples, stacked uint8 tensors for ``decode="tensor"``,
            ``shardio.torch.collate.collate_fields`` with ``fields=``, default
            collation otherwise).
        pin_memory: default: only when CUDA is available.
        prefetch_factor: batches each worker keeps ready (raw batches, which cross
            a few per DataLoader item, ``GROUP_BATCHES``: a group more).
        persistent_workers: keep workers between epochs (they read the epoch
            from shared memory); a killed worker is replaced at the next ``iter()``.
        multiprocessing_context: e.g. ``"spawn"``; default: the platform's.
        drop_last: leave out the epoch's last batch when it is short.
        log_every: every this many batches, hand ``log_fn`` the ``stats()`` of those
            batches (the loop's wait for data, the workers' time per stage).
        log_fn: receives that dict (default: one INFO line on the ``shardio`` logger).

    ``loader.stats()`` is always kept: about 0.55 us a batch (clock reads and two
    appends), 0.7% of a warm epoch of 2-4 KB records at batch 16 in one process and
    0.2-0.4% otherwise (``benchmarks/results/telemetry.json``, written by
    ``python -m benchmarks.bench_telemetry``); ``loader.reset_stats()`` starts it afresh.
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
        drop_last=drop_last,
        log_every=log_every,
        log_fn=log_fn,
    )
