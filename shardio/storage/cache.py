"""The node cache: byte ranges of remote objects kept as files, shared by all processes of a node.

A reader asks for bytes ``start..stop`` of one object of one dataset version
and gets a ``CachedRange``: a local file it may map or ``pread``, which it
holds (a shared flock) until it closes it; eviction never removes a held range.
The first process to want a range takes the range's download lock, reserves
its bytes against ``max_cache_bytes`` (``budget.py``), streams it into a
partial file, runs the caller's ``check`` (once more after a fresh download if
it fails, then the error stands) and renames it into place: nothing enters the
cache unchecked, so one bad reply is never served again. Processes that want
the same range meanwhile wait for the download lock and then find it complete,
so each range is downloaded once per node. That wait is bounded: a holder
whose partial file has not grown for ``stall_s`` (a process stopped by SIGSTOP
or a scheduler) is passed over, and the waiter downloads the range itself.
Keys hold a namespace per dataset URL and manifest checksum, so a dataset
re-packed at the same URL never reads a stale range, and old versions age out
by LRU. Ranges are not fsynced: the cache can always be downloaded again. A
range of the wrong size is discarded on open, and so is one that fails the
caller's ``check`` (the first time each process opens it: the node's disk may
have damaged it), which is then downloaded again.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardio.errors import CacheBudgetError, ChecksumError, ShardCorruptError, StorageError
from shardio.storage.budget import BUDGET_LOCK, LOCKS, PARTIAL, Budget, CacheUsage
from shardio.storage.cachedrange import CachedRange
from shardio.storage.sharing import WAITING
from shardio.storage.store import Store, check_range

RangeCheck = Callable[[memoryview], None]
"""Verifies a downloaded range (e.g. its record CRCs); raises ``ShardCorruptError`` if bad."""

DEFAULT_WAIT_S = 120.0
DEFAULT_STALL_S = 30.0
"""How long another process's download of a range may make no progress before a process
waiting for that range downloads it itself: a stopped process (SIGSTOP, a scheduler's
suspend, Ctrl-Z) keeps its locks, and waiting for it had no end. Long enough that a
download between two retries of a slow store is not repeated (each retry waits less)."""
MAX_CHECKED = 1 << 16
"""Cache files this process remembers having checked (then forgets them all and checks
again): a range is checked once per process, not once per open (a random-access reader
opens one range per sample)."""


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
    discarded: int = 0
    """Cached ranges that failed the caller's check, deleted and downloaded again."""
    takeovers: int = 0
    """Ranges downloaded while another process held their download without progress."""
    reused: int = 0
    """Bytes of downloaded ranges copied from parts of them cached on their own."""


class _DamagedCopy(Exception):
    """A cached range failed its check (and was discarded); ``error`` says how."""

    def __init__(self, path: Path, error: ShardCorruptError) -> None:
        super().__init__(str(path))
        self.path = path
        self.error = error


_CACHES: weakref.WeakSet[RangeCache] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """Drop what a forked child inherited from downloads in flight in its parent's threads.

    A thread downloading at the fork holds the range's download lock and its
    partial file through descriptors (flocks belong to the open file, which
    the child shares); those threads do not exist in the child, so nothing
    would ever close the child's copies, and the child waiting for that same
    download lock would wait forever. Lock, partial and waiting files
    (``budget.py``, ``sharing.py``) are only ever held by such short-lived
    frames, never by objects a child keeps, so their descriptors are closed
    here (found through ``/proc/self/fd``; elsewhere, nothing is done). Each
    cache's thread lock is made anew too.
    """
    roots = set()
    for cache in list(_CACHES):
        cache._lock = threading.Lock()
        roots.add(os.path.realpath(cache.root))
    if not roots:
        return
    held = tuple(os.path.join(root, sub) + os.sep for root in roots
                 for sub in (LOCKS, PARTIAL, WAITING))
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


def _read_into(store: Store, name: str, start: int, stop: int, fd: int, at: int) -> None:
    """Download bytes ``start..stop`` of ``name`` into ``fd`` from its byte ``at``."""
    store.read_range_into(name, start, stop, lambda offset, chunk: _pwrite_all(
        fd, chunk, at + offset))


class RangeCache:
    """Remote byte ranges cached in one folder under a hard byte budget; thread- and fork-safe."""

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, *, max_cache_bytes: int,
                 wait_s: float = DEFAULT_WAIT_S, stall_s: float = DEFAULT_STALL_S) -> None:
        """Open (or create) the cache folder.

        Args:
            cache_dir: the folder, shared by every process and job of the node that names
                it; default ``default_cache_dir()``. Datasets are kept apart inside it.
            max_cache_bytes: the hard budget of the whole folder, partial downloads included.
            wait_s: how long a download waits for other processes to release space before
                ``CacheBudgetError``.
            stall_s: how long another process's download of a wanted range may make no
                progress before this process downloads the range itself.
        """
        self.root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.max_cache_bytes = max_cache_bytes
        self.wait_s = wait_s
        self.stall_s = stall_s
        self._budget = Budget(self.root, max_cache_bytes)
        self.stats = CacheStats()
        self._held = 0
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._checked: set[tuple[int, int]] = set()
        """``(st_dev, st_ino)`` of cache files this process checked (``MAX_CHECKED``)."""
        _CACHES.add(self)

    def __repr__(self) -> str:
        return f"RangeCache({str(self.root)!r}, max_cache_bytes={self.max_cache_bytes})"

    def __getstate__(self) -> dict[str, object]:
        """What a spawned worker needs: the folder and the budget; it holds nothing yet."""
        return {"root": self.root, "max_cache_bytes": self.max_cache_bytes, "wait_s": self.wait_s,
                "stall_s": self.stall_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], max_cache_bytes=state["max_cache_bytes"],  # type: ignore[misc]
                      wait_s=state["wait_s"], stall_s=state.get("stall_s", DEFAULT_STALL_S))

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
                   check: RangeCheck | None = None,
                   parts: tuple[tuple[int, int], ...] = ()) -> CachedRange:
        """Bytes ``start..stop`` of ``name`` from the cache, downloading them once per node.

        Args:
            store: a remote store (local stores are read in place, never cached).
            name: the object, relative to the store's root.
            start: first byte.
            stop: byte after the last; callers use fixed, record-aligned ranges so that
                every process asks for the same keys.
            version: the dataset version, e.g. the manifest's checksum.
            check: verifies every byte of the range: a fresh download (on failure it is
                downloaded once more, then the check's error is raised) and, the first
                time this process opens it, a cached copy (on failure it is discarded and
                downloaded again).
            parts: spans ``(a, b)`` within ``start..stop`` that may be cached as ranges of
                their own: a download copies those it finds and fetches only the rest
                (``check`` still verifies the whole; a second try fetches it all).

        Raises:
            CacheBudgetError: the range does not fit next to those in use.
            ShardCorruptError: ``check`` failed on two downloads (the message names the
                object); ``ChecksumError`` naming the cache file when a cached copy failed
                it and the store could not be read to replace it.
            StorageError, FileNotFoundError: the store could not deliver.
        """
        if store.local_path(name) is not None:
            raise ValueError(
                f"{store.url}: local datasets are read in place (store.local_path), not cached")
        check_range(name, start, stop)
        namespace = dataset_namespace(store.url, version)
        key = range_key(namespace, name, start, stop)
        part_keys = [(a, b, range_key(namespace, name, a, b)) for a, b in sorted(parts)
                     if start <= a < b <= stop and (a, b) != (start, stop)]
        damaged: _DamagedCopy | None = None

        def cached() -> CachedRange | None:
            """The complete cached copy, counted as a hit; None (a damaged one remembered)."""
            nonlocal damaged
            try:
                hit = self._open_complete(key, name, start, stop, check)
            except _DamagedCopy as exc:
                hit, damaged = None, exc
            if hit is not None:
                self.stats.hits += 1
            return hit

        for attempt in (0, 1):
            if (hit := cached()) is not None:
                return hit
            fd, holder = self._lock_download(key)
            if fd is None and holder is None:
                if not attempt:
                    continue  # completed by its downloader while we waited: open it
                holder = "another process"  # yet it cannot be opened (evicted, or locked)
            try:
                if (hit := cached()) is not None:
                    return hit
                if holder is not None:
                    self.stats.takeovers += 1
                return self._fetch(store, key, name, start, stop, check, damaged, holder,
                                   part_keys)
            finally:
                if fd is not None:
                    os.close(fd)
        raise AssertionError("unreachable")  # pragma: no cover

    def _fetch(self, store: Store, key: str, name: str, start: int, stop: int,
               check: RangeCheck | None, damaged: _DamagedCopy | None,
               holder: str | None, part_keys: Sequence[tuple[int, int, str]]) -> CachedRange:
        """``_download``, its errors saying what the store was never asked (a damaged cached
        copy it could not replace) or who holds the download it took over."""
        try:
            return self._download(store, key, name, start, stop, check, part_keys)
        except (ShardCorruptError, FileNotFoundError):
            raise  # the store's own copy failed the check, or is gone: the message says so
        except (StorageError, OSError, CacheBudgetError) as exc:
            if damaged is not None:
                where = ("" if damaged.error.record is None
                         else f" at record {damaged.error.record}")
                raise ChecksumError(
                    f"{damaged.path}: this node cache's copy of bytes {start}..{stop} of "
                    f"{name} failed its check{where} and was deleted (the node's disk damaged "
                    f"it; the store's copy was not checked), and fetching it again failed: "
                    f"{exc}; read again once the store answers",
                    path=damaged.path, record=damaged.error.record,
                ) from exc
            if holder is not None and isinstance(exc, CacheBudgetError):
                raise CacheBudgetError(
                    f"{exc}; {holder} holds the download of bytes {start}..{stop} of {name} "
                    f"and has made no progress for over {self.stall_s:g} s (stopped or "
                    "suspended?): resume or end it",
                    path=self.root,
                ) from exc
            raise

    def open_cached(self, store: Store, name: str, start: int, stop: int, *,
                    version: str, check: RangeCheck | None = None) -> CachedRange | None:
        """Bytes ``start..stop`` of ``name`` if the cache holds them complete now, else None:
        ``open_range`` without the download (a reader looking ahead, which must not wait).
        A cached copy failing ``check`` is discarded (None)."""
        key = range_key(dataset_namespace(store.url, version), name, start, stop)
        try:
            hit = self._open_complete(key, name, start, stop, check)
        except _DamagedCopy:
            return None
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

    def _open_complete(self, key: str, name: str, start: int, stop: int,
                       check: RangeCheck | None = None) -> CachedRange | None:
        """The complete range ``key``, held, or None if absent.

        Raises:
            _DamagedCopy: it failed ``check`` (run once per process and file) and was deleted.
        """
        path = self._budget.range_path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            verdict = self._inspect(fd, path, stop - start, check)
        except BaseException:
            os.close(fd)
            raise
        if verdict != "ok":
            os.close(fd)
            if verdict == "gone":  # evicted between open and lock, or its lock never came
                return None
            self._budget.discard(key)
            if verdict == "short":  # a crash between write and rename on some fs
                return None
            assert isinstance(verdict, ShardCorruptError)
            self.stats.discarded += 1
            raise _DamagedCopy(path, verdict) from verdict
        self._add_held(stop - start)
        return CachedRange(fd, path, name=name, start=start, stop=stop, release=self._release)

    def _inspect(self, fd: int, path: Path, num_bytes: int,
                 check: RangeCheck | None) -> str | ShardCorruptError:
        """Lock the range file open as ``fd`` shared and judge it: ``ok`` (its last use is
        now), ``gone`` (evicted, or an evictor stopped in the act), ``short``, or the
        error of ``check`` (run once per process and file)."""
        if not self._lock_shared(fd):
            return "gone"
        st = os.fstat(fd)
        try:
            current = os.stat(path)
        except FileNotFoundError:
            return "gone"
        if (current.st_ino, current.st_dev) != (st.st_ino, st.st_dev):
            return "gone"
        if st.st_size != num_bytes:
            return "short"
        identity = (st.st_dev, st.st_ino)
        if check is not None and identity not in self._checked:
            try:
                self._check(fd, num_bytes, check)
            except ShardCorruptError as exc:
                return exc
            if len(self._checked) >= MAX_CHECKED:
                self._checked.clear()
            self._checked.add(identity)
        now = time.time_ns()  # last use, for LRU; the fine clock, not the fs's coarse one
        os.utime(fd, ns=(now, now))
        return "ok"

    def _lock_shared(self, fd: int) -> bool:
        """Take a range file's shared lock, waiting while an evictor (or the committing
        downloader) holds it exclusively: a moment, unless that process is stopped, so
        at most ``stall_s``. Returns whether it was taken."""
        deadline = time.monotonic() + self.stall_s
        delay = 0.0005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
            time.sleep(delay)
            delay = min(2 * delay, 0.02)

    def _release(self, num_bytes: int) -> None:
        self._add_held(-num_bytes)

    def _lock_download(self, key: str) -> tuple[int | None, str | None]:
        """Take range ``key``'s download lock, waiting while another process downloads it.

        Returns ``(fd, None)`` holding the lock; ``(None, None)`` once the range is in
        the cache (its downloader finished); ``(None, holder)`` when the holder has made
        no progress for ``stall_s``: its partial file has not grown, or it has none (a
        stopped process keeps its flocks; blocking on them waited for ever), and the
        caller downloads the range itself. ``holder`` names it ("process 123").
        """
        path = self._budget.lock_path(key)
        final = self._budget.range_path(key)
        progress, progress_at = self._download_progress(key), time.monotonic()
        delay = 0.0005
        fd = self._budget.open_lock(key)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            else:
                st = os.fstat(fd)
                try:
                    current = os.stat(path)
                except FileNotFoundError:
                    current = None
                if current is not None and (current.st_ino, current.st_dev) == (
                        st.st_ino, st.st_dev):
                    return fd, None
                os.close(fd)  # eviction deleted the lock file while we waited: take the new one
                fd = self._budget.open_lock(key)
                continue
            if final.exists():
                os.close(fd)
                return None, None
            now, seen = time.monotonic(), self._download_progress(key)
            if seen != progress:
                progress, progress_at = seen, now
            elif now - progress_at >= self.stall_s:
                os.close(fd)
                pids = sorted({n.rsplit(".", 1)[-1].split("-", 1)[0] for n, _s, _t in seen})
                return None, f"process {', '.join(pids)}" if pids else "another process"
            time.sleep(delay)
            delay = min(2 * delay, 0.02)

    def _download_progress(self, key: str) -> tuple[tuple[str, int, int], ...]:
        """``(name, size, mtime)`` of the partial files downloading range ``key`` (named
        ``<key>.<bytes>.<pid>-<token>`` by ``budget.py``): what grows while it downloads."""
        found = []
        prefix = f"{key}."  # a quoted name holds no "@", so no other key starts with this
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self._budget.root / PARTIAL):
                if entry.name.startswith(prefix):
                    with contextlib.suppress(FileNotFoundError):
                        st = entry.stat()
                        found.append((entry.name, st.st_size, st.st_mtime_ns))
        return tuple(sorted(found))

    def _download(self, store: Store, key: str, name: str, start: int, stop: int,
                  check: RangeCheck | None,
                  part_keys: Sequence[tuple[int, int, str]] = ()) -> CachedRange:
        size = stop - start
        reservation = self._budget.reserve(key, size, own_bytes=self._own_bytes,
                                           wait_s=self.wait_s)
        self._add_held(size)
        try:
            for attempt in (0, 1):
                copied = [] if attempt else self._copy_parts(part_keys, name, start,
                                                             reservation.fd)
                at = start
                for lo, hi in [*copied, (stop, stop)]:
                    if at < lo:
                        _read_into(store, name, at, lo, reservation.fd, at - start)
                    at = max(at, hi)
                try:
                    if check is not None:
                        self._check(reservation.fd, size, check)
                    break
                except ShardCorruptError:
                    if attempt:
                        raise
                    self.stats.refetches += 1
            # a stalled downloader, resumed, finds the range that another process took
            # over and committed: it keeps that one (replacing it would leave the copy
            # its readers hold on disk, uncounted by the budget)
            other = self._open_complete(key, name, start, stop) if self._budget.range_path(
                key).exists() else None
            if other is not None:
                self._budget.abort(reservation)
                self._add_held(-size)
                return other
            path = self._budget.commit(reservation, key)
        except BaseException:
            self._budget.abort(reservation)
            self._add_held(-size)
            raise
        self.stats.downloads += 1
        if check is not None:
            st = os.fstat(reservation.fd)
            self._checked.add((st.st_dev, st.st_ino))
        return CachedRange(reservation.fd, path, name=name, start=start, stop=stop,
                           release=self._release)

    def _copy_parts(self, part_keys: Sequence[tuple[int, int, str]], name: str, start: int,
                    fd: int) -> list[tuple[int, int]]:
        """Copy the ``parts`` of a range that are cached now into its download file ``fd``
        (which holds the range from ``start``); the spans copied, in order.

        A first batch's records are downloaded on their own before their ranges. Each range
        downloaded them again, and a cap on those bytes (``HEAD_SHARE`` in ``git show
        59fb72b:shardio/reading/stream.py``) left the first batches of ``bench_remote
        --quick`` waiting for whole ranges: 1.2 s with 0 workers and 2.0 s with 2. With the
        copies and no cap, 0.35 and 0.55 s for 1.00 and 1.03 times the stored bytes
        downloaded (``python -m benchmarks.bench_remote --quick``,
        ``benchmarks/results/remote-quick.json``). A copy needs no check of its own: the
        range's check covers it.
        """
        copied: list[tuple[int, int]] = []
        for a, b, part_key in part_keys:
            if copied and a < copied[-1][1]:
                continue  # overlaps one copied already
            try:
                part = self._open_complete(part_key, name, a, b)
            except _DamagedCopy:
                part = None
            if part is None:
                continue
            try:
                _pwrite_all(fd, memoryview(part.read()), a - start)
            finally:
                part.close()
            copied.append((a, b))
            self.stats.reused += b - a
        return copied

    @staticmethod
    def _check(fd: int, num_bytes: int, check: RangeCheck) -> None:
        mapped = mmap.mmap(fd, num_bytes, access=mmap.ACCESS_READ)
        view = memoryview(mapped)
        try:
            check(view)
        finally:
            view.release()
            with contextlib.suppress(BufferError):  # the check kept a view: the map goes with it
                mapped.close()
