"""shardio: pack many small files into shuffled, checksummed shards; stream them into PyTorch.

Data flow: files → records → shards + manifest (``pack``, ``ShardWriter``) →
stream → shuffle → split → decode → batch → device (``StreamingDataset``,
``IndexedDataset``, ``loader``, ``DevicePrefetcher``).

``import shardio`` does not import torch: the torch-facing names below are
loaded on first use, so packing and verifying work where torch is absent.
"""

from __future__ import annotations

import importlib
from typing import Any

from shardio.errors import (
    BadInputError,
    ChecksumError,
    DecodeError,
    EmptySourceError,
    ManifestError,
    ManifestNotFoundError,
    OutputExistsError,
    PackError,
    RecordEncodeError,
    ShardCorruptError,
    ShardioError,
    ShardMissingError,
    TruncatedShardError,
    UnsafeKeyError,
    UnsupportedVersionError,
)
from shardio.manifest import Manifest, ShardInfo, read_manifest
from shardio.pack import PackSummary, pack, pack_imagefolder
from shardio.reader import DatasetReader, open_dataset
from shardio.unpack import unpack
from shardio.verify import verify
from shardio.version import __version__
from shardio.writer import ShardWriter, WriteOptions

_LAZY = {
    "StreamingDataset": "shardio.dataset",
    "IndexedDataset": "shardio.dataset",
    "merge_states": "shardio.state",
    "RecordBatch": "shardio.batch",
    "loader": "shardio.dataloader",
    "DevicePrefetcher": "shardio.prefetch",
    "pil_backend": "shardio.decode",
}

__all__ = [
    "BadInputError",
    "ChecksumError",
    "DatasetReader",
    "DecodeError",
    "DevicePrefetcher",
    "EmptySourceError",
    "IndexedDataset",
    "Manifest",
    "ManifestError",
    "ManifestNotFoundError",
    "OutputExistsError",
    "PackError",
    "PackSummary",
    "RecordBatch",
    "RecordEncodeError",
    "ShardCorruptError",
    "ShardInfo",
    "ShardMissingError",
    "ShardWriter",
    "ShardioError",
    "StreamingDataset",
    "TruncatedShardError",
    "UnsafeKeyError",
    "UnsupportedVersionError",
    "WriteOptions",
    "__version__",
    "loader",
    "merge_states",
    "open_dataset",
    "pack",
    "pack_imagefolder",
    "pil_backend",
    "read_manifest",
    "unpack",
    "verify",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardio' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
