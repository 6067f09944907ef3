"""The classic single-LMDB-file loader: every sample one key, one random read per sample.

Values are a 4-byte little-endian label followed by the original bytes (no pickle); a
sample of several fields is a pickled dict of them and its label, as such loaders keep
them. The reader is map-style (so its epoch is random access); each DataLoader worker
opens its own environment on first use, read only, without locking or OS readahead, the
settings such loaders use for random access.
"""

from __future__ import annotations

import os
import pickle
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.adapters import (
    Batch,
    EpochSpec,
    decode_image,
    files_under,
    module_missing,
    random_loader,
    read_payload,
    source_samples,
)
from benchmarks.datagen import Tree

_LABEL = struct.Struct("<i")
_COUNT_KEY = b"__len__"
_TXN_SAMPLES = 2000


def _key(index: int) -> bytes:
    return b"%08d" % index


class LmdbFileDataset:
    """``dataset[i]`` = one ``txn.get`` of key ``i``: ``(bytes or CHW tensor, label)``."""

    def __init__(self, path: Path, *, decode: bool, fields: tuple[str, ...]) -> None:
        self.path = str(path)
        self.decode = decode
        self.fields = fields
        self._env: Any = None
        self._pid = -1
        env = self._open()
        with env.begin() as txn:
            self.length = int(txn.get(_COUNT_KEY))
        env.close()
        self._env = None

    def _open(self) -> Any:
        import lmdb

        return lmdb.open(
            self.path, subdir=True, readonly=True, lock=False, readahead=False, meminit=False
        )

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Any, int]:
        if self._env is None or self._pid != os.getpid():
            self._env = self._open()
            self._pid = os.getpid()
        with self._env.begin() as txn:
            value = txn.get(_key(index))
        if len(self.fields) > 1:
            sample = pickle.loads(value)
            return tuple(sample[f] for f in self.fields), sample["label"]
        label = _LABEL.unpack_from(value)[0]
        data = value[_LABEL.size:]
        return (decode_image(data) if self.decode else data), label


class LmdbFileAdapter:
    """Single ``data.mdb`` holding every sample, written in source order."""

    library = "lmdb"

    def __init__(self, *, name: str) -> None:
        self.name = name

    def missing(self) -> str | None:
        return module_missing("lmdb", "lmdb")

    def pack(self, tree: Tree, work: Path, *, seed: int, num_workers: int) -> None:
        import lmdb

        work.mkdir(parents=True, exist_ok=True)
        map_size = 2 * tree.num_bytes + 4096 * tree.num_files + (1 << 26)
        env = lmdb.open(str(work), subdir=True, map_size=map_size, sync=True)
        items = source_samples(tree)
        for start in range(0, len(items), _TXN_SAMPLES):
            with env.begin(write=True) as txn:
                for index in range(start, min(start + _TXN_SAMPLES, len(items))):
                    paths, _, label = items[index]
                    payload = read_payload(paths)
                    value = (_LABEL.pack(label) + payload if len(paths) == 1 else pickle.dumps(
                        {**dict(zip(tree.fields, payload, strict=True)), "label": label}))
                    txn.put(_key(index), value, append=True)
        with env.begin(write=True) as txn:
            txn.put(_COUNT_KEY, str(len(items)).encode())
        env.sync(True)
        env.close()

    def data_files(self, tree: Tree, work: Path) -> list[Path]:
        return files_under(work)

    def epochs(self, tree: Tree, work: Path, spec: EpochSpec) -> Iterator[Iterable[Batch]]:
        loader = random_loader(LmdbFileDataset(work, decode=spec.decode, fields=tree.fields), spec)
        for _ in range(spec.num_epochs):
            yield loader
