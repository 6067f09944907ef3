"""The classic single-LMDB-file loader: every sample one key, one random read per sample.

Values are a 4-byte little-endian label followed by the original bytes (no pickle); a
sample of several fields is a pickled dict of them and its label, as such loaders keep
them. The reader is map-style (so its epoch is random access); each DataLoader worker
opens its own environment on first use, read only, without locking or OS readahead, the
settings such loaders use for random access.
"""

from __future__ import annotations

import itertools
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


def write_values(work: Path, values: Iterable[bytes], map_size: int = 1 << 36) -> None:
    """The single file at ``work``: value ``i`` under key ``i``, then the count."""
    import lmdb

    work.mkdir(parents=True, exist_ok=True)
    env = lmdb.open(str(work), subdir=True, map_size=map_size, sync=True)
    count, pending, full = 0, iter(values), True
    while full:
        with env.begin(write=True) as txn:
            before = count
            for value in itertools.islice(pending, _TXN_SAMPLES):
                txn.put(_key(count), value, append=True)
                count += 1
            full = count - before == _TXN_SAMPLES
            if not full:
                txn.put(_COUNT_KEY, str(count).encode())
    env.sync(True)
    env.close()


def write_labelled(work: Path, samples: Iterable[tuple[int, bytes]]) -> None:
    """``write_values`` of ``(label, payload)`` pairs, as the adapter stores one field."""
    write_values(work, (_LABEL.pack(label) + payload for label, payload in samples))


class LmdbFileAdapter:
    """Single ``data.mdb`` holding every sample, written in source order."""

    library = "lmdb"

    def __init__(self, *, name: str) -> None:
        self.name = name

    def missing(self) -> str | None:
        return module_missing("lmdb", "lmdb")

    def pack(self, tree: Tree, work: Path, *, seed: int, num_workers: int) -> None:
        items = source_samples(tree)

        def values() -> Iterator[bytes]:
            for paths, _, label in items:
                payload = read_payload(paths)
                yield (_LABEL.pack(label) + payload if len(paths) == 1 else pickle.dumps(
                    {**dict(zip(tree.fields, payload, strict=True)), "label": label}))

        write_values(work, values(), 2 * tree.num_bytes + 4096 * tree.num_files + (1 << 26))

    def data_files(self, tree: Tree, work: Path) -> list[Path]:
        return files_under(work)

    def epochs(self, tree: Tree, work: Path, spec: EpochSpec) -> Iterator[Iterable[Batch]]:
        loader = random_loader(LmdbFileDataset(work, decode=spec.decode, fields=tree.fields), spec)
        for _ in range(spec.num_epochs):
            yield loader
