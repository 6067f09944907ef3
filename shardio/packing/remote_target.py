"""``RemoteTarget``: a pack's output in an object store, built shard by shard in local staging.

Shards are built in a local *staging* folder and each finished one uploaded
(``Store.put_file``: an atomic PUT, multipart when large), deleted from
staging, then the journal object replaced; ``manifest.json`` is uploaded last,
so a pack killed at any point leaves no manifest. Staging never holds more than
the shards being built and the one being uploaded. It lives under the
temporary folder (``$TMPDIR``), one per user and output URL, under a lock: a
second pack to the same URL on this host is refused while the first runs, and
the next pack reclaims what a killed one left there.

Overwriting a remote dataset deletes its ``manifest.json`` first (from then on
no reader opens it, and a killed overwrite leaves no manifest), then its other
objects, before the first new shard is uploaded: the new shards take the old
names, so a manifest and shards of two packs never coexist, and a resumed
overwrite finds only what the new pack journaled. Only names a pack writes
(``journal.is_shardio_file``: exact shard names at the top of the prefix, the
journal, the manifest) may be deleted; anything else makes ``--overwrite``
refuse. Overwriting or resuming also aborts the multipart uploads a killed
pack left unfinished under the prefix. Imports ``journal``,
``manifest`` and ``storage``; fsspec only through the store; no torch.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from shardio.errors import OutputExistsError, PackError
from shardio.format.manifest import JOURNAL_NAME, MANIFEST_NAME, Manifest, write_manifest
from shardio.packing.journal import (
    is_shardio_file,
    journal_bytes,
    parse_journal,
    refuse_to_clear,
)
from shardio.storage import RemoteStore

STAGING_LOCK = ".lock"


def staging_folder(url: str) -> Path:
    """The staging folder of packs to ``url`` by this user on this host."""
    digest = hashlib.sha256(url.encode("utf-8")).hexdigest()[:16]
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"shardio-pack-{uid}-{digest}"


class RemoteTarget:
    """An object-store prefix: shards staged locally, uploaded one by one, manifest last."""

    def __init__(self, store: RemoteStore) -> None:
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
        """Refuse a non-empty prefix, unless resuming or overwriting a shardio dataset.

        Both also abort shardio's unfinished multipart uploads under the prefix:
        a pack killed between parts leaves one, invisible to a listing and
        billed until aborted, and the pack that takes over the prefix owns it.
        """
        names = self.store.list_names()
        if names and not resume:
            refuse_to_clear(self.url, names, overwrite=overwrite)
            self.store.delete(MANIFEST_NAME)  # first: the old dataset is no longer complete
            self.store.delete(JOURNAL_NAME)
            for name in names:
                if name not in (MANIFEST_NAME, JOURNAL_NAME):
                    self.store.delete(name)
        if overwrite or resume:
            self.store.abort_uploads(is_shardio_file)

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
        self.store.put_bytes(JOURNAL_NAME, journal_bytes(state))

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
