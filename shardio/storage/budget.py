"""The node cache's byte budget: reserve before a download, evict least-recently-used unused ranges.

Every file the cache owns lives under its root (nothing in /dev/shm, nothing
that outlives a crash anywhere else)::

    .budget.lock                    flock'd exclusively while space is counted or changed
    ranges/<key>                    complete ranges; mtime = last use; readers hold LOCK_SH
    partial/<key>.<bytes>.<token>   downloads in flight; the name says the bytes reserved;
                                    the downloader holds LOCK_EX until it renames it or dies
    locks/<key>.lock                per-range download locks (empty files)
    waiting/<pid>-<token>.<bytes>   a download waiting for space (``sharing.py``)

Processes agree on the usage by counting those files under the budget lock:
complete ranges at the size their names say (``…@start-stop``, ``cache.range_key``:
a listing, no ``stat`` per file), partial files at the size they reserved, each
rounded up to whole blocks of the filesystem: what it occupies on disk (10 KB
ranges counted at their sizes took 22% more on disk). A reservation creates its
partial file under that lock, so the folder's files never occupy more than the
budget, downloads in flight included. A partial file whose lock is free belongs
to a dead process (flocks die with their process, so a reused pid cannot fool
this) and is deleted by the next count. Eviction takes LOCK_EX|LOCK_NB on a
range file, so a range any reader holds is skipped, and the oldest unused ranges
go first.

A download that finds no room first has this process give back ranges it holds only
ahead of its readers, then says it waits (other processes give back theirs), and
waits; a read-ahead download waits without a deadline, taking no space while another
download waits, until its reader wants it (``sharing.py``: jobs sharing the folder
each hold the whole budget ahead of themselves otherwise, and both failed).

The folder is disposable: removed while readers run, it is made again where it is
needed. Imports ``errors`` and ``sharing``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from shardio.errors import CacheBudgetError
from shardio.storage.sharing import (
    WAITING,
    current_ticket,
    give_back_ahead,
    waited_for,
    waiter,
)

RANGES, PARTIAL, LOCKS = "ranges", "partial", "locks"
BUDGET_LOCK = ".budget.lock"
EVICT_SLACK = 32
"""An eviction frees up to 1/32 of the budget more than the download needs, in whole ranges:
eviction stats every range (for the least recently used), under the budget lock that every
download takes; under a full budget of small ranges (one plan block, ~190 KB) that was done
for every download, 0.7 s of CPU in one 871-range epoch and the downloads waiting on it."""
DEFAULT_BLOCK_BYTES = 4096
"""The block size assumed where the filesystem does not say one."""


@dataclass(frozen=True)
class CacheUsage:
    """What a cache folder holds, as the budget counts it: each file at the whole
    filesystem blocks it occupies."""

    range_bytes: int
    num_ranges: int
    partial_bytes: int
    """Bytes reserved by downloads in flight (their files occupy at most this much)."""
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


@dataclass(frozen=True)
class _Count:
    """One count of the folder: sizes as the files' names or ``stat`` say them."""

    partial_bytes: int
    partial_disk: int
    num_partial: int
    ranges: list[tuple[int, int, str]]
    """``(mtime, size, path)`` of each complete range."""


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


def _scandir(folder: Path) -> list[os.DirEntry[str]]:
    """The entries of ``folder``; none when it was removed (with the cache folder)."""
    try:
        return list(os.scandir(folder))
    except FileNotFoundError:
        return []


class Budget:
    """The space accounting of one cache folder, shared by every process that opens it."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_cache_bytes must be positive, got {max_bytes}")
        self.root = root
        self.max_bytes = max_bytes
        self._make_folders()
        try:
            block = os.statvfs(root).f_frsize
        except (OSError, AttributeError):  # no statvfs (not POSIX)
            block = 0
        self.block_bytes = block if block > 0 else DEFAULT_BLOCK_BYTES
        """What the filesystem allocates a file in: each file is counted in whole blocks."""
        self._key = os.path.abspath(root)
        self.evictions = 0
        self.reclaimed = 0
        self._partials: set[str] = set()
        """Partial files this process is downloading into: alive, so not lock-tested."""
        self._partials_pid = os.getpid()

    def _make_folders(self) -> None:
        """Make the folder and its subfolders (again, after someone removed them)."""
        for sub in (RANGES, PARTIAL, LOCKS, WAITING):
            # a removal still under way may take a parent away again, also between mkdir's
            # "exists" and its own check that it is a folder: the callers retry
            try:
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            except FileNotFoundError:
                pass
            except FileExistsError:
                if (self.root / sub).exists():  # a file where the folder goes: no race
                    raise

    def disk_bytes(self, num_bytes: int) -> int:
        """What a file of ``num_bytes`` occupies on the cache's filesystem: whole blocks."""
        return -(-num_bytes // self.block_bytes) * self.block_bytes

    def range_path(self, key: str) -> Path:
        """Where the complete range ``key`` lives."""
        return self.root / RANGES / key

    def lock_path(self, key: str) -> Path:
        """The download lock file of range ``key``."""
        return self.root / LOCKS / f"{key}.lock"

    def open_lock(self, key: str) -> int:
        """A descriptor of range ``key``'s download lock file, created if need be (with the
        cache folder, if it was removed under a running reader)."""
        while True:
            try:
                return os.open(self.lock_path(key), os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                self._make_folders()

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the folder's budget lock (a fresh descriptor: threads exclude each other too).

        The folder is made again if it was removed, and the lock taken again if it was
        removed while this process waited for it (the lock of a deleted file locks nothing).
        """
        path = self.root / BUDGET_LOCK
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except FileNotFoundError:
                self._make_folders()
                continue
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(fd, path):
                break
            os.close(fd)
        try:
            yield
        finally:
            os.close(fd)

    def _scan(self, *, mtimes: bool = True) -> _Count:
        """Count the folder; reclaims the partial files of dead processes.

        Partials are listed before ranges so that a download renamed in between is
        counted twice, never missed. ``mtimes=False``: sizes from the names and mtimes 0
        (no ``stat``), enough to count the usage.
        """
        partial_bytes = partial_disk = num_partial = 0
        mine = self._own_partials()
        for entry in _scandir(self.root / PARTIAL):
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
            if reserved is None:
                try:
                    reserved = entry.stat().st_size
                except FileNotFoundError:
                    continue
            partial_bytes += reserved
            partial_disk += self.disk_bytes(reserved)
            num_partial += 1
        ranges = []
        for entry in _scandir(self.root / RANGES):
            size = None if mtimes else _range_bytes(entry.name)
            if size is not None:
                ranges.append((0, size, entry.path))
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            ranges.append((st.st_mtime_ns, st.st_size, entry.path))
        return _Count(partial_bytes, partial_disk, num_partial, ranges)

    def _used(self, count: _Count) -> int:
        """Bytes on disk that ``count`` found."""
        return count.partial_disk + sum(self.disk_bytes(size) for _m, size, _p in count.ranges)

    def _evict(self, ranges: list[tuple[int, int, str]], need: int, extra: int = 0) -> int:
        """Delete unused ranges, least recently used first, until ``need`` bytes on disk are
        free, then more while they fit in ``extra`` bytes beyond it; returns the bytes freed."""
        freed = 0
        for _mtime, size, path in sorted(ranges):
            disk = self.disk_bytes(size)
            if freed >= need and freed + disk > need + extra:
                break
            fd = _try_lock(path, fcntl.LOCK_EX)
            if fd is None:  # a reader holds it
                continue
            try:
                if _same_file(fd, path):
                    with contextlib.suppress(FileNotFoundError):  # the folder was removed
                        os.unlink(path)
                        freed += disk
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
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
            finally:
                os.close(fd)

    def usage(self) -> CacheUsage:
        """The folder's usage now (stale partial files are reclaimed first)."""
        with self.locked():
            count = self._scan()
        return CacheUsage(sum(self.disk_bytes(size) for _m, size, _p in count.ranges),
                          len(count.ranges), count.partial_disk, count.num_partial)

    def _try_reserve(self, key: str, num_bytes: int, *,
                     ahead: bool) -> Reservation | tuple[int, int]:
        """A reservation if the budget has room now (after evicting unused ranges), else
        ``(bytes on disk in use, bytes in use as the files' sizes)``; none for read-ahead
        (``ahead``) while a download waits for space."""
        need = self.disk_bytes(num_bytes)
        with self.locked():
            if ahead and waited_for(self.root):
                return self.max_bytes, 0
            count = self._scan(mtimes=False)
            used = self._used(count)
            if used + need > self.max_bytes:  # count again, with the LRU order
                count = self._scan()
                used = self._used(count)
                used -= self._evict(count.ranges, used + need - self.max_bytes,
                                    self.max_bytes // EVICT_SLACK)
            if used + need <= self.max_bytes:
                return self._create_partial(key, num_bytes)
            count = self._scan(mtimes=False)  # what is left, for the caller's decision
            return self._used(count), count.partial_bytes + sum(s for _m, s, _p in count.ranges)

    def reserve(self, key: str, num_bytes: int, *, own_bytes: Callable[[], int],
                wait_s: float) -> Reservation:
        """Reserve ``num_bytes`` for downloading range ``key``, evicting unused ranges.

        Without room, this process first gives back ranges it holds ahead of its readers,
        then waits for other processes to release theirs. A read-ahead download
        (``sharing.reading_ahead``) waits for room without a deadline until its reader
        wants it, then like any download.

        Args:
            key: the range's key.
            num_bytes: its size.
            own_bytes: bytes this process holds in the cache (open ranges and downloads):
                when nobody else holds anything and none of it is still downloading,
                waiting cannot help.
            wait_s: how long to wait for other processes to release ranges.

        Raises:
            CacheBudgetError: the budget cannot hold this range next to those in use; at
                once when this process alone holds them, else after ``wait_s``; at once
                for a read-ahead download its reader dropped.
        """
        need = self.disk_bytes(num_bytes)
        if need > self.max_bytes:
            raise CacheBudgetError(
                f"{self.root}: a range of {num_bytes} bytes ({need} on disk) does not fit in "
                f"max_cache_bytes={self.max_bytes}; the minimum is {need} bytes per range in "
                "flight on this node: raise max_cache_bytes",
                path=self.root,
            )
        ticket = current_ticket()
        deadline: float | None = None
        delay = 0.005
        with contextlib.ExitStack() as waiting:
            while True:
                pending = ticket is not None and not ticket.wanted
                got = self._try_reserve(key, num_bytes, ahead=pending)
                if isinstance(got, Reservation):
                    return got
                if ticket is not None and pending:  # nobody needs it yet: wait, no deadline
                    if ticket.dropped:
                        raise CacheBudgetError(
                            f"{self.root}: a read-ahead of {num_bytes} bytes was dropped while "
                            "it waited for room", path=self.root)
                    ticket.wait(delay)
                    delay = min(2 * delay, 0.2)
                    continue
                used, used_size = got
                if give_back_ahead(self._key, used + need - self.max_bytes):
                    continue  # ranges held only ahead were released: count again at once
                mine = own_bytes()
                others = max(0, used_size - mine)
                if not others and not self._own_partials():
                    raise CacheBudgetError(
                        f"{self.root}: max_cache_bytes={self.max_bytes} cannot hold a range "
                        f"of {num_bytes} bytes next to the {mine} bytes ({used} on disk) that "
                        f"this process holds; the minimum is {used + need} bytes: raise "
                        "max_cache_bytes, or read with fewer workers or fewer ranges in flight",
                        path=self.root,
                    )
                now = time.monotonic()
                if deadline is None:  # a read-ahead download's wait starts when it is wanted
                    deadline, delay = now + wait_s, 0.005
                    # read-ahead everywhere on the node yields until this is done
                    waiting.enter_context(waiter(self.root, need))
                elif now >= deadline:
                    raise CacheBudgetError(
                        f"{self.root}: max_cache_bytes={self.max_bytes} had no room for a "
                        f"range of {num_bytes} bytes for {wait_s:g} s: other processes on "
                        f"this node (other jobs, or workers of this one) held {others} bytes "
                        f"of it and this process {mine}; it needs at least {mine + num_bytes} "
                        "bytes beside what the others hold: raise max_cache_bytes to hold "
                        "every job that reads through this cache folder at once, or give "
                        "the jobs cache folders of their own",
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
        while True:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileNotFoundError:  # the folder was removed since it was counted
                self._make_folders()
        fcntl.flock(fd, fcntl.LOCK_EX)  # a new file, under the budget lock: cannot block
        self._own_partials().add(str(path))
        return Reservation(fd, path, num_bytes)

    def commit(self, reservation: Reservation, key: str) -> Path:
        """Move a finished download into ``ranges/`` and keep it locked shared for the caller.

        If the cache folder was removed meanwhile, the caller keeps the download through
        its descriptor (held, not cached: nobody else will find it).
        """
        final = self.range_path(key)
        now = time.time_ns()  # the fine clock: LRU order within one coarse fs tick
        os.utime(reservation.fd, ns=(now, now))
        with self.locked():
            while True:  # a removal of the folder may still be under way: until it is done
                try:
                    os.rename(reservation.path, final)
                    break
                except FileNotFoundError:
                    if not reservation.path.exists():
                        break
                    self._make_folders()
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
