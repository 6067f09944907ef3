"""The node cache's byte budget: reserve before a download, evict least-recently-used unused ranges.

Every file the cache owns lives under its root (nothing in /dev/shm, nothing
that outlives a crash anywhere else)::

    .budget.lock                    flock'd exclusively while space is counted or changed
    ranges/<key>                    complete ranges; mtime = last use; readers hold LOCK_SH
    partial/<key>.<bytes>.<token>   downloads in flight; the name says the bytes reserved;
                                    the downloader holds LOCK_EX until it renames it or dies
    locks/<key>.lock                per-range download locks (empty files)

Processes agree on the usage by counting those files under the budget lock:
complete ranges at the size their names say (``…@start-stop``, ``cache.range_key``:
a listing, no ``stat`` per file), partial files at the size they reserved. A
reservation creates its partial file under that lock, so the folder never
holds more than the budget, downloads in flight included. A partial file whose
lock is free belongs to a dead process (flocks die with their process, so a
reused pid cannot fool this) and is deleted by the next count. Eviction takes
LOCK_EX|LOCK_NB on a range file, so a range any reader holds is skipped, and
the oldest unused ranges go first. Imports only ``errors``.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from shardio.errors import CacheBudgetError

RANGES, PARTIAL, LOCKS = "ranges", "partial", "locks"
BUDGET_LOCK = ".budget.lock"
EVICT_SLACK = 32
"""An eviction frees up to 1/32 of the budget more than the download needs, in whole ranges:
eviction stats every range (for the least recently used), under the budget lock that every
download takes; under a full budget of small ranges (one plan block, ~190 KB) that was done
for every download, 0.7 s of CPU in one 871-range epoch and the downloads waiting on it."""


@dataclass(frozen=True)
class CacheUsage:
    """What a cache folder holds, as the budget counts it."""

    range_bytes: int
    num_ranges: int
    partial_bytes: int
    """Bytes reserved by downloads in flight (their files are at most this large)."""
    num_partial: int

    @property
    def total_bytes(self) -> int:
        """Bytes counted against the budget."""
        return self.range_bytes + self.partial_bytes


@dataclass(frozen=True)
class Reservation:
    """Space reserved for one download: its partial file, open and exclusively locked."""

    fd: int
    path: Path
    num_bytes: int


def _try_lock(path: str | Path, kind: int) -> int | None:
    """An fd of ``path`` holding ``kind`` (with LOCK_NB), or None when held elsewhere or gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _same_file(fd: int, path: str | Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not unlinked or replaced)."""
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    st = os.fstat(fd)
    return (st.st_ino, st.st_dev) == (current.st_ino, current.st_dev)


def _range_bytes(name: str) -> int | None:
    """The size of a complete range as its name says (``…@start-stop``), if it says one."""
    _head, at, span = name.rpartition("@")
    start, dash, stop = span.partition("-")
    if not (at and dash and start.isdigit() and stop.isdigit()):
        return None
    return int(stop) - int(start)


def _reserved_bytes(name: str) -> int | None:
    parts = name.rsplit(".", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


class Budget:
    """The space accounting of one cache folder, shared by every process that opens it."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_cache_bytes must be positive, got {max_bytes}")
        self.root = root
        self.max_bytes = max_bytes
        for sub in (RANGES, PARTIAL, LOCKS):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.evictions = 0
        self.reclaimed = 0
        self._partials: set[str] = set()
        """Partial files this process is downloading into: alive, so not lock-tested."""
        self._partials_pid = os.getpid()

    def range_path(self, key: str) -> Path:
        """Where the complete range ``key`` lives."""
        return self.root / RANGES / key

    def lock_path(self, key: str) -> Path:
        """The download lock file of range ``key``."""
        return self.root / LOCKS / f"{key}.lock"

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the folder's budget lock (a fresh descriptor: threads exclude each other too)."""
        fd = os.open(self.root / BUDGET_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _scan(self, *, mtimes: bool = True) -> tuple[int, int, list[tuple[int, int, str]]]:
        """``(partial bytes, partial files, [(mtime, size, path) of ranges])``; reclaims stale.

        Partials are listed before ranges so that a download renamed in between is
        counted twice, never missed. ``mtimes=False``: sizes from the names and mtimes 0
        (no ``stat``), enough to count the usage.
        """
        partial_bytes = num_partial = 0
        mine = self._own_partials()
        for entry in os.scandir(self.root / PARTIAL):
            fd = None if entry.path in mine else _try_lock(entry.path, fcntl.LOCK_EX)
            if fd is not None:  # nobody downloads into it: its process died
                try:
                    os.unlink(entry.path)
                    self.reclaimed += 1
                except FileNotFoundError:
                    pass
                finally:
                    os.close(fd)
                continue
            reserved = _reserved_bytes(entry.name)
            partial_bytes += reserved if reserved is not None else entry.stat().st_size
            num_partial += 1
        ranges = []
        for entry in os.scandir(self.root / RANGES):
            size = None if mtimes else _range_bytes(entry.name)
            if size is not None:
                ranges.append((0, size, entry.path))
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            ranges.append((st.st_mtime_ns, st.st_size, entry.path))
        return partial_bytes, num_partial, ranges

    def _evict(self, ranges: list[tuple[int, int, str]], need: int, extra: int = 0) -> int:
        """Delete unused ranges, least recently used first, until ``need`` bytes are free,
        then more while they fit in ``extra`` bytes beyond it."""
        freed = 0
        for _mtime, size, path in sorted(ranges):
            if freed >= need and freed + size > need + extra:
                break
            fd = _try_lock(path, fcntl.LOCK_EX)
            if fd is None:  # a reader holds it
                continue
            try:
                if _same_file(fd, path):
                    os.unlink(path)
                    freed += size
                    self.evictions += 1
            finally:
                os.close(fd)
            self._drop_lock_file(os.path.basename(path))
        return freed

    def _drop_lock_file(self, key: str) -> None:
        """Delete a range's download lock file unless a downloader holds it."""
        path = self.lock_path(key)
        fd = _try_lock(path, fcntl.LOCK_EX)
        if fd is not None:
            try:
                if _same_file(fd, path):
                    os.unlink(path)
            finally:
                os.close(fd)

    def usage(self) -> CacheUsage:
        """The folder's usage now (stale partial files are reclaimed first)."""
        with self.locked():
            partial_bytes, num_partial, ranges = self._scan()
        return CacheUsage(sum(size for _m, size, _p in ranges), len(ranges),
                          partial_bytes, num_partial)

    def reserve(self, key: str, num_bytes: int, *, own_bytes: Callable[[], int],
                wait_s: float) -> Reservation:
        """Reserve ``num_bytes`` for downloading range ``key``, evicting unused ranges.

        Args:
            key: the range's key.
            num_bytes: its size.
            own_bytes: bytes this process holds in the cache (open ranges and downloads):
                when nobody else holds anything, waiting cannot help.
            wait_s: how long to wait for other processes to release ranges.

        Raises:
            CacheBudgetError: the budget cannot hold this range next to those in use; at
                once when this process alone holds them, else after ``wait_s``.
        """
        if num_bytes > self.max_bytes:
            raise CacheBudgetError(
                f"{self.root}: a range of {num_bytes} bytes does not fit in max_cache_bytes="
                f"{self.max_bytes}; the minimum is {num_bytes} bytes per range in flight on "
                "this node: raise max_cache_bytes",
                path=self.root,
            )
        deadline = time.monotonic() + wait_s
        delay = 0.005
        while True:
            with self.locked():
                partial_bytes, _num_partial, ranges = self._scan(mtimes=False)
                used = partial_bytes + sum(size for _m, size, _p in ranges)
                if used + num_bytes > self.max_bytes:  # count again, with the LRU order
                    partial_bytes, _num_partial, ranges = self._scan()
                    used = partial_bytes + sum(size for _m, size, _p in ranges)
                    used -= self._evict(ranges, used + num_bytes - self.max_bytes,
                                        self.max_bytes // EVICT_SLACK)
                if used + num_bytes <= self.max_bytes:
                    return self._create_partial(key, num_bytes)
                mine = own_bytes()
            if used <= mine or time.monotonic() >= deadline:
                raise CacheBudgetError(
                    f"{self.root}: max_cache_bytes={self.max_bytes} cannot hold a range of "
                    f"{num_bytes} bytes next to the {used} bytes that readers on this node "
                    f"hold or are downloading ({mine} of them by this process); the minimum "
                    f"is {used + num_bytes} bytes: raise max_cache_bytes, or read with fewer "
                    "workers or fewer ranges in flight",
                    path=self.root,
                )
            time.sleep(delay)
            delay = min(2 * delay, 0.2)

    def _own_partials(self) -> set[str]:
        if self._partials_pid != os.getpid():  # a forked child downloads nothing of its own yet
            self._partials, self._partials_pid = set(), os.getpid()
        return self._partials

    def _create_partial(self, key: str, num_bytes: int) -> Reservation:
        path = self.root / PARTIAL / f"{key}.{num_bytes}.{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # a new file, under the budget lock: cannot block
        self._own_partials().add(str(path))
        return Reservation(fd, path, num_bytes)

    def commit(self, reservation: Reservation, key: str) -> Path:
        """Move a finished download into ``ranges/`` and keep it locked shared for the caller."""
        final = self.range_path(key)
        now = time.time_ns()  # the fine clock: LRU order within one coarse fs tick
        os.utime(reservation.fd, ns=(now, now))
        with self.locked():
            os.rename(reservation.path, final)
            self._own_partials().discard(str(reservation.path))
            # flock converts EX -> SH by dropping and re-taking; under the budget lock no
            # evictor can take the file in between.
            fcntl.flock(reservation.fd, fcntl.LOCK_SH)
        return final

    def abort(self, reservation: Reservation) -> None:
        """Give up a download: delete its partial file and release its space."""
        try:
            reservation.path.unlink(missing_ok=True)
        finally:
            self._own_partials().discard(str(reservation.path))
            os.close(reservation.fd)

    def discard(self, key: str) -> None:
        """Delete the complete range ``key`` (found damaged); readers holding it keep their copy."""
        with self.locked():
            self.range_path(key).unlink(missing_ok=True)
