"""Image bytes → pixels with Pillow (or pillow-simd): the one place shardio decodes images.

``decode_image`` decodes like torchvision's ``pil_loader`` (``Image.open`` then
``convert("RGB")``), so an ImageFolder pack yields the same pixels as the
original files; it can ask libjpeg for a reduced-size decode (JPEG draft mode)
when the transform will downscale anyway. ``image_to_array`` exposes the
pixels as a uint8 HWC numpy array. ``pil_backend`` says which imaging library
is doing the work. ``open_image`` splits a decode in two, the size from the
header first and then the pixels written straight into memory the caller
chose (a batch buffer): with ``simplejpeg`` installed (the ``jpeg`` extra)
baseline JPEGs are decoded by it, into that memory, with the same pixels as
Pillow's (both are libjpeg-turbo with the same settings; docs/decisions.md, "JPEG
decoding"); everything else goes through Pillow. Every
header read on any path (Pillow's, simplejpeg's, the GPU's frame walk in
``shardio.torch.device_decode``) goes through ``check_pixels`` before a pixel is
allocated, so one limit (``max_image_pixels``) holds everywhere. This module
must not import torch: the torch-side wrappers live in ``shardio.torch.collate``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import io
import os
import re
import struct
from types import ModuleType
from typing import Protocol

import numpy as np
import PIL
from PIL import Image

from shardio.errors import DecodeError

_DECODE_FAILURES = (
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    IndexError,
    struct.error,
    Image.DecompressionBombError,
)
"""What Pillow raises on bytes it cannot decode (``UnidentifiedImageError`` is an ``OSError``)."""


@functools.cache
def pil_backend() -> str:
    """Name and version of the library that provides ``PIL``: pillow-simd or Pillow.

    Both install the same ``PIL`` package, so the name is read from the
    installed distribution whose version matches ``PIL.__version__`` (the one
    whose files are on disk when one was installed over the other). Without
    metadata, pillow-simd is recognised by the ``.postN`` suffix it adds to
    Pillow's version.

    Returns:
        ``"pillow-simd <version>"`` or ``"Pillow <version>"``.
    """
    version = PIL.__version__
    providers = importlib.metadata.packages_distributions().get("PIL", [])
    matching = set()
    for name in providers:
        try:
            if importlib.metadata.version(name) == version:
                matching.add(name.lower().replace("_", "-"))
        except importlib.metadata.PackageNotFoundError:
            continue
    simd = "pillow-simd" in matching if matching else ".post" in version
    return f"{'pillow-simd' if simd else 'Pillow'} {version}"


def decode_image(
    data: bytes | memoryview,
    *,
    mode: str = "RGB",
    draft_size: tuple[int, int] | None = None,
    key: str | None = None,
) -> Image.Image:
    """Decode one encoded image into a fully loaded Pillow image of ``mode``.

    The pixels equal ``Image.open(f).convert(mode)`` (torchvision's
    ``pil_loader``), except that an image already in ``mode`` is not copied.

    Args:
        data: the encoded file's bytes (JPEG, PNG, WebP, … anything Pillow reads).
        mode: Pillow mode of the result.
        draft_size: ``(width, height)`` the transform will shrink the image to
            at least. For JPEG, libjpeg then decodes at the largest 1/2, 1/4
            or 1/8 scale that stays at or above this size in both sides (Pillow's
            draft mode), which is several times faster. Other formats ignore it.
            Leave it unset when a transform may crop a small region and enlarge
            it (``RandomResizedCrop``): draft discards detail such crops need.
        key: the sample's key, named in the error if decoding fails.

    Returns:
        A loaded image that holds no file handle.

    Raises:
        DecodeError: ``data`` is not an image Pillow can decode, or is truncated.
        ValueError: ``draft_size`` is not two positive integers.
    """
    if draft_size is not None and (len(draft_size) != 2 or min(draft_size) < 1):
        raise ValueError(f"draft_size must be (width, height) of positive ints, got {draft_size!r}")
    image = open_header(data, key)
    try:
        with image as img:
            if draft_size is not None and img.format in ("JPEG", "MPO"):
                img.draft(mode, draft_size)
            img.load()
            return img if img.mode == mode else img.convert(mode)
    except _DECODE_FAILURES as exc:
        raise DecodeError(_failure_message(data, key, exc), key=key) from exc


def max_image_pixels() -> int | None:
    """The most pixels (width x height) shardio decodes one image into; None: no limit.

    Pillow's ``PIL.Image.MAX_IMAGE_PIXELS`` as it is at the call, so one setting
    governs Pillow and every shardio decoder alike: raise it (or set None) where the
    DataLoader workers import PIL, e.g. at the top of the training script.
    """
    return Image.MAX_IMAGE_PIXELS


def check_pixels(width: int, height: int, data: bytes | memoryview, key: str | None) -> None:
    """Refuse an image whose header claims more than ``max_image_pixels()``.

    Called by every decode path right after its header is read and before any
    pixel memory is allocated: a file of a few hundred bytes can claim 65535 x 65535
    pixels, 12.9 GB decoded.

    Raises:
        DecodeError: the header claims more pixels than the limit.
    """
    limit = max_image_pixels()
    if limit is not None and width * height > limit:
        raise DecodeError(_too_large(data, key, f"{width}x{height} ({width * height:,} pixels)"),
                          key=key)


def open_header(data: bytes | memoryview, key: str | None) -> Image.Image:
    """``Image.open`` of ``data``: its header read and checked (``check_pixels``), no
    pixels decoded yet.

    Raises:
        DecodeError: the header is not one Pillow reads, or claims too many pixels.
    """
    try:
        image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:  # Pillow's own refusal, past twice the limit
        pixels = re.search(r"(\d+) pixels", str(exc))
        claimed = f"{int(pixels[1]):,} pixels" if pixels else "too many pixels"
        raise DecodeError(_too_large(data, key, claimed), key=key) from exc
    except _DECODE_FAILURES as exc:
        raise DecodeError(_failure_message(data, key, exc), key=key) from exc
    width, height = image.size
    try:
        check_pixels(width, height, data, key)
    except DecodeError:
        image.close()
        raise
    return image


def image_to_array(img: Image.Image) -> np.ndarray:
    """The pixels of ``img`` as a read-only uint8 array, HWC (or HW for one-band modes).

    Pillow packs its pixels into one new buffer and numpy wraps that buffer
    without copying it again; copy the array before writing to it.

    Raises:
        ValueError: ``img`` is not an 8-bit mode (``I;16``, ``I``, ``F``).
    """
    arr = np.asarray(img)
    if arr.dtype != np.uint8:
        raise ValueError(
            f"image_to_array wants an 8-bit image, got mode {img.mode!r} ({arr.dtype}); "
            "decode with mode='RGB' or 'L'"
        )
    return arr


def _too_large(data: bytes | memoryview, key: str | None, claimed: str) -> str:
    where = f"sample {key!r}" if key is not None else "image bytes"
    return (
        f"{where}: the image header ({len(data)} bytes of file) claims {claimed}, more than "
        f"the {max_image_pixels():,} pixels one image may have; nothing was decoded. For a "
        "genuine image this large raise PIL.Image.MAX_IMAGE_PIXELS (None: no limit) where "
        "the DataLoader workers import PIL; a small file claiming it is damaged or hostile - "
        "repack without it"
    )


def _failure_message(data: bytes | memoryview, key: str | None, exc: BaseException) -> str:
    where = f"sample {key!r}" if key is not None else "image bytes"
    head = bytes(data[:8])
    return (
        f"{where}: cannot decode {len(data)} bytes starting {head!r} as an image ({exc}); "
        "the stored field is not an image Pillow can read - repack from the original file, "
        "or read it with decode='raw' to inspect it"
    )


JPEG_DECODER_ENV = "SHARDIO_JPEG_DECODER"
"""``pillow`` makes ``open_image`` decode every JPEG with Pillow even where simplejpeg is
installed (to compare the two; the pixels are the same)."""


@functools.cache
def _simplejpeg() -> ModuleType | None:
    if os.environ.get(JPEG_DECODER_ENV, "").lower() == "pillow":
        return None
    try:
        return importlib.import_module("simplejpeg")
    except ImportError:
        return None


def jpeg_decoder() -> str:
    """Name and version of what decodes baseline JPEGs in ``open_image``."""
    fast = _simplejpeg()
    return f"simplejpeg {fast.__version__}" if fast is not None else pil_backend()


class PendingImage(Protocol):
    """An image whose header was read: its RGB shape is known, its pixels not yet decoded."""

    shape: tuple[int, int, int]
    """``(height, width, 3)``."""

    def decode_into(self, out: np.ndarray) -> None:
        """Decode the pixels into ``out``, a writable C-contiguous uint8 array of ``shape``.

        Raises:
            DecodeError: the bytes past the header are not a decodable image.
        """


def open_image(
    data: bytes | memoryview,
    *,
    draft_size: tuple[int, int] | None = None,
    key: str | None = None,
) -> PendingImage:
    """Read an encoded image's header; decode its RGB pixels later into memory of your choice.

    The pixels are those of ``decode_image(data, mode="RGB", draft_size=...)``.
    Baseline YCbCr and grayscale JPEGs without ``draft_size`` are decoded by
    simplejpeg when it is installed (straight into ``out``, about 1.3x faster
    here); anything it refuses, and every other format, by Pillow.

    Raises:
        DecodeError: the header is not one of an image Pillow can read, or claims more
            pixels than ``max_image_pixels()``.
        ValueError: ``draft_size`` is not two positive integers.
    """
    fast = _simplejpeg() if draft_size is None else None
    if fast is not None and bytes(data[:2]) == b"\xff\xd8":
        try:
            height, width, colorspace, _sub = fast.decode_jpeg_header(data)
        except ValueError:
            colorspace = None
        if colorspace in ("YCbCr", "Gray"):
            check_pixels(int(width), int(height), data, key)
            return _FastJpeg(fast, data, (int(height), int(width), 3), key)
    return _PilImage(data, draft_size, key)


def decode_array(
    data: bytes | memoryview, *, draft_size: tuple[int, int] | None = None,
    key: str | None = None,
) -> np.ndarray:
    """The RGB pixels of an encoded image as a uint8 HWC array with a buffer of its own.

    The pixels are ``decode_image(data, mode="RGB", draft_size=...)``'s, decoded as
    ``open_image`` decodes them: straight into a new array by simplejpeg where it
    applies, else Pillow's pixels in the one buffer it packs them into (read-only, as
    ``image_to_array`` says; nothing else references it, so a copy is not needed to
    write to it).

    Raises:
        DecodeError: ``data`` is not an image Pillow can decode, or is truncated.
        ValueError: ``draft_size`` is not two positive integers.
    """
    pending = open_image(data, draft_size=draft_size, key=key)
    if isinstance(pending, _PilImage):
        return pending.array()
    out = np.empty(pending.shape, np.uint8)
    pending.decode_into(out)
    return out


class _FastJpeg:
    def __init__(
        self, fast: ModuleType, data: bytes | memoryview, shape: tuple[int, int, int],
        key: str | None,
    ) -> None:
        self.fast, self.data, self.shape, self.key = fast, data, shape, key

    def decode_into(self, out: np.ndarray) -> None:
        try:
            self.fast.decode_jpeg(self.data, colorspace="RGB", buffer=out)
            return
        except ValueError:  # libjpeg's warnings are errors here (strict): ask Pillow, once
            pass
        slow = _PilImage(self.data, None, self.key)
        if slow.shape != self.shape:
            raise DecodeError(
                _failure_message(self.data, self.key, ValueError(
                    f"the JPEG header says {self.shape[1]}x{self.shape[0]}, Pillow reads "
                    f"{slow.shape[1]}x{slow.shape[0]}")), key=self.key)
        slow.decode_into(out)


class _PilImage:
    def __init__(
        self, data: bytes | memoryview, draft_size: tuple[int, int] | None, key: str | None
    ) -> None:
        if draft_size is not None and (len(draft_size) != 2 or min(draft_size) < 1):
            raise ValueError(
                f"draft_size must be (width, height) of positive ints, got {draft_size!r}"
            )
        self.data, self.key = data, key
        self.image = open_header(data, key)
        try:
            if draft_size is not None and self.image.format in ("JPEG", "MPO"):
                self.image.draft("RGB", draft_size)
        except _DECODE_FAILURES as exc:
            raise DecodeError(_failure_message(data, key, exc), key=key) from exc
        width, height = self.image.size
        self.shape = (height, width, 3)

    def decode_into(self, out: np.ndarray) -> None:
        np.copyto(out, self.array())

    def array(self) -> np.ndarray:
        """The RGB pixels in the buffer Pillow packs them into (read-only)."""
        try:
            with self.image as img:
                img.load()
                rgb = img if img.mode == "RGB" else img.convert("RGB")
                return np.asarray(rgb)
        except _DECODE_FAILURES as exc:
            raise DecodeError(_failure_message(self.data, self.key, exc), key=self.key) from exc
