"""Dataset paths and URLs → a ``Store``: local paths stay local, everything else goes to fsspec.

``open_store`` is the one place that decides. A string with a ``scheme://``
prefix (two letters or more, so a Windows drive is not one) is remote, except
``file://``; everything else, ``os.PathLike`` included, is a local path. Making
a remote store imports nothing: fsspec is imported when it is first used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from shardio.storage.local import LocalStore
from shardio.storage.remote import RemoteStore
from shardio.storage.retry import RetryPolicy
from shardio.storage.store import Store

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]+)://")
LOCAL_SCHEMES = ("file", "local")


def split_url(path: str | os.PathLike[str]) -> tuple[str | None, str]:
    """``(protocol, rest)``: protocol None for local paths, whose ``rest`` is the path itself."""
    if not isinstance(path, str):
        return None, os.fspath(path)
    match = _SCHEME.match(path)
    if match is None:
        return None, path
    protocol = match.group(1).lower()
    if protocol in LOCAL_SCHEMES:
        return None, path[match.end():] or "/"
    return protocol, path


def is_remote(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a URL read through fsspec rather than a local path."""
    return split_url(path)[0] is not None


def open_store(
    path: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> Store:
    """The store rooted at ``path``: a ``LocalStore`` or a ``RemoteStore``.

    Args:
        path: a local folder, ``file://…``, or any fsspec URL (``s3://bucket/prefix``,
            ``gs://…``, ``az://…``, ``https://host/dataset``…).
        storage_options: passed through to the fsspec filesystem (remote only).
        retry: retry policy of a remote store.

    Raises:
        ValueError: ``storage_options`` given for a local path (they would be ignored).
    """
    protocol, rest = split_url(path)
    if protocol is None:
        if storage_options:
            raise ValueError(
                f"{rest}: storage_options are for remote URLs (s3://, gs://, https://...), "
                "but this is a local path; drop them or pass a URL"
            )
        return LocalStore(rest)
    return RemoteStore(rest, protocol=protocol, storage_options=storage_options, retry=retry)
