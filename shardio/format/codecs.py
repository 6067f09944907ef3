"""Compression of record payloads, behind a registry keyed by the manifest's codec name.

A dataset names one codec (``"none"`` or ``"zstd"``); each record then says in
its frame whether *it* was compressed, because payloads that are already
compressed (JPEG, PNG, WebP, gzip, zip, …) are stored as they are: zstd gains
under 1% on them and costs a decompression per sample on every epoch.
"""

from __future__ import annotations

import threading
import weakref
from typing import ClassVar, Final, Protocol

import numpy as np
import numpy.typing as npt
import zstandard

from shardio.format.frames import CODEC_NONE, CODEC_ZSTD

COMPRESSED_MAGICS: Final[tuple[bytes, ...]] = (
    b"\xff\xd8\xff",  # JPEG
    b"\x89PNG\r\n\x1a\n",
    b"GIF8",
    b"\x1f\x8b",  # gzip
    b"PK\x03\x04",  # zip, npz, docx, jar
    b"\x28\xb5\x2f\xfd",  # zstd
    b"BZh",
    b"\xfd7zXZ\x00",
    b"7z\xbc\xaf\x27\x1c",
    b"\x00\x00\x00\x0cjP  ",  # JPEG 2000
    b"OggS",
    b"fLaC",
    b"ID3",  # mp3
    b"\x1aE\xdf\xa3",  # webm / mkv
)

MIN_ZSTD_LEVEL: Final = -(1 << 17)
"""zstd's fastest level (``ZSTD_minCLevel``); below it the library would clamp silently."""
MAX_ZSTD_LEVEL: Final = zstandard.MAX_COMPRESSION_LEVEL

MIN_SAVING: Final = 0.03
"""A compressed payload is kept only when it is at least this fraction smaller."""


def looks_compressed(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` starts like a format that is already compressed."""
    head = bytes(data[:12])
    if head.startswith(COMPRESSED_MAGICS):
        return True
    if head[:4] == b"RIFF" and head[8:12] in (b"WEBP", b"AVI "):
        return True
    return head[4:8] == b"ftyp"  # mp4, mov, heic, avif


class Codec(Protocol):
    """Compresses payloads for one codec name; ``decompress`` is used on every read."""

    name: str

    def compress(self, payload: bytes) -> tuple[int, bytes]:
        """Return ``(codec id written in the frame, stored bytes)``."""
        ...


class NoneCodec:
    """Stores every payload as it is."""

    name = "none"

    def compress(self, payload: bytes) -> tuple[int, bytes]:
        return CODEC_NONE, payload


class ZstdCodec:
    """zstd at ``level``, keeping the raw payload when compression does not pay."""

    name = "zstd"

    def __init__(self, level: int = 3) -> None:
        # checked here, not at the first compress: a bad level must fail before any work
        if not MIN_ZSTD_LEVEL <= level <= MAX_ZSTD_LEVEL:
            raise ValueError(f"zstd level must be {MIN_ZSTD_LEVEL}..{MAX_ZSTD_LEVEL} (negative: "
                             f"faster and larger; 3 is the default), got {level}")
        self.level = level
        self._local = threading.local()

    def compress(self, payload: bytes) -> tuple[int, bytes]:
        compressor = getattr(self._local, "compressor", None)
        if compressor is None:
            compressor = zstandard.ZstdCompressor(level=self.level, write_content_size=True)
            self._local.compressor = compressor
        packed = compressor.compress(payload)
        if len(packed) <= len(payload) * (1.0 - MIN_SAVING):
            return CODEC_ZSTD, packed
        return CODEC_NONE, payload


CODEC_NAMES: Final = ("none", "zstd")


def get_codec(name: str, level: int = 3) -> Codec:
    """Look up a codec by its manifest name."""
    if name == "none":
        return NoneCodec()
    if name == "zstd":
        return ZstdCodec(level)
    raise ValueError(f"unknown codec {name!r}; expected one of {', '.join(CODEC_NAMES)}")


_decompressors = threading.local()


def decompressor() -> zstandard.ZstdDecompressor:
    """This thread's reusable zstd decompression context."""
    dctx = getattr(_decompressors, "dctx", None)
    if dctx is None:
        dctx = zstandard.ZstdDecompressor()
        _decompressors.dctx = dctx
    return dctx


IDLE_BYTES: Final = 64 << 20
"""Idle inflation buffers kept for reuse in a process, at most about (in bytes)."""
_SMALLEST: Final = 1 << 12


class _Idle:
    """Buffers no view uses any more, by capacity (a power of two)."""

    by_capacity: ClassVar[dict[int, list[npt.NDArray[np.uint8]]]] = {}
    held: ClassVar[int] = 0  # updated without a lock: the bound is approximate


def inflate(stored: bytes | memoryview, size: int) -> memoryview:
    """The zstd frame ``stored`` inflated into a reused buffer: a view of its first bytes,
    ``size`` at most (fewer where the frame holds fewer; the caller checks).

    Inflated into a new ``bytes``, every page of a column is memory fresh from the system,
    which faults on first write: a warm epoch over 10^4 tiny samples (26 MB inflated) took
    6,900 page faults and a fifth of its time in them on this project's 2-core VM. The
    buffer returns to an idle list when the last view made from this one is gone (a
    ``weakref`` on the array behind it), so that later windows and epochs write into pages
    already mapped: 500 faults, and the second epoch of ``python -m benchmarks.bench_warm``
    on the tiny tree faster by what they cost (``benchmarks/results/warm.json``).
    Lock-free (list operations are atomic under the interpreter's lock), so a buffer given
    back by the garbage collector in any thread, or in a forked child, is safe.

    Raises:
        zstandard.ZstdError: the frame is damaged or holds more than ``size`` bytes.
    """
    capacity = max(_SMALLEST, 1 << (max(size, 1) - 1).bit_length())
    idle = _Idle.by_capacity.get(capacity)
    try:
        buffer = idle.pop() if idle else None
    except IndexError:  # another thread took the last one
        buffer = None
    if buffer is None:
        buffer = np.empty(capacity, np.uint8)
    else:
        _Idle.held -= capacity
    view = buffer[:size]
    weakref.finalize(view, _give_back, buffer).atexit = False
    out = memoryview(view.data)
    filled = 0
    with decompressor().stream_reader(stored, read_size=max(len(stored), 1)) as reader:
        while filled < size:
            got = reader.readinto(out[filled:])
            if not got:
                break
            filled += got
        if filled == size and reader.readinto(bytearray(1)):
            raise zstandard.ZstdError(f"the frame holds more than {size} bytes")
    return out[:filled] if filled < size else out


def _give_back(buffer: npt.NDArray[np.uint8]) -> None:
    if _Idle.held + buffer.nbytes <= IDLE_BYTES:
        _Idle.held += buffer.nbytes
        _Idle.by_capacity.setdefault(buffer.nbytes, []).append(buffer)


def decompress(codec_id: int, stored: bytes | memoryview) -> bytes | memoryview:
    """Undo the compression a frame's codec id names (a no-op for ``CODEC_NONE``)."""
    if codec_id == CODEC_NONE:
        return stored
    return decompressor().decompress(stored)
