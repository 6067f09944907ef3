"""LitData: ``optimize`` into chunks, read by ``StreamingDataset`` + ``StreamingDataLoader``.

Configured as its documentation describes for a local folder: ``optimize`` with a
64 MB ``chunk_bytes`` and one worker per core, no compression; ``StreamingDataset`` on the
output folder (read in place, no cache copy) with ``shuffle`` and ``seed``; its
``StreamingDataLoader``. Inputs are given in source (class) order.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.adapters import (
    Batch,
    EpochSpec,
    collate_pairs,
    decode_image,
    files_under,
    module_missing,
    source_items,
)
from benchmarks.datagen import Tree

CHUNK_BYTES = "64MB"


def read_item(item: tuple[str, int]) -> dict[str, Any]:
    """``optimize``'s function: one source file -> one sample dict."""
    path, label = item
    with open(path, "rb") as fh:
        return {"data": fh.read(), "label": label}


def _pair(sample: dict[str, Any]) -> tuple[Any, int]:
    return bytes(sample["data"]), int(sample["label"])


def _decoded_pair(sample: dict[str, Any]) -> tuple[Any, int]:
    return decode_image(sample["data"]), int(sample["label"])


class LitDataAdapter:
    """LitData optimized chunks."""

    library = "litdata"

    def __init__(self, *, name: str) -> None:
        self.name = name

    def missing(self) -> str | None:
        return module_missing("litdata", "litdata")

    def pack(self, tree: Tree, work: Path, *, seed: int, num_workers: int) -> None:
        import litdata

        inputs = [(str(path), label) for path, _, label in source_items(tree)]
        # optimize stages chunks in a cache folder before moving them to output_dir; keep
        # it beside the output (same file system, removed with the work folder).
        os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = str(work.parent / ".litdata-cache")
        litdata.optimize(
            fn=read_item, inputs=inputs, output_dir=str(work), chunk_bytes=CHUNK_BYTES,
            num_workers=max(1, num_workers), verbose=False,
        )

    def data_files(self, tree: Tree, work: Path) -> list[Path]:
        return files_under(work)

    def epochs(self, tree: Tree, work: Path, spec: EpochSpec) -> Iterator[Iterable[Batch]]:
        import litdata

        dataset = litdata.StreamingDataset(
            input_dir=str(work), shuffle=spec.shuffle, seed=spec.seed,
            transform=_decoded_pair if spec.decode else _pair,
        )
        loader = litdata.StreamingDataLoader(
            dataset, batch_size=spec.batch_size, num_workers=spec.num_workers,
            collate_fn=collate_pairs,
        )
        for _ in range(spec.num_epochs):
            yield loader
