"""shardio: pack many small files into shuffled, checksummed shards; stream them into PyTorch.

Data flow: files → records → shards + manifest (``pack``, ``ShardWriter``) →
stream → shuffle → split → decode → batch → device (``StreamingDataset``,
``IndexedDataset``, ``loader``, ``DevicePrefetcher``, ``DeviceDecoder``).

``import shardio`` imports nothing heavy (no torch, numpy, zstandard, lmdb, Pillow):
every name but the errors and the manifest is loaded on first use, so packing and
verifying work where torch is absent and ``shardio --help`` starts at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardio.errors import (
    BadInputError,
    CacheBudgetError,
    ChecksumError,
    DatasetLockedError,
    DecodeError,
    EmptySourceError,
    ManifestError,
    ManifestNotFoundError,
    MissingDependencyError,
    OutputExistsError,
    PackError,
    RecordEncodeError,
    ResumeError,
    ShardCorruptError,
    ShardioError,
    ShardMissingError,
    StorageError,
    TruncatedShardError,
    UnsafeKeyError,
    UnsupportedVersionError,
)
from shardio.format.manifest import Manifest, ShardInfo
from shardio.version import __version__

if TYPE_CHECKING:
    from shardio.decode.crop import CenterCrop, RandomResizedCrop
    from shardio.decode.fields import Fields
    from shardio.decode.image import pil_backend
    from shardio.ops.merge import MergeSummary, merge
    from shardio.ops.preview import preview
    from shardio.ops.unpack import unpack
    from shardio.ops.verify import verify
    from shardio.order.mix import Source
    from shardio.packing.pack import PackSummary, pack, pack_imagefolder
    from shardio.packing.writer import ShardWriter, WriteOptions
    from shardio.reading.batch import RecordBatch
    from shardio.reading.reader import DatasetReader, open_dataset
    from shardio.storage.location import read_manifest
    from shardio.storage.options import RemoteOptions
    from shardio.torch.badimage import BadImageWarning
    from shardio.torch.dataset import StreamingDataset
    from shardio.torch.device_decode import DeviceDecoder
    from shardio.torch.doctor import doctor
    from shardio.torch.indexed import IndexedDataset
    from shardio.torch.loader import loader
    from shardio.torch.prefetch import DevicePrefetcher
    from shardio.torch.state import merge_states

_LAZY = {
    "PackSummary": "shardio.packing.pack",
    "MergeSummary": "shardio.ops.merge",
    "merge": "shardio.ops.merge",
    "pack": "shardio.packing.pack",
    "pack_imagefolder": "shardio.packing.pack",
    "DatasetReader": "shardio.reading.reader",
    "open_dataset": "shardio.reading.reader",
    "unpack": "shardio.ops.unpack",
    "verify": "shardio.ops.verify",
    "ShardWriter": "shardio.packing.writer",
    "WriteOptions": "shardio.packing.writer",
    "StreamingDataset": "shardio.torch.dataset",
    "IndexedDataset": "shardio.torch.indexed",
    "merge_states": "shardio.torch.state",
    "RecordBatch": "shardio.reading.batch",
    "loader": "shardio.torch.loader",
    "DevicePrefetcher": "shardio.torch.prefetch",
    "DeviceDecoder": "shardio.torch.device_decode",
    "pil_backend": "shardio.decode.image",
    "Fields": "shardio.decode.fields",
    "preview": "shardio.ops.preview",
    "read_manifest": "shardio.storage.location",
    "RemoteOptions": "shardio.storage.options",
    "Source": "shardio.order.mix",
    "doctor": "shardio.torch.doctor",
    "BadImageWarning": "shardio.torch.badimage",
    "RandomResizedCrop": "shardio.decode.crop",
    "CenterCrop": "shardio.decode.crop",
}

__all__ = [
    "BadImageWarning",
    "BadInputError",
    "CacheBudgetError",
    "CenterCrop",
    "ChecksumError",
    "DatasetLockedError",
    "DatasetReader",
    "DecodeError",
    "DeviceDecoder",
    "DevicePrefetcher",
    "EmptySourceError",
    "Fields",
    "IndexedDataset",
    "Manifest",
    "ManifestError",
    "ManifestNotFoundError",
    "MergeSummary",
    "MissingDependencyError",
    "OutputExistsError",
    "PackError",
    "PackSummary",
    "RandomResizedCrop",
    "RecordBatch",
    "RecordEncodeError",
    "RemoteOptions",
    "ResumeError",
    "ShardCorruptError",
    "ShardInfo",
    "ShardMissingError",
    "ShardWriter",
    "ShardioError",
    "Source",
    "StorageError",
    "StreamingDataset",
    "TruncatedShardError",
    "UnsafeKeyError",
    "UnsupportedVersionError",
    "WriteOptions",
    "__version__",
    "doctor",
    "loader",
    "merge",
    "merge_states",
    "open_dataset",
    "pack",
    "pack_imagefolder",
    "pil_backend",
    "preview",
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

