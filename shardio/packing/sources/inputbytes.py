"""Where a field's input bytes are when they are not a file of their own: a range of a bigger file.

A sample to pack (``shardio.packing.stems.SourceSample``) names one path per field,
which ``shardio.packing.build`` reads whole. A source kept in containers (a
WebDataset tar, ``shardio.packing.sources.tars``) names instead a *locator*: the
container's path, the offset of the member's bytes and a name to report, joined
by NUL characters, which no file name can hold. An uncompressed container is
read with one ``pread`` per field, in any order, so that shuffled shards are
built in parallel as from files; a gzip-compressed one can only be read forward,
through one decompressing handle kept per process. Imports nothing from shardio.
"""

from __future__ import annotations

import gzip
import os
from typing import IO, Final

GZIP_MARK: Final = "z"
"""Prefix of an offset into a container's gzip-decompressed bytes."""

_open_gzip: dict[str, tuple[int, IO[bytes] | None, gzip.GzipFile | None]] = {}
"""This process's forward reader of each gzip container (one at a time), by path."""


def locator(path: str, offset: int, size: int, name: str, *, compressed: bool = False) -> str:
    """The locator of the ``size`` bytes at ``offset`` of ``path`` (of its decompressed bytes
    when ``compressed``); ``name`` is how errors name them (``shard-000.tar/000123.jpg``)."""
    return f"{path}\0{GZIP_MARK if compressed else ''}{offset}+{size}\0{name}"


def is_locator(path: str) -> bool:
    """Whether a sample's path is a locator rather than a file's path."""
    return "\0" in path


def locator_name(path: str) -> str:
    """The name a locator reports its bytes under."""
    return path.rsplit("\0", 1)[1]


def _parse(path: str, size: int | None) -> tuple[str, str, int, int]:
    """``(container, offset field, offset, size)`` of a locator."""
    container, where, _ = path.split("\0")
    start, _, length = where.removeprefix(GZIP_MARK).partition("+")
    return container, where, int(start), int(length) if size is None else size


def read_range(path: str, size: int | None = None, dir_fd: int | None = None) -> bytes:
    """The bytes a locator names (``size`` of them when given; fewer when the container
    is cut short).

    Raises:
        OSError: the container cannot be opened or read, or its gzip stream is damaged.
    """
    container, where, offset, size = _parse(path, size)
    if where.startswith(GZIP_MARK):
        return _read_gzip(container, offset, size, dir_fd)
    fd = os.open(container, os.O_RDONLY, dir_fd=dir_fd)
    try:
        return os.pread(fd, size, offset)
    finally:
        os.close(fd)


class OpenContainers:
    """``read_range`` for one shard build, keeping each container it reads open until
    ``close``: an ``open`` and a ``close`` per tar instead of per field.

    Saves a tar source the ``open`` and ``close`` a folder pack pays per file: with the
    faster header scan, tars went from 0.75x to 1.08x the folder pack's speed on the images
    tree and from 0.94x to 1.35x on the tiny tree (``python -m benchmarks.bench_import``,
    2 workers, load average 4-5 on 2 cores; ``benchmarks/results/import.json``).
    One per build, never shared: a Dask worker runs builds in threads. At most
    ``MAX_OPEN`` stay open (the least recently opened is closed first).
    """

    MAX_OPEN: Final = 64

    def __init__(self, dir_fd: int | None = None) -> None:
        self.dir_fd = dir_fd
        self.fds: dict[str, int] = {}

    def read(self, path: str, size: int | None = None) -> bytes:
        """``read_range(path, size)`` from the container kept open."""
        container, where, offset, size = _parse(path, size)
        if where.startswith(GZIP_MARK):
            return _read_gzip(container, offset, size, self.dir_fd)
        fd = self.fds.get(container)
        if fd is None:
            if len(self.fds) >= self.MAX_OPEN:
                os.close(self.fds.pop(next(iter(self.fds))))
            fd = self.fds[container] = os.open(container, os.O_RDONLY, dir_fd=self.dir_fd)
        return os.pread(fd, size, offset)

    def close(self) -> None:
        """Close every container kept open."""
        while self.fds:
            os.close(self.fds.popitem()[1])


def _read_gzip(container: str, offset: int, size: int, dir_fd: int | None) -> bytes:
    pid, raw, fh = _open_gzip.pop(container, (0, None, None))
    if fh is None or raw is None or pid != os.getpid() or fh.tell() > offset:
        if fh is not None and raw is not None and pid == os.getpid():
            fh.close()
            raw.close()
        _close_all()  # one container open at a time: bounded file descriptors
        raw = os.fdopen(os.open(container, os.O_RDONLY, dir_fd=dir_fd), "rb")
        fh = gzip.GzipFile(fileobj=raw, mode="rb")
    try:
        fh.seek(offset)  # forward: decompresses what lies between
        data = fh.read(size)
    except (EOFError, gzip.BadGzipFile) as exc:
        fh.close()
        raw.close()
        raise OSError(f"its gzip stream is damaged ({exc})") from exc
    _open_gzip[container] = (os.getpid(), raw, fh)
    return data


def _close_all() -> None:
    """Close this process's gzip readers (a forked child's inherited ones are only dropped)."""
    for pid, raw, fh in _open_gzip.values():
        if pid == os.getpid() and fh is not None and raw is not None:
            fh.close()
            raw.close()
    _open_gzip.clear()
