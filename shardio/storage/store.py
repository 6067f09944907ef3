"""The ``Store`` protocol: what the readers, the pack and the cache need from a place holding files.

A store is rooted at a dataset folder (a local path or a URL) and names objects
relative to that root with ``/`` separators (``manifest.json``,
``shard-00000.rec``). It offers whole and ranged reads, size, existence,
listing, deletion and atomic writes; nothing more, so that a local folder, S3,
GCS, Azure or a read-only HTTP server all fit. Imports nothing from shardio.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

RangeWriter = Callable[[int, memoryview], None]
"""``write(offset, chunk)``: ``chunk`` belongs at ``offset`` bytes from the start of the range.

Chunks arrive in order; after a retried request the offsets continue where the
last delivered chunk ended, so a writer may append or write at the offset.
"""


class Store(Protocol):
    """Objects under one root: ranged reads, listing and atomic writes."""

    url: str
    """The root as given: a local path or a URL without a trailing slash."""

    def local_path(self, name: str) -> Path | None:
        """The file of ``name`` when the store is local (read it in place), else None."""
        ...

    def read_bytes(self, name: str) -> bytes:
        """The whole object ``name`` (the manifest, a journal)."""
        ...

    def read_range(self, name: str, start: int, stop: int) -> bytes:
        """Bytes ``start..stop`` of ``name`` (one ranged GET on object stores)."""
        ...

    def read_range_into(self, name: str, start: int, stop: int, write: RangeWriter) -> None:
        """Stream bytes ``start..stop`` of ``name`` into ``write``; a cut body resumes."""
        ...

    def size(self, name: str) -> int:
        """Size of ``name`` in bytes; FileNotFoundError when it does not exist."""
        ...

    def exists(self, name: str) -> bool:
        """Whether ``name`` exists."""
        ...

    def list_names(self) -> list[str]:
        """Every object under the root, as sorted names relative to it (hidden ones included)."""
        ...

    def delete(self, name: str) -> None:
        """Remove ``name``; a missing object is not an error."""
        ...

    def put_file(self, name: str, source: Path) -> None:
        """Store the local file ``source`` as ``name`` atomically: all of it or nothing."""
        ...

    def put_bytes(self, name: str, data: bytes) -> None:
        """Store ``data`` as ``name``, atomically."""
        ...


def check_name(name: str) -> str:
    """``name`` if it is a relative object name that stays under the root, else ValueError.

    Names come from manifests, which may be damaged or hostile: a name with
    ``..`` or a leading ``/`` would read or write outside the dataset.
    """
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or any(p in ("", ".", "..") for p in parts):
        raise ValueError(
            f"object name {name!r} is not a plain relative name (no '..', no leading '/', "
            "no empty parts); the manifest or the caller passed a bad name"
        )
    return name


def check_range(name: str, start: int, stop: int) -> None:
    """Refuse an empty or negative range with a message naming the object."""
    if not 0 <= start < stop:
        raise ValueError(f"{name}: bad byte range {start}..{stop}; expected 0 <= start < stop")
