"""Move batches to the accelerator one step ahead of the training loop.

``DevicePrefetcher`` wraps any iterable of batches. On CUDA it copies the
next batch host → device on a side stream while the current step runs: CPU
tensors are pinned (unless the DataLoader already did with
``pin_memory=True``, which is cheaper because its thread does it), copied
with ``non_blocking=True``, optionally converted on the device (uint8 →
float, mean/std normalisation, channels_last), and handed over with
``wait_stream`` + ``record_stream`` so the caching allocator never reuses
their memory while the consumer's stream still reads it. On the CPU
(``"cpu"`` or ``device=None``) batches pass through unchanged apart from the
optional conversion; ``"cuda"`` where CUDA is not available raises, as torch does.

Every device runs the same one-batch look-ahead: batch N+1 is taken from the
loader (and, on CUDA, its copy started) before batch N is handed over. So the
loader's own ``state_dict()`` counts one batch the training loop has not seen;
``DevicePrefetcher.state_dict()`` is the loader's state as it was right after
the handed-over batch was taken, which is what a checkpoint in the loop must
save. No threads are started. Imports torch.

Like ``shardio.loader`` it keeps ``stats()`` (``shardio.reading.telemetry``): per step the
training loop's wait for its batch (which here includes taking the next batch from
the loader and staging it), and the seconds of the copy to the device and of ``decode=``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import torch

from shardio.reading import telemetry

if TYPE_CHECKING:
    from shardio.torch.device_decode import DeviceDecoder

T = TypeVar("T")


class DevicePrefetcher(Generic[T]):
    """Iterate ``loader`` with each batch already on ``device`` (one batch in flight).

    Batches may be tensors, tuples, lists, named tuples or mappings of them
    (nested), or objects with a ``to(device, non_blocking=...)`` method;
    other leaves (ints, strings, None) pass through unchanged.

    The optional conversion applies to *image tensors*: uint8 tensors with 3
    (C, H, W) or 4 (B, C, H, W) dimensions, as ``decode="tensor"`` and
    ``shardio.torch.collate.collate_tensor`` produce. Other tensors are never
    converted; turn conversion off if a batch carries uint8 masks of that shape.

    On CUDA, memory behind an object moved by its own ``to`` cannot be handed
    over with ``record_stream``; a batch holding one makes the next copy wait
    for the work already queued on the consumer's stream (safe, less overlap).
    Tensors the loader already put on the device are used as they are, so the
    loader must have finished writing them (synchronised its stream).

    Checkpoint with ``prefetcher.state_dict()``, not the loader's (see the
    module docstring); the state is that of the latest iteration.
    """

    def __init__(
        self,
        loader: Iterable[T],
        device: str | torch.device | None,
        *,
        convert_float: bool = False,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        channels_last: bool = False,
        decode: DeviceDecoder | None = None,
        log_every: int | None = None,
        log_fn: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """Wrap ``loader``; nothing is read until iteration starts.

        Args:
            loader: any iterable of batches, usually a ``torch.utils.data.DataLoader``.
            device: target device; ``"cpu"`` or None for the CPU pass-through.
                ``self.device`` is the device used (``"cuda"`` gains its index).
            convert_float: convert image tensors to float32 in [0, 1] (divide by 255).
            mean: per-channel mean subtracted after ``convert_float`` (e.g. ImageNet's).
            std: per-channel standard deviation divided by after ``mean``.
            channels_last: give 4-D image tensors the ``torch.channels_last`` layout.
            decode: a ``shardio.DeviceDecoder`` for ``device``: each raw batch
                (``RecordBatch``) of the loader becomes ``(images, labels)`` there,
                decoded one batch ahead (on CUDA, on the side stream, so the GPU's
                part of it overlaps the step), then converted as above. Random
                crops are drawn for the epoch the loader is reading (its ``epoch``,
                as ``shardio.loader`` has, else its dataset's).
            log_every: every this many steps, hand ``log_fn`` the ``stats()`` of those steps.
            log_fn: receives that dict (default: one INFO line on the ``shardio`` logger).

        Raises:
            RuntimeError: ``device`` is a CUDA device but CUDA is not available.
            ValueError: ``mean``/``std`` given without each other, of different
                lengths, with a zero in ``std``, or without ``convert_float``;
                ``decode`` decodes to another device.
            TypeError: ``decode`` draws random crops but neither the loader nor its
                dataset says which epoch it reads.
        """
        if (mean is None) != (std is None):
            raise ValueError("pass mean and std together, or neither")
        if mean is not None and std is not None:
            if not convert_float:
                raise ValueError(
                    "mean/std normalise float images in [0, 1]; pass convert_float=True"
                )
            if len(mean) != len(std) or len(mean) == 0:
                raise ValueError(
                    f"mean and std need one value per channel, got {len(mean)} and {len(std)}"
                )
            if any(s == 0 for s in std):
                raise ValueError(f"std must not contain 0, got {list(std)}")
        self.loader = loader
        self.device = resolve_device(device)
        if decode is not None and decode.device != self.device:
            raise ValueError(f"decode= decodes to {decode.device}, but the prefetcher hands "
                             f"batches over on {self.device}: give both the same device")
        if decode is not None and decode.needs_epoch and _epoch_of(loader) is None:
            raise TypeError(
                f"decode= draws random crops per epoch, but {type(loader).__name__} has no "
                "epoch: wrap shardio.loader(...), or a DataLoader over a StreamingDataset")
        self.decode = decode
        self.convert_float = convert_float
        self.channels_last = channels_last
        self._norm = None if mean is None or std is None else (tuple(mean), tuple(std))
        self._affine: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._handed: Any = None
        """The loader's state right after the batch last handed over was taken, or None."""
        self._stats = telemetry.LoaderStats(telemetry.DEVICE_STAGES, log_every=log_every,
                                            log_fn=log_fn)
        self._staged = (0.0, 0.0)
        """Batches taken since the last step recorded: seconds of their (synchronous)
        copies and of ``decode``."""
        self._events: list[tuple[Any, Any, int]] = []
        """CUDA copies not yet timed: start and end events, and their step's number."""

    def stats(self) -> dict[str, Any]:
        """The loop's wait per step and the device stages (``h2d_s``,
        ``device_decode_s``), since made or ``reset_stats()``: see
        ``shardio.reading.telemetry.LoaderStats.as_dict``; ``loader``: the wrapped loader's own
        ``stats()``, where it has them."""
        self._time_copies(wait=True)
        out = self._stats.as_dict()
        inner = getattr(self.loader, "stats", None)
        if callable(inner):
            out["loader"] = inner()
        return out

    def reset_stats(self) -> None:
        """Start ``stats()`` afresh, the wrapped loader's too where it has them."""
        self._time_copies(wait=True)
        self._stats.reset()
        inner = getattr(self.loader, "reset_stats", None)
        if callable(inner):
            inner()

    def __len__(self) -> int:
        """The loader's length.

        Raises:
            TypeError: the loader has no length (an iterable dataset without ``__len__``).
        """
        if not isinstance(self.loader, Sized):
            raise TypeError(f"{type(self.loader).__name__} has no len()")
        return len(self.loader)

    def state_dict(self) -> Any:
        """The loader's state with exactly the batches handed over so far counted.

        Mid-epoch this is the snapshot taken when the batch last handed over
        was pulled, so a resume continues with the batch after it, not after
        the one already taken ahead. Before the first batch, after
        ``load_state_dict`` and after a finished epoch, it is the loader's own.

        Raises:
            TypeError: the loader has no ``state_dict()``.
        """
        if self._handed is not None:
            return self._handed
        return self._loader_method("state_dict")()

    def load_state_dict(self, state: Any) -> None:
        """Pass ``state`` (from ``state_dict()``) to the loader; the next iteration resumes it.

        Raises:
            TypeError: the loader has no ``load_state_dict()``.
        """
        self._loader_method("load_state_dict")(state)
        self._handed = None

    def _loader_method(self, name: str) -> Any:
        method = getattr(self.loader, name, None)
        if not callable(method):
            raise TypeError(
                f"{type(self.loader).__name__} has no {name}(); wrap a resumable loader "
                "(shardio.loader or torchdata's StatefulDataLoader) to checkpoint mid-epoch"
            )
        return method

    def __iter__(self) -> Iterator[T]:
        """Batch N handed over while batch N+1 is already taken (and on CUDA, being copied)."""
        self._handed = None
        snapshot = getattr(self.loader, "state_dict", None)
        if not callable(snapshot):
            snapshot = _no_state
        side = None
        if self.device.type == "cuda":
            # torch.cuda.Stream.__new__ carries no annotations.
            side = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        stats, now = self._stats, telemetry.clock()
        stats.start()
        asked = now()
        batches = iter(self.loader)
        try:
            ahead = self._take(batches, snapshot, side)
            while ahead is not None:
                batch, recorded, state = ahead
                self._hand_over(batch, recorded, side)
                # Take the next batch now: on CUDA its copy overlaps this step.
                ahead = self._take(batches, snapshot, side)
                # Once the loader is exhausted, every batch it gave is handed over
                # with this one, and its own state (the next epoch's start) is exact.
                self._handed = state if ahead is not None else None
                # the staging done during this wait: the batch taken ahead (and, at the
                # first step, the first batch too)
                stats.record(asked, now(), self._staged)
                self._staged = (0.0, 0.0)
                if side is not None:
                    self._time_copies(wait=False)
                yield cast(T, batch)
                asked = now()
        finally:
            _close(batches)

    def _take(
        self,
        batches: Iterator[Any],
        snapshot: Callable[[], Any],
        side: torch.cuda.Stream | None,
    ) -> tuple[Any, list[torch.Tensor], Any] | None:
        """The next batch, staged for the device, with its CUDA tensors and the loader's state."""
        try:
            batch = next(batches)
        except StopIteration:
            return None
        state = snapshot()
        now = telemetry.clock()
        began = now()
        if side is None:
            decoded = self._decoded(batch)
            middle = now()
            staged = self._stage_sync(decoded)
            copy, decode = self._staged
            self._staged = (copy + now() - middle, decode + middle - began)
            return staged, [], state
        with torch.cuda.stream(side):
            decoded = self._decoded(batch)
            middle = now()
            start = end = None
            if telemetry.ENABLED:  # the copy runs later on the side stream: time it there
                start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                start.record(side)
            moved = self._transfer(decoded, move=True, non_blocking=True, pin=True)
            if start is not None and end is not None:
                end.record(side)
                # the step whose wait issued the copy: the next one recorded
                self._events.append((start, end, self._stats.steps + 1))
        self._staged = (self._staged[0], self._staged[1] + middle - began)
        return moved, _device_tensors(moved), state

    def _time_copies(self, *, wait: bool) -> None:
        """Add each finished CUDA copy's time to its step (``wait``: finish them first)."""
        while self._events:
            start, end, step = self._events[0]
            if not wait and not end.query():
                return
            end.synchronize()
            self._events.pop(0)
            back = self._stats.steps - step + 1
            if back >= 1:
                self._stats.add_stage("h2d", start.elapsed_time(end) / 1e3, back)

    def _decoded(self, batch: Any) -> Any:
        """``batch`` through ``decode``, for the epoch the loader is reading, if given."""
        if self.decode is None:
            return batch
        return self.decode(batch, epoch=_epoch_of(self.loader) or 0)

    def _stage_sync(self, batch: Any) -> Any:
        """CPU pass-through, or a blocking copy for a non-CUDA accelerator."""
        move = self.device.type != "cpu"
        if not (move or self.convert_float or self.channels_last):
            return batch
        return self._transfer(batch, move=move, non_blocking=False, pin=False)

    def _hand_over(
        self, batch: Any, recorded: list[torch.Tensor], side: torch.cuda.Stream | None
    ) -> None:
        """On CUDA: make the consumer's stream wait for the copy and own its memory."""
        if side is None:
            return
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_stream(side)
        for tensor in recorded:
            tensor.record_stream(consumer)
        if _has_opaque(batch):
            # Objects moved by their own .to() cannot be recorded: make the
            # next copy wait for the consumer instead of racing it.
            side.wait_stream(consumer)

    def _transfer(self, x: Any, *, move: bool, non_blocking: bool, pin: bool) -> Any:
        if isinstance(x, torch.Tensor):
            if move and x.device != self.device:
                if pin and x.device.type == "cpu" and not x.is_pinned():
                    x = x.pin_memory()
                x = x.to(self.device, non_blocking=non_blocking)
            return self._convert(x)
        if isinstance(x, Mapping):
            items = {k: self._transfer(v, move=move, non_blocking=non_blocking, pin=pin)
                     for k, v in x.items()}
            try:
                return cast(Any, type(x))(items)
            except TypeError:
                return items
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*(self._transfer(v, move=move, non_blocking=non_blocking, pin=pin)
                             for v in x))
        if isinstance(x, (tuple, list)):
            return type(x)(self._transfer(v, move=move, non_blocking=non_blocking, pin=pin)
                           for v in x)
        to = getattr(x, "to", None)
        if move and callable(to) and not isinstance(x, (str, bytes)):
            return to(self.device, non_blocking=non_blocking)
        return x

    def _convert(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.uint8 or x.dim() not in (3, 4):
            return x
        if self.channels_last and x.dim() == 4:
            # Re-laid out while still 1 byte per value; the float ops below keep the layout.
            x = x.contiguous(memory_format=torch.channels_last)
        if self.convert_float:
            x = x.to(torch.float32)
            if self._norm is None:
                x.div_(255.0)
            else:
                scale, shift = self._affine_for(x)
                x.mul_(scale).add_(shift)
        return x

    def _affine_for(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x / 255 - mean) / std`` as ``x * scale + shift``, the factors cached per device."""
        cached = self._affine.get(x.device)
        if cached is None:
            assert self._norm is not None
            mean = torch.tensor(self._norm[0], dtype=torch.float64)
            std = torch.tensor(self._norm[1], dtype=torch.float64)
            scale = (1.0 / (255.0 * std)).to(torch.float32).view(-1, 1, 1)
            shift = (-mean / std).to(torch.float32).view(-1, 1, 1)
            cached = (scale.to(x.device), shift.to(x.device))
            self._affine[x.device] = cached
        if x.shape[-3] != cached[0].shape[0]:
            raise ValueError(
                f"mean/std have {cached[0].shape[0]} channels but an image tensor of shape "
                f"{tuple(x.shape)} has {x.shape[-3]} at dim -3 (want (B, C, H, W) or (C, H, W))"
            )
        return cached


def resolve_device(device: str | torch.device | None) -> torch.device:
    """The device batches will land on: ``device``, CPU for None, CUDA with its index.

    A CUDA device where CUDA is absent is refused here, not silently replaced by the
    CPU: a script asking for the GPU would otherwise train on the CPU without a word.

    Raises:
        RuntimeError: ``device`` is a CUDA device but CUDA is not available.
    """
    wanted = torch.device("cpu" if device is None else device)
    if wanted.type != "cuda":
        return wanted
    if not torch.cuda.is_available():
        why = ("this torch is built without CUDA" if torch.version.cuda is None
               else "torch finds no CUDA device")
        raise RuntimeError(f"device {str(wanted)!r} asked for, but CUDA is not available "
                           f"({why}); pass \"cpu\" or device=None to run on the CPU")
    index = torch.cuda.current_device() if wanted.index is None else wanted.index
    return torch.device("cuda", index)


def _epoch_of(loader: Any) -> int | None:
    """The epoch a loader is reading: its own (``shardio.loader``), else its dataset's."""
    for holder in (loader, getattr(loader, "dataset", None)):
        epoch = getattr(holder, "epoch", None)
        if isinstance(epoch, int):
            return epoch
    return None


def _no_state() -> None:
    """The snapshot of a loader without ``state_dict()``: nothing to keep."""
    return None


def _close(batches: Iterator[Any]) -> None:
    """Close a generator the consumer abandoned, so its ``finally`` blocks run now."""
    close = getattr(batches, "close", None)
    if callable(close):
        close()


def _device_tensors(x: Any) -> list[torch.Tensor]:
    """Every CUDA tensor inside a moved batch, to ``record_stream`` on the consumer."""
    if isinstance(x, torch.Tensor):
        return [x] if x.is_cuda else []
    if isinstance(x, Mapping):
        return [t for v in x.values() for t in _device_tensors(v)]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _device_tensors(v)]
    return []


def _has_opaque(x: Any) -> bool:
    """Whether a moved batch holds a non-tensor object that was moved by its own ``to``."""
    if isinstance(x, torch.Tensor):
        return False
    if isinstance(x, Mapping):
        return any(_has_opaque(v) for v in x.values())
    if isinstance(x, (tuple, list)):
        return any(_has_opaque(v) for v in x)
    return callable(getattr(x, "to", None)) and not isinstance(x, (str, bytes))
