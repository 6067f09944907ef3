"""Where a pack's shards, journal and manifest go: a local folder, or a URL via staging.

``shardio.pack`` and ``ShardWriter`` build each shard as a local file in
``target.staging``, then hand it to the target. ``LocalTarget`` is the output
folder itself: shards are built in place and renamed into their names, as
always. A URL gets a ``shardio.packing.remote_target.RemoteTarget``: shards staged
locally, uploaded one by one, the journal object replaced after each, the
manifest uploaded last. ``open_target`` picks one. Nothing here imports torch;
fsspec only through a remote store.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from shardio.errors import PackError
from shardio.format.manifest import JOURNAL_NAME, MANIFEST_NAME, Manifest, fsync_dir, write_manifest
from shardio.packing.journal import (
    LOCK_NAME,
    JournalWriter,
    open_journal,
    refuse_to_clear,
    shard_is_intact,
)
from shardio.packing.remote_target import RemoteTarget
from shardio.storage import RemoteOptions, RemoteStore, Store, split_url


class PackTarget(Protocol):
    """The output of one pack; every method is called from the packing process only."""

    url: str
    """The output folder or URL as the user gave it (for messages and summaries)."""
    staging: Path
    """The local folder shards are built in (``out`` itself for a local target)."""

    @property
    def store(self) -> Store | None:
        """The object store shards are uploaded to; None when they are renamed into ``staging``.

        Tasks on other machines (``shardio.packing.engines.dask``) upload their shards
        to it themselves, or build them in ``staging`` when it is None.
        """
        ...

    def prepare(self, *, overwrite: bool, resume: bool) -> None:
        """Check that the output may be written; clear an old dataset on ``overwrite``."""
        ...

    def open_journal(self, identity: Mapping[str, Any]) -> dict[str, Any] | None:
        """The journal of an interrupted pack with ``identity``, or None to start afresh."""
        ...

    def is_intact(self, name: str, num_bytes: int, checksum: str) -> bool:
        """Whether the journaled shard ``name`` is still there as journaled."""
        ...

    @contextlib.contextmanager
    def local_copy(self, name: str) -> Iterator[Path]:
        """A local file with the bytes of the finished shard ``name``, while in the block."""
        ...

    def publish(self, name: str) -> None:
        """Move the finished shard ``staging/name`` to its place in the output."""
        ...

    def write_journal(self, state: Mapping[str, Any]) -> None:
        """Journal ``state``; call after the shards it lists are published. Its ``shards``
        list grows at its end from one call to the next (a local journal appends them)."""
        ...

    def write_manifest(self, manifest: Manifest) -> None:
        """Write ``manifest.json``: the last write of a pack."""
        ...

    def finish(self) -> None:
        """Remove the journal of a completed pack."""
        ...

    def close(self) -> None:
        """Release the staging folder (whatever happened)."""
        ...


def prepare_output(out: Path, *, overwrite: bool, resume: bool) -> None:
    """Create ``out`` or check that it may be written; clear old shardio files on overwrite."""
    out.mkdir(parents=True, exist_ok=True)
    # a folder is never a shardio file, whatever its name; "/" judges it as the store does
    names = sorted(e.name + "/" if e.is_dir(follow_symlinks=False) else e.name
                   for e in os.scandir(out) if e.name != LOCK_NAME)  # held by this writer
    if not names or resume:
        return
    refuse_to_clear(str(out), names, overwrite=overwrite)
    (out / MANIFEST_NAME).unlink(missing_ok=True)
    fsync_dir(out)
    for name in names:
        (out / name).unlink(missing_ok=True)


class LocalTarget:
    """A local output folder: shards are built in place, the journal and manifest beside them."""

    def __init__(self, out: Path) -> None:
        self.url = str(out)
        self.staging = out
        self.store: Store | None = None
        self._journal = JournalWriter(out)

    def prepare(self, *, overwrite: bool, resume: bool) -> None:
        """See ``prepare_output``."""
        prepare_output(self.staging, overwrite=overwrite, resume=resume)

    def open_journal(self, identity: Mapping[str, Any]) -> dict[str, Any] | None:
        """See ``shardio.packing.journal.open_journal``."""
        return open_journal(self.staging, identity)

    def is_intact(self, name: str, num_bytes: int, checksum: str) -> bool:
        """Size and whole-file checksum, read from disk."""
        return shard_is_intact(self.staging / name, num_bytes, checksum)

    @contextlib.contextmanager
    def local_copy(self, name: str) -> Iterator[Path]:
        """The shard's own file."""
        yield self.staging / name

    def publish(self, name: str) -> None:
        """Nothing: the builder renamed the shard into place and fsynced the folder."""

    def write_journal(self, state: Mapping[str, Any]) -> None:
        """See ``shardio.packing.journal.JournalWriter``."""
        self._journal.write(state)

    def write_manifest(self, manifest: Manifest) -> None:
        """See ``shardio.format.manifest.write_manifest``."""
        write_manifest(self.staging, manifest)

    def finish(self) -> None:
        """Remove the journal file."""
        (self.staging / JOURNAL_NAME).unlink(missing_ok=True)

    def close(self) -> None:
        """Nothing to release."""


def open_target(out: str | os.PathLike[str], remote: RemoteOptions | None = None) -> PackTarget:
    """The target of a pack to ``out``: a ``RemoteTarget`` for a URL, else a ``LocalTarget``.

    Args:
        out: the output folder or URL.
        remote: how a URL is reached; only its ``storage_options`` and ``retry``
            matter to a writer (nothing written is cached). Ignored for a local
            path, as readers ignore it, so one ``RemoteOptions`` serves both.

    Raises:
        PackError: another pack on this host is writing to the same URL, or the
            URL holds a query string or a fragment.
    """
    protocol, local = split_url(out)
    if protocol is not None:
        _refuse_query(local)
        options = remote or RemoteOptions()
        return RemoteTarget(RemoteStore(local, protocol=protocol,
                                        storage_options=options.storage_options,
                                        retry=options.retry))
    return LocalTarget(Path(local))  # file:///x is the folder /x, not one named "file:"


def _refuse_query(url: str) -> None:
    """Refuse an output URL with ``?…`` or ``#…``, naming the URL without them.

    fsspec reads ``s3://b/x?versionId=…`` as a version of ``x`` to read, so a
    pack there would report success having written nothing one can open; a
    query may also hold a signature, which a message must not echo.
    """
    cut = min((i for i in (url.find("?"), url.find("#")) if i >= 0), default=-1)
    if cut >= 0:
        raise PackError(
            f"{url[:cut]}{url[cut]}...: an output URL cannot hold a query string ('?...') "
            "or a fragment ('#...'); nothing was written. Pack to the plain prefix "
            f"{url[:cut]} (object versions and signed URLs are for reading)",
            path=url[:cut])
