"""Compression of record payloads, behind a registry keyed by the manifest's codec name.

A dataset names one codec (``"none"`` or ``"zstd"``); each record then says in
its frame whether *it* was compressed, because payloads that are already
compressed (JPEG, PNG, WebP, gzip, zip, …) are stored as they are: zstd gains
under 1% on them and costs a decompression per sample on every epoch.
"""

from __future__ import annotations

import threading
from typing import Final, Protocol

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


def decompress(codec_id: int, stored: bytes | memoryview) -> bytes | memoryview:
    """Undo the compression a frame's codec id names (a no-op for ``CODEC_NONE``)."""
    if codec_id == CODEC_NONE:
        return stored
    return decompressor().decompress(stored)
