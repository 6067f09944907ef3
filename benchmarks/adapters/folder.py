"""The baseline users have today: a torchvision-style ImageFolder, one file read per sample.

A map-style Dataset scans the tree once (like ``torchvision.datasets.ImageFolder``), and
``__getitem__`` opens and reads the sample's files (one; two for the ``fields`` tree); a
DataLoader with a seeded ``shuffle=True`` sampler shuffles, which is also its random
access. torchvision itself is not imported (it does not load beside this torch).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.adapters import (
    Batch,
    EpochSpec,
    decode_image,
    random_loader,
    read_payload,
    source_samples,
)
from benchmarks.datagen import Tree


class FolderDataset:
    """``dataset[i]`` reads sample ``i`` of the tree: ``(payload or CHW tensor, label)``."""

    def __init__(self, tree: Tree, *, decode: bool) -> None:
        self.items = [(paths, label) for paths, _, label in source_samples(tree)]
        self.decode = decode

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        paths, label = self.items[index]
        data = read_payload(paths)
        return (decode_image(data) if self.decode else data), label


class FolderAdapter:
    """The plain ImageFolder reader; it has nothing to pack."""

    library = None

    def __init__(self, *, name: str) -> None:
        self.name = name

    def missing(self) -> str | None:
        return None

    def pack(self, tree: Tree, work: Path, *, seed: int, num_workers: int) -> None:
        work.mkdir(parents=True, exist_ok=True)

    def data_files(self, tree: Tree, work: Path) -> list[Path]:
        return tree.files()

    def epochs(self, tree: Tree, work: Path, spec: EpochSpec) -> Iterator[Iterable[Batch]]:
        loader = random_loader(FolderDataset(tree, decode=spec.decode), spec)
        for _ in range(spec.num_epochs):
            yield loader
