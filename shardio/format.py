"""Format v1 on the byte level: constants, struct layouts and record framing.

This module owns every byte layout of docs/format.md and nothing else: it does
no file I/O and imports no other shardio module but ``errors``. A record frame
is the same in every backend, so a frame read from an LMDB value and one read
from a ``.rec`` file are checked and decoded by the same functions here.

Record frame (little-endian)::

    u32 payload_length | u32 crc32 | u8 codec | 3 bytes zero | payload

The CRC-32 (zlib polynomial) covers the frame from byte 8 to the end: the
codec byte, the reserved bytes and the payload as stored.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Final

from shardio.errors import (
    ChecksumError,
    ShardCorruptError,
    TruncatedShardError,
    UnsupportedVersionError,
)

FORMAT_NAME: Final = "shardio"
FORMAT_VERSION: Final = 1
SUPPORTED_VERSIONS: Final = frozenset({1})

CODEC_NONE: Final = 0
CODEC_ZSTD: Final = 1

SHARD_MAGIC: Final = b"SHARDIO\x00"
HEADER = struct.Struct("<8sII")
"""Shard file header: magic, format version, flags (zero in v1)."""

FRAME = struct.Struct("<IIB3x")
"""Record frame header: payload length, crc32 of bytes 8.., codec id."""

FOOTER = struct.Struct("<QQQII8s")
"""Shard file footer: index offset, keys offset, record count, index crc32, version, magic."""

FRAME_SIZE: Final = FRAME.size
HEADER_SIZE: Final = HEADER.size
FOOTER_SIZE: Final = FOOTER.size


@dataclass(frozen=True)
class Footer:
    """The fixed-size tail of a ``.rec`` shard: where its index and key list start."""

    index_offset: int
    keys_offset: int
    num_records: int
    index_crc32: int
    version: int


def frame(payload: bytes, codec: int) -> bytes:
    """Wrap a stored payload in a record frame with its checksum."""
    tail = bytes((codec, 0, 0, 0))
    crc = zlib.crc32(payload, zlib.crc32(tail))
    return FRAME.pack(len(payload), crc, codec) + payload


def unframe(
    buf: bytes | memoryview, *, path: str, record: int, offset: int = 0, verify: bool = True,
    exact: bool = False,
) -> tuple[int, memoryview]:
    """Check one record frame and return ``(codec, stored payload)``.

    ``buf`` starts at the frame and may run past its end (a whole mapped shard
    sliced at ``offset``), unless ``exact``: then it is the record as the
    shard's index delimits it, and a frame length that disagrees is refused
    even with ``verify`` off (a damaged length must not move the payload).
    Raises a ``ShardCorruptError`` naming the file, record index and byte
    offset when the frame is cut short or its checksum does not match.
    """
    view = memoryview(buf)
    if len(view) < FRAME_SIZE:
        raise TruncatedShardError(
            f"{path}: record {record} at byte {offset} is cut short: frame header needs "
            f"{FRAME_SIZE} bytes, found {len(view)}; the shard is truncated, re-pack it",
            path=path, record=record, offset=offset,
        )
    length, crc, codec = FRAME.unpack_from(view)
    end = FRAME_SIZE + length
    if len(view) < end:
        raise TruncatedShardError(
            f"{path}: record {record} at byte {offset} is cut short: expected {length} "
            f"payload bytes, found {len(view) - FRAME_SIZE}; the shard is truncated, re-pack it",
            path=path, record=record, offset=offset,
        )
    if exact and len(view) != end:
        raise ShardCorruptError(
            f"{path}: record {record} at byte {offset} is {len(view)} bytes in the shard's "
            f"index but its frame header says {end}; the shard is corrupt: restore it from a "
            "copy or re-pack",
            path=path, record=record, offset=offset,
        )
    if verify:
        actual = zlib.crc32(view[8:end])
        if actual != crc:
            raise ChecksumError(
                f"{path}: record {record} at byte {offset} fails its checksum "
                f"(stored crc32 {crc:08x}, computed {actual:08x}); the shard is corrupt: "
                f"restore it from a copy or re-pack",
                path=path, record=record, offset=offset,
            )
    if codec not in (CODEC_NONE, CODEC_ZSTD):
        raise ShardCorruptError(
            f"{path}: record {record} at byte {offset} names unknown codec {codec}",
            path=path, record=record, offset=offset,
        )
    return codec, view[FRAME_SIZE:end]


def pack_header() -> bytes:
    """The 16-byte header every ``.rec`` shard starts with."""
    return HEADER.pack(SHARD_MAGIC, FORMAT_VERSION, 0)


def check_header(buf: bytes | memoryview, *, path: str) -> None:
    """Refuse a file that is not a shardio shard of a known version."""
    if len(buf) < HEADER_SIZE:
        raise TruncatedShardError(
            f"{path}: {len(buf)} bytes is too short for a shard header; re-pack it", path=path
        )
    magic, version, flags = HEADER.unpack_from(buf)
    if magic != SHARD_MAGIC:
        raise ShardCorruptError(
            f"{path}: not a shardio shard (magic {magic!r}, expected {SHARD_MAGIC!r})",
            path=path, offset=0,
        )
    _check_version(version, path)
    if flags != 0:
        # v1 defines no flags: a set bit is damage (or a newer writer), never something to skip
        raise ShardCorruptError(
            f"{path}: shard header flags are {flags:#010x}, format v1 writes 0; the header "
            "is damaged: restore the shard from a copy or re-pack",
            path=path, offset=12,
        )


def pack_footer(index_offset: int, keys_offset: int, num_records: int, index_crc: int) -> bytes:
    """The fixed-size footer that ends every ``.rec`` shard."""
    return FOOTER.pack(
        index_offset, keys_offset, num_records, index_crc, FORMAT_VERSION, SHARD_MAGIC
    )


def unpack_footer(buf: bytes | memoryview, *, path: str, size: int | None = None) -> Footer:
    """Parse and sanity-check the footer from the last ``FOOTER_SIZE`` bytes of a shard.

    ``buf`` is the whole shard, or only its last bytes when ``size`` (the whole
    file's) is given: a remote reader fetches the tail alone.
    """
    size = len(buf) if size is None else size
    if size < HEADER_SIZE + FOOTER_SIZE or len(buf) < FOOTER_SIZE:
        raise TruncatedShardError(
            f"{path}: {size} bytes is too short for a shard; it is truncated, re-pack it",
            path=path,
        )
    index_offset, keys_offset, num_records, index_crc, version, magic = FOOTER.unpack_from(
        buf, len(buf) - FOOTER_SIZE
    )
    if magic != SHARD_MAGIC:
        raise TruncatedShardError(
            f"{path}: no shard footer at byte {size - FOOTER_SIZE} (the file is truncated or "
            f"was not finished); re-pack it or run `shardio pack --resume`",
            path=path, offset=size - FOOTER_SIZE,
        )
    _check_version(version, path)
    index_end = index_offset + 8 * (num_records + 1)
    if not HEADER_SIZE <= index_offset <= keys_offset <= size - FOOTER_SIZE or index_end != (
        keys_offset
    ):
        raise ShardCorruptError(
            f"{path}: footer offsets are inconsistent (index at {index_offset}, keys at "
            f"{keys_offset}, {num_records} records, file of {size} bytes)",
            path=path, offset=size - FOOTER_SIZE,
        )
    return Footer(index_offset, keys_offset, num_records, index_crc, version)


def _check_version(version: int, path: str) -> None:
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedVersionError(
            f"{path}: written by shardio format version {version}; this reader supports "
            f"{sorted(SUPPORTED_VERSIONS)}. Upgrade shardio to read it.",
            path=path,
        )
