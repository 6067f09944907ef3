"""The ``records`` backend: one flat ``.rec`` file per shard.

Layout (docs/format.md): a 16-byte header, the framed records back to back,
an index of ``num_records + 1`` little-endian u64 offsets (record ``i`` spans
``offsets[i]:offsets[i+1]``), the keys as one msgpack array of str, and a
fixed footer that says where the index and keys start. A reader maps the file
once and slices records out of the map: no syscall per record.
"""

from __future__ import annotations

import functools
import mmap
import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import msgpack
import numpy as np

from shardio.backends import pack_keys
from shardio.errors import ChecksumError, ShardCorruptError, ShardMissingError
from shardio.format import (
    FOOTER_SIZE,
    FRAME,
    HEADER_SIZE,
    check_header,
    pack_footer,
    pack_header,
    unpack_footer,
)

WRITE_BUFFER_BYTES = 1 << 20
"""Large enough that writes are few; small enough that glibc does not map (and the kernel
zero) a fresh buffer for every shard, which cost pack about 3 ms of CPU per shard at 8 MB."""
COMBINE_MIN_BYTES = 16 << 10
"""Frames at least this large extend the file CRC by combining, not by a second pass."""


@functools.cache
def _crc32_combine() -> Callable[[int, int, int], int] | None:
    """zlib's ``crc32_combine`` through ctypes, checked once; None where it cannot be used."""
    import ctypes  # only writers of large records need it
    import ctypes.util

    try:
        combine = ctypes.CDLL(ctypes.util.find_library("z") or "libz.so.1").crc32_combine
    except (OSError, AttributeError):
        return None
    combine.restype = ctypes.c_ulong
    combine.argtypes = (ctypes.c_ulong, ctypes.c_ulong, ctypes.c_long)
    head, tail = b"shardio", bytes(range(256)) * 3
    if combine(zlib.crc32(head), zlib.crc32(tail), len(tail)) != zlib.crc32(head + tail):
        return None
    return combine


def crc32_after_frame(crc: int, framed: bytes) -> int:
    """``zlib.crc32(framed, crc)``, without reading a large frame's payload a second time.

    A frame stores the CRC-32 of its bytes 8.. (``shardio.format``), so the
    running CRC of a file is extended by the frame's 8-byte head and then
    combined with that stored CRC, in O(log n) instead of a pass over the payload.
    """
    combine = _crc32_combine() if len(framed) >= COMBINE_MIN_BYTES else None
    if combine is None:
        return zlib.crc32(framed, crc)
    return combine(zlib.crc32(framed[:8], crc), FRAME.unpack_from(framed)[1], len(framed) - 8)


class RecordsShardWriter:
    """Writes one ``.rec`` shard, computing its file checksum as it goes."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fh: BinaryIO | None = open(self.path, "wb", buffering=WRITE_BUFFER_BYTES)  # noqa: SIM115 - closed in finish/abort
        self._crc = 0
        self._size = 0
        self._offsets: list[int] = []
        self._keys: list[str] = []
        self._write(pack_header())

    def _write(self, data: bytes) -> None:
        assert self._fh is not None, "shard already finished"
        self._fh.write(data)
        self._crc = zlib.crc32(data, self._crc)
        self._size += len(data)

    def append(self, key: str, framed: bytes) -> None:
        """Add the next record."""
        assert self._fh is not None, "shard already finished"
        self._offsets.append(self._size)
        self._keys.append(key)
        self._fh.write(framed)
        self._crc = crc32_after_frame(self._crc, framed)
        self._size += len(framed)

    def finish(self) -> tuple[int, str]:
        """Write index, keys and footer; fsync; return ``(bytes, checksum)``."""
        index_offset = self._size
        offsets = np.asarray([*self._offsets, index_offset], dtype="<u8").tobytes()
        keys = pack_keys(self._keys)
        tail = offsets + keys
        self._write(tail)
        self._write(
            pack_footer(
                index_offset, index_offset + len(offsets), len(self._keys), zlib.crc32(tail)
            )
        )
        assert self._fh is not None
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        return self._size, f"crc32:{self._crc:08x}"

    def abort(self) -> None:
        """Close and delete the partial file."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self.path.unlink(missing_ok=True)


class RecordsShardReader:
    """Maps one ``.rec`` shard and serves its records as memoryview slices."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise ShardMissingError(
                f"{self.path}: shard file is missing; the dataset is incomplete. Restore the "
                "file, or re-pack the dataset",
                path=self.path,
            ) from exc
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE + FOOTER_SIZE:
                unpack_footer(b"\0" * size, path=self.path)
            self._mmap = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.size = size
        view = memoryview(self._mmap)
        self._view = view
        check_header(view[:HEADER_SIZE], path=self.path)
        footer = unpack_footer(view, path=self.path)
        self.num_records = footer.num_records
        tail = view[footer.index_offset : size - FOOTER_SIZE]
        # One CRC over the index and key block on open (they are a few bytes per record,
        # next to the footer): a damaged offset could otherwise frame another intact record.
        if zlib.crc32(tail) != footer.index_crc32:
            raise ChecksumError(
                f"{self.path}: the record index and key block (bytes {footer.index_offset}.."
                f"{size - FOOTER_SIZE}) fail their checksum (or the footer's copy of it is "
                "damaged); the shard is corrupt: restore it from a copy or re-pack",
                path=self.path, offset=footer.index_offset,
            )
        self.offsets = np.frombuffer(view, dtype="<u8", count=footer.num_records + 1,
                                     offset=footer.index_offset)
        self._offsets_list: list[int] = self.offsets.tolist()
        if self._offsets_list[0] != HEADER_SIZE or self._offsets_list[-1] != footer.index_offset:
            raise ShardCorruptError(
                f"{self.path}: record index does not span the record area; re-pack it",
                path=self.path, offset=footer.index_offset,
            )
        self._keys_offset = footer.keys_offset
        self._keys: list[str] | None = None

    def frame(self, index: int) -> memoryview:
        """Framed bytes of record ``index``."""
        if not 0 <= index < self.num_records:
            raise IndexError(f"{self.path}: record {index} out of range 0..{self.num_records - 1}")
        offs = self._offsets_list
        return self._view[offs[index] : offs[index + 1]]

    def offset(self, index: int) -> int:
        """Byte offset of record ``index``."""
        return self._offsets_list[index]

    def scan(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, memoryview]]:
        """Yield ``(index, framed bytes)`` front to back."""
        stop = self.num_records if stop is None else stop
        offs = self._offsets_list
        view = self._view
        for i in range(start, stop):
            yield i, view[offs[i] : offs[i + 1]]

    def will_need(self, start: int, stop: int) -> None:
        """Ask the kernel to start reading records ``start..stop`` now (asynchronous readahead)."""
        offs = self._offsets_list
        if hasattr(os, "posix_fadvise"):
            length = offs[stop] - offs[start]
            os.posix_fadvise(self._fd, offs[start], length, os.POSIX_FADV_WILLNEED)

    def read_frames(self, start: int, stop: int) -> list[memoryview]:
        """Records ``start..stop`` with one positional read into a private buffer.

        Streaming uses this rather than the map: one syscall per block, and the
        bytes live only as long as the caller holds them, so memory stays
        bounded by the shuffle window instead of growing with mapped pages.
        """
        offs = self._offsets_list
        base = offs[start]
        length = offs[stop] - base
        buf = os.pread(self._fd, length, base)
        if len(buf) != length:
            raise ShardCorruptError(
                f"{self.path}: short read of records {start}..{stop} at byte {base} "
                f"({len(buf)} of {length} bytes); the file changed while reading",
                path=self.path, record=start, offset=base,
            )
        view = memoryview(buf)
        return [view[offs[i] - base : offs[i + 1] - base] for i in range(start, stop)]

    def keys(self) -> Sequence[str]:
        """Every record's ``__key__``, read from the key block on first use."""
        if self._keys is None:
            raw = self._view[self._keys_offset : self.size - FOOTER_SIZE]
            try:
                keys = msgpack.unpackb(raw, raw=False)
            except Exception:  # msgpack raises several unrelated types on bad input
                keys = None
            # the block passed its CRC on open, so only a broken writer gets here
            if not isinstance(keys, list) or len(keys) != self.num_records or not (
                set(map(type, keys)) <= {str}  # a third of the time of an isinstance loop
            ):
                raise ShardCorruptError(
                    f"{self.path}: the key block at byte {self._keys_offset} is not a list of "
                    f"{self.num_records} str keys; the shard was written by a broken writer: "
                    "re-pack it",
                    path=self.path, offset=self._keys_offset,
                )
            self._keys = keys
        return self._keys

    def close(self) -> None:
        """Unmap the file (later, when the last record view a caller holds is dropped)."""
        self.offsets = np.empty(0, dtype="<u8")
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        try:
            self._view.release()
            self._mmap.close()
        except BufferError:
            pass
