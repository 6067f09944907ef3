"""``CachedRange``: one range of the node cache, held open by a reader.

Holding it means holding a shared flock on its file, which is what keeps
eviction (``budget.py``) away; closing it makes the range evictable again and
tells the cache how many bytes this process no longer holds. Imports nothing
from shardio.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType


class CachedRange:
    """Bytes ``start..stop`` of object ``name`` as a cache file, held until ``close``.

    Holding it (a shared flock on the file) keeps it from being evicted. Views
    from ``view`` stay valid after ``close`` without holding it: the file may then
    be evicted, and its pages stay readable while views exist (a cache file is
    never truncated, only unlinked), so a reader hands out views instead of copies;
    an evicted file's disk space comes back when its last view goes.
    """

    def __init__(self, fd: int, path: Path, *, name: str, start: int, stop: int,
                 release: Callable[[int], None]) -> None:
        self.path = path
        self.name = name
        self.start = start
        self.stop = stop
        self._fd = fd
        self._map: mmap.mmap | None = None
        self._release = release

    @property
    def size(self) -> int:
        """Bytes in the range."""
        return self.stop - self.start

    def view(self) -> memoryview:
        """The range mapped read-only (offsets relative to ``start``)."""
        if self._fd < 0:
            raise ValueError(f"{self.path}: cached range used after close")
        if self._map is None:
            fd = self._unlocked_fd()
            try:
                self._map = mmap.mmap(fd, self.size, access=mmap.ACCESS_READ)
            finally:
                if fd != self._fd:  # the map keeps its own duplicate
                    os.close(fd)
        return memoryview(self._map)

    def _unlocked_fd(self) -> int:
        """A descriptor of this file that shares no flock with the hold, else the hold's own.

        A map keeps a duplicate of the descriptor it was made from, and a flock belongs
        to the open file that duplicates share: mapped from the hold's descriptor, views
        outliving ``close`` kept the range locked, so eviction skipped it and a small
        budget ran out. The file is opened again by name while the hold keeps evictors
        away; the map keeps its own duplicate, and ``view`` closes this one at once.
        """
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return self._fd
        st, held = os.fstat(fd), os.fstat(self._fd)
        if (st.st_dev, st.st_ino) != (held.st_dev, held.st_ino):  # discarded and replaced
            os.close(fd)
            return self._fd
        return fd

    def read(self, offset: int = 0, length: int | None = None) -> bytes:
        """``length`` bytes from ``offset`` (relative to ``start``) with one ``pread``."""
        if self._fd < 0:
            raise ValueError(f"{self.path}: cached range used after close")
        length = self.size - offset if length is None else length
        if offset < 0 or length < 0 or offset + length > self.size:
            raise ValueError(f"{self.path}: bytes {offset}..{offset + length} are outside this "
                             f"range of {self.size} bytes")
        return os.pread(self._fd, length, offset)

    def close(self) -> None:
        """Release the file (and its lock); the range becomes evictable."""
        if self._fd < 0:
            return
        if self._map is not None:
            with contextlib.suppress(BufferError):  # views still exported: the map goes with them
                self._map.close()
            self._map = None
        os.close(self._fd)
        self._fd = -1
        self._release(self.size)

    def forget(self) -> None:
        """Drop this process's copy of the file without telling the cache (a forked child).

        A child inherits the descriptors of the ranges its parent holds; keeping
        them would keep those ranges unevictable for the child's lifetime. It
        must not call ``close`` either: that takes the cache's lock, which a
        thread of the parent may have held at the fork. The parent's own
        descriptor, and so its hold, is untouched.
        """
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._map = None  # an unshared map closes its own descriptor when collected

    def __enter__(self) -> CachedRange:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
