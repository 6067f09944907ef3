"""Fixed-size crops decoded at the smallest JPEG scale that keeps their detail.

Training reads images of every size but feeds the model one size: torchvision's
``RandomResizedCrop`` (training) and ``Resize`` + ``CenterCrop`` (evaluation) run
after a full-size decode. Here the crop box is chosen from the header's size first,
then libjpeg decodes at the largest 1/2, 1/4 or 1/8 scale at which the box still
covers the output size (Pillow's draft mode), and the box is resized into the
output in one step (``Image.resize(box=)``): a 500x375 photo cropped to 224x224
decodes at full scale, while most boxes of a 1600x1200 photo decode at 1/2 or 1/4.
libjpeg still entropy-decodes every block at any scale, so the saving is the inverse
DCT, the colour conversion and the resize of fewer pixels (docs/decisions.md, "Crops at
decode time"). Every batch then has one shape, decoded straight into the batch's
buffer (``shardio.torch.collate.ImageBatchDecoder``).

The random draws of a sample are a pure function of ``(seed, epoch, __index__)``,
so an epoch's crops do not depend on ``num_workers`` and a resumed epoch sees the
same crops. Box sampling follows torchvision's ``RandomResizedCrop`` (ten tries of
area and log-ratio, then the largest centred box of an allowed ratio); the centre
crop is FFCV's: a centred square of ``ratio`` times the short side. The pixels are
an antialiased bilinear resize of the box, as torchvision computes on PIL images:
Pillow's, or a faster one the dataset hands in (``shardio.torch.resize``, torch's uint8
kernels, within a level or so of Pillow's), which baseline JPEGs then take after a
simplejpeg decode at the chosen scale. A reduced-scale decode differs from a full-scale
one by libjpeg's DCT scaling, not by more than the resize's own smoothing would.
Pure: numpy and Pillow.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from shardio.decode.image import (
    _DECODE_FAILURES,
    _failure_message,
    _simplejpeg,
    open_header,
    pil_backend,
)
from shardio.errors import DecodeError

Box = tuple[float, float, float, float]
"""``(left, top, right, bottom)`` in pixels of the full-size image."""

Resize = Callable[[np.ndarray, Box, np.ndarray, bool], None]
"""Resize ``box`` of ``(H, W, 3)`` uint8 pixels into ``out`` (antialiased bilinear),
mirrored left to right when the last argument is true."""


def _size(size: int | tuple[int, int]) -> tuple[int, int]:
    """``(height, width)`` from an int (square) or a pair, checked positive."""
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(isinstance(v, int) and v >= 1 for v in pair):
        raise ValueError(f"size must be a positive int or (height, width), got {size!r}")
    return int(pair[0]), int(pair[1])


@dataclass(frozen=True)
class RandomResizedCrop:
    """A random box of ``scale`` of the area and ``ratio`` width/height, resized to ``size``.

    ``size`` is ``(height, width)`` or an int for a square; ``flip`` mirrors half
    the crops left to right (``RandomHorizontalFlip``), drawn with the box.
    """

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True

    def __post_init__(self) -> None:
        _size(self.size)
        low, high = self.scale
        if not 0 < low <= high <= 1:
            raise ValueError(f"scale must satisfy 0 < low <= high <= 1, got {self.scale!r}")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"ratio must satisfy 0 < low <= high, got {self.ratio!r}")

    @property
    def output(self) -> tuple[int, int]:
        """``(height, width)`` of every crop."""
        return _size(self.size)

    def box(self, height: int, width: int, rng: np.random.Generator) -> tuple[Box, bool]:
        """The box to cut from a ``height`` x ``width`` image, and whether to mirror it."""
        area = height * width
        log_low, log_high = math.log(self.ratio[0]), math.log(self.ratio[1])
        draws = rng.random(41)  # 10 tries of (area, ratio, left, top), then the flip
        chosen: Box | None = None
        for t in range(10):
            target = area * (self.scale[0] + (self.scale[1] - self.scale[0]) * draws[4 * t])
            aspect = math.exp(log_low + (log_high - log_low) * draws[4 * t + 1])
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                left = math.floor(draws[4 * t + 2] * (width - w + 1))
                top = math.floor(draws[4 * t + 3] * (height - h + 1))
                chosen = (left, top, left + w, top + h)
                break
        if chosen is None:  # no try fitted: the whole image, cut to the nearest allowed ratio
            aspect = width / height
            if aspect < self.ratio[0]:
                w, h = width, round(width / self.ratio[0])
            elif aspect > self.ratio[1]:
                w, h = round(height * self.ratio[1]), height
            else:
                w, h = width, height
            left, top = (width - w) // 2, (height - h) // 2
            chosen = (left, top, left + w, top + h)
        return chosen, bool(self.flip and draws[40] < 0.5)


@dataclass(frozen=True)
class CenterCrop:
    """The centred square of ``ratio`` times the short side, resized to ``size``.

    ``ratio=224/256`` is evaluation's ``Resize(256)`` then ``CenterCrop(224)``.
    """

    size: int | tuple[int, int]
    ratio: float = 224 / 256

    def __post_init__(self) -> None:
        _size(self.size)
        if not 0 < self.ratio <= 1:
            raise ValueError(f"ratio must be in (0, 1], got {self.ratio!r}")

    @property
    def output(self) -> tuple[int, int]:
        """``(height, width)`` of every crop."""
        return _size(self.size)

    def box(self, height: int, width: int, rng: np.random.Generator | None) -> tuple[Box, bool]:
        """The centred box (no randomness, never mirrored)."""
        side = max(1, round(min(height, width) * self.ratio))
        # whole pixels, as torchvision's CenterCrop rounds them
        left, top = round((width - side) / 2), round((height - side) / 2)
        return (left, top, left + side, top + side), False


Crop = RandomResizedCrop | CenterCrop
"""What ``StreamingDataset(crop=...)`` takes."""


class Cropper:
    """A dataset's crop with its seed; the epoch is set as each epoch starts.

    One object is shared by a dataset's decoders in a process, so the per-sample
    and the batch decoders draw the same boxes.
    """

    def __init__(self, crop: Crop, seed: int, resize: Resize | None = None) -> None:
        if not isinstance(crop, (RandomResizedCrop, CenterCrop)):
            raise TypeError(
                f"crop must be shardio.RandomResizedCrop or shardio.CenterCrop, got {crop!r}")
        self.crop = crop
        self.seed = seed
        self.epoch = 0
        self.resize = resize
        """A faster resize than Pillow's (``shardio.torch.resize.resize_box``, torch's uint8
        kernels, about 4x here); with simplejpeg installed, baseline JPEGs then decode
        into an array (at a 1/2, 1/4 or 1/8 scale where the box allows) and go through it.
        Everything else, and everything without it, goes through Pillow."""

    def describe(self) -> str:
        """What decodes and resizes a baseline JPEG's crop here (for benchmark records)."""
        fast = _simplejpeg()
        if self.resize is not None and fast is not None:
            return f"simplejpeg {fast.__version__} at 1/2^k scale, torch resize"
        return f"{pil_backend()} (draft scale)"

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(height, width, 3)`` of every decoded crop."""
        return (*self.crop.output, 3)

    def rng(self, index: int) -> np.random.Generator:
        """The draws of sample ``index`` this epoch."""
        return np.random.default_rng((self.seed, self.epoch, index))

    def open(self, data: bytes | memoryview, index: int, key: str | None = None) -> PendingCrop:
        """Read the header and choose the box; ``decode_into`` does the rest."""
        return PendingCrop(self, data, index, key)


class PendingCrop:
    """One sample's crop, header read and box chosen; pixels on ``decode_into``."""

    def __init__(self, cropper: Cropper, data: bytes | memoryview, index: int,
                 key: str | None) -> None:
        self.shape = cropper.shape
        self.data, self.key = data, key
        self.image = open_header(data, key)
        width, height = self.image.size
        crop = cropper.crop
        if isinstance(crop, RandomResizedCrop):
            self.box, self.flip = crop.box(height, width, cropper.rng(index))
        else:
            self.box, self.flip = crop.box(height, width, None)
        self.full = (width, height)
        self.resize = cropper.resize
        self.denom = 0
        """The fast path's scale, 1/denom (0: Pillow's path)."""
        if (cropper.resize is not None and self.image.format == "JPEG"
                and self.image.mode in ("RGB", "L") and _simplejpeg() is not None):
            self.denom = _denominator(self.box, self.shape)
            # the box's edges on whole pixels of that scale, so the resize cuts exactly
            # this box; it moves by under half a pixel of the decoded scale
            self.box = _snap(self.box, self.denom, self.full)

    def decode_into(self, out: np.ndarray) -> None:
        """Decode at the smallest scale that covers the box, then resize it into ``out``.

        Raises:
            DecodeError: the bytes are not a decodable image.
        """
        out_h, out_w = self.shape[:2]
        left, top, right, bottom = self.box
        # the whole image at the size where the box still covers the output
        want = (min(math.ceil(self.full[0] * out_w / max(right - left, 1e-9)), self.full[0]),
                min(math.ceil(self.full[1] * out_h / max(bottom - top, 1e-9)), self.full[1]))
        if self.denom and self._decode_fast(out):
            return
        try:
            with self.image as img:
                if img.format in ("JPEG", "MPO"):
                    img.draft("RGB", want)
                img.load()
                rgb: Any = img if img.mode == "RGB" else img.convert("RGB")
                sx, sy = rgb.size[0] / self.full[0], rgb.size[1] / self.full[1]
                resized = rgb.resize((out_w, out_h), Image.Resampling.BILINEAR,
                                     box=(left * sx, top * sy, right * sx, bottom * sy))
                if self.flip:
                    resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
                np.copyto(out, np.asarray(resized))
        except _DECODE_FAILURES as exc:
            raise DecodeError(_failure_message(self.data, self.key, exc), key=self.key) from exc

    def _decode_fast(self, out: np.ndarray) -> bool:
        """simplejpeg at scale 1/denom, then ``self.resize``.

        False where libjpeg warns about the data: Pillow's path then decodes it, or
        says what is wrong.
        """
        fast, d = _simplejpeg(), self.denom
        assert fast is not None and self.resize is not None
        try:
            pixels = fast.decode_jpeg(
                self.data, colorspace="RGB", min_width=math.ceil(self.full[0] / d),
                min_height=math.ceil(self.full[1] / d))
        except ValueError:
            return False
        # pixel i of scale 1/d covers pixels [i*d, (i+1)*d) of the full one
        left, top, right, bottom = self.box
        self.resize(pixels, (left / d, top / d, right / d, bottom / d), out, self.flip)
        self.image.close()
        return True


def _denominator(box: Box, shape: tuple[int, int, int]) -> int:
    """The largest of 8, 4, 2 and 1 at which ``box`` still covers the output ``shape``.

    Only the power-of-two scales: libjpeg's others (5/8, 3/4, ...) decode slower than
    the full scale here.
    """
    left, top, right, bottom = box
    d = 8
    while d > 1 and ((right - left) / d < shape[1] or (bottom - top) / d < shape[0]):
        d //= 2
    return d


def _snap(box: Box, d: int, full: tuple[int, int]) -> Box:
    """``box`` with its edges on multiples of ``d``, inside the image, at least ``d`` wide."""
    if d == 1:
        return box
    left = min(round(box[0] / d) * d, (full[0] - 1) // d * d)
    top = min(round(box[1] / d) * d, (full[1] - 1) // d * d)
    right = min(max(round(box[2] / d) * d, left + d), full[0])
    bottom = min(max(round(box[3] / d) * d, top + d), full[1])
    return (left, top, right, bottom)
