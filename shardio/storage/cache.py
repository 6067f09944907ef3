"""The node cache: byte ranges of remote objects kept as files, shared by all processes of a node.

A reader asks for bytes ``start..stop`` of one object of one dataset version
and gets a ``CachedRange``: a local file it may map or ``pread``, which it
holds (a shared flock) until it closes it; eviction never removes a held range.
The first process to want a range takes the range's download lock, reserves
its bytes against ``max_cache_bytes`` (``budget.py``), streams it into a
partial file, runs the caller's ``check`` (once more after a fresh download if
it fails, then the error stands) and renames it into place. Processes that
want the same range meanwhile wait on the download lock and then find it
complete, so each range is downloaded once per node. Keys hold a namespace per
dataset URL and manifest checksum, so a dataset re-packed at the same URL never
reads a stale range, and old versions age out by LRU. Ranges are not fsynced:
the cache can always be downloaded again, and a range of the wrong size is
discarded on open.

The folder must be on a node-local filesystem (flock over NFS cannot be
trusted). Local datasets never come here: they are read in place. Imports
``errors`` and the storage modules below it; no fsspec, no torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import re
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardio.errors import CacheBudgetError, ShardCorruptError
from shardio.storage.budget import BUDGET_LOCK, LOCKS, PARTIAL, Budget, CacheUsage, Reservation
from shardio.storage.cachedrange import CachedRange
from shardio.storage.store import Store, check_range

RangeCheck = Callable[[memoryview], None]
"""Verifies a downloaded range (e.g. its record CRCs); raises ``ShardCorruptError`` if bad."""

DEFAULT_WAIT_S = 120.0


def default_cache_dir() -> Path:
    """The per-user cache folder: ``$SHARDIO_CACHE_DIR``, else ``$XDG_CACHE_HOME/shardio``,
    else ``~/.cache/shardio``."""
    explicit = os.environ.get("SHARDIO_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shardio"


def dataset_namespace(url: str, version: str) -> str:
    """A file-name-safe key for one dataset URL at one version (its manifest checksum)."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", url.rstrip("/").rsplit("/", 1)[-1])[:32]
    digest = hashlib.sha256(f"{url}\0{version}".encode()).hexdigest()[:16]
    return f"{tail}-{digest}"


def range_key(namespace: str, name: str, start: int, stop: int) -> str:
    """The file name of bytes ``start..stop`` of object ``name`` in ``namespace``."""
    quoted = urllib.parse.quote(name, safe="")
    if len(quoted) > 100:  # stay well under 255 bytes with the suffixes budget.py adds
        quoted = f"{quoted[:60]}~{hashlib.sha256(name.encode()).hexdigest()[:16]}"
    return f"{namespace}~{quoted}@{start}-{stop}"


@dataclass
class CacheStats:
    """What one ``RangeCache`` did in this process."""

    hits: int = 0
    downloads: int = 0
    refetches: int = 0
    """Downloads repeated because the caller's check failed."""


_CACHES: weakref.WeakSet[RangeCache] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """Drop what a forked child inherited from downloads in flight in its parent's threads.

    A thread downloading at the fork holds the range's download lock and its
    partial file through descriptors (flocks belong to the open file, which
    the child shares); those threads do not exist in the child, so nothing
    would ever close the child's copies, and the child waiting for that same
    download lock would wait forever. Lock and partial files are only ever
    held by such short-lived frames, never by objects a child keeps, so their
    descriptors are closed here (found through ``/proc/self/fd``; elsewhere,
    nothing is done). Each cache's thread lock is made anew too.
    """
    roots = set()
    for cache in list(_CACHES):
        cache._lock = threading.Lock()
        roots.add(os.path.realpath(cache.root))
    if not roots:
        return
    held = tuple(os.path.join(root, sub) + os.sep for root in roots for sub in (LOCKS, PARTIAL))
    budget_locks = {os.path.join(root, BUDGET_LOCK) for root in roots}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}").removesuffix(" (deleted)")
        except OSError:
            continue
        if target.startswith(held) or target in budget_locks:
            with contextlib.suppress(OSError):
                os.close(int(name))


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data = data[written:]
        offset += written


class RangeCache:
    """Remote byte ranges cached in one folder under a hard byte budget; thread- and fork-safe."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, *, max_cache_bytes: int,
                 wait_s: float = DEFAULT_WAIT_S) -> None:
        """Open (or create) the cache folder.

        Args:
            cache_dir: the folder, shared by every process and job of the node that names
                it; default ``default_cache_dir()``. Datasets are kept apart inside it.
            max_cache_bytes: the hard budget of the whole folder, partial downloads included.
            wait_s: how long a download waits for other processes to release space before
                ``CacheBudgetError``.
        """
        self.root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.max_cache_bytes = max_cache_bytes
        self.wait_s = wait_s
        self._budget = Budget(self.root, max_cache_bytes)
        self.stats = CacheStats()
        self._held = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()
        _CACHES.add(self)

    def __repr__(self) -> str:
        return f"RangeCache({str(self.root)!r}, max_cache_bytes={self.max_cache_bytes})"

    def __getstate__(self) -> dict[str, object]:
        """What a spawned worker needs: the folder and the budget; it holds nothing yet."""
        return {"root": self.root, "max_cache_bytes": self.max_cache_bytes, "wait_s": self.wait_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], max_cache_bytes=state["max_cache_bytes"],  # type: ignore[misc]
                      wait_s=state["wait_s"])

    @property
    def evictions(self) -> int:
        """Ranges this process evicted."""
        return self._budget.evictions

    @property
    def reclaimed(self) -> int:
        """Partial downloads of dead processes this process deleted."""
        return self._budget.reclaimed

    @property
    def held_bytes(self) -> int:
        """Bytes of ranges this process holds open or is downloading (they cannot be evicted)."""
        return self._own_bytes()

    def usage(self) -> CacheUsage:
        """What the folder holds now, as the budget counts it."""
        return self._budget.usage()

    def require(self, num_bytes: int, *, what: str = "the ranges in flight") -> None:
        """Fail at once unless the budget can hold ``num_bytes`` (what readers need at once).

        Raises:
            CacheBudgetError: naming the minimum.
        """
        if num_bytes > self.max_cache_bytes:
            raise CacheBudgetError(
                f"{self.root}: max_cache_bytes={self.max_cache_bytes} is smaller than "
                f"{what} ({num_bytes} bytes); the minimum is {num_bytes} bytes: raise "
                "max_cache_bytes, or read with fewer workers or fewer ranges in flight",
                path=self.root,
            )

    def _add_held(self, num_bytes: int) -> None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child holds nothing of its own yet
                self._pid, self._held = os.getpid(), 0
            self._held += num_bytes

    def _own_bytes(self) -> int:
        return self._held if self._pid == os.getpid() else 0

    def open_range(self, store: Store, name: str, start: int, stop: int, *, version: str,
                   check: RangeCheck | None = None) -> CachedRange:
        """Bytes ``start..stop`` of ``name`` from the cache, downloading them once per node.

        Args:
            store: a remote store (local stores are read in place, never cached).
            name: the object, relative to the store's root.
            start: first byte.
            stop: byte after the last; callers use fixed, record-aligned ranges so that
                every process asks for the same keys.
            version: the dataset version, e.g. the manifest's checksum.
            check: verifies a fresh download; on failure it is downloaded once more, then
                the check's error is raised.

        Raises:
            CacheBudgetError: the range does not fit next to those in use.
            ShardCorruptError: ``check`` failed twice.
            StorageError, FileNotFoundError: the store could not deliver.
        """
        if store.local_path(name) is not None:
            raise ValueError(
                f"{store.url}: local datasets are read in place (store.local_path), not cached")
        check_range(name, start, stop)
        key = range_key(dataset_namespace(store.url, version), name, start, stop)
        hit = self._open_complete(key, name, start, stop)
        if hit is None:
            with self._download_lock(key):  # another process may be downloading it: wait
                hit = self._open_complete(key, name, start, stop)
                if hit is None:
                    return self._download(store, key, name, start, stop, check)
        self.stats.hits += 1
        return hit

    def open_cached(self, store: Store, name: str, start: int, stop: int, *,
                    version: str) -> CachedRange | None:
        """Bytes ``start..stop`` of ``name`` if the cache holds them complete now, else None:
        ``open_range`` without the download (a reader looking ahead, which must not wait)."""
        key = range_key(dataset_namespace(store.url, version), name, start, stop)
        hit = self._open_complete(key, name, start, stop)
        if hit is not None:
            self.stats.hits += 1
        return hit

    def holds(self, store: Store, name: str, start: int, stop: int, *, version: str) -> bool:
        """Whether bytes ``start..stop`` of ``name`` are in the cache now, complete (they may
        still be evicted before they are opened: a hint, never a hold)."""
        key = range_key(dataset_namespace(store.url, version), name, start, stop)
        return self._budget.range_path(key).exists()

    def mark_used(self, store: Store, name: str, start: int, stop: int, *, version: str) -> bool:
        """Whether bytes ``start..stop`` of ``name`` are in the cache now; if so their last
        use is now, so eviction takes ranges used longer ago first (a reader that plans to
        open them soon; like ``holds``, a hint, never a hold)."""
        key = range_key(dataset_namespace(store.url, version), name, start, stop)
        now = time.time_ns()
        try:
            os.utime(self._budget.range_path(key), ns=(now, now))
        except FileNotFoundError:
            return False
        return True

    def open_file(self, store: Store, name: str, *, size: int, version: str,
                  check: RangeCheck | None = None) -> CachedRange:
        """The whole object ``name`` of ``size`` bytes as one cache file (an LMDB shard)."""
        return self.open_range(store, name, 0, size, version=version, check=check)

    def _open_complete(self, key: str, name: str, start: int, stop: int) -> CachedRange | None:
        path = self._budget.range_path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while an evictor unlinks it
            st = os.fstat(fd)
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            if current is None or (current.st_ino, current.st_dev) != (st.st_ino, st.st_dev):
                os.close(fd)  # evicted between open and lock
                return None
            if st.st_size != stop - start:  # a crash between write and rename on some fs
                os.close(fd)
                self._budget.discard(key)
                return None
            now = time.time_ns()  # last use, for LRU; the fine clock, not the fs's coarse one
            os.utime(fd, ns=(now, now))
        except BaseException:
            os.close(fd)
            raise
        self._add_held(stop - start)
        return CachedRange(fd, path, name=name, start=start, stop=stop, release=self._release)

    def _release(self, num_bytes: int) -> None:
        self._add_held(-num_bytes)

    @contextmanager
    def _download_lock(self, key: str) -> Iterator[None]:
        path = self._budget.lock_path(key)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            st = os.fstat(fd)
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            if current is not None and (current.st_ino, current.st_dev) == (st.st_ino, st.st_dev):
                break
            os.close(fd)  # eviction deleted the lock file while we waited: take the new one
        try:
            yield
        finally:
            os.close(fd)

    def _download(self, store: Store, key: str, name: str, start: int, stop: int,
                  check: RangeCheck | None) -> CachedRange:
        size = stop - start
        reservation = self._budget.reserve(key, size, own_bytes=self._own_bytes,
                                           wait_s=self.wait_s)
        self._add_held(size)
        try:
            for attempt in (0, 1):
                store.read_range_into(name, start, stop, lambda offset, chunk: _pwrite_all(
                    reservation.fd, chunk, offset))
                try:
                    if check is not None:
                        self._check(reservation, check)
                    break
                except ShardCorruptError:
                    if attempt:
                        raise
                    self.stats.refetches += 1
            path = self._budget.commit(reservation, key)
        except BaseException:
            self._budget.abort(reservation)
            self._add_held(-size)
            raise
        self.stats.downloads += 1
        return CachedRange(reservation.fd, path, name=name, start=start, stop=stop,
                           release=self._release)

    @staticmethod
    def _check(reservation: Reservation, check: RangeCheck) -> None:
        mapped = mmap.mmap(reservation.fd, reservation.num_bytes, access=mmap.ACCESS_READ)
        view = memoryview(mapped)
        try:
            check(view)
        finally:
            view.release()
            with contextlib.suppress(BufferError):  # the check kept a view: the map goes with it
                mapped.close()
