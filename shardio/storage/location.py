"""Where a dataset lives: a local folder, or a URL read through ``shardio.storage``.

``read_manifest`` is the one entry every reader goes through: a local path is
read exactly as before (``shardio.format.manifest.load_manifest``); a ``scheme://``
URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, any fsspec protocol) is
read with one GET of ``manifest.json`` through a ``Store``. What is not
supported for URLs yet (a pack's SRC, unpack's DEST) keeps the refusal of
``local_path``, so ``s3://bucket/x`` is never misread as a local folder named
``s3:``. A local path that is no dataset is told apart by what it is
(``not_a_dataset``): missing, a file of a dataset, a source folder of images,
an unfinished pack. Imports ``errors``, ``manifest``, ``journal``, ``stems``
and ``storage``; nothing above them.
"""

from __future__ import annotations

import os
import re
import shlex
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from shardio.errors import ManifestNotFoundError, StorageError
from shardio.format.manifest import (
    IMG_EXTENSIONS,
    JOURNAL_NAME,
    MANIFEST_NAME,
    Manifest,
    load_manifest,
    parse_manifest,
)
from shardio.storage.options import RemoteOptions
from shardio.storage.store import Store
from shardio.storage.url import is_remote, open_store

_URL: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
"""``scheme://`` at the start: s3://, gs://, https://, file://, hf://, …"""

MAX_COUNTED: Final = 10_000
"""Entries a folder that is no dataset is walked for before its files are counted "at least"."""


def is_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` starts with ``scheme://``."""
    return _URL.match(os.fspath(location)) is not None


def local_path(location: str | os.PathLike[str], *, role: str = "dataset") -> Path:
    """``location`` as a local path, for the places that need one; refuses ``scheme://`` URLs.

    Args:
        location: a folder path (or a URL, refused).
        role: what the location is for, named in the message ("source", "destination", …).

    Raises:
        StorageError: ``location`` is a URL, which this role does not accept yet.
    """
    if is_url(location):
        text = os.fspath(location)
        raise StorageError(
            f"{text}: the {role} is a URL, and a {role} must be a local folder (remote "
            f"datasets can be read, but a remote {role} is not supported yet). Copy it to a "
            "local folder first (for example with `aws s3 sync` or `gsutil rsync`) and pass "
            "that folder's path",
            path=text)
    return Path(location)


@dataclass(frozen=True)
class RemoteDataset:
    """A dataset behind a URL: its store, manifest, and the version that names its cache."""

    url: str
    """The dataset's root URL, without ``/manifest.json`` and without a trailing slash."""
    store: Store
    manifest: Manifest
    version: str
    """``crc32:<hex>`` of the manifest's bytes: a re-packed dataset never reads stale ranges."""


def open_remote(url: str, *, remote: RemoteOptions | None = None) -> RemoteDataset:
    """Read the manifest of the dataset at ``url`` (one GET) and describe it.

    Raises:
        ManifestNotFoundError: there is no ``manifest.json`` at ``url``.
        ManifestError: it is not a valid shardio manifest.
        StorageError: the store failed after retries or refused the request.
    """
    options = remote or RemoteOptions()
    root = url.rstrip("/")
    if root.endswith("/" + MANIFEST_NAME):
        root = root[: -len(MANIFEST_NAME) - 1]
    store = open_store(root, storage_options=options.storage_options, retry=options.retry)
    where = f"{store.url}/{MANIFEST_NAME}"
    try:
        data = store.read_bytes(MANIFEST_NAME)
    except FileNotFoundError as exc:
        raise ManifestNotFoundError(
            f"{where}: no {MANIFEST_NAME} at {store.url}, so it is not a shardio dataset (or "
            "its pack did not finish). Check the URL; make one with "
            f"`shardio pack SRC {store.url}`, or finish an interrupted pack with --resume.",
            path=where,
        ) from exc
    manifest = parse_manifest(data, path=where)
    return RemoteDataset(store.url, store, manifest, f"crc32:{zlib.crc32(data):08x}")


def read_manifest(
    path: str | os.PathLike[str], *, remote: RemoteOptions | None = None
) -> Manifest:
    """Read and validate the manifest of the dataset at ``path``, a folder or a URL.

    Args:
        path: dataset folder (or its manifest.json), or a URL such as ``s3://bucket/train``.
        remote: how a URL is reached (``storage_options``, retries); ignored for local paths.

    Raises:
        ManifestNotFoundError: ``path`` has no manifest.json.
        ManifestError: the manifest is not valid JSON or not a shardio manifest.
        UnsupportedVersionError: it was written by an unknown format version.
        StorageError: a remote store failed after retries or refused the request.
    """
    if is_remote(path):
        return open_remote(os.fspath(path), remote=remote).manifest
    return read_local_manifest(path)


def read_local_manifest(path: str | os.PathLike[str]) -> Manifest:
    """``shardio.format.manifest.load_manifest``, with a path that is no dataset told apart.

    Raises:
        ManifestNotFoundError: ``path`` has no manifest.json (``not_a_dataset`` says why).
        ManifestError: the manifest is not valid JSON or not a shardio manifest.
        UnsupportedVersionError: it was written by an unknown format version.
    """
    try:
        return load_manifest(path)
    except (ManifestNotFoundError, NotADirectoryError) as exc:  # a shard file given: the latter
        raise not_a_dataset(path) from exc


def not_a_dataset(path: str | os.PathLike[str]) -> ManifestNotFoundError:
    """The error for a local ``path`` without a manifest, saying what it is and what to do.

    A missing path, a file (of a dataset, or not), a folder of files to pack, an
    unfinished pack and an empty folder each send the user another way.
    """
    given = Path(path)
    where = given.parent if given.name == MANIFEST_NAME and not given.is_dir() else given
    folder = shlex.quote(str(where))
    made = f"a dataset is the folder OUT that `shardio pack SRC OUT` wrote, holding {MANIFEST_NAME}"
    if not os.path.lexists(where):
        message = f"{where}: does not exist. Check the path ({made})"
    elif not where.is_dir():
        parent = where.parent
        message = (f"{where}: a file of the dataset in {parent}, not a dataset: pass the folder "
                   f"{parent} instead" if (parent / MANIFEST_NAME).is_file() else
                   f"{where}: a file, not a dataset folder: pass a dataset folder ({made})")
    elif (where / JOURNAL_NAME).exists():
        message = (f"{where}: an unfinished pack ({JOURNAL_NAME} but no {MANIFEST_NAME} yet): "
                   f"finish it with `shardio pack SRC {folder} --resume`, with the SRC and "
                   "options it began with")
    else:
        images, files, capped = _count_files(where)
        at_least = "at least " if capped else ""
        if images or files:
            what = (f"{at_least}{images:,} images" + (f" and {files:,} other files" if files
                                                      else "") if images
                    else f"{at_least}{files:,} files")
            message = (f"{where}: a source folder of {what}, not a shardio dataset (no "
                       f"{MANIFEST_NAME}). Pack it first with `shardio pack {folder} OUT` (OUT: a "
                       "new folder outside it), then read OUT")
        else:
            message = (f"{where}: an empty folder, not a shardio dataset (no {MANIFEST_NAME}). "
                       f"Check the path, or pack files into it with `shardio pack SRC {folder}`")
    return ManifestNotFoundError(message, path=str(where / MANIFEST_NAME))


def _count_files(folder: Path) -> tuple[int, int, bool]:
    """Images and other files under ``folder`` (hidden entries skipped), and whether the walk
    stopped at ``MAX_COUNTED`` entries: cheap however large the tree."""
    images = files = seen = 0
    todo = [folder]
    while todo:
        try:
            with os.scandir(todo.pop()) as it:
                for entry in it:
                    if seen == MAX_COUNTED:
                        return images, files, True
                    seen += 1
                    if entry.name.startswith("."):
                        continue
                    if entry.is_dir():
                        todo.append(Path(entry.path))
                    elif entry.name.lower().endswith(IMG_EXTENSIONS):
                        images += 1
                    else:
                        files += 1
        except OSError:  # an unreadable folder is not what this message is about
            continue
    return images, files, False
