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
import sys
import types
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
    OutputExistsError,
    PackError,
    RecordEncodeError,
    ShardCorruptError,
    ShardioError,
    ShardMissingError,
    StorageError,
    TruncatedShardError,
    UnsafeKeyError,
    UnsupportedVersionError,
)
from shardio.manifest import Manifest, ShardInfo
from shardio.version import __version__

if TYPE_CHECKING:
    from shardio.badimage import BadImageWarning
    from shardio.batch import RecordBatch
    from shardio.crop import CenterCrop, RandomResizedCrop
    from shardio.dataloader import loader
    from shardio.dataset import IndexedDataset, StreamingDataset
    from shardio.decode import pil_backend
    from shardio.devicedecode import DeviceDecoder
    from shardio.doctor import doctor
    from shardio.fields import Fields
    from shardio.location import read_manifest
    from shardio.merge import MergeSummary, merge
    from shardio.mix import Source
    from shardio.pack import PackSummary, pack, pack_imagefolder
    from shardio.prefetch import DevicePrefetcher
    from shardio.preview import preview
    from shardio.reader import DatasetReader, open_dataset
    from shardio.state import merge_states
    from shardio.storage.options import RemoteOptions
    from shardio.unpack import unpack
    from shardio.verify import verify
    from shardio.writer import ShardWriter, WriteOptions

_LAZY = {
    "PackSummary": "shardio.pack",
    "MergeSummary": "shardio.merge",
    "merge": "shardio.merge",
    "pack": "shardio.pack",
    "pack_imagefolder": "shardio.pack",
    "DatasetReader": "shardio.reader",
    "open_dataset": "shardio.reader",
    "unpack": "shardio.unpack",
    "verify": "shardio.verify",
    "ShardWriter": "shardio.writer",
    "WriteOptions": "shardio.writer",
    "StreamingDataset": "shardio.dataset",
    "IndexedDataset": "shardio.dataset",
    "merge_states": "shardio.state",
    "RecordBatch": "shardio.batch",
    "loader": "shardio.dataloader",
    "DevicePrefetcher": "shardio.prefetch",
    "DeviceDecoder": "shardio.devicedecode",
    "pil_backend": "shardio.decode",
    "Fields": "shardio.fields",
    "preview": "shardio.preview",
    "read_manifest": "shardio.location",
    "RemoteOptions": "shardio.storage.options",
    "Source": "shardio.mix",
    "doctor": "shardio.doctor",
    "BadImageWarning": "shardio.badimage",
    "RandomResizedCrop": "shardio.crop",
    "CenterCrop": "shardio.crop",
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
    "OutputExistsError",
    "PackError",
    "PackSummary",
    "RandomResizedCrop",
    "RecordBatch",
    "RecordEncodeError",
    "RemoteOptions",
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


class _Package(types.ModuleType):
    """``shardio`` itself: ``pack``, ``unpack`` and ``verify`` stay the functions.

    Importing a submodule sets it as an attribute of its package, so without this
    ``import shardio.pack`` (done by the CLI, or any caller) would replace the
    function ``shardio.pack`` with the module of the same name.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
