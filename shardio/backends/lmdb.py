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
LMDB checks no checksums of its own and trusts every page number it reads, so
the reader first proves the file's B-tree structure sound
(``shardio.backends.lmdbcheck``: no page reference or value leaves the file),
then checks every value's length against its frame header; LMDB errors are
translated into shardio errors here.

py-lmdb refuses to open one file twice in a process, so the readers of a file
share one environment (``shardio.backends.lmdbenv``, which also runs the
structure check and translates errors at open); each reader keeps its own read
transaction. A reader a forked child inherited is never used there: it lets go
of the parent's transaction and says to open the shard again. This module
imports only ``errors``, ``format``, ``backends.lmdbcheck`` and
``backends.lmdbenv`` from shardio.
"""

from __future__ import annotations

import os
import weakref
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

import lmdb
import msgpack
import numpy as np

from shardio.backends import ShardFileEncoder
from shardio.backends.lmdbcheck import check_lmdb_file
from shardio.backends.lmdbenv import REPACK as _REPACK
from shardio.backends.lmdbenv import SharedEnv, acquire_env, release_env
from shardio.backends.lmdbenv import translate_error as _translate
from shardio.errors import (
    ChecksumError,
    PackError,
    ShardCorruptError,
    ShardioError,
    TruncatedShardError,
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
NUM_META_ENTRIES: Final = 2
MAX_META_BYTES: Final = 1024

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


_LIVE: weakref.WeakSet[LmdbShardReader] = weakref.WeakSet()
"""Every open reader of this process, so that a forked child can let go of their transactions."""


def _forget_inherited_readers() -> None:
    """In a forked child: every reader lets go of its parent's transaction and environment."""
    for reader in list(_LIVE):
        reader._txn = _InheritedTxn(reader.path)
        reader._shared = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inherited_readers)


class _InheritedTxn:
    """Stands in, in a forked child, for the read transaction a reader had in its parent."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _refuse(self) -> NoReturn:
        raise ShardioError(
            f"{self.path}: this LMDB shard reader was opened before the process forked, and "
            "liblmdb forbids using its environment in the child; open the shard again here "
            "(shardio's datasets and DatasetReader do so by themselves)",
            path=self.path,
        )

    def get(self, key: bytes) -> NoReturn:
        self._refuse()

    def cursor(self) -> NoReturn:
        self._refuse()

    def abort(self) -> None:
        """Nothing to end: the transaction is the parent's."""


class LmdbShardReader:
    """Opens one LMDB shard read-only, without a lock file, and serves its frames.

    Frames are returned as copies (``memoryview`` over ``bytes``), never as views
    into LMDB's map: such a view would dangle, and crash the process when read,
    once the shard is closed. ``offset(i)`` returns ``i``: LMDB places values on
    pages as it sees fit, so a record has no stable byte offset to report. One
    reader holds one LMDB read transaction: use it from one thread at a time.
    Readers of one file in one process share its environment (``lmdbenv``), so
    any number of them may be open at once.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._closed = False
        self._keys: Sequence[str] | None = None
        self._fd = -1
        self._pid = os.getpid()
        # liblmdb follows page numbers and value sizes unchecked, so a damaged page can make
        # it read past the end of the file (SIGBUS): the file is proved sound before this
        # process first maps it (looked up here at each open, so that tests and benchmarks
        # can stand in for it)
        shared, self._size = acquire_env(self.path, check=check_lmdb_file)
        self._shared: SharedEnv | None = shared
        txn: lmdb.Transaction[memoryview] | None = None
        try:
            try:
                stat, info = shared.env.stat(), shared.env.info()
                txn = shared.env.begin(buffers=True)
            except lmdb.Error as exc:
                raise _translate(exc, self.path, "opening the shard") from exc
            self._txn: lmdb.Transaction[memoryview] | _InheritedTxn = txn
            needed = (info["last_pgno"] + 1) * stat["psize"]
            if self._size < needed:  # shrunk since the check: refuse before any page is read
                raise TruncatedShardError(
                    f"{self.path}: shard is {self._size} bytes but its LMDB header says "
                    f"{needed}; it is truncated: restore it from a copy or re-pack",
                    path=self.path, offset=self._size,
                )
            self.block_index: BlockIndex | None = None
            self._meta = self._read_meta(stat["entries"] - NUM_META_ENTRIES)
            if self._meta.get("version") == VERSION3:
                self.block_index = BlockIndex(parse_lmdb(
                    self._value(META_KEY), self._value(INDEX_KEY), self._value(KEYS_KEY),
                    stat["entries"] - NUM_META_ENTRIES - 1, path=self.path))
                self._keys = self.block_index.index.keys
        except BaseException:
            if txn is not None:
                txn.abort()
            release_env(shared)
            raise
        self.num_records: int = self._meta["num_records"]
        self.checksum: str = self._meta.get("checksum", CHECKSUM_OF_VERSION[1])
        _LIVE.add(self)

    def _get(self, key: bytes, doing: str, record: int | None = None) -> memoryview | None:
        try:
            return self._txn.get(key)
        except lmdb.Error as exc:
            self._check_open()
            raise _translate(exc, self.path, doing, record) from exc

    def _read_meta(self, num_entries: int) -> dict[str, Any]:
        """The checked metadata entry; ``num_entries`` is how many records the file holds."""
        view = self._get(META_KEY, "reading the shard metadata")
        meta: Any = None
        if view is not None and len(view) <= MAX_META_BYTES:
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
        if not all(type(meta.get(f)) is int for f in fields) or meta["num_records"] != num_entries:
            raise ShardCorruptError(
                f"{self.path}: metadata {meta} does not match the {num_entries} records the "
                f"file holds; {_REPACK}",
                path=self.path,
            )
        return meta

    def _value(self, key: bytes) -> bytes:
        """A copy of entry ``key`` (empty where it is missing: the caller's check refuses it)."""
        view = self._get(key, f"reading the entry {key!r}")
        return b"" if view is None else bytes(view)

    def _check_framed(self) -> None:
        if self.block_index is not None:
            raise TypeError(f"{self.path}: a format v3 shard holds blocks, not one frame a "
                            "record: read records with read_run and shardio.format.runs")

    def _read_blocks(self, start: int, stop: int) -> RunBytes:
        """Records ``start..stop`` of a v3 shard as copies of their blocks, one cursor pass."""
        assert self.block_index is not None
        b0, b1 = self.block_index.blocks(start, stop)
        values: list[bytes] = []
        try:
            with self._txn.cursor() as cursor:
                if b1 > b0 and cursor.set_key(block_key(b0)):
                    for key, value in cursor.iternext():
                        if key != block_key(b0 + len(values)):
                            break
                        values.append(bytes(value))
                        if len(values) == b1 - b0:
                            break
        except lmdb.Error as exc:
            self._check_open()
            raise _translate(exc, self.path, "reading blocks", start) from exc
        if len(values) != b1 - b0:
            raise ShardCorruptError(
                f"{self.path}: block {b0 + len(values)} (records from "
                f"{self.block_index.firsts[b0 + len(values)]}) is missing from the LMDB file; "
                f"{_REPACK}", path=self.path, record=self.block_index.firsts[b0 + len(values)])
        bounds = np.zeros(len(values) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, values), np.int64, len(values)), out=bounds[1:])
        return RunBytes(memoryview(b"".join(values)), bounds, CRC32C, None, -1,
                        np.asarray(self.block_index.firsts[b0 : b1 + 1], np.int64),
                        (start, stop), b0)

    def _copy_frame(self, view: memoryview, index: int) -> memoryview:
        """A private copy of record ``index``'s value, once its length agrees with its frame."""
        if len(view) >= FRAME_SIZE:
            length = FRAME_SIZE + FRAME.unpack_from(view)[0]
            if length != len(view):
                raise ShardCorruptError(
                    f"{self.path}: record {index}'s LMDB value is {len(view)} bytes but its "
                    f"frame says {length}; {_REPACK}",
                    path=self.path, record=index,
                )
        return memoryview(bytes(view))

    def frame(self, index: int) -> memoryview:
        """Framed bytes of record ``index`` (a copy)."""
        self._check_framed()
        if not 0 <= index < self.num_records:
            raise IndexError(f"{self.path}: record {index} out of range 0..{self.num_records - 1}")
        view = self._get(record_key(index), "reading the record", index)
        if view is None:
            raise ShardCorruptError(
                f"{self.path}: record {index} is missing from the LMDB file; {_REPACK}",
                path=self.path, record=index,
            )
        return self._copy_frame(view, index)

    def offset(self, index: int) -> int:
        """Record ``index`` itself: LMDB has no stable byte offset for a record."""
        return index

    def scan(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, memoryview]]:
        """Yield ``(index, framed bytes)`` for records ``start..stop`` with one cursor."""
        self._check_framed()
        stop = self.num_records if stop is None else stop
        if not 0 <= start <= stop <= self.num_records:
            raise IndexError(f"{self.path}: records {start}..{stop} out of range "
                             f"0..{self.num_records}")
        expected = start
        try:
            with self._txn.cursor() as cursor:
                if start == stop or not cursor.set_key(record_key(start)):
                    items: Iterator[tuple[memoryview, memoryview]] = iter(())
                else:
                    items = cursor.iternext()
                for key, value in items:
                    if key != record_key(expected):
                        break
                    yield expected, self._copy_frame(value, expected)
                    expected += 1
                    if expected == stop:
                        break
        except lmdb.Error as exc:
            self._check_open()
            raise _translate(exc, self.path, "scanning the shard", expected) from exc
        if expected != stop:
            raise ShardCorruptError(
                f"{self.path}: record {expected} is missing from the LMDB file; {_REPACK}",
                path=self.path, record=expected,
            )

    def read_frames(self, start: int, stop: int) -> list[memoryview]:
        """Records ``start..stop`` as private copies, read with one cursor pass."""
        return [framed for _index, framed in self.scan(start, stop)]

    def read_run(self, start: int, stop: int) -> RunBytes:
        """Records ``start..stop`` copied into one private buffer with one cursor pass.

        ``check_frames`` then checks each value's length against its frame header
        and each frame's own checksum (LMDB records have no chain).
        """
        if self.block_index is not None:
            return self._read_blocks(start, stop)
        frames = self.read_frames(start, stop)
        bounds = np.zeros(len(frames) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, frames), np.int64, len(frames)), out=bounds[1:])
        return RunBytes(memoryview(b"".join(frames)), bounds, self.checksum, None, -1)

    def will_need(self, start: int, stop: int) -> None:
        """Hint the kernel to read the share of the file records ``start..stop`` likely use.

        LMDB allocates pages in write order, so record ``i`` lies near ``i / num_records``
        of the file; a wrong guess only costs readahead.
        """
        self._check_open()
        if self.num_records == 0 or not hasattr(os, "posix_fadvise"):
            return
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDONLY)
        lo = self._size * start // self.num_records
        hi = -(-self._size * stop // self.num_records)
        os.posix_fadvise(self._fd, lo, hi - lo, os.POSIX_FADV_WILLNEED)

    def keys(self) -> Sequence[str]:
        """Every record's ``__key__``, read and checked on first use."""
        if self._keys is None:
            view = self._get(KEYS_KEY, "reading the key list")
            keys: Any = None
            if (
                view is not None
                and len(view) == self._meta["keys_bytes"]
                and zlib.crc32(view) == self._meta["keys_crc32"]
            ):
                keys = msgpack.unpackb(view, raw=False)
            if not isinstance(keys, list) or len(keys) != self.num_records:
                raise ChecksumError(
                    f"{self.path}: the key list under {KEYS_KEY.decode()!r} is missing or "
                    f"fails its length or checksum; {_REPACK}",
                    path=self.path,
                )
            self._keys = keys
        return self._keys

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"{self.path}: the shard reader is closed")

    def close(self) -> None:
        """End the read transaction and let go of the file; frames handed out stay valid.

        The environment closes with the last reader of the file in this process.
        In a forked child a reader opened in the parent touches nothing of LMDB's.
        """
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        shared, self._shared = self._shared, None
        if shared is None or self._pid != os.getpid():  # inherited: py-lmdb's to finalize
            self._txn = _InheritedTxn(self.path)
            return
        try:
            self._txn.abort()
        finally:
            release_env(shared)
