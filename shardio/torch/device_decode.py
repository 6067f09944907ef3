"""Raw batches decoded on the GPU: nvJPEG (through torchvision) and the crop resized there.

With many loader workers the CPU's JPEG decode is the ceiling of a training input
pipeline (``benchmarks/bench_gpu.py`` measures it as the *decode limit*); the GPU's
JPEG decoder passes it several times over. ``DeviceDecoder`` takes a ``RecordBatch``
of encoded images, as ``shardio.loader`` yields for ``decode="raw"``, and returns
one uint8 ``(B, 3, H, W)`` tensor on the device and the labels there too.

The crop is the dataset's (``shardio.RandomResizedCrop``, ``shardio.CenterCrop``),
drawn from ``(seed, epoch, __index__)`` as ``StreamingDataset(crop=...)`` draws it,
so a sample gets the same box whichever side decodes it; the box is cut from the
full-size image and resized with an antialiased bilinear filter (torch's
``interpolate(antialias=True)``), as torchvision resizes tensors.

Only what nvJPEG decodes goes to the GPU: baseline and progressive JPEGs with one or
three components, ending with their end-of-image marker. Everything else (PNG, CMYK
JPEGs, lossless and arithmetic-coded JPEGs, files cut short), and any image nvJPEG
refuses, is decoded by shardio's CPU decoder and copied over, so a batch never fails
for one odd file; bytes neither decodes raise ``DecodeError`` naming the sample.
On the CPU (``"cpu"`` or ``device=None``), or without torchvision (the ``gpu``
extra), the whole batch takes the CPU path: the same pixels
``StreamingDataset(decode="tensor", crop=...)`` gives. ``"cuda"`` where CUDA is not
available raises, as torch does. Imports torch.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Sequence
from types import ModuleType

import numpy as np
import torch
import torch.nn.functional as F

from shardio.decode.crop import CenterCrop, Crop, Cropper, RandomResizedCrop
from shardio.decode.image import check_pixels, open_image
from shardio.errors import DecodeError
from shardio.format.record import INDEX_FIELD, KEY_FIELD
from shardio.reading.batch import RecordBatch
from shardio.torch.collate import ImageBatchDecoder
from shardio.torch.prefetch import resolve_device
from shardio.torch.resize import resize_box

_GPU_SOF = frozenset((0xC0, 0xC1, 0xC2))
"""Start-of-frame markers nvJPEG decodes: baseline, extended and progressive Huffman."""


@functools.cache
def _torchvision_io() -> ModuleType | None:
    try:
        return importlib.import_module("torchvision.io")
    except Exception:  # absent, or built for another torch (its C ops fail to load)
        return None


def jpeg_components(data: bytes | memoryview) -> int | None:
    """The component count of a JPEG nvJPEG can decode (1 or 3), else None.

    Walks the markers up to the frame header: None for anything that is not a
    JPEG, is cut before its frame header, or is coded in a way nvJPEG does not
    take (lossless, arithmetic, hierarchical), or has 2 or 4 components (CMYK).
    None too for a JPEG that does not end with its end-of-image marker: a file
    cut short, which libjpeg refuses (a ``DecodeError`` naming the sample) and
    nvJPEG might decode with its missing part filled in; a JPEG followed by
    other bytes decodes on the CPU.
    """
    frame = jpeg_frame(data)
    return None if frame is None else frame[0]


def jpeg_frame(data: bytes | memoryview) -> tuple[int, int, int] | None:
    """``(components, height, width)`` of a JPEG nvJPEG can decode, else None (see
    ``jpeg_components``)."""
    view = memoryview(data)
    if len(view) < 4 or view[0] != 0xFF or view[1] != 0xD8 or (
            view[-2] != 0xFF or view[-1] != 0xD9):
        return None
    at, end = 2, len(view)
    while at + 4 <= end:
        if view[at] != 0xFF:
            return None
        marker = view[at + 1]
        if marker == 0xFF:  # fill byte before a marker
            at += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            at += 2
            continue
        length = view[at + 2] << 8 | view[at + 3]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if marker not in _GPU_SOF or at + 10 > end:
                return None
            components = int(view[at + 9])
            height, width = view[at + 5] << 8 | view[at + 6], view[at + 7] << 8 | view[at + 8]
            return (components, height, width) if components in (1, 3) else None
        if marker in (0xD9, 0xDA) or length < 2:  # image data before any frame header
            return None
        at += 2 + length
    return None


class DeviceDecoder:
    """Decode a raw batch's images on ``device`` (nvJPEG), cropped to one size if asked.

    ``decoder(batch, epoch=e)`` returns ``(images, labels)``: ``images`` one uint8
    ``(B, 3, H, W)`` tensor on ``self.device`` (with ``crop``, or when every image
    has one size; else a list of ``(3, H, W)`` tensors), ``labels`` the ``label``
    field as an int64 tensor there (None when the batch has none). Pass the epoch
    being read (``shardio.loader``'s ``loader.epoch``) so that random crops differ
    between epochs and match what ``StreamingDataset(crop=..., seed=...)`` draws.

    ``self.device`` is where batches land: the CPU for ``"cpu"`` or ``device=None``.
    ``self.gpu`` says whether nvJPEG decodes (a CUDA device and torchvision).
    ``DevicePrefetcher(loader, device, decode=decoder)`` calls it one batch ahead
    with the loader's epoch.
    """

    def __init__(
        self,
        device: str | torch.device | None = "cuda",
        *,
        crop: Crop | None = None,
        seed: int = 0,
        image: str = "image",
        label: str = "label",
    ) -> None:
        """Choose the device, the crop and the fields.

        Args:
            device: where the decoded batch goes; ``"cpu"`` or None decodes on the CPU.
            crop: every image cropped and resized to one size (None: full images).
            seed: the seed of the random crops: the dataset's, for the same boxes.
            image: the field holding the encoded images.
            label: the int field returned as labels.

        Raises:
            RuntimeError: ``device`` is a CUDA device but CUDA is not available.
            TypeError: ``crop`` is not a ``RandomResizedCrop`` or ``CenterCrop``.
        """
        if crop is not None and not isinstance(crop, (RandomResizedCrop, CenterCrop)):
            raise TypeError(
                f"crop must be shardio.RandomResizedCrop or shardio.CenterCrop, got {crop!r}")
        self.device = resolve_device(device)
        self.crop = crop
        self.seed = seed
        self.image, self.label = image, label
        self._io = _torchvision_io() if self.device.type == "cuda" else None
        self._cropper = None if crop is None else Cropper(crop, seed, resize=resize_box)
        self._cpu = ImageBatchDecoder(image=image, label=label, cropper=self._cropper)

    @property
    def needs_epoch(self) -> bool:
        """Whether the crops depend on the epoch (random ones)."""
        return isinstance(self.crop, RandomResizedCrop)

    @property
    def gpu(self) -> bool:
        """Whether JPEGs are decoded on the GPU here."""
        return self._io is not None

    def describe(self) -> str:
        """What decodes here, for logs and benchmark records."""
        if self._io is not None:
            version = getattr(importlib.import_module("torchvision"), "__version__", "?")
            return f"nvjpeg (torchvision {version})"
        if self.device.type == "cuda":
            return "CPU (shardio's decoder; torchvision, the gpu extra, is missing or broken)"
        return f"CPU (shardio's decoder, to {self.device})"

    def __call__(self, batch: RecordBatch, *, epoch: int = 0
                 ) -> tuple[torch.Tensor | list[torch.Tensor], torch.Tensor | None]:
        """``(images, labels)`` of ``batch`` on ``self.device``.

        Raises:
            DecodeError: a sample lacks the image field, or its bytes are no image.
            KeyError: the batch has no such image field.
            ValueError: the batch is empty.
        """
        if len(batch) == 0:
            raise ValueError("DeviceDecoder got an empty batch")
        if self.image not in batch.offsets:
            raise KeyError(f"the batch has no bytes field {self.image!r} "
                           f"(its fields: {batch.fields}); pass image= naming it")
        datas = batch.bytes(self.image)
        keys = batch.keys
        for data, key in zip(datas, keys, strict=True):
            if data is None:
                raise DecodeError(f"sample {key!r} has no {self.image!r} field to decode",
                                  key=key)
        present: list[bytes | memoryview] = [d for d in datas if d is not None]
        labels = self._labels(batch)
        if self._io is None:
            return self._decode_cpu(batch, present, epoch), labels
        return self._decode_gpu(present, keys, batch.indices, epoch), labels

    def _labels(self, batch: RecordBatch) -> torch.Tensor | None:
        column = batch.values.get(self.label)
        if not isinstance(column, np.ndarray):
            return None
        return torch.from_numpy(column).to(self.device, non_blocking=True)

    def _decode_cpu(self, batch: RecordBatch, datas: Sequence[bytes | memoryview], epoch: int
                    ) -> torch.Tensor | list[torch.Tensor]:
        if self._cropper is not None:
            self._cropper.epoch = epoch
        samples = [{self.image: data, INDEX_FIELD: int(index), KEY_FIELD: key, self.label: 0}
                   for data, index, key in zip(datas, batch.indices.tolist(), batch.keys,
                                               strict=True)]
        images: torch.Tensor | list[torch.Tensor] = self._cpu(samples)[0]
        if isinstance(images, list):
            return [image.to(self.device) for image in images]
        return images.to(self.device)

    def _decode_gpu(self, datas: Sequence[bytes | memoryview], keys: Sequence[str],
                    indices: np.ndarray, epoch: int) -> torch.Tensor | list[torch.Tensor]:
        decoded = self._nvjpeg(datas, keys)
        if self.crop is None:
            first = decoded[0].shape
            if all(image.shape == first for image in decoded):
                return torch.stack(decoded)
            return decoded
        size = self.crop.output
        # every crop resized into one float batch, then rounded, cast and mirrored once:
        # each op is a kernel launch from this process, which bounds the batch's rate
        scaled = torch.empty((len(decoded), 3, *size), dtype=torch.float32, device=self.device)
        flips = []
        for i, (image, index) in enumerate(zip(decoded, indices.tolist(), strict=True)):
            rng = np.random.default_rng((self.seed, epoch, index))
            box, flip = self.crop.box(int(image.shape[1]), int(image.shape[2]), rng)
            scaled[i] = _resized(image, box, size)
            if flip:
                flips.append(i)
        out = scaled.round_().clamp_(0, 255).to(torch.uint8)
        if flips:
            mirrored = torch.tensor(flips, device=self.device)
            out[mirrored] = out[mirrored].flip(-1)
        return out

    def _nvjpeg(self, datas: Sequence[bytes | memoryview], keys: Sequence[str]
                ) -> list[torch.Tensor]:
        """Each image as ``(3, H, W)`` uint8 on the device: nvJPEG where it decodes, else CPU."""
        io = self._io
        assert io is not None
        decoded: list[torch.Tensor | None] = [None] * len(datas)
        gpu = []
        for i, data in enumerate(datas):
            frame = jpeg_frame(data)
            if frame is not None:  # nvJPEG allocates what the header claims: the one limit
                check_pixels(frame[2], frame[1], data, keys[i])
                gpu.append(i)
        with warnings.catch_warnings():
            # views of read-only shard maps and shared memory: decode_jpeg only reads them
            warnings.filterwarnings("ignore", message="The given buffer is not writable")
            encoded = [torch.frombuffer(datas[i], dtype=torch.uint8) for i in gpu]
        if encoded:
            try:
                got = io.decode_jpeg(encoded, mode=io.ImageReadMode.RGB, device=self.device)
            except RuntimeError:  # one bad image fails the call: find it one by one
                got = [self._one(io, tensor) for tensor in encoded]
            for i, image in zip(gpu, got, strict=True):
                decoded[i] = image
        for i, image in enumerate(decoded):
            if image is None:
                decoded[i] = self._on_cpu(datas[i], keys[i])
        return [image for image in decoded if image is not None]

    def _one(self, io: ModuleType, tensor: torch.Tensor) -> torch.Tensor | None:
        try:
            image: torch.Tensor = io.decode_jpeg(tensor, mode=io.ImageReadMode.RGB,
                                                 device=self.device)
            return image
        except RuntimeError:
            return None

    def _on_cpu(self, data: bytes | memoryview, key: str) -> torch.Tensor:
        pending = open_image(data, key=key)
        pixels = np.empty(pending.shape, np.uint8)
        pending.decode_into(pixels)
        return torch.from_numpy(pixels).permute(2, 0, 1).to(self.device)


def resize_on_device(image: torch.Tensor, box: tuple[float, float, float, float],
                     size: tuple[int, int], flip: bool) -> torch.Tensor:
    """``box`` of a ``(3, H, W)`` uint8 image resized to ``size`` (antialiased bilinear).

    The box's edges are rounded to whole pixels, as ``shardio.torch.resize.resize_box``
    rounds them; torch's CUDA kernels resize float images, so the result is
    rounded back to uint8.
    """
    out = _resized(image, box, size)
    if out.is_floating_point():
        out = out.round_().clamp_(0, 255).to(torch.uint8)
    return out.flip(-1) if flip else out


def _resized(image: torch.Tensor, box: tuple[float, float, float, float],
             size: tuple[int, int]) -> torch.Tensor:
    """``box`` of ``image`` at ``size``: the cut itself where it has that size, else its
    float resize (not rounded: a batch rounds all its crops at once)."""
    cut = _cut(image, box)
    if tuple(cut.shape[1:]) == size:
        return cut
    return F.interpolate(cut.unsqueeze(0).float(), size=size, mode="bilinear",
                         antialias=True, align_corners=False)[0]


def _cut(image: torch.Tensor, box: tuple[float, float, float, float]) -> torch.Tensor:
    """The view of ``box`` in a ``(3, H, W)`` image, its edges rounded to whole pixels."""
    height, width = int(image.shape[1]), int(image.shape[2])
    left = min(max(round(box[0]), 0), width - 1)
    top = min(max(round(box[1]), 0), height - 1)
    right = min(max(round(box[2]), left + 1), width)
    bottom = min(max(round(box[3]), top + 1), height)
    return image[:, top:bottom, left:right]
