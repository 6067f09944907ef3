"""The baseline users have today: a torchvision-style ImageFolder, one file read per sample.

A map-style Dataset scans the tree once (like ``torchvision.datasets.ImageFolder``), and
``__getitem__`` opens and reads one file; a DataLoader with a seeded ``shuffle=True``
sampler shuffles. torchvision itself is not imported (it does not load beside this torch).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.adapters import Batch, EpochSpec, collate_pairs, decode_image, source_items
from benchmarks.datagen import Tree


class FolderDataset:
    """``dataset[i]`` reads file ``i`` of the tree: ``(bytes or CHW tensor, label)``."""

    def __init__(self, tree: Tree, *, decode: bool) -> None:
        self.items = [(str(path), label) for path, _, label in source_items(tree)]
        self.decode = decode

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.items[index]
        with open(path, "rb") as fh:
            data = fh.read()
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
        import torch
        from torch.utils.data import DataLoader

        dataset = FolderDataset(tree, decode=spec.decode)
        loader = DataLoader(
            dataset,  # type: ignore[arg-type]
            batch_size=spec.batch_size,
            shuffle=spec.shuffle,
            generator=torch.Generator().manual_seed(spec.seed),
            num_workers=spec.num_workers,
            collate_fn=collate_pairs,
        )
        for _ in range(spec.num_epochs):
            yield loader
