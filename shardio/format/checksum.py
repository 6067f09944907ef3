"""Record checksums by name: ``crc32`` (format v1) and ``crc32c`` (format v2).

A shard names its checksum in its header and footer (``shardio.format.frames``), the
manifest in the prefix of each shard's file checksum (``"crc32c:1a2b3c4d"``),
and every record frame by a one-byte id. Readers and writers look the function
up here by that name or id, so no other module calls a checksum library.

Both are 32-bit CRCs and both *continue*: ``compute(b, compute(a)) ==
compute(a + b)``. A v2 ``.rec`` shard uses that to check any run of
consecutive records with one call (``shardio.format.frames.check_run``).

Why CRC-32C (docs/decisions.md, "Record checksums"):
on this project's machine it runs at 15-18 GB/s from memory against 7 GB/s for
zlib's CRC-32; xxh3-64 is faster still per byte (27-29 GB/s) but cannot be
continued from a previous value, so a run would cost one call per record.
The ``crc32c`` package is used because it takes any buffer (``google-crc32c``
takes only ``bytes``, which would copy every mapped record first). Imports
nothing from shardio.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Final

import crc32c as _crc32c

Checksum = Callable[[bytes | memoryview, int], int]
"""``f(data, value)``: the checksum of ``data`` continued from ``value`` (0 to start)."""

CRC32: Final = "crc32"
CRC32C: Final = "crc32c"
DEFAULT: Final = CRC32C
"""What the writer uses: the checksum of format v2."""

_FUNCTIONS: Final[dict[str, Checksum]] = {CRC32: zlib.crc32, CRC32C: _crc32c.crc32c}
IDS: Final[dict[str, int]] = {CRC32: 0, CRC32C: 1}
"""A frame's checksum id (its byte 9) for each name; v1 frames hold 0 there."""
NAMES: Final[tuple[str, ...]] = (CRC32, CRC32C)
"""Names by id."""
NAME_BYTES: Final = 8
"""Bytes a name takes in a shard header and footer (ASCII, NUL-padded)."""


def checksum_function(name: str) -> Checksum:
    """The continuing checksum function called ``name``.

    Raises:
        ValueError: ``name`` is not a known checksum (the message lists the known ones).
    """
    try:
        return _FUNCTIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown checksum {name!r}; this shardio knows {', '.join(NAMES)}"
        ) from None


def compute(name: str, data: bytes | memoryview, value: int = 0) -> int:
    """Checksum ``name`` of ``data``, continued from ``value``."""
    return checksum_function(name)(data, value)


def digest(name: str, value: int) -> str:
    """The manifest's form of a whole-file checksum: ``"<name>:<8 lowercase hex digits>"``."""
    return f"{name}:{value:08x}"


def name_of(text: str) -> str:
    """The checksum a ``"<name>:<hex>"`` file checksum names (``crc32`` if it names none known:
    a comparison with it then fails, and its message shows both)."""
    name = text.partition(":")[0]
    return name if name in _FUNCTIONS else CRC32


def encode_name(name: str) -> bytes:
    """``name`` as the 8 bytes a shard header and footer store."""
    checksum_function(name)
    return name.encode("ascii").ljust(NAME_BYTES, b"\0")


def decode_name(raw: bytes) -> str | None:
    """The known name stored in 8 header or footer bytes, or None if they name none."""
    name = raw.rstrip(b"\0").decode("ascii", errors="replace")
    return name if name in _FUNCTIONS and encode_name(name) == raw else None
