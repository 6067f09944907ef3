"""Where a dataset lives: a local folder, or a URL read through ``shardio.storage``.

``read_manifest`` is the one entry every reader goes through: a local path is
read exactly as before (``shardio.manifest.read_manifest``); a ``scheme://``
URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``, any fsspec protocol) is
read with one GET of ``manifest.json`` through a ``Store``. What is not
supported for URLs yet (a pack's SRC, unpack's DEST) keeps the refusal of
``local_path``, so ``s3://bucket/x`` is never misread as a local folder named
``s3:``. Imports ``errors``, ``manifest`` and ``storage``; nothing above them.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from shardio.errors import ManifestError, ManifestNotFoundError, StorageError
from shardio.manifest import MANIFEST_NAME, Manifest
from shardio.manifest import read_manifest as read_local_manifest
from shardio.storage.options import RemoteOptions
from shardio.storage.store import Store
from shardio.storage.url import is_remote, open_store

_URL: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
"""``scheme://`` at the start: s3://, gs://, https://, file://, hf://, …"""


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
    try:
        parsed = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{where}: not valid JSON ({exc})", path=where) from exc
    manifest = Manifest.from_json(parsed, path=where)
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
