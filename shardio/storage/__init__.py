"""Storage: where a dataset's files live, below the backends and above nothing torch.

A dataset path is a local folder or a URL; ``open_store`` (``url.py``) turns
it into a ``Store`` (``store.py``) with whole and ranged reads, listing, size,
deletion and atomic writes. ``LocalStore`` (``local.py``) reads files in place
and is never cached; ``RemoteStore`` (``remote.py``) reaches any fsspec
protocol with per-process, fork-safe clients (``client.py``), retries
(``retry.py``) and streamed, resumable transfers (``transfer.py``). Remote
bytes that readers need as files or maps go through the node cache
(``cache.py``; space accounting in ``budget.py``, held ranges in
``cachedrange.py``): a folder shared by every process of a node, under a hard
byte budget; ``fetch.py`` keeps a few planned ranges downloading ahead, and
``readahead.py`` does so for a reader whose plan grows as it reads (the
stream). ``options.py`` holds ``RemoteOptions``, the one value every reading
entry point takes for a URL (cache folder, budget, ranges). fsspec
and its protocol packages are imported only when a remote store is first used
(``pip install fsspec s3fs``, the ``remote`` extra); nothing here imports torch.
"""

from __future__ import annotations

from shardio.storage.budget import CacheUsage
from shardio.storage.cache import (
    CacheStats,
    RangeCache,
    RangeCheck,
    dataset_namespace,
    default_cache_dir,
)
from shardio.storage.cachedrange import CachedRange
from shardio.storage.fetch import RangePrefetcher, RangeRequest, min_cache_bytes
from shardio.storage.local import LocalStore
from shardio.storage.options import RemoteOptions, default_max_cache_bytes
from shardio.storage.readahead import ReadAhead
from shardio.storage.remote import RemoteStore
from shardio.storage.retry import RetryPolicy, StoreStats, is_transient
from shardio.storage.store import RangeWriter, Store
from shardio.storage.url import is_remote, open_store, split_url

__all__ = [
    "CacheStats",
    "CacheUsage",
    "CachedRange",
    "LocalStore",
    "RangeCache",
    "RangeCheck",
    "RangePrefetcher",
    "RangeRequest",
    "RangeWriter",
    "ReadAhead",
    "RemoteOptions",
    "RemoteStore",
    "RetryPolicy",
    "Store",
    "StoreStats",
    "dataset_namespace",
    "default_cache_dir",
    "default_max_cache_bytes",
    "is_remote",
    "is_transient",
    "min_cache_bytes",
    "open_store",
    "split_url",
]
