"""Where a dataset's manifest and shards come from: a local folder, read in place, or a URL.

``ShardSource`` is what ``DatasetReader`` asks for its manifest and for
remote shards; local shards it still opens itself, exactly as before (no
copy, no cache, no extra call). For a URL it holds the store, the manifest
and its version, and, per process, the node cache (``RangeCache``), the
read-ahead queue shared by all shards (``ReadAhead``) and a few threads that
fetch shard tails in parallel (``prefetch``: a window of the stream touches
many shards, and each tail is a round trip). ``.rec`` shards are read by
ranges (``backends.remoterecords``); LMDB shards, and any shard ``verify``
checks whole, are downloaded whole and checked against the manifest's file
checksum (``backends.cachedshard``).

Process safety: the description (store, manifest, options) pickles; the
per-process parts are made on first use in each process. A forked child
releases what it inherited (cache entries held by the parent's readers stay
the parent's) and starts afresh. Imports ``backends``, ``location`` and
``storage``; nothing above the reader, no torch.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from shardio.backends import ShardFileReader
from shardio.backends.cachedshard import CachedShardReader
from shardio.backends.remoterecords import RemoteRecordsReader, ShardTail, join_bytes, read_tail
from shardio.errors import (
    ChecksumError,
    ShardCorruptError,
    ShardioError,
    ShardMissingError,
    StorageError,
    TruncatedShardError,
)
from shardio.format.checksum import compute, digest, name_of
from shardio.format.manifest import MANIFEST_NAME, Manifest, ShardInfo
from shardio.storage.cache import RangeCache
from shardio.storage.cachedrange import CachedRange
from shardio.storage.fetch import (
    MIN_IN_FLIGHT,
    RangeRequest,
    in_flight_bytes,
    min_cache_bytes,
)
from shardio.storage.location import RemoteDataset, open_remote, read_local_manifest
from shardio.storage.options import RemoteOptions
from shardio.storage.readahead import ReadAhead
from shardio.storage.url import split_url

TAIL_THREADS = 32
"""Shard tails fetched at once (each is one small GET: latency, not bandwidth; a shuffle
window of a large dataset touches up to its number of blocks, 128 by default)."""

_LIVE: weakref.WeakSet[ShardSource] = weakref.WeakSet()


def _release_inherited() -> None:
    """In a forked child: let go of the parent's cache entries and threads, start afresh."""
    for source in list(_LIVE):
        source._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_release_inherited)


class ShardSource:
    """The manifest and shards of one dataset, local or remote."""

    def __init__(self, path: str | os.PathLike[str], *, remote: RemoteOptions | None = None,
                 num_processes: int = 1, block_records: int | None = None) -> None:
        """Read the manifest of ``path`` (a folder, its manifest.json, or a URL).

        Args:
            path: the dataset.
            remote: how a URL is reached and cached; ignored for local paths.
            num_processes: processes of this node reading the dataset at once, times
                ``LOCAL_WORLD_SIZE`` from the environment: the cache budget must hold
                the ranges all of them have in flight, which is checked on open.
            block_records: the block size of the plan that reads the dataset: remote
                ``.rec`` ranges are then whole blocks (``remoterecords.partition``), so a
                range is wanted by one shuffle window only. Every process of a dataset
                must pass the same value, so a range has one name on the node.
        """
        protocol, rest = split_url(path)
        self.remote: RemoteDataset | None = None
        self.options: RemoteOptions | None = None
        if protocol is None:
            local = Path(rest)
            self.manifest: Manifest = read_local_manifest(local)
            self.root: Path | str = local.parent if local.is_file() else local
        else:
            self.options = (remote or RemoteOptions()).resolved()
            self.remote = open_remote(os.fspath(path), remote=self.options)
            self.manifest = self.remote.manifest
            self.root = self.remote.url
        self.num_processes = num_processes
        self.block_records = block_records
        self._reset()
        _LIVE.add(self)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cache: RangeCache | None = None
        self._ahead: ReadAhead | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._tails: dict[int, Future[ShardTail]] = {}
        self._whole: dict[int, CachedRange] = {}
        self._readers: weakref.WeakSet[RemoteRecordsReader | CachedShardReader] = (
            weakref.WeakSet())

    def __getstate__(self) -> dict[str, Any]:
        """The description only: caches, threads and held ranges belong to a process."""
        return {"remote": self.remote, "options": self.options, "manifest": self.manifest,
                "root": self.root, "num_processes": self.num_processes,
                "block_records": self.block_records}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()
        _LIVE.add(self)

    def fresh(self, *, num_processes: int | None = None,
              block_records: int | None = None) -> ShardSource:
        """The same dataset (same manifest, no GET) with nothing open, for another reader.

        ``num_processes`` and ``block_records`` (see ``__init__``) replace this one's when given.
        """
        state = self.__getstate__()
        if num_processes is not None:
            state["num_processes"] = num_processes
        if block_records is not None:
            state["block_records"] = block_records
        clone = object.__new__(ShardSource)
        clone.__setstate__(state)
        return clone

    def _after_fork(self) -> None:
        """Let go of the parent's holds without taking any lock (a parent thread may have held
        one at the fork, and it would never be released here), then start afresh."""
        for reader in list(self._readers):
            reader.forget()
        for cached in self._whole.values():
            cached.forget()
        if self._ahead is not None:
            self._ahead.forget()
        self._reset()

    @property
    def is_remote(self) -> bool:
        """Whether the dataset is read through a store and the node cache."""
        return self.remote is not None

    def shard_url(self, number: int) -> str:
        """The URL (or path) of shard ``number``, as messages name it."""
        return f"{self.root}/{self.manifest.shards[number].name}"

    def cache(self) -> RangeCache:
        """This process's node cache (remote datasets only)."""
        if self._pid != os.getpid():
            self._after_fork()
        if self._cache is None:
            assert self.options is not None and self.options.max_cache_bytes is not None
            self._cache = RangeCache(self.options.cache_path,
                                     max_cache_bytes=self.options.max_cache_bytes)
        return self._cache

    def _remote(self) -> tuple[RemoteDataset, RemoteOptions]:
        if self.remote is None or self.options is None:
            raise ValueError(f"{self.root}: a local dataset is read in place, not through a store")
        return self.remote, self.options

    def _ahead_here(self) -> ReadAhead:
        remote, options = self._remote()
        cache = self.cache()
        if self._ahead is None:
            assert options.max_cache_bytes is not None  # resolved() sets it
            # the regime where blocks are joined: the budget holds the dataset, so a cached
            # range is rarely evicted before its turn and need not be held in a slot
            fits = join_bytes(options.max_cache_bytes, self.manifest.num_bytes) > 0
            self._ahead = ReadAhead(cache, remote.store, version=remote.version,
                                    max_in_flight=options.max_in_flight,
                                    max_in_flight_bytes=options.max_in_flight_bytes,
                                    skip_cached=fits)
        return self._ahead

    def _fetch(self, request: RangeRequest) -> bytes:
        remote, _options = self._remote()
        with self.cache().open_range(remote.store, request.name, request.start, request.stop,
                                     version=remote.version, check=request.check) as cached:
            return cached.read()

    def _tail(self, number: int) -> ShardTail:
        info = self.manifest.shards[number]
        return read_tail(self._fetch, info.name, url=self.shard_url(number),
                         size=info.num_bytes, num_records=info.num_samples,
                         block_records=self.manifest.block_records)

    def prefetch(self, numbers: Iterable[int]) -> None:
        """Start fetching the tails of remote ``.rec`` shards ``numbers`` in the background."""
        if self.remote is None or self.manifest.backend != "records":
            return
        self.cache()  # after a fork: reset before looking at our own futures
        for number in numbers:
            if number not in self._tails:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(TAIL_THREADS, thread_name_prefix="shardio-tail")
                self._tails[number] = self._pool.submit(self._tail, number)

    def open_shard(self, number: int) -> ShardFileReader:
        """Open remote shard ``number``: by ranges (``.rec``), or whole (LMDB; held by ``verify``).

        Raises:
            ShardMissingError: the object is missing.
            TruncatedShardError: its size is not the manifest's.
            ShardCorruptError: its footer, index or checksum is bad.
            CacheBudgetError: the cache budget cannot hold what this reader needs in flight.
            StorageError: the store failed after retries.
        """
        _remote, options = self._remote()
        info = self.manifest.shards[number]
        url = self.shard_url(number)
        try:
            reader: RemoteRecordsReader | CachedShardReader
            if self.manifest.backend == "records" and number not in self._whole:
                self.cache()
                # tails first: a shard's ranges start downloading as soon as it is open, and
                # with a window's tails still on the way they took the link and the cache's
                # budget lock from them (opening 40 shards of a window took up to 1.5 s)
                wait(list(self._tails.values()))
                future = self._tails.pop(number, None)
                tail = future.result() if future is not None else self._tail(number)
                assert options.max_cache_bytes is not None  # resolved() sets it
                reader = RemoteRecordsReader(
                    self._ahead_here(), info.name, tail, url=url,
                    range_bytes=options.range_bytes, block_records=self.block_records,
                    max_join_bytes=join_bytes(options.max_cache_bytes, self.manifest.num_bytes))
                self._fit_in_flight(reader.max_range_bytes, url)
            else:
                cached = self._whole.pop(number, None) or self._download_whole(number)
                reader = CachedShardReader(self.manifest.backend, cached, url=url)
        except (StorageError, ShardCorruptError) as exc:
            raise self._diagnose(info, url, exc) from exc
        except FileNotFoundError as exc:
            raise self._missing(info, url) from exc
        self._readers.add(reader)
        return reader

    def _fit_in_flight(self, max_range_bytes: int, url: str) -> None:
        """Fit what this process downloads ahead into its share of the budget, or fail at once.

        Every reading process of the node (DataLoader workers times ``LOCAL_WORLD_SIZE``)
        holds the range it reads plus those it has in flight; when the budget cannot
        hold the options' in-flight limits for all of them, the limits shrink to fit,
        down to one range ahead; below that the read fails saying the minimum.

        Raises:
            CacheBudgetError: the budget cannot hold two ranges per reading process.
        """
        _remote, options = self._remote()
        assert options.max_cache_bytes is not None
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        processes = max(1, self.num_processes) * max(1, local_world)
        self.cache().require(
            min_cache_bytes(max_range_bytes, max_in_flight=1, num_processes=processes),
            what=f"the ranges {processes} reading process(es) need at least (one ahead + the "
                 f"one read, up to {max_range_bytes} bytes each, for {url})")
        want = in_flight_bytes(max_range_bytes, max_in_flight=options.max_in_flight,
                               max_in_flight_bytes=options.max_in_flight_bytes)
        ahead = min(want, options.max_cache_bytes // processes - max_range_bytes)
        # two ranges always go (ReadAhead): one only when two of these would not fit; the
        # count is otherwise left alone, as one shard with a large range would keep it
        # low for all the others
        one = ahead < MIN_IN_FLIGHT * max_range_bytes
        self._ahead_here().limit(max_in_flight=1 if one else options.max_in_flight,
                                 max_in_flight_bytes=ahead)

    def _missing(self, info: ShardInfo, url: str) -> ShardMissingError:
        return ShardMissingError(
            f"{url}: shard {info.name} named by {self.root}/{MANIFEST_NAME} is missing; "
            "restore the object or re-pack the dataset",
            path=url,
        )

    def _diagnose(self, info: ShardInfo, url: str, exc: ShardioError) -> ShardioError:
        """Name a wrong size or a missing object when a fetch fails; else ``exc`` itself."""
        remote, _options = self._remote()
        try:
            size = remote.store.size(info.name)
        except FileNotFoundError:
            return self._missing(info, url)
        except ShardioError:
            return exc
        if size != info.num_bytes:
            return TruncatedShardError(
                f"{url}: shard is {size} bytes but the manifest says {info.num_bytes}; it was "
                "truncated or replaced: restore it from a copy or re-pack",
                path=url,
            )
        return exc

    def _download_whole(self, number: int) -> CachedRange:
        """Shard ``number`` whole in the cache, checked against the manifest's file checksum."""
        remote, _options = self._remote()
        info = self.manifest.shards[number]
        url = self.shard_url(number)

        def check(view: memoryview) -> None:
            name = name_of(info.checksum)
            actual = digest(name, compute(name, view))
            if actual != info.checksum:
                raise ChecksumError(
                    f"{url}: file checksum is {actual} but the manifest says {info.checksum} "
                    "(downloaded twice); the shard is corrupt: restore it from a copy or re-pack",
                    path=url,
                )

        self.cache().require(info.num_bytes, what=f"the whole shard {url}")
        return self.cache().open_file(remote.store, info.name, size=info.num_bytes,
                                      version=remote.version, check=check)

    def shard_file(self, number: int) -> Path:
        """A local file holding shard ``number`` whole: the file itself, or a held cache copy.

        A remote shard is downloaded whole and checked against the manifest's file
        checksum; it stays held until ``release(number)`` or until ``open_shard``
        hands it to the reader that opens it.

        Raises:
            ShardMissingError, TruncatedShardError, ChecksumError, StorageError: as
                ``open_shard``.
        """
        if self.remote is None:
            assert isinstance(self.root, Path)
            return self.root / self.manifest.shards[number].name
        if number not in self._whole:
            info = self.manifest.shards[number]
            url = self.shard_url(number)
            try:
                self._whole[number] = self._download_whole(number)
            except (StorageError, ShardCorruptError) as exc:
                raise self._diagnose(info, url, exc) from exc
            except FileNotFoundError as exc:
                raise self._missing(info, url) from exc
        return self._whole[number].path

    def release(self, number: int) -> None:
        """Release a whole copy of shard ``number`` that no reader took."""
        cached = self._whole.pop(number, None)
        if cached is not None:
            cached.close()

    def close(self) -> None:
        """Stop the threads of this process and release everything fetched ahead or held."""
        if self._pid != os.getpid():
            self._after_fork()
            return
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        self._tails.clear()
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None
        for number in list(self._whole):
            self.release(number)
