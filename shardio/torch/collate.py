"""uint8 image tensors, the field decoders of the torch datasets, and the collates.

``decode_tensor`` turns encoded bytes into a uint8 CHW tensor (a view over
the decoded pixels, like torchvision's ``pil_to_tensor`` but without its
extra copy). ``collate_tensor`` stacks ``(image, label)`` samples into one
``(B, C, H, W)`` uint8 tensor and one int64 label tensor; ``collate_fields``
does the same per position for the tuples of ``fields=`` (``field_decoder``
builds their decoder with the image decoder of the decode mode).
``ImageBatchDecoder`` is ``shardio.loader``'s collate for ``decode="tensor"``:
it decodes a batch of raw samples straight into one buffer, HWC, without the
per-image tensors and the transposing copy of the two steps above. Inside a
DataLoader worker a batch's buffer comes from ``batch_buffer``: the worker's
shared-memory ring under ``shardio.loader`` (``shardio.torch.handover.ring``), else fresh
shared memory, so a batch reaches the main process as one segment instead of
pickled arrays. Imports torch; nothing below the torch layer may import this module.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info

from shardio.decode.crop import Cropper, PendingCrop
from shardio.decode.fields import FieldDecoder, Fields, ImageDecoder, as_fields, to_bytes
from shardio.decode.image import PendingImage, decode_array, decode_image, open_image
from shardio.errors import DecodeError
from shardio.format.manifest import Manifest
from shardio.format.record import INDEX_FIELD, KEY_FIELD
from shardio.torch.badimage import SkippedImages
from shardio.torch.handover import pinned
from shardio.torch.handover.ring import active_ring


def decode_tensor(
    data: bytes | memoryview,
    *,
    draft_size: tuple[int, int] | None = None,
    key: str | None = None,
) -> torch.Tensor:
    """Decode an encoded image into a uint8 ``(3, H, W)`` RGB tensor.

    The tensor is a CHW view (not contiguous) over one buffer of HWC pixels
    (``shardio.decode.image.decode_array``: simplejpeg's output where it decodes the
    image, else the buffer Pillow packs its pixels into); ``collate_tensor``
    makes the batch contiguous when it stacks. The buffer belongs to this
    tensor alone, so writing to it is safe even where numpy marks it read-only.

    Args:
        data: the encoded file's bytes.
        draft_size: see ``shardio.decode.image.decode_image``.
        key: the sample's key, named in the error if decoding fails.

    Raises:
        DecodeError: ``data`` is not an image Pillow can decode.
    """
    arr = decode_array(data, draft_size=draft_size, key=key)
    with warnings.catch_warnings():
        # The array wraps a bytes object nothing else references; see the docstring.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        hwc = torch.from_numpy(arr)
    return hwc.permute(2, 0, 1)


def image_and_label(sample: Mapping[str, Any], num_classes: int, path: str
                    ) -> tuple[bytes | memoryview, int]:
    """An ImageFolder sample's ``image`` bytes and ``label``, checked as ``shardio verify``
    checks them: a record that is no such pair would fail deep in a decoder with a bare
    KeyError or TypeError, or deliver a label outside the classes.

    Raises:
        DecodeError: the record does not fit the layout (``layout_error``).
    """
    data, label = sample.get("image"), sample.get("label")
    if isinstance(data, (bytes, memoryview)) and type(label) is int and 0 <= label < num_classes:
        return data, label
    raise layout_error(sample, num_classes, path)


def layout_error(sample: Mapping[str, Any], num_classes: int, path: str) -> DecodeError:
    """The error of a record of a dataset with ``num_classes`` classes whose ``label`` does
    not index them, or (ImageFolder) whose ``image`` is missing or not bytes."""
    key, label, image = sample.get(KEY_FIELD), sample.get("label"), sample.get("image")
    fields = sorted(set(sample) - {KEY_FIELD, INDEX_FIELD})
    if "label" not in sample:
        problem = f"has no 'label' (its fields: {fields})"
    elif type(label) is not int or not 0 <= label < num_classes:
        problem = f"has label {label!r}, not an index into the {num_classes} classes"
    elif "image" not in sample:
        problem = f"has no 'image' (its fields: {fields})"
    else:
        problem = f"has an image of type {type(image).__name__}, not bytes"
    return DecodeError(
        f"{path}: sample {key!r} (index {sample.get(INDEX_FIELD)}) {problem}: the record does "
        f"not fit the dataset's layout; run `shardio verify {path}` to list every such record, "
        "and re-pack them (decode='raw' reads them as stored)", key=key)


def collate_tensor(
    batch: Sequence[tuple[torch.Tensor, Any]],
) -> tuple[torch.Tensor | list[torch.Tensor], torch.Tensor]:
    """Batch ``(uint8 CHW image, label)`` samples into ``(images, labels)``.

    Args:
        batch: samples as yielded by a dataset with ``decode="tensor"``.

    Returns:
        ``images``: one ``(B, C, H, W)`` uint8 tensor when every image has the
        same shape, else the list of images (stacking would need a resize
        that only the caller can choose). ``labels``: an int64 ``(B,)`` tensor
        for int labels (other label types are collated by ``default_collate``).

    Raises:
        TypeError: a sample is not an ``(image tensor, label)`` pair.
        ValueError: ``batch`` is empty.
    """
    if not batch:
        raise ValueError("collate_tensor got an empty batch")
    images: list[torch.Tensor] = []
    labels: list[Any] = []
    for i, sample in enumerate(batch):
        if not (isinstance(sample, (tuple, list)) and len(sample) == 2):
            raise TypeError(
                f"collate_tensor wants (image, label) pairs; sample {i} is {type(sample).__name__}"
            )
        image, label = sample
        if not isinstance(image, torch.Tensor):
            raise TypeError(
                f"collate_tensor wants tensor images (decode='tensor'); sample {i} holds "
                f"{type(image).__name__}"
            )
        images.append(image)
        labels.append(label)
    if all(type(x) is int for x in labels):
        label_batch = torch.tensor(labels, dtype=torch.int64)
    else:
        label_batch = default_collate(labels)
    flat, views = pack_views(images)
    first = images[0].shape
    if all(x.shape == first for x in images):
        return flat.view(len(images), *first), label_batch
    return views, label_batch


def pack_views(images: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Copy images into one buffer; return it and a contiguous view per image.

    A worker hands a list of separate tensors to the main process as one
    shared-memory segment *each* (about a millisecond apiece); views of one
    storage travel as a single segment. Inside a worker the buffer is
    allocated in shared memory up front, so it is written once. The copy goes
    through numpy, whose strided copy of a CHW view of HWC pixels is about
    twice as fast as torch's.
    """
    dtype = images[0].dtype
    if any(x.dtype != dtype for x in images):
        raise TypeError(
            "collate_tensor wants images of one dtype, got "
            f"{sorted({str(x.dtype) for x in images})}"
        )
    total = sum(int(x.numel()) for x in images)
    flat = batch_buffer(total * images[0].element_size()).view(dtype)
    flat_np = flat.numpy()
    views = []
    at = 0
    for image in images:
        n = int(image.numel())
        np.copyto(flat_np[at : at + n].reshape(image.shape), image.numpy())
        views.append(flat[at : at + n].view(image.shape))
        at += n
    return flat, views


def shared_empty(nbytes: int) -> torch.Tensor:
    """``nbytes`` of uint8 shared memory (``file_descriptor`` or ``file_system``, as torch
    shares), made there: ``share_memory_`` on a new tensor would copy it into a second
    segment."""
    new_shared = getattr(torch.UntypedStorage, "_new_shared", None)
    if new_shared is None:  # a private helper of torch's (since 1.x): fall back if it goes
        flat = torch.empty(nbytes, dtype=torch.uint8)
        flat.share_memory_()  # type: ignore[no-untyped-call]
        return flat
    return torch.empty(0, dtype=torch.uint8).set_(new_shared(nbytes))


def decode_shared(pending: Sequence[PendingImage | PendingCrop]) -> list[torch.Tensor]:
    """Decode opened images (``open_image``, ``Cropper.open``) into uint8 ``(3, H, W)``
    tensors that are CHW views of one block of shared memory, HWC as decoded.

    For the samples of a plain DataLoader worker: torch hands a tensor to the main
    process by its storage, each storage as a file descriptor the main process fetches
    over a connection of its own (about 0.3 ms of its CPU each, measured with 80 KB
    JPEGs), and moves each storage not in shared memory there first (a copy into a
    fresh segment). Views of one block cross with one descriptor for every tensor of a
    batch that shares it, and are written there once. A tensor kept alive keeps its
    whole block alive.

    Raises:
        DecodeError: an image does not decode.
    """
    return decode_views(pending, shared_empty(pixel_bytes(pending)))


def pixel_bytes(pending: Sequence[PendingImage | PendingCrop]) -> int:
    """The bytes ``decode_views`` needs for ``pending``."""
    return sum(h * w * c for h, w, c in (p.shape for p in pending))


def decode_views(
    pending: Sequence[PendingImage | PendingCrop], flat: torch.Tensor,
    on_error: Callable[[int], object] | None = None,
) -> list[torch.Tensor]:
    """Decode ``pending`` one after another into ``flat`` (uint8, ``pixel_bytes`` long),
    HWC as the decoders write; their ``(3, H, W)`` views.

    ``on_error``: called with the position of an image that raises ``DecodeError``,
    which then has no view (the next image takes its place in ``flat``); without it
    the error propagates.
    """
    flat_np = flat.numpy()
    views: list[torch.Tensor] = []
    at = 0
    for i, image in enumerate(pending):
        h, w, c = image.shape
        size = h * w * c
        try:
            image.decode_into(flat_np[at : at + size].reshape(image.shape))
        except DecodeError:
            if on_error is None:
                raise
            on_error(i)
            continue
        views.append(flat[at : at + size].view(image.shape).permute(2, 0, 1))
        at += size
    return views


def batch_buffer(nbytes: int, *, pin: bool = False) -> torch.Tensor:
    """``nbytes`` of uint8 memory for one batch, where it will cross to the main process.

    In a worker under ``shardio.loader``: a slot of the worker's shared-memory
    ring (``shardio.torch.handover.ring``), so the batch is written once and never copied
    again. In another DataLoader worker: fresh shared memory. Elsewhere: pinned
    memory with ``pin`` (the batch is pinned anyway: decoded there, it is never
    copied), else plain memory.
    """
    ring = active_ring()
    if ring is not None:
        buf = ring.buffer(nbytes)
        if buf is not None:
            return torch.from_numpy(buf)
    in_worker = get_worker_info() is not None
    if pin and not in_worker:
        return pinned.empty(nbytes)
    if ring is None and in_worker:
        return shared_empty(nbytes)
    return torch.empty(nbytes, dtype=torch.uint8)


class ImageBatchDecoder:
    """``shardio.loader``'s collate for ``decode="tensor"``: raw samples to ``(images, labels)``.

    Every image is decoded straight into one batch buffer (``batch_buffer``),
    pixels in HWC order as the decoder writes them: ``images`` is one uint8
    ``(B, 3, H, W)`` tensor in ``torch.channels_last`` memory format when all
    images have one size, else a list of ``(3, H, W)`` views of the buffer
    (``.contiguous()`` gives the NCHW order). The pixels are those of
    ``decode_tensor``; labels as ``collate_tensor`` makes them. With ``skipped``
    (``on_bad_image="skip"``) a sample whose image does not decode is left out of the
    batch and counted there; a batch left with none is None. With ``num_classes`` (an
    ImageFolder dataset's, ``path``), a record that is no ``image``/``label`` pair of its
    classes is such a sample (``image_and_label``).
    """

    def __init__(
        self, *, draft_size: tuple[int, int] | None = None, image: str = "image",
        label: str = "label", pin_memory: bool = False, cropper: Cropper | None = None,
        skipped: SkippedImages | None = None, num_classes: int | None = None, path: str = "",
    ) -> None:
        self.num_classes, self.path = num_classes, path
        self.draft_size = draft_size
        self.cropper = cropper
        """Every image cropped to one size (``crop=``): the batch is one tensor."""
        self.image = image
        self.label = label
        self.pin_memory = pin_memory
        """Decode into pinned memory outside workers (``batch_buffer``): the loader pins."""
        self.skipped = skipped

    def __call__(self, samples: Sequence[dict[str, Any]]) -> Any:
        if not samples:
            raise ValueError("ImageBatchDecoder got an empty batch")
        kept: list[dict[str, Any]] = []
        pending: list[PendingImage | PendingCrop] = []
        for sample in samples:  # every header before the buffer: a bomb never allocates
            try:
                pending.append(self._open(sample))
            except DecodeError:
                if self.skipped is None:
                    raise
                self.skipped.record(sample.get(KEY_FIELD))
                continue
            kept.append(sample)
        if not pending:
            return None
        flat = batch_buffer(pixel_bytes(pending), pin=self.pin_memory)
        failed: list[int] = []
        views = decode_views(pending, flat, None if self.skipped is None else failed.append)
        if failed:
            assert self.skipped is not None
            for i in failed:
                self.skipped.record(kept[i].get(KEY_FIELD))
            kept = [s for i, s in enumerate(kept) if i not in failed]
            pending = [p for i, p in enumerate(pending) if i not in failed]
            if not pending:
                return None
        labels = [s[self.label] for s in kept]
        label_batch = (
            torch.tensor(labels, dtype=torch.int64) if all(type(x) is int for x in labels)
            else default_collate(labels)
        )
        first = pending[0].shape
        if all(p.shape == first for p in pending):
            used = len(pending) * first[0] * first[1] * first[2]
            return flat[:used].view(len(pending), *first).permute(0, 3, 1, 2), label_batch
        return views, label_batch

    def _open(self, sample: dict[str, Any]) -> PendingImage | PendingCrop:
        data = (sample[self.image] if self.num_classes is None
                else image_and_label(sample, self.num_classes, self.path)[0])
        return open_pending(data, sample, draft_size=self.draft_size, cropper=self.cropper)


def open_pending(data: bytes | memoryview, sample: Mapping[str, Any], *,
                 draft_size: tuple[int, int] | None, cropper: Cropper | None
                 ) -> PendingImage | PendingCrop:
    """An image of ``sample`` opened for decoding: its crop, drawn from the sample's
    ``__index__``, where ``cropper`` is given, else the whole image (at ``draft_size``)."""
    if cropper is None:
        return open_image(data, draft_size=draft_size, key=sample.get(KEY_FIELD))
    return cropper.open(data, sample[INDEX_FIELD], sample.get(KEY_FIELD))


def _field_image(data: bytes | memoryview, sample: Mapping[str, Any], *, mode: str,
                 draft_size: tuple[int, int] | None, cropper: Cropper | None) -> Any:
    """An image field as ``mode`` gives it: a PIL RGB image, or a uint8 CHW tensor."""
    if cropper is None:
        if mode == "pil":
            return decode_image(data, draft_size=draft_size)
        return decode_tensor(data, draft_size=draft_size)
    pending = cropper.open(data, sample[INDEX_FIELD], sample.get(KEY_FIELD))
    pixels = np.empty(pending.shape, np.uint8)
    pending.decode_into(pixels)
    if mode == "pil":
        from PIL import Image

        return Image.fromarray(pixels)
    return torch.from_numpy(pixels).permute(2, 0, 1)


def _raw_image(data: Any, sample: Mapping[str, Any]) -> Any:
    """An image field of ``decode="raw"``: its bytes."""
    return to_bytes(data)


def field_decoder(
    fields: Fields | Sequence[str],
    *,
    mode: str,
    manifest: Manifest,
    path: str,
    transform: Callable[[Any], Any] | None = None,
    target_transform: Callable[[Any], Any] | None = None,
    draft_size: tuple[int, int] | None = None,
    cropper: Cropper | None = None,
) -> FieldDecoder:
    """The decoder of a dataset built with ``fields=``: image fields per ``mode``
    (``"pil"``: PIL RGB, ``"tensor"``: uint8 CHW, ``"raw"``: bytes), the rest by name.

    With ``cropper`` (``crop=``, ``"pil"`` or ``"tensor"``) every image field the
    built-in decoder decodes is cropped to one size; the fields of one sample draw
    the same box (an image and its mask of one size stay aligned).

    Raises:
        TypeError: ``fields`` is a str or holds something other than names.
        ValueError: a name is no field of the dataset (the message lists its
            fields), the spec is inconsistent, or ``target_transform`` is given
            (there is no single target: use ``Fields(transforms=...)``).
    """
    spec = as_fields(fields)
    if target_transform is not None:
        raise ValueError(
            f"{path}: target_transform applies to ImageFolder (image, label) pairs; with fields= "
            "pass one transform per field: fields=shardio.Fields(names, transforms=(...))"
        )
    unknown = [name for name in spec.names if name not in manifest.fields]
    if unknown:
        raise ValueError(
            f"{path}: no field {unknown[0]!r} in this dataset; its samples have fields "
            f"{list(manifest.fields)} (a field is the part of a file name after the sample "
            "key's first dot: x.seg.png -> 'seg.png')"
        )
    image: ImageDecoder = _raw_image
    if mode in ("pil", "tensor"):
        image = functools.partial(_field_image, mode=mode, draft_size=draft_size,
                                  cropper=cropper)
    together = functools.partial(_tensors_shared, draft_size=draft_size, cropper=cropper)
    options: dict[str, Any] = dict(mode=mode, image=image, path=path, transform=transform,
                                   images=together if mode == "tensor" else None)
    if manifest.classes is not None and "label" in spec.names:
        return ClassFieldDecoder(spec, num_classes=len(manifest.classes), **options)
    return FieldDecoder(spec, **options)


class ClassFieldDecoder(FieldDecoder):
    """``fields=`` naming ``label`` on a dataset with classes: a stored label that does not
    index them is refused (``layout_error``), not handed out as a class."""

    def __init__(self, spec: Fields, *, num_classes: int, **options: Any) -> None:
        super().__init__(spec, **options)
        self.num_classes = num_classes

    def __call__(self, sample: Mapping[str, Any], decoded: Mapping[str, Any] | None = None,
                 ) -> Any:
        label = sample.get("label", 0)  # a missing one is the field decoder's (``missing=``)
        if type(label) is not int or not 0 <= label < self.num_classes:
            raise layout_error(sample, self.num_classes, self.path)
        return super().__call__(sample, decoded)


def _tensors_shared(
    values: list[Any], samples: list[Mapping[str, Any]], *,
    draft_size: tuple[int, int] | None, cropper: Cropper | None,
) -> list[torch.Tensor]:
    """``_field_image``'s tensors of ``values``, views of one shared block.

    Raises:
        DecodeError: an image does not decode, or a value is no bytes (decoded one by one
            then, the field decoder's error names the sample and field).
    """
    try:
        pending = [open_pending(v, s, draft_size=draft_size, cropper=cropper)
                   for v, s in zip(values, samples, strict=True)]
    except TypeError as exc:
        raise DecodeError(f"an image field holds no bytes ({exc})") from exc
    return decode_shared(pending)


def collate_fields(batch: Sequence[Any]) -> Any:
    """Batch the tuples of ``fields=`` position by position, as a user expects.

    Per position: tensors of one shape and dtype → one stacked tensor (in shared
    memory inside a worker); tensors of several shapes → a list of views of one
    buffer; ints → an int64 tensor; anything else (PIL images, strings, dicts,
    arrays, None) → a list. Samples that are not tuples of one length (a
    ``transform`` made something else) go to ``default_collate``, or stay a list
    where it cannot batch them.

    Raises:
        ValueError: ``batch`` is empty.
    """
    if not batch:
        raise ValueError("collate_fields got an empty batch")
    width = len(batch[0]) if isinstance(batch[0], tuple) else -1
    if width < 0 or any(not isinstance(s, tuple) or len(s) != width for s in batch):
        try:
            return default_collate(list(batch))
        except (TypeError, RuntimeError):
            return list(batch)
    return tuple(_collate_column([s[i] for s in batch]) for i in range(width))


def _collate_column(values: list[Any]) -> Any:
    if all(isinstance(v, torch.Tensor) for v in values):
        if len({(v.dtype, v.device, v.requires_grad) for v in values}) != 1 or (
            values[0].device.type != "cpu" or values[0].requires_grad
        ):
            return values  # pack_views copies through numpy: plain CPU tensors of one dtype
        flat, views = pack_views(values)
        first = values[0].shape
        return flat.view(len(values), *first) if all(v.shape == first for v in values) else views
    if all(type(v) is int for v in values):
        return torch.tensor(values, dtype=torch.int64)
    return values
