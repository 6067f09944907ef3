"""Shard backends: one file per shard, behind one small writer/reader protocol.

A backend stores *framed records* (see ``shardio.format.frames``) and knows nothing of
samples, codecs or manifests. ``records`` is a flat file read front to back
with an offset index at its end; ``lmdb`` is one LMDB file keyed by the record's
index in the shard. Both give O(1) access to record ``i`` and a sequential scan.
Both store a shard's keys as one *key block*: the msgpack array of its record
keys (``pack_keys``), whose CRC-32 the manifest keeps (``keys_crc32``). Readers
hand a run of records to ``shardio.format.frames.check_frames`` as one ``RunBytes``.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgpack

from shardio.errors import ShardMissingError
from shardio.format.codecs import get_codec
from shardio.format.frames import CHECKSUM_OF_VERSION, FORMAT_VERSION, RunBytes
from shardio.format.record import encode_record


class ShardFileWriter(Protocol):
    """Writes the samples of one shard file under a temporary name."""

    def add(self, sample: Mapping[str, Any]) -> None:
        """Add the next sample (with its ``__key__``), encoded as the shard's version does."""
        ...

    @property
    def keys_crc32(self) -> int:
        """The manifest's ``keys_crc32`` of the finished shard."""
        ...

    def finish(self) -> tuple[int, str]:
        """Complete, fsync and close the file; return ``(size in bytes, "<checksum>:<hex>")``."""
        ...

    def abort(self) -> None:
        """Close and delete the partial file."""
        ...


class ShardFileReader(Protocol):
    """Reads framed records from one finished shard file."""

    path: str
    num_records: int

    def frame(self, index: int) -> memoryview:
        """The framed bytes of record ``index`` (checked later by ``shardio.format.frames``)."""
        ...

    def offset(self, index: int) -> int:
        """Byte offset of record ``index`` in the file, for error messages."""
        ...

    def scan(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, memoryview]]:
        """Yield ``(index, framed bytes)`` for records ``start..stop`` in storage order."""
        ...

    def read_frames(self, start: int, stop: int) -> list[memoryview]:
        """Framed bytes of records ``start..stop`` in one sequential read (a streaming block)."""
        ...

    def read_run(self, start: int, stop: int) -> RunBytes:
        """Records ``start..stop`` as one buffer with their bounds (what streaming decodes)."""
        ...

    def will_need(self, start: int, stop: int) -> None:
        """Hint that records ``start..stop`` will be read soon (readahead); may do nothing."""
        ...

    def keys(self) -> Sequence[str]:
        """The ``__key__`` of every record, in record order."""
        ...

    def close(self) -> None:
        """Release the file; the reader must not be used afterwards."""
        ...


SHARD_SUFFIX = {"records": ".rec", "lmdb": ".mdb"}


def pack_keys(keys: Sequence[str]) -> bytes:
    """A shard's key block: its record keys as one msgpack array of str."""
    return msgpack.packb(list(keys), use_bin_type=True)  # type: ignore[no-any-return]


def keys_crc32(keys: Sequence[str]) -> int:
    """CRC-32 of the key block of a shard holding ``keys``: its fingerprint in the manifest."""
    return zlib.crc32(pack_keys(keys))


def stored_keys_crc32(reader: ShardFileReader) -> int:
    """The manifest's ``keys_crc32`` of the shard ``reader`` reads: its v3 key section's as
    stored, else that of the key block its keys make."""
    index = getattr(reader, "block_index", None)
    return index.index.keys_crc32 if index is not None else keys_crc32(reader.keys())


def open_shard_file(path: str) -> int:
    """A read-only descriptor of the shard file at ``path``.

    Raises:
        ShardMissingError: there is no file at ``path``.
    """
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise ShardMissingError(
            f"{path}: shard file is missing; the dataset is incomplete. Restore the file, or "
            "re-pack the dataset",
            path=path,
        ) from exc


def shard_name(backend: str, number: int) -> str:
    """The file name of shard ``number`` for ``backend``."""
    return f"shard-{number:05d}{SHARD_SUFFIX[backend]}"


class ShardFileEncoder:
    """How a writer of format ``version`` turns samples into stored bytes: v1/v2 frames
    (``encode_record``); for v3, the zstd ``level`` of its columns (None: all raw)."""

    def __init__(self, version: int, codec: str = "zstd", level: int = 3) -> None:
        self._codec = get_codec(codec, level)
        self._checksum = CHECKSUM_OF_VERSION[version]
        self.level: int | None = None if codec == "none" else level

    def frame(self, sample: Mapping[str, Any]) -> bytes:
        """A v1/v2 record of ``sample``."""
        return encode_record(sample, self._codec, self._checksum)


def create_shard(backend: str, path: Path, *, version: int = FORMAT_VERSION,
                 codec: str = "zstd", level: int = 3,
                 block_records: int | None = None) -> ShardFileWriter:
    """Start writing a shard of ``backend`` at temporary ``path`` in format ``version``,
    compressed with ``codec`` at ``level`` where it pays; v3: ``block_records`` records a
    block (``shardfile3.ShardEncoder3``)."""
    if backend == "records":
        from shardio.backends.records import RecordsShardWriter

        return RecordsShardWriter(path, version=version, codec=codec, level=level,
                                  block_records=block_records)
    if backend == "lmdb":
        from shardio.backends.lmdb import LmdbShardWriter

        return LmdbShardWriter(path, version=version, codec=codec, level=level,
                               block_records=block_records)
    raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(SHARD_SUFFIX)}")


def open_shard(backend: str, path: str | Path) -> ShardFileReader:
    """Open a finished shard of ``backend`` for reading."""
    if backend == "records":
        from shardio.backends.records import RecordsShardReader

        return RecordsShardReader(path)
    if backend == "lmdb":
        from shardio.backends.lmdb import LmdbShardReader

        return LmdbShardReader(path)
    raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(SHARD_SUFFIX)}")
