"""A remote shard downloaded whole into the node cache, read by its local backend reader.

liblmdb needs a file, so a remote LMDB shard is one cache entry holding the
whole object (checked against the manifest's file checksum on download);
``verify`` reads ``.rec`` shards of a remote dataset the same way, since it
checks whole files. The cache entry stays held (unevictable) while the reader
is open. Errors of the local reader name the cache file; they are re-raised
naming the shard's URL, so a message says which object is at fault. Imports
``errors``, ``backends`` and ``storage``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import NoReturn

from shardio.backends import ShardFileReader, open_shard
from shardio.errors import ShardioError
from shardio.format.frames import RunBytes
from shardio.storage.cachedrange import CachedRange


class CachedShardReader:
    """The local reader of a shard whose whole file is held in the node cache."""

    def __init__(self, backend: str, cached: CachedRange, *, url: str) -> None:
        """Open ``cached`` (the whole shard) with ``backend``'s reader; holds it until ``close``.

        Args:
            backend: ``records`` or ``lmdb``.
            cached: the held cache entry of the whole object.
            url: the shard's URL, named in messages instead of the cache file.
        """
        self.path = url
        self.cached = cached
        self._local = str(cached.path)
        try:
            self._inner: ShardFileReader = open_shard(backend, cached.path)
        except ShardioError as exc:
            cached.close()
            self._renamed(exc)
        except BaseException:
            cached.close()
            raise
        self.num_records = self._inner.num_records
        self.block_index = getattr(self._inner, "block_index", None)
        """Format v3: the shard's block index (``shardfile3.BlockIndex``); None: frames."""

    def _renamed(self, exc: ShardioError) -> NoReturn:
        """Raise ``exc`` again naming the URL instead of the cache file."""
        message = str(exc).replace(self._local, self.path)
        try:
            renamed = type(exc)(message, path=self.path, record=exc.record, offset=exc.offset)
        except TypeError:  # a subclass with another signature: keep it as it is
            raise exc from None
        raise renamed from exc

    def frame(self, index: int) -> memoryview:
        """Framed bytes of record ``index``."""
        try:
            return self._inner.frame(index)
        except ShardioError as exc:
            self._renamed(exc)

    def offset(self, index: int) -> int:
        """Byte offset (LMDB: index) of record ``index``."""
        return self._inner.offset(index)

    def scan(self, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, memoryview]]:
        """Yield ``(index, framed bytes)`` in storage order."""
        records = self._inner.scan(start, stop)
        while True:
            try:
                item = next(records)
            except StopIteration:
                return
            except ShardioError as exc:
                self._renamed(exc)
            yield item

    def read_frames(self, start: int, stop: int) -> list[memoryview]:
        """Records ``start..stop`` in one read."""
        try:
            return self._inner.read_frames(start, stop)
        except ShardioError as exc:
            self._renamed(exc)

    def read_run(self, start: int, stop: int) -> RunBytes:
        """Records ``start..stop`` as one buffer."""
        try:
            return self._inner.read_run(start, stop)
        except ShardioError as exc:
            self._renamed(exc)

    def will_need(self, start: int, stop: int) -> None:
        """Readahead hint, passed to the local reader (the file is on local disk)."""
        self._inner.will_need(start, stop)

    def keys(self) -> Sequence[str]:
        """Every record's ``__key__``."""
        try:
            return self._inner.keys()
        except ShardioError as exc:
            self._renamed(exc)

    def forget(self) -> None:
        """In a forked child: drop the parent's hold on the cache entry, touching no lock (the
        local reader's own handles are the reader module's to drop)."""
        self.cached.forget()

    def close(self) -> None:
        """Close the local reader and release the cache entry (it becomes evictable)."""
        try:
            self._inner.close()
        finally:
            self.cached.close()
