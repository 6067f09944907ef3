"""Where a pack's shards, journal and manifest go: a local folder, or a remote store via staging.

``shardio.pack`` and ``ShardWriter`` build each shard as a local file, then
hand it to a target. ``LocalTarget`` is the output folder itself: shards are
built in place and renamed into their names, as always. ``RemoteTarget``
builds shards in a local *staging* folder and uploads each finished one
(``Store.put_file``: an atomic PUT, multipart when large), deletes the staged
file, then replaces the journal object; ``manifest.json`` is uploaded last, so
a pack killed at any point leaves no manifest. Staging never holds more than
the shards being built and the one being uploaded. It lives under the
temporary folder (``$TMPDIR``), one per user and output URL, under a lock: a
second pack to the same URL on this host is refused while the first runs,
and the next pack reclaims what a killed one left there.

Overwriting a remote dataset deletes its ``manifest.json`` first (from then
on no reader opens it, and a killed overwrite leaves no manifest), then its
other objects, before the first new shard is uploaded: the new shards take
the old names, so a manifest and shards of two packs never coexist, and a
resumed overwrite finds only what the new pack journaled. Nothing here
imports torch; fsspec only through a remote store.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from shardio.backends import SHARD_SUFFIX
from shardio.errors import OutputExistsError, PackError
from shardio.journal import (
    JOURNAL_NAME,
    open_journal,
    parse_journal,
    shard_is_intact,
    write_journal,
)
from shardio.manifest import MANIFEST_NAME, Manifest, fsync_dir, write_manifest
from shardio.storage import Store, is_remote, open_store

STAGING_LOCK = ".lock"


class PackTarget(Protocol):
    """The output of one pack; every method is called from the packing process only."""

    url: str
    """The output folder or URL as the user gave it (for messages and summaries)."""
    staging: Path
    """The local folder shards are built in (``out`` itself for a local target)."""

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
        """Replace the journal; call after the shards it lists are published."""
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


def is_shardio_file(name: str) -> bool:
    """Whether ``name`` is one shardio writes into a dataset (shards, journal, manifest, temps)."""
    return name in (
        MANIFEST_NAME,
        JOURNAL_NAME,
        f".{MANIFEST_NAME}.tmp",
        f"{JOURNAL_NAME}.tmp",
    ) or (
        name.startswith(("shard-", ".shard-"))
        and name.endswith(
            tuple(SHARD_SUFFIX.values())
            + tuple(s + ".tmp" for s in SHARD_SUFFIX.values())
            + tuple(s + "-lock" for s in SHARD_SUFFIX.values())
        )
    )


def _refuse_to_clear(where: str, names: list[str], *, overwrite: bool) -> None:
    """Raise unless a non-empty output holding ``names`` may be cleared for a new pack."""
    if not overwrite:
        raise OutputExistsError(
            f"{where}: output is not empty ({len(names)} entries, e.g. {names[0]!r}); "
            "choose an empty folder or prefix, pass --overwrite to replace a dataset, or "
            "--resume to finish an interrupted pack",
            path=where,
        )
    foreign = [n for n in names if not is_shardio_file(n)]
    if foreign:
        raise OutputExistsError(
            f"{where}: refusing to overwrite an output that holds files shardio did not "
            f"write (e.g. {foreign[0]!r}); choose another output folder or prefix",
            path=where,
        )


def prepare_output(out: Path, *, overwrite: bool, resume: bool) -> None:
    """Create ``out`` or check that it may be written; clear old shardio files on overwrite."""
    out.mkdir(parents=True, exist_ok=True)
    names = sorted(os.listdir(out))
    if not names or resume:
        return
    _refuse_to_clear(str(out), names, overwrite=overwrite)
    (out / MANIFEST_NAME).unlink(missing_ok=True)
    fsync_dir(out)
    for name in names:
        (out / name).unlink(missing_ok=True)


class LocalTarget:
    """A local output folder: shards are built in place, the journal and manifest beside them."""

    def __init__(self, out: Path) -> None:
        self.url = str(out)
        self.staging = out

    def prepare(self, *, overwrite: bool, resume: bool) -> None:
        """See ``prepare_output``."""
        prepare_output(self.staging, overwrite=overwrite, resume=resume)

    def open_journal(self, identity: Mapping[str, Any]) -> dict[str, Any] | None:
        """See ``shardio.journal.open_journal``."""
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
        """See ``shardio.journal.write_journal``."""
        write_journal(self.staging, state)

    def write_manifest(self, manifest: Manifest) -> None:
        """See ``shardio.manifest.write_manifest``."""
        write_manifest(self.staging, manifest)

    def finish(self) -> None:
        """Remove the journal file."""
        (self.staging / JOURNAL_NAME).unlink(missing_ok=True)

    def close(self) -> None:
        """Nothing to release."""


def staging_folder(url: str) -> Path:
    """The staging folder of packs to ``url`` by this user on this host."""
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"shardio-pack-{uid}-{digest}"


class RemoteTarget:
    """An object-store prefix: shards staged locally, uploaded one by one, manifest last."""

    def __init__(self, store: Store) -> None:
        """Take the staging folder of ``store``'s URL, reclaiming what a killed pack left.

        Raises:
            PackError: another pack on this host is writing to the same URL.
        """
        self.store = store
        self.url = store.url
        self.staging = staging_folder(store.url)
        self._lock: int | None = self._take_staging()
        for name in os.listdir(self.staging):  # a killed pack's partial and staged shards
            if name != STAGING_LOCK:
                (self.staging / name).unlink(missing_ok=True)

    def _take_staging(self) -> int:
        """Create and lock the staging folder; the lock's file descriptor."""
        lock = self.staging / STAGING_LOCK
        for _ in range(10):  # a pack that just ended may remove the folder under us
            self.staging.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise PackError(
                    f"{self.url}: another shardio pack on this host is writing to this URL "
                    f"(its staging folder {self.staging} is locked); wait for it to end, or "
                    "pack to another prefix", path=self.url) from None
            try:
                current = os.stat(lock).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                current = False
            if current:
                return fd
            os.close(fd)
        raise PackError(f"{self.url}: could not lock the staging folder {self.staging}; "
                        "run the pack again", path=self.url)

    def prepare(self, *, overwrite: bool, resume: bool) -> None:
        """Refuse a non-empty prefix, unless resuming or overwriting a shardio dataset."""
        names = self.store.list_names()
        if not names or resume:
            return
        _refuse_to_clear(self.url, names, overwrite=overwrite)
        self.store.delete(MANIFEST_NAME)  # first: the old dataset is no longer complete
        self.store.delete(JOURNAL_NAME)
        for name in names:
            if name not in (MANIFEST_NAME, JOURNAL_NAME):
                self.store.delete(name)

    def open_journal(self, identity: Mapping[str, Any]) -> dict[str, Any] | None:
        """The journal object, checked against ``identity``; None for an empty prefix.

        Raises:
            OutputExistsError: the prefix holds a complete dataset, or objects but no journal.
            PackError: the journal is damaged or was written for another identity.
        """
        names = self.store.list_names()
        if MANIFEST_NAME in names:
            raise OutputExistsError(
                f"{self.url}: this dataset is already complete (it has a {MANIFEST_NAME}); "
                "there is nothing to resume. Use --overwrite to pack it again", path=self.url)
        if JOURNAL_NAME not in names:
            if names:
                raise OutputExistsError(
                    f"{self.url}: no pack journal ({JOURNAL_NAME}) to resume from, but the "
                    "prefix is not empty; use --overwrite to start again", path=self.url)
            return None
        return parse_journal(self.store.read_bytes(JOURNAL_NAME), identity, where=self.url)

    def is_intact(self, name: str, num_bytes: int, checksum: str) -> bool:
        """Whether the object has the journaled size (a HEAD; the bytes are not downloaded).

        An object PUT is all or nothing, so a journaled shard is whole unless
        something else replaced it; ``shardio verify`` checks every byte.
        """
        try:
            return self.store.size(name) == num_bytes
        except FileNotFoundError:
            return False

    @contextlib.contextmanager
    def local_copy(self, name: str) -> Iterator[Path]:
        """The shard downloaded into staging, deleted after the block."""
        path = self.staging / f".fetch-{name}"
        try:
            with open(path, "wb") as fh:

                def write(offset: int, chunk: memoryview) -> None:
                    fh.seek(offset)  # a retried range repeats from where it was cut
                    fh.write(chunk)

                size = self.store.size(name)
                if size:
                    self.store.read_range_into(name, 0, size, write)
            yield path
        finally:
            path.unlink(missing_ok=True)

    def publish(self, name: str) -> None:
        """Upload the staged shard, then delete it from staging."""
        staged = self.staging / name
        self.store.put_file(name, staged)
        staged.unlink()

    def write_journal(self, state: Mapping[str, Any]) -> None:
        """Replace the journal object (one PUT)."""
        self.store.put_bytes(JOURNAL_NAME, json.dumps(state).encode("utf-8"))

    def write_manifest(self, manifest: Manifest) -> None:
        """Upload ``manifest.json``, serialized exactly as a local pack writes it."""
        path = write_manifest(self.staging, manifest)
        try:
            self.store.put_file(MANIFEST_NAME, path)
        finally:
            path.unlink(missing_ok=True)

    def finish(self) -> None:
        """Delete the journal object."""
        self.store.delete(JOURNAL_NAME)

    def close(self) -> None:
        """Empty the staging folder and release its lock."""
        if self._lock is None:
            return
        shutil.rmtree(self.staging, ignore_errors=True)  # the next pack checks the lock's inode
        os.close(self._lock)
        self._lock = None


def open_target(out: str | os.PathLike[str],
                storage_options: Mapping[str, Any] | None = None) -> PackTarget:
    """The target of a pack to ``out``: a ``RemoteTarget`` for a URL, else a ``LocalTarget``.

    Raises:
        ValueError: ``storage_options`` given for a local path.
        PackError: another pack on this host is writing to the same URL.
    """
    if is_remote(out):
        return RemoteTarget(open_store(out, storage_options=storage_options))
    if storage_options:
        raise ValueError(f"{out}: storage_options are for remote URLs (s3://, gs://, ...), "
                         "but this is a local path; drop them or pass a URL")
    return LocalTarget(Path(out))
