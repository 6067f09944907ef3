"""One small interface over every system the harness measures, and the registry of them.

Each adapter packs a generated tree into a work folder and iterates epochs of it
through a DataLoader (batch size 64), yielding per batch ``(payloads, labels)``: the
samples' original bytes (``decode=False``; a tuple of them, in ``tree.fields`` order, for
samples of several fields) or, decoded with Pillow in the workers, uint8 CHW tensors
(``decode=True``). The harness counts samples and bytes from them and checks
exactly-once delivery; it never sees a system's own types. An adapter imports its library
only when used, so a missing peer is reported (``missing()``), never a crash.
``EpochSpec.access="random"`` asks a map-style reader (``RANDOM_ACCESS``) for its samples
through a DataLoader's seeded random sampler; ``verify=False`` turns shardio's checksums
off (its public ``verify=`` option), to measure their share of an epoch.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from PIL import Image

from benchmarks.datagen import Tree

BATCH_SIZE = 64
Batch = tuple[Sequence[Any], Sequence[int]]


@dataclass(frozen=True)
class EpochSpec:
    """How to iterate one epoch."""

    num_workers: int = 0
    shuffle: bool = True
    seed: int = 0
    decode: bool = False
    batch_size: int = BATCH_SIZE
    num_epochs: int = 1
    access: str = "stream"
    """``"stream"`` (the system's own reader) or ``"random"`` (map-style, random sampler)."""
    verify: bool = True


class Adapter(Protocol):
    """What every system offers the harness."""

    name: str
    library: str | None

    def missing(self) -> str | None:
        """Why this system cannot run here (its library is not installed), or None."""

    def pack(self, tree: Tree, work: Path, *, seed: int, num_workers: int) -> None:
        """Convert ``tree`` into this system's format in the empty folder ``work``."""

    def data_files(self, tree: Tree, work: Path) -> list[Path]:
        """Every file an epoch reads (what "cold" evicts and ``cat`` reads)."""

    def epochs(self, tree: Tree, work: Path, spec: EpochSpec) -> Iterator[Iterable[Batch]]:
        """Build the dataset and loader once, then yield ``num_epochs`` iterables of batches.

        The same loader serves every epoch, as in a training loop, so memory growth from
        one epoch to the next shows; building it happens on the first ``next()``.
        """


def decode_image(data: bytes | memoryview) -> Any:
    """Decode JPEG bytes with Pillow into a uint8 CHW torch tensor, as a training job would."""
    import torch

    with Image.open(io.BytesIO(data)) as img:
        pixels = np.array(img.convert("RGB"))
    return torch.from_numpy(pixels).permute(2, 0, 1)


def collate_pairs(samples: Sequence[tuple[Any, int]]) -> Batch:
    """Collate ``(payload, label)`` samples into ``(list of payloads, list of labels)``."""
    return [s[0] for s in samples], [int(s[1]) for s in samples]


def source_samples(tree: Tree) -> list[tuple[list[Path], str, int]]:
    """``(the sample's files in field order, key, label)`` of every sample, in class order."""
    return [(paths, key, tree.label_of(key)) for key, paths in tree.samples()]


def read_payload(paths: Sequence[Path]) -> Any:
    """A sample's payload from its files: their bytes, a tuple of them for several fields."""
    if len(paths) == 1:
        return paths[0].read_bytes()
    return tuple(p.read_bytes() for p in paths)


def payload_from(values: Sequence[Any]) -> Any:
    """The payload of a sample whose field values a reader gave, in field order."""
    return values[0] if len(values) == 1 else tuple(values)


def payload_crc(payload: Any) -> int:
    """CRC-32 of a raw payload, its fields chained in order (what exactly-once compares)."""
    if isinstance(payload, tuple | list):  # a DataLoader's default_convert makes lists
        crc = 0
        for part in payload:
            crc = zlib.crc32(part, crc)
        return crc
    return zlib.crc32(payload)


def payload_nbytes(payload: Any) -> int:
    """Bytes of a payload: raw bytes, views, a tuple of fields, or a decoded tensor."""
    if isinstance(payload, tuple | list):  # a DataLoader's default_convert makes lists
        return sum(payload_nbytes(p) for p in payload)
    if isinstance(payload, memoryview):
        return payload.nbytes
    if isinstance(payload, bytes | bytearray):
        return len(payload)
    return int(payload.numel())


class MapView:
    """A peer's own ``dataset[i]`` as a map-style Dataset, for a random sampler."""

    def __init__(self, dataset: Any, length: int, pair: Callable[[Any], tuple[Any, int]]) -> None:
        self.dataset, self.length, self.pair = dataset, length, pair

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.pair(self.dataset[index])


def random_loader(dataset: Any, spec: EpochSpec, collate: Callable[..., Any] = collate_pairs
                  ) -> Any:
    """A DataLoader drawing ``dataset``'s samples through a seeded random sampler."""
    import torch
    from torch.utils.data import DataLoader

    return DataLoader(dataset, batch_size=spec.batch_size, shuffle=spec.shuffle,
                      generator=torch.Generator().manual_seed(spec.seed),
                      num_workers=spec.num_workers, collate_fn=collate)


def module_missing(module: str, dist: str) -> str | None:
    """A reason string when ``module`` cannot be found, naming the package to install."""
    if importlib.util.find_spec(module) is None:
        return f"{dist} is not installed (run benchmarks/setup_env.sh)"
    return None


def files_under(folder: Path) -> list[Path]:
    """Every regular file below ``folder``, sorted."""
    return sorted(p for p in folder.rglob("*") if p.is_file())


_REGISTRY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "imagefolder": ("benchmarks.adapters.folder", "FolderAdapter", {}),
    "shardio-records": ("benchmarks.adapters.shardio_packs", "ShardioAdapter",
                        {"backend": "records"}),
    "shardio-lmdb": ("benchmarks.adapters.shardio_packs", "ShardioAdapter", {"backend": "lmdb"}),
    "shardio-records-v2": ("benchmarks.adapters.shardio_packs", "ShardioAdapter",
                           {"backend": "records", "version": 2}),
    "shardio-records-unshuffled": ("benchmarks.adapters.shardio_packs", "ShardioAdapter",
                                   {"backend": "records", "pack_shuffle": False}),
    "shardio-records-dataloader": ("benchmarks.adapters.shardio_dataloader",
                                   "ShardioDataLoaderAdapter", {"backend": "records"}),
    "webdataset": ("benchmarks.adapters.wds", "WebDatasetAdapter", {}),
    "mosaicml": ("benchmarks.adapters.mds", "MosaicAdapter", {}),
    "litdata": ("benchmarks.adapters.litdata_chunks", "LitDataAdapter", {}),
    "lmdb-file": ("benchmarks.adapters.lmdb_file", "LmdbFileAdapter", {}),
}
SYSTEMS: tuple[str, ...] = tuple(_REGISTRY)
BASELINE = "imagefolder"
PEERS = ("webdataset", "mosaicml", "litdata", "lmdb-file")
SHUFFLE_ONLY = frozenset({"shardio-records-unshuffled"})
"""Variants measured for shuffle quality only (warm raw epochs), not for throughput."""
OPT_IN = frozenset({"shardio-records-v2"})
"""Variants measured only when named (``--systems``): format v2 beside v3, for issue 29."""
RANDOM_ACCESS = frozenset({BASELINE, "lmdb-file", "mosaicml", "litdata", "shardio-records",
                           "shardio-lmdb"})
"""Systems with a map-style reader (``dataset[i]``), measured with a random sampler too."""
CHECKED = frozenset({"shardio-records", "shardio-lmdb"})
"""Systems whose checksums can be turned off through a public option (``verify=False``)."""


def get_adapter(name: str) -> Adapter:
    """The adapter registered as ``name`` (see ``SYSTEMS``)."""
    try:
        module, cls, kwargs = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown system {name!r}; choose from {', '.join(SYSTEMS)}") from None
    factory: Callable[..., Adapter] = getattr(importlib.import_module(module), cls)
    return factory(name=name, **kwargs)
