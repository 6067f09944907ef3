"""The ``lmdb`` backend: one LMDB file per shard, keyed by the record's index.

Layout (docs/format.md): one LMDB environment in a single file (``subdir=False``,
no ``-lock`` file), main database only. Record ``i`` is stored under the 8-byte
big-endian key ``i``; its value is the record frame, byte for byte the frame the
``records`` backend stores, so ``shardio.format.frames`` checks both alike. Two entries
whose keys are never 8 bytes long, and sort after every record key, describe the
shard: ``__shardio__`` holds msgpack ``{"format": "shardio", "version": 2,
"checksum": "crc32c", "num_records": N, "keys_bytes": B, "keys_crc32": C}``
(version 1: no ``checksum``, records use CRC-32) and ``__shardio_keys__`` the
sample keys as a msgpack array of str (``B`` bytes with CRC-32 ``C``).

The writer appends in large write transactions (``append=True``) straight into
the file it is given and fsyncs once. LMDB is deterministic and zero-fills the
pages it allocates (``meminit``), so identical input gives an identical file.

Reading needs no liblmdb: LMDB checks no checksums of its own and trusts every
page number it reads (one flipped bit can send it past the end of the file), so
the reader first proves the file's B-tree structure sound and finds where every
value lies (``shardio.backends.lmdbcheck``: no page reference or value leaves
the file), then cuts values from its own read-only map of the file. A v3 block
is then a view, checked by its CRC-32C like a ``.rec`` shard's, never a copy
(a copy per block, and one more to join a run's, made LMDB shards 3x slower than
``.rec`` ones on a warm image epoch: ``benchmarks.run --quick``, ``shardio-lmdb``).
This module imports only ``errors``, ``format``, ``backends`` and
``backends.lmdbcheck`` from shardio.
"""

from __future__ import annotations

import mmap
import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import lmdb
import msgpack
import numpy as np

from shardio.backends import ShardFileEncoder, open_shard_file
from shardio.backends.lmdbcheck import check_lmdb_file
from shardio.errors import (
    ChecksumError,
    PackError,
    ShardCorruptError,
    UnsupportedVersionError,
)
from shardio.format.blockfile import INDEX_KEY as INDEX_KEY
from shardio.format.blockfile import VERSION as VERSION3
from shardio.format.blockfile import BlockIndex, ShardEncoder3, block_key, lmdb_tail, parse_lmdb
from shardio.format.checksum import CRC32C, IDS, NAMES, checksum_function, digest
from shardio.format.frames import (
    CHECKSUM_OF_VERSION,
    FORMAT_NAME,
    FORMAT_VERSION,
    FRAME,
    FRAME_SIZE,
    SUPPORTED_VERSIONS,
    RunBytes,
)
from shardio.format.record import KEY_FIELD

META_KEY: Final = b"__shardio__"
"""Key of the shard's metadata entry; never 8 bytes long, so never a record key."""
KEYS_KEY: Final = b"__shardio_keys__"
"""Key of the msgpack array of sample keys; sorts after ``META_KEY``."""
MAX_META_BYTES: Final = 1024

_REPACK: Final = "the shard is damaged: restore it from a copy or re-pack"
INITIAL_MAP_BYTES: Final = 1 << 30
"""Address space the writer reserves at first; it doubles whenever a batch does not fit."""
BATCH_BYTES: Final = 32 << 20
"""Framed bytes buffered per write transaction: large enough that commits are rare."""
READ_CHUNK_BYTES: Final = 8 << 20


def record_key(index: int) -> bytes:
    """The LMDB key of record ``index``: 8 bytes, big-endian, so keys sort by index."""
    return index.to_bytes(8, "big")


def _write_error(exc: lmdb.Error, path: Path, doing: str, record: int | None = None) -> PackError:
    """The shardio error for an LMDB error met while writing ``path``."""
    return PackError(
        f"{path}: {doing} failed ({type(exc).__name__}: {exc})", path=path, record=record
    )


class LmdbShardWriter:
    """Writes one LMDB shard at ``path``: batched appends, one fsync at the end."""

    def __init__(self, path: Path, *, version: int = FORMAT_VERSION, codec: str = "zstd",
                 level: int = 3, block_records: int | None = None) -> None:
        """Start ``path`` in format ``version`` (1 and 2 exist to write the datasets older
        readers made); ``codec`` and ``level``: how ``add`` compresses; ``block_records``:
        v3 records a block."""
        self.path = Path(path)
        self.version = version
        self.checksum = CHECKSUM_OF_VERSION[version]
        self._encode = ShardFileEncoder(version, codec, level)
        self._encoder3 = ShardEncoder3(level=self._encode.level,
                                       block_records=block_records) if version == 3 else None
        self._num_blocks = 0
        self._keys_crc32 = 0
        self.path.unlink(missing_ok=True)
        self._map_bytes = INITIAL_MAP_BYTES
        try:
            self._env: lmdb.Environment | None = lmdb.open(
                str(self.path), subdir=False, lock=False, sync=False, metasync=False,
                map_size=self._map_bytes, meminit=True, max_dbs=0, mode=0o644,
            )
        except lmdb.Error as exc:
            raise _write_error(exc, self.path, "creating the LMDB shard") from exc
        self._keys: list[str] = []
        self._batch: list[tuple[bytes, bytes]] = []
        self._batch_bytes = 0

    def add(self, sample: Mapping[str, Any]) -> None:
        """Add the next sample (with its ``__key__``), encoded as this shard's version does."""
        if self._encoder3 is None:
            self.append(sample[KEY_FIELD], self._encode.frame(sample))
            return
        self._put_blocks(self._encoder3.add(sample))

    def _put_blocks(self, blocks: list[bytes]) -> None:
        for block in blocks:
            self._batch.append((block_key(self._num_blocks), block))
            self._num_blocks += 1
            self._batch_bytes += len(block)
        if self._batch_bytes >= BATCH_BYTES:
            self._commit()

    @property
    def keys_crc32(self) -> int:
        """The manifest's ``keys_crc32`` of the shard (after ``finish``)."""
        return self._keys_crc32

    def append(self, key: str, framed: bytes) -> None:
        """Add the next record (v1/v2 frame); it is committed with its batch."""
        if self.version >= 3:
            raise TypeError(f"{self.path}: a format v3 shard takes samples (add), not frames")
        if self._env is None:
            raise ValueError(f"{self.path}: shard already finished")
        if len(framed) < FRAME_SIZE or framed[9] != IDS[self.checksum]:
            raise ValueError(f"{self.path}: a frame for a {self.checksum} shard must name "
                             f"checksum id {IDS[self.checksum]}")
        self._batch.append((record_key(len(self._keys)), framed))
        self._keys.append(key)
        self._batch_bytes += len(framed)
        if self._batch_bytes >= BATCH_BYTES:
            self._commit()

    def _commit(self) -> None:
        """Put the buffered batch in one write transaction, growing the map when full."""
        assert self._env is not None
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    txn.cursor().putmulti(self._batch, append=True)
                break
            except lmdb.MapFullError:
                self._map_bytes *= 2
                self._env.set_mapsize(self._map_bytes)
            except lmdb.Error as exc:
                first = len(self._keys) - len(self._batch)
                if self._encoder3 is not None:
                    first = len(self._encoder3.keys)
                raise _write_error(exc, self.path, f"writing records {first}..", first) from exc
        self._batch = []
        self._batch_bytes = 0

    def finish(self) -> tuple[int, str]:
        """Write the metadata entries, fsync and close the file.

        Returns:
            ``(size in bytes, "<checksum>:<8 hex digits>")`` of the file at ``path``.
        """
        if self._env is None:
            raise ValueError(f"{self.path}: shard already finished")
        if self._encoder3 is not None:
            self._put_blocks(self._encoder3.finish())
            tail = lmdb_tail(self._encoder3)
            self._keys_crc32 = zlib.crc32(tail[-1][1])
            self._batch += tail
        else:
            keys = msgpack.packb(self._keys, use_bin_type=True)
            self._keys_crc32 = zlib.crc32(keys)
            meta = {
                "format": FORMAT_NAME, "version": self.version, "num_records": len(self._keys),
                "keys_bytes": len(keys), "keys_crc32": self._keys_crc32,
            }
            if self.version > 1:
                meta["checksum"] = self.checksum
            self._batch += [(META_KEY, msgpack.packb(meta, use_bin_type=True)), (KEYS_KEY, keys)]
        self._commit()
        try:
            self._env.sync(True)
        except lmdb.Error as exc:
            raise _write_error(exc, self.path, "flushing the LMDB shard to disk") from exc
        finally:
            self._env.close()
            self._env = None
        crc = size = 0
        compute = checksum_function(self.checksum)
        with open(self.path, "rb") as fh:
            while chunk := fh.read(READ_CHUNK_BYTES):
                crc = compute(chunk, crc)
                size += len(chunk)
        return size, digest(self.checksum, crc)

    def abort(self) -> None:
        """Close and delete the partial file."""
        if self._env is not None:
            self._env.close()
            self._env = None
        self._batch = []
        self.path.unlink(missing_ok=True)


class LmdbShardReader:
    """Maps one LMDB shard, proved sound first, and serves its values as views of the map.

    liblmdb is not used to read: ``check_lmdb_file`` walks every page a read could
    reach and returns where each value lies, so values are cut from this reader's
    own map of the file, and they stay valid while a caller holds them, after
    ``close`` and in a forked child too. ``offset(i)`` returns ``i``: LMDB places
    values on pages as it sees fit, so a record has no stable byte offset to report.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._keys: Sequence[str] | None = None
        fd = open_shard_file(self.path)
        try:
            # the check and the map read one open file: a path replaced meanwhile is not mixed
            layout = check_lmdb_file(self.path, fd=fd)
            self._size = os.fstat(fd).st_size
            self._mmap: mmap.mmap | None = mmap.mmap(fd, self._size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        self._view = memoryview(self._mmap)
        numbered = layout.numbered
        self._named = layout.named
        self._starts = numbered[:, 1].copy()
        self._stops = numbered[:, 1] + numbered[:, 2]
        keys = numbered[:, 0]
        missing = np.flatnonzero(keys != np.arange(len(keys)))
        if len(missing):
            raise ShardCorruptError(
                f"{self.path}: record (v3: block) {int(missing[0])} is missing from the LMDB "
                f"file, key {int(keys[missing[0]])} is in its place; {_REPACK}",
                path=self.path, record=int(missing[0]))
        self.block_index: BlockIndex | None = None
        self._meta = self._read_meta(len(keys))
        if self._meta.get("version") == VERSION3:
            self.block_index = BlockIndex(parse_lmdb(
                self._value(META_KEY), self._value(INDEX_KEY), self._value(KEYS_KEY),
                len(keys), path=self.path))
            self._keys = self.block_index.index.keys
        self.num_records: int = self._meta["num_records"]
        self.checksum: str = self._meta.get("checksum", CHECKSUM_OF_VERSION[1])

    def _read_meta(self, num_values: int) -> dict[str, Any]:
        """The checked metadata entry; ``num_values``: how many numbered values the file holds."""
        view = self._value(META_KEY)
        meta: Any = None
        if 0 < len(view) <= MAX_META_BYTES:
            try:
                meta = msgpack.unpackb(view, raw=False)
            except Exception:  # msgpack raises several unrelated types on bad input
                meta = None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
            found = meta.get("format") if isinstance(meta, dict) else meta
            raise ShardCorruptError(
                f"{self.path}: not a shardio shard: the LMDB entry {META_KEY.decode()!r} must "
                f"hold a map with format {FORMAT_NAME!r}, found {found!r}; re-pack it",
                path=self.path,
            )
        version = meta.get("version")
        if version == VERSION3:  # checked whole by parse_lmdb
            return meta
        if version not in SUPPORTED_VERSIONS:
            raise UnsupportedVersionError(
                f"{self.path}: written by shardio format version {version!r}; this reader "
                f"supports {sorted(SUPPORTED_VERSIONS)}. Upgrade shardio to read it.",
                path=self.path,
            )
        fields = ("num_records", "keys_bytes", "keys_crc32")
        checksum = meta.get("checksum") if version > 1 else CHECKSUM_OF_VERSION[1]
        if checksum not in NAMES:
            raise ShardCorruptError(
                f"{self.path}: the metadata names checksum {checksum!r}; known: "
                f"{', '.join(NAMES)}. {_REPACK}, or upgrade shardio", path=self.path)
        if not all(type(meta.get(f)) is int for f in fields) or meta["num_records"] != num_values:
            raise ShardCorruptError(
                f"{self.path}: metadata {meta} does not match the {num_values} records the "
                f"file holds; {_REPACK}",
                path=self.path,
            )
        return meta

    def _value(self, key: bytes) -> memoryview:
        """Entry ``key`` (empty where it is missing: the caller's check refuses it)."""
        at, size = self._named.get(key, (0, 0))
        return self._open_view()[at : at + size]

    def _open_view(self) -> memoryview:
        if self._mmap is None:
            raise ValueError(f"{self.path}: the shard reader is closed")
        return self._view

    def _check_framed(self) -> None:
        if self.block_index is not None:
            raise TypeError(f"{self.path}: a format v3 shard holds blocks, not one frame a "
                            "record: read records with read_run and shardio.format.runs")

    def _read_blocks(self, start: int, stop: int) -> RunBytes:
        """Records ``start..stop`` of a v3 shard: one view from their first block's start to
        their last one's end; LMDB's page headers lie between blocks (``RunBytes.ends``)."""
        assert self.block_index is not None
        b0, b1 = self.block_index.blocks(start, stop)
        view = self._open_view()
        if b1 == b0:
            return RunBytes(view[:0], np.zeros(1, np.int64), CRC32C, None, -1,
                            np.asarray(self.block_index.firsts[b0 : b0 + 1], np.int64),
                            (start, stop), b0, np.zeros(0, np.int64))
        starts, stops = self._starts[b0:b1], self._stops[b0:b1]
        lo, hi = int(starts.min()), int(stops.max())
        bounds = np.append(starts, stops[-1]) - lo
        return RunBytes(view[lo:hi], bounds, CRC32C, None, -1,
                        np.asarray(self.block_index.firsts[b0 : b1 + 1], np.int64),
                        (start, stop), b0, stops - lo)

    def frame(self, index: int) -> memoryview:
        """Framed bytes of record ``index`` (a view of the map)."""
        self._check_framed()
        if not 0 <= index < self.num_records:
            raise IndexError(f"{self.path}: record {index} out of range 0..{self.num_records - 1}")
        view = self._open_view()[int(self._starts[index]) : int(self._stops[index])]
        if len(view) >= FRAME_SIZE:
            length = FRAME_SIZE + FRAME.unpack_from(view)[0]
            if length != len(view):
                raise ShardCorruptError(
                    f"{self.path}: record {index}'s LMDB value is {len(view)} bytes but its "
                    f"frame says {length}; {_REPACK}",
                    path=self.path, record=index,
                )
        return view

    def offset(self, index: int) -> int:
        """Record ``index`` itself: LMDB has no stable byte offset for a record."""
        return index

    def scan(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, memoryview]]:
        """Yield ``(index, framed bytes)`` for records ``start..stop``."""
        self._check_framed()
        stop = self.num_records if stop is None else stop
        if not 0 <= start <= stop <= self.num_records:
            raise IndexError(f"{self.path}: records {start}..{stop} out of range "
                             f"0..{self.num_records}")
        for index in range(start, stop):
            yield index, self.frame(index)

    def read_frames(self, start: int, stop: int) -> list[memoryview]:
        """Records ``start..stop`` as views of the map."""
        return [framed for _index, framed in self.scan(start, stop)]

    def read_run(self, start: int, stop: int) -> RunBytes:
        """Records ``start..stop``: a v3 shard's blocks as one view, a v1/v2 shard's frames
        copied into one private buffer (``check_frames`` then checks each value's length
        against its frame header and each frame's own checksum: LMDB records have no chain).
        """
        if self.block_index is not None:
            return self._read_blocks(start, stop)
        frames = self.read_frames(start, stop)
        bounds = np.zeros(len(frames) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, frames), np.int64, len(frames)), out=bounds[1:])
        return RunBytes(memoryview(b"".join(frames)), bounds, self.checksum, None, -1)

    def will_need(self, start: int, stop: int) -> None:
        """Hint the kernel to read the values records ``start..stop`` use."""
        view = self._open_view()
        if self.num_records == 0 or stop <= start or not hasattr(mmap, "MADV_WILLNEED"):
            return
        b0, b1 = (self.block_index.blocks(start, stop) if self.block_index is not None
                  else (start, stop))
        if b1 <= b0:
            return
        lo = int(self._starts[b0:b1].min()) // mmap.PAGESIZE * mmap.PAGESIZE
        hi = int(self._stops[b0:b1].max())
        assert self._mmap is not None and len(view) >= hi
        self._mmap.madvise(mmap.MADV_WILLNEED, lo, hi - lo)

    def keys(self) -> Sequence[str]:
        """Every record's ``__key__``, read and checked on first use."""
        if self._keys is None:
            view = self._value(KEYS_KEY)
            keys: Any = None
            if len(view) == self._meta["keys_bytes"] and zlib.crc32(view) == self._meta[
                    "keys_crc32"]:
                keys = msgpack.unpackb(view, raw=False)
            if not isinstance(keys, list) or len(keys) != self.num_records:
                raise ChecksumError(
                    f"{self.path}: the key list under {KEYS_KEY.decode()!r} is missing or "
                    f"fails its length or checksum; {_REPACK}",
                    path=self.path,
                )
            self._keys = keys
        return self._keys

    def close(self) -> None:
        """Let go of the map (unmapped when the last value a caller holds is dropped)."""
        mapped, self._mmap = self._mmap, None
        if mapped is None:
            return
        try:
            self._view.release()
            mapped.close()
        except BufferError:
            pass
