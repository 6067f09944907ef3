"""The exception tree of shardio; every error a user can meet is one of these.

Each class also subclasses the builtin a caller would naturally catch, so
``except FileNotFoundError`` keeps working around shardio calls::

    ShardioError(Exception)
    ├── ManifestError(ValueError)             bad or unsupported manifest.json
    │   └── UnsupportedVersionError           format version this reader does not know
    ├── ManifestNotFoundError(FileNotFoundError)
    ├── ShardMissingError(FileNotFoundError)  manifest names a shard that is not there
    ├── ShardCorruptError(ValueError)         bytes on disk disagree with the format
    │   ├── ChecksumError                     a record or file checksum does not match
    │   └── TruncatedShardError               a shard is shorter than it claims
    ├── RecordEncodeError(TypeError)          a sample holds a value the format cannot store
    ├── DecodeError(ValueError)               a sample's image bytes cannot be decoded
    ├── PackError                             packing could not finish
    │   ├── BadInputError(OSError)            an input file is unreadable, empty, not an image…
    │   ├── EmptySourceError(ValueError)      nothing to pack
    │   ├── OutputExistsError(FileExistsError)
    │   └── DatasetLockedError(TimeoutError)  another writer holds the dataset's write lock
    ├── UnsafeKeyError(ValueError)            unpack refused a key that escapes DEST
    ├── ResumeError(ValueError)               a state cannot resume this dataset, or cannot be known
    ├── StorageError(OSError)                 a remote store failed after retries, or refused
    ├── CacheBudgetError(ValueError)          max_cache_bytes is below what must be in flight
    └── MissingDependencyError(ImportError)   an optional extra (shardio-torch[remote]) is missing

Every constructor takes the message as its only positional argument (the
DataLoader re-raises worker errors in the main process by calling
``type(exc)(message)``); the location is kept in keyword attributes.
"""

from __future__ import annotations

import re
from pathlib import Path

_URL_SECRETS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?:[^/\s@'\"<>]*@)?"
                          r"(?P<rest>[^\s?#'\"<>]*)(?:[?#][^\s'\"<>]*)?")
"""A URL, its user info (``user:password@``) and its query string or fragment (a presigned
URL's signature and access key id)."""


def without_url_secrets(text: str) -> str:
    """``text`` with every URL's user info, query string and fragment cut out: what an error
    may say of a URL a user gave (``s3://key:secret@bucket/x``, a presigned ``https://``)."""
    return _URL_SECRETS.sub(lambda m: m["scheme"] + m["rest"], text)


class ShardioError(Exception):
    """Base class of every shardio error; carries where it happened."""

    def __init__(
        self,
        message: str,
        *,
        path: str | Path | None = None,
        record: int | None = None,
        offset: int | None = None,
    ) -> None:
        # every message and place is built from what the caller gave, URLs included: cut
        # their secrets here, once, whichever module built the message
        super().__init__(without_url_secrets(message))
        self.path = None if path is None else without_url_secrets(str(path))
        self.record = record
        self.offset = offset


class ManifestError(ShardioError, ValueError):
    """The manifest cannot be read or describes something this version cannot use."""


class UnsupportedVersionError(ManifestError):
    """The manifest or a shard was written by a format version this reader does not know."""


class ManifestNotFoundError(ShardioError, FileNotFoundError):
    """A dataset directory has no manifest.json."""


class ShardMissingError(ShardioError, FileNotFoundError):
    """The manifest names a shard file that does not exist."""


class ShardCorruptError(ShardioError, ValueError):
    """A shard's bytes disagree with the format or the manifest."""


class ChecksumError(ShardCorruptError):
    """A record's or a shard file's checksum does not match the stored one."""


class TruncatedShardError(ShardCorruptError):
    """A shard file is shorter than its header, index or manifest entry says."""


class RecordEncodeError(ShardioError, TypeError):
    """A sample holds a value the record format cannot store (it would need pickle)."""


class DecodeError(ShardioError, ValueError):
    """A sample's stored bytes are not an image Pillow can decode; ``key`` names the sample."""

    def __init__(
        self,
        message: str,
        *,
        key: str | None = None,
        path: str | Path | None = None,
        record: int | None = None,
    ) -> None:
        super().__init__(message, path=path, record=record)
        self.key = key


class PackError(ShardioError):
    """Packing could not finish; nothing that points at partial output was written."""


class BadInputError(PackError, OSError):
    """An input file cannot be packed: unreadable, empty, a broken link, not an image."""


class EmptySourceError(PackError, ValueError):
    """The source folder holds nothing to pack."""


class OutputExistsError(PackError, FileExistsError):
    """The output folder is not empty and neither --overwrite nor --resume was given."""


class DatasetLockedError(PackError, TimeoutError):
    """Another process is writing the same local dataset (pack, append or merge) and kept it."""


class UnsafeKeyError(ShardioError, ValueError):
    """Unpacking refused a sample key that would write outside the destination."""


class ResumeError(ShardioError, ValueError):
    """A saved state does not fit this dataset, or a position cannot be known exactly."""


class StorageError(ShardioError, OSError):
    """A remote store could not be read or written (after retries), or refused the request."""


class CacheBudgetError(ShardioError, ValueError):
    """``max_cache_bytes`` is below what must be cached at once; the message says the minimum."""


class MissingDependencyError(ShardioError, ImportError):
    """An optional dependency is not installed; the message names the pip extra."""
