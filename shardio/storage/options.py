"""``RemoteOptions``: how a dataset given as a URL is reached and cached, as one frozen value.

Every reading entry point (``read_manifest``, ``DatasetReader``, the torch
datasets, ``verify``, ``unpack``, the CLI) takes ``remote=RemoteOptions(...)``
and passes it down unchanged, so the options are spelled once. They apply to
URLs only: a local dataset is read in place and never cached, whatever they
say. The default cache budget is computed here from the cache folder's disk
(``default_max_cache_bytes``). Imports the storage modules below it; no fsspec.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from shardio.storage.budget import PARTIAL, RANGES
from shardio.storage.cache import default_cache_dir
from shardio.storage.fetch import DEFAULT_IN_FLIGHT, DEFAULT_IN_FLIGHT_BYTES
from shardio.storage.retry import RetryPolicy

DEFAULT_RANGE_BYTES: Final = 16 << 20
"""Largest fetch range (a record larger than this is a range of its own): S3's advice is 8-16 MB."""
MIN_RANGE_BYTES: Final = 64 << 10
CACHE_DISK_FRACTION: Final = 0.5
"""The default budget is this fraction of the cache filesystem's free space (plus the cache)."""
MAX_DEFAULT_CACHE_BYTES: Final = 100 * 10**9
"""...capped at 100 GB; set ``max_cache_bytes`` to keep a larger dataset cached whole."""
_ROUND_BYTES: Final = 1 << 20


@dataclass(frozen=True)
class RemoteOptions:
    """How a remote dataset (``s3://``, ``gs://``, ``az://``, ``http(s)://``, …) is read.

    Attributes:
        storage_options: passed to the fsspec filesystem (``endpoint_url``, ``key``,
            ``profile``, ``anon``, …), over the backend's own configuration (the
            ``AWS_*`` environment, profiles, ``GOOGLE_APPLICATION_CREDENTIALS``).
        cache_dir: the node cache folder, shared by every process of the node that
            names it; default ``$SHARDIO_CACHE_DIR``, else ``$XDG_CACHE_HOME/shardio``,
            else ``~/.cache/shardio``. It must be on a node-local filesystem.
        max_cache_bytes: hard budget of that folder (downloads in flight included);
            default ``default_max_cache_bytes(cache_dir)``: half the free space of its
            filesystem plus what the cache already holds, at most 100 GB.
        max_in_flight: ranges each reading process keeps downloading ahead of it, at most.
        max_in_flight_bytes: bytes of those ranges, at most (two ranges may hold more):
            both limits shrink to fit ``max_cache_bytes`` when it cannot hold them for
            every reading process of the node, down to one range ahead.
        range_bytes: largest range of records fetched at once (ranges are cut at record
            boundaries from each shard's index; the same cut in every process, so each
            range is downloaded once per node).
        retry: retry policy of the remote store.
    """

    storage_options: Mapping[str, Any] | None = None
    cache_dir: str | os.PathLike[str] | None = None
    max_cache_bytes: int | None = None
    max_in_flight: int = DEFAULT_IN_FLIGHT
    max_in_flight_bytes: int = DEFAULT_IN_FLIGHT_BYTES
    range_bytes: int = DEFAULT_RANGE_BYTES
    retry: RetryPolicy | None = None

    def __post_init__(self) -> None:
        if self.max_cache_bytes is not None and self.max_cache_bytes <= 0:
            raise ValueError(f"max_cache_bytes must be positive, got {self.max_cache_bytes}")
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {self.max_in_flight}")
        if self.max_in_flight_bytes < 1:
            raise ValueError(
                f"max_in_flight_bytes must be positive, got {self.max_in_flight_bytes}")
        if self.range_bytes < MIN_RANGE_BYTES:
            raise ValueError(
                f"range_bytes must be at least {MIN_RANGE_BYTES} (64 KiB), got {self.range_bytes}")

    @property
    def cache_path(self) -> Path:
        """The cache folder these options name (the default one when unset)."""
        return Path(self.cache_dir) if self.cache_dir is not None else default_cache_dir()

    def resolved(self) -> RemoteOptions:
        """These options with ``max_cache_bytes`` fixed, so every process agrees on it.

        A dataset resolves its options once, in the process that builds it;
        DataLoader workers inherit the result instead of each measuring the disk.
        """
        if self.max_cache_bytes is not None:
            return self
        return dataclasses.replace(self, cache_dir=self.cache_path,
                                   max_cache_bytes=default_max_cache_bytes(self.cache_path))


def _cached_bytes(cache_dir: Path) -> int:
    """Bytes the cache folder's ranges and partial downloads occupy on disk now."""
    total = 0
    for sub in (RANGES, PARTIAL):
        try:
            entries = list(os.scandir(cache_dir / sub))
        except FileNotFoundError:
            continue
        for entry in entries:
            try:
                total += entry.stat().st_blocks * 512  # st_blocks counts 512-byte units
            except FileNotFoundError:  # evicted meanwhile
                continue
    return total


def default_max_cache_bytes(cache_dir: str | os.PathLike[str]) -> int:
    """The budget used when ``max_cache_bytes`` is not given.

    Half of what the cache folder's filesystem has free, counting what the
    cache already holds as free (it is the cache's to reuse), at most 100 GB,
    rounded down to whole MiB. The folder is created if needed.
    """
    folder = Path(cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free + _cached_bytes(folder)
    budget = min(MAX_DEFAULT_CACHE_BYTES, int(free * CACHE_DISK_FRACTION))
    return max(_ROUND_BYTES, budget - budget % _ROUND_BYTES)
