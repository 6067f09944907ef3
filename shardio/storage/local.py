"""``LocalStore``: a dataset folder on a local (or mounted) filesystem, read in place.

Local datasets are never copied into the cache and never evicted: readers take
``local_path`` and map or ``pread`` the file as they always have. Writes go to
a hidden temporary name in the same folder, are fsynced and renamed, and the
folder is fsynced, so a reader sees a whole file or none (docs/format.md §6).
Imports only ``errors``, ``manifest`` and ``store``; no fsspec.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from shardio.errors import StorageError
from shardio.format.manifest import fsync_dir
from shardio.storage.store import RangeWriter, check_name, check_range

READ_CHUNK_BYTES = 8 << 20


class LocalStore:
    """Files under a local folder; the folder need not exist until the first write."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.url = str(root).rstrip("/") or "/"

    def __repr__(self) -> str:
        return f"LocalStore({self.url!r})"

    def _path(self, name: str) -> Path:
        return self.root / check_name(name)

    def local_path(self, name: str) -> Path | None:
        """The file of ``name``: local stores are read in place."""
        return self._path(name)

    def read_bytes(self, name: str) -> bytes:
        """The whole file ``name``."""
        return self._path(name).read_bytes()

    def read_range(self, name: str, start: int, stop: int) -> bytes:
        """Bytes ``start..stop`` of ``name`` with positional reads."""
        check_range(name, start, stop)
        path = self._path(name)
        fd = os.open(path, os.O_RDONLY)
        try:
            parts, got = [], 0
            while got < stop - start:  # regular files return all at once, but EOF returns less
                part = os.pread(fd, stop - start - got, start + got)
                if not part:
                    break
                parts.append(part)
                got += len(part)
        finally:
            os.close(fd)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if len(data) != stop - start:
            raise StorageError(
                f"{path}: bytes {start}..{stop} were asked but the file ends at "
                f"{start + len(data)}; it was truncated or replaced while in use",
                path=path, offset=start,
            )
        return data

    def read_range_into(self, name: str, start: int, stop: int, write: RangeWriter) -> None:
        """Bytes ``start..stop`` of ``name`` into ``write``, in chunks of 8 MB."""
        check_range(name, start, stop)
        for lo in range(start, stop, READ_CHUNK_BYTES):
            hi = min(lo + READ_CHUNK_BYTES, stop)
            write(lo - start, memoryview(self.read_range(name, lo, hi)))

    def size(self, name: str) -> int:
        """Size of the file ``name``."""
        return self._path(name).stat().st_size

    def exists(self, name: str) -> bool:
        """Whether the file ``name`` exists."""
        return self._path(name).is_file()

    def list_names(self) -> list[str]:
        """Every file under the root, relative and sorted; an absent root lists nothing."""
        names = []
        for folder, _dirs, files in os.walk(self.root):
            rel = os.path.relpath(folder, self.root)
            for file in files:
                names.append(file if rel == "." else f"{rel}/{file}".replace(os.sep, "/"))
        return sorted(names)

    def delete(self, name: str) -> None:
        """Remove the file ``name`` if it exists."""
        self._path(name).unlink(missing_ok=True)

    def put_file(self, name: str, source: Path) -> None:
        """Copy ``source`` to ``name``: temporary name, fsync, rename, fsync the folder."""
        target = self._path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        try:
            with open(source, "rb") as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, READ_CHUNK_BYTES)
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(target.parent)

    def put_bytes(self, name: str, data: bytes) -> None:
        """Write ``data`` to ``name``: temporary name, fsync, rename, fsync the folder."""
        target = self._path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(target.parent)
