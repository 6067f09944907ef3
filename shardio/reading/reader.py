"""Read a packed dataset without torch: by global index, by shard range, or in stored order.

``DatasetReader`` opens shards lazily (one open per shard per reader) and
checks each against the manifest's size when it opens; record checksums are
checked as records are read. It is the one place where manifest, backend and
record codec meet, and everything above it (the torch datasets, the CLI)
reads through it. A dataset given as a URL is read through
``shardio.reading.shards`` (a store and the node cache); a local one is opened
here in place.
"""

from __future__ import annotations

import atexit
import bisect
import mmap
import os
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from shardio.backends import ShardFileReader, open_shard, stored_keys_crc32
from shardio.backends.records import RecordsShardReader, advise_open
from shardio.errors import ShardCorruptError, ShardMissingError, TruncatedShardError
from shardio.format import runs as rundecode
from shardio.format.frames import RunBytes
from shardio.format.manifest import Manifest, ShardInfo
from shardio.format.record import INDEX_FIELD, decode_record
from shardio.reading import telemetry
from shardio.reading.blockcache import (
    DEFAULT_CACHE_BYTES,
    BlockCache,
    BlockParts,
    DecodedBlock,
    block_parts,
)
from shardio.reading.checkahead import Check, checker
from shardio.reading.shards import ShardSource
from shardio.storage.options import RemoteOptions

_LIVE: weakref.WeakSet[DatasetReader] = weakref.WeakSet()
"""Every reader of this process, so that a forked child can let go of their open shards."""


def _forget_inherited_shards() -> None:
    """In a forked child: drop the parent's open shards held by every reader.

    liblmdb forbids using an environment across ``fork``, and py-lmdb refuses
    to open a file twice in one process, so a child that kept the parent's
    environment alive (say a dataset's own reader) could not open that shard
    again. Dropping the references closes the child's copies; each reader
    reopens what it needs (records maps too, which keeps one rule for both).
    """
    for reader in list(_LIVE):
        reader._open = {}
        reader._blocks.clear()
        hinted, reader._hinted = reader._hinted, {}
        for fd in hinted.values():  # this process's copies; the parent's stay open
            os.close(fd)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inherited_shards)


@atexit.register
def _close_at_exit() -> None:
    """Close every reader while the interpreter still has its modules.

    A stream a script stopped reading early (``next(iter(dataset))``, a ``break``) is
    closed by the collector after the modules its ``finally`` calls into are cleared,
    which printed ``Exception ignored in: <generator …>``; a reader closed here makes
    that late close a no-op.
    """
    for reader in list(_LIVE):
        reader.close()
        reader._exited = True


class DatasetReader:
    """Random and sequential access to the samples of one dataset directory."""

    _exited = False
    """Closed by ``_close_at_exit``: a later ``close`` has nothing left to do."""

    def __init__(self, path: str | os.PathLike[str], *, verify: bool = True,
                 remote: RemoteOptions | None = None, num_processes: int = 1,
                 block_cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        """Read the manifest of ``path``; shards are opened on first use.

        Args:
            path: dataset folder (or its manifest.json), or a URL (``s3://bucket/train``,
                ``https://host/train``, any fsspec protocol).
            verify: check each record's CRC-32 as it is read.
            remote: how a URL is reached and cached (``RemoteOptions``); ignored for
                local paths, which are read in place.
            num_processes: processes of this node reading the dataset at once (DataLoader
                workers), for the check that the cache budget holds their ranges in flight.
            block_cache_bytes: decoded v3 blocks kept for ``get`` and ``get_many``
                (``shardio.reading.blockcache``); 0 keeps none.
        """
        self._source = ShardSource(path, remote=remote, num_processes=num_processes)
        self.manifest: Manifest = self._source.manifest
        self.root: Path | str = self._source.root
        """The dataset folder, or its URL (a str) when remote."""
        self.remote: RemoteOptions | None = self._source.options
        """The resolved ``RemoteOptions`` of a remote dataset (its budget fixed); None if local."""
        self.verify = verify
        self._firsts = [s.first_index for s in self.manifest.shards]
        self._open: dict[int, ShardFileReader] = {}
        self._blocks = BlockCache(block_cache_bytes)
        self._hinted: dict[int, int] = {}
        """Local ``.rec`` shards asked of the kernel ahead (``prefetch``), not opened yet:
        their descriptors, which the open takes."""
        _LIVE.add(self)

    def __len__(self) -> int:
        return self.manifest.num_samples

    def __getstate__(self) -> dict[str, Any]:
        """Pickle without the open shards: maps and LMDB environments cannot cross processes.

        A DataLoader with the ``spawn`` or ``forkserver`` start method pickles
        the dataset, and with it this reader, after the parent may have used it.
        """
        state = dict(self.__dict__)
        state["_open"] = {}
        state["_hinted"] = {}
        state["_blocks"] = BlockCache(self._blocks.budget)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Restore a pickled reader; its shards reopen on first use in this process."""
        self.__dict__.update(state)
        self._open = {}
        self._blocks = BlockCache(self._blocks.budget)
        _LIVE.add(self)

    def reopened(self, *, num_processes: int | None = None,
                 block_records: int | None = None) -> DatasetReader:
        """A reader of the same dataset and manifest (read again: never) with nothing open.

        ``block_records``: the block size of the plan this reader will follow; a remote
        dataset's ranges are then cut into whole blocks (``ShardSource``).
        """
        clone: DatasetReader = object.__new__(DatasetReader)
        clone.__setstate__(self.__getstate__())
        clone._source = self._source.fresh(num_processes=num_processes,
                                           block_records=block_records)
        return clone

    @property
    def num_processes(self) -> int:
        """Processes of this node reading the dataset at once (its DataLoader workers)."""
        return self._source.num_processes

    @property
    def is_remote(self) -> bool:
        """Whether the dataset is read from a URL (through the node cache)."""
        return self._source.is_remote

    def __enter__(self) -> DatasetReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def shard_path(self, shard: int) -> Path | str:
        """File path of shard number ``shard`` (its URL when the dataset is remote)."""
        if isinstance(self.root, str):
            return self._source.shard_url(shard)
        return self.root / self.manifest.shards[shard].name

    def shard_file(self, shard: int) -> Path:
        """A local file holding shard ``shard`` whole (``verify``): the file itself, or a
        checked copy in the node cache, held until ``close_shard``."""
        return self._source.shard_file(shard)

    def prefetch(self, shards: Iterable[int]) -> None:
        """Start reading what opening ``shards`` reads: their tails, fetched in the background
        (remote), or asked of the kernel with their files opened (local ``.rec`` shards,
        ``advise_open``), so that a window's cold shards are read together, not one open
        after another."""
        todo = [s for s in shards if s not in self._open]
        if isinstance(self.root, str) or self.manifest.backend != "records":
            self._source.prefetch(todo)
            return
        for shard in todo:
            if shard not in self._hinted:
                info = self.manifest.shards[shard]
                fd = advise_open(self.root / info.name, info.num_bytes, info.num_samples)
                if fd is not None:
                    self._hinted[shard] = fd

    def shard(self, shard: int) -> ShardFileReader:
        """The open reader of shard number ``shard``, opening and checking it once."""
        reader = self._open.get(shard)
        if reader is None:
            reader = self._open_checked(shard)
            self._open[shard] = reader
        return reader

    def opened(self, shard: int) -> ShardFileReader | None:
        """The reader of shard ``shard`` if it is open now, without opening it."""
        return self._open.get(shard)

    def _open_checked(self, shard: int) -> ShardFileReader:
        info: ShardInfo = self.manifest.shards[shard]
        path = self.shard_path(shard)
        if isinstance(path, str):  # remote: the source checks size and footer as it fetches
            reader = self._source.open_shard(shard)
        else:
            try:
                size = path.stat().st_size
            except FileNotFoundError as exc:
                raise ShardMissingError(
                    f"{path}: shard {info.name} named by {path.parent / 'manifest.json'} is "
                    "missing; restore the file or re-pack the dataset",
                    path=path,
                ) from exc
            if size != info.num_bytes:
                raise TruncatedShardError(
                    f"{path}: shard is {size} bytes but the manifest says {info.num_bytes}; it "
                    "was truncated or replaced: restore it from a copy or re-pack",
                    path=path,
                )
            hinted = self._hinted.pop(shard, None)
            reader = (open_shard(self.manifest.backend, path) if hinted is None
                      else RecordsShardReader(path, hinted))
        try:
            if reader.num_records != info.num_samples:
                raise TruncatedShardError(
                    f"{path}: shard holds {reader.num_records} records but the manifest says "
                    f"{info.num_samples}; re-pack the dataset",
                    path=path,
                )
            # size and count can match another shard's (LMDB files grow by whole pages): the
            # key block's CRC tells this shard's records from any other's, for one small read
            if info.keys_crc32 is not None and stored_keys_crc32(reader) != info.keys_crc32:
                raise ShardCorruptError(
                    f"{path}: the shard's key block does not match the manifest's "
                    f"keys_crc32 {info.keys_crc32:08x}: the file holds another shard's records "
                    "(shard files exchanged or replaced); restore it from a copy or re-pack",
                    path=path,
                )
        except BaseException:
            reader.close()
            raise
        telemetry.count_shard_open()
        return reader

    def close_shard(self, shard: int) -> None:
        """Release one shard's file (its map and descriptor, or its cache entries)."""
        self._blocks.drop_shard(shard)
        reader = self._open.pop(shard, None)
        if reader is not None:
            reader.close()
        hinted = self._hinted.pop(shard, None)
        if hinted is not None:
            os.close(hinted)
        self._source.release(shard)

    def close(self) -> None:
        """Release every open shard (and a remote dataset's downloads ahead and threads)."""
        if self._exited:
            return
        for shard in [*self._open, *self._hinted]:
            self.close_shard(shard)
        self._source.close()

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard number, record in shard)`` of global sample ``index``."""
        if not 0 <= index < self.manifest.num_samples:
            raise IndexError(f"sample {index} out of range 0..{self.manifest.num_samples - 1}")
        shard = bisect.bisect_right(self._firsts, index) - 1
        return shard, index - self._firsts[shard]

    def decode(self, shard: int, record: int, framed: memoryview | bytes) -> dict[str, Any]:
        """Check and decode one framed record of ``shard`` into its sample dict."""
        reader = self.shard(shard)
        sample = decode_record(
            framed,
            path=reader.path,
            record=record,
            offset=reader.offset(record),
            verify=self.verify,
            key=reader.keys()[record],
        )
        sample[INDEX_FIELD] = self._firsts[shard] + record
        return sample

    def get(self, index: int) -> dict[str, Any]:
        """Sample ``index`` (global, stored order) as a dict with ``__key__`` and ``__index__``."""
        return self.get_many([index])[0]

    def get_many(self, indices: Sequence[int], *, decode_ahead: bool = False
                 ) -> list[dict[str, Any]]:
        """Samples ``indices`` (global, stored order), as ``get`` gives each, in that order.

        v3 blocks are decoded once into the reader's block cache and each sample cut from
        its block's columns; v1/v2 records are decoded one by one. Indices in ascending
        order find their shard and block fastest. ``decode_ahead``: the blocks of local
        shards that the cache lacks are also checked and inflated on this process's
        checker thread (``_decode_ahead``), worth it where a core is free for it.
        """
        ahead = self._decode_ahead(indices) if decode_ahead else {}
        try:
            return self._fetch(indices, ahead)
        finally:  # a read that failed leaves none queued holding views of its shards
            for _run, check in ahead.values():
                check.cancel()

    def _fetch(self, indices: Sequence[int], ahead: dict[tuple[int, int], tuple[RunBytes, Check]]
               ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        lo = hi = first = stop = 0  # the current shard's indices, the current block's records
        decoded: DecodedBlock | None = None
        for index in indices:
            if not lo <= index < hi:
                shard, _ = self.locate(index)
                reader = self.shard(shard)
                blocks = getattr(reader, "block_index", None)
                lo, hi = self._firsts[shard], self._firsts[shard] + reader.num_records
                first = stop = 0
            record = index - lo
            if blocks is None:
                out.append(self.decode(shard, record, reader.frame(record)))
                continue
            if not first <= record < stop:
                block = bisect.bisect_right(blocks.firsts, record) - 1
                first, stop = blocks.firsts[block], blocks.firsts[block + 1]
                decoded = self._blocks.get(shard, block, partial(
                    self._decode_block, reader, first, stop, ahead.get((shard, block))))
            assert decoded is not None
            sample = decoded.sample(record - first)
            sample[INDEX_FIELD] = index
            out.append(sample)
        return out

    def _decode_ahead(self, indices: Sequence[int]
                      ) -> dict[tuple[int, int], tuple[RunBytes, Check]]:
        """The runs of the blocks of local ``.rec`` shards that ``indices`` need and the
        cache lacks, each queued on the checker thread to be checked and inflated
        (``block_parts``) from the far end, while this thread takes them from the front
        as it cuts samples; none for fewer than two such blocks.

        A first random epoch decodes a block for nearly every sample: CRC-32C over about
        six images, or inflating a hundred tiny files. Shared with the thread, the epoch of
        an ``IndexedDataset`` under a random sampler in one process ran 0.50 -> 0.45 s
        (8,000 JPEGs) and 0.94 -> 0.86 s (10^5 tiny files), medians of 6 epochs alternated
        with the commit before; ``python -m benchmarks.bench_warm --rounds 5``, the commit
        before (``BENCH_SHARDIO_SNAPSHOT``) then this, gave 0.61 -> 0.67x (images) and
        0.65 -> 0.69x (tiny) the single LMDB file's time. The thread waits for the
        interpreter's lock after each block, so the decoding does not take half as long."""
        found: dict[tuple[int, int], tuple[int, int, ShardFileReader]] = {}
        lo = hi = 0
        blocks = reader = None
        for index in indices:
            if not lo <= index < hi:
                shard, _ = self.locate(index)
                reader = self.shard(shard)
                blocks = getattr(reader, "block_index", None) if type(
                    reader) is RecordsShardReader else None
                lo, hi = self._firsts[shard], self._firsts[shard] + reader.num_records
            if blocks is None:
                continue
            block = bisect.bisect_right(blocks.firsts, index - lo) - 1
            if (shard, block) not in found and (shard, block) not in self._blocks:
                assert reader is not None
                found[(shard, block)] = (blocks.firsts[block], blocks.firsts[block + 1], reader)
        if len(found) < 2:
            return {}
        thread = checker()
        out = {}
        # the thread starts at the far end while this one checks from the front as it
        # decodes: in the same order, this one would wait on the block the thread is in
        for key, (start, stop, reader) in reversed(found.items()):
            run = reader.read_run(start, stop)
            out[key] = (run, thread.submit(run, partial(
                block_parts, path=reader.path, verify=self.verify)))
        return out

    def _decode_block(self, reader: ShardFileReader, start: int, stop: int,
                      ahead: tuple[RunBytes, Check] | None = None) -> DecodedBlock:
        if ahead is not None:
            run, check = ahead
            # a block that failed is decoded again here, which raises the error naming it
            parts = cast("BlockParts", check.result) if check.passed() else None
            return DecodedBlock(run, reader.keys()[start:stop], path=reader.path,
                                verify=self.verify, parts=parts)
        run = reader.read_run(start, stop)
        if self.is_remote and isinstance(run.buffer.obj, mmap.mmap):
            # a view of a node-cache file: kept, it would pin the file past its eviction,
            # beyond the cache's budget; a copy is counted in this cache's
            run = replace(run, buffer=memoryview(bytes(run.buffer)))
        return DecodedBlock(run, reader.keys()[start:stop], path=reader.path,
                            verify=self.verify)

    def decode_run(self, shard: int, start: int, stop: int, *, verify: bool = True
                   ) -> list[dict[str, Any]]:
        """Records ``start..stop`` of ``shard``, read as one run and checked (checksums too,
        with ``verify`` and the reader's), as sample dicts."""
        reader = self.shard(shard)
        return rundecode.decode_run(
            reader.read_run(start, stop), path=reader.path, first_record=start,
            offset_of=reader.offset, verify=self.verify and verify,
            first_index=self._firsts[shard] + start, keys=reader.keys())

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.get(index)

    def iter_shard(
        self, shard: int, start: int = 0, stop: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """Samples ``start..stop`` of one shard, read front to back."""
        reader = self.shard(shard)
        index = getattr(reader, "block_index", None)
        if index is None:
            for record, framed in reader.scan(start, stop):
                yield self.decode(shard, record, framed)
            return
        stop = reader.num_records if stop is None else stop
        b0, b1 = index.blocks(start, stop)
        for b in range(b0, b1):  # block by block: one read, check and inflate each
            yield from self.decode_run(shard, max(start, index.firsts[b]),
                                       min(stop, index.firsts[b + 1]))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Every sample in stored order, one shard open at a time."""
        for shard in range(len(self.manifest.shards)):
            yield from self.iter_shard(shard)
            self.close_shard(shard)

    def keys(self) -> Iterator[str]:
        """Every sample key in stored order, from the shards' key blocks (no record reads)."""
        self.prefetch(range(len(self.manifest.shards)))
        for shard in range(len(self.manifest.shards)):
            yield from self.shard(shard).keys()


def open_dataset(
    path: str | os.PathLike[str], *, verify: bool = True, remote: RemoteOptions | None = None
) -> DatasetReader:
    """Open the dataset at ``path``, a folder or a URL, for reading (see ``DatasetReader``)."""
    return DatasetReader(path, verify=verify, remote=remote)
