"""The public surface: ``__all__`` is pinned and sorted, every name resolves, torch stays lazy."""

from __future__ import annotations

import subprocess
import sys

import shardio

EXPECTED = {
    "BadImageWarning", "BadInputError", "CacheBudgetError", "CenterCrop", "ChecksumError",
    "DatasetLockedError", "DatasetReader",
    "DecodeError", "DeviceDecoder", "DevicePrefetcher", "EmptySourceError", "Fields",
    "IndexedDataset", "Manifest",
    "ManifestError", "ManifestNotFoundError", "MergeSummary", "MissingDependencyError",
    "OutputExistsError", "PackError",
    "PackSummary", "RandomResizedCrop", "RecordBatch", "RecordEncodeError", "RemoteOptions",
    "ResumeError",
    "ShardCorruptError", "ShardInfo", "ShardMissingError", "ShardWriter", "ShardioError", "Source",
    "StorageError", "StreamingDataset", "TruncatedShardError", "UnsafeKeyError",
    "UnsupportedVersionError", "WriteOptions", "__version__", "doctor", "loader", "merge",
    "merge_states",
    "open_dataset", "pack", "pack_imagefolder", "pil_backend", "preview", "read_manifest",
    "unpack", "verify",
}


def test_all_is_pinned_and_sorted() -> None:
    assert set(shardio.__all__) == EXPECTED
    assert list(shardio.__all__) == sorted(shardio.__all__)


def test_every_public_name_resolves() -> None:
    for name in shardio.__all__:
        assert getattr(shardio, name) is not None, name
    for name in ("pack", "pack_imagefolder", "verify", "unpack", "loader", "merge",
                 "merge_states"):
        assert callable(getattr(shardio, name)), name


def test_import_shardio_does_not_import_torch() -> None:
    code = (
        "import sys, shardio; "
        "shardio.read_manifest; shardio.ShardWriter; shardio.pack; shardio.verify; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_import_shardio_imports_nothing_heavy() -> None:
    code = (
        "import sys, shardio; "
        "heavy = sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('numpy', 'PIL', 'torch', 'lmdb', 'zstandard', 'tqdm')); "
        "assert not heavy, heavy"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr


def test_submodule_imports_keep_the_public_functions() -> None:
    code = (
        "import shardio, shardio.packing.pack, shardio.ops.verify, shardio.ops.unpack; "
        "from shardio.packing.pack import pack as pack_fn; "
        "assert shardio.pack is pack_fn, shardio.pack; "
        "assert callable(shardio.verify) and callable(shardio.unpack)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
