"""LitData: ``optimize`` into chunks, read by ``StreamingDataset`` + ``StreamingDataLoader``.

Configured as its documentation describes for a local folder: ``optimize`` with a
64 MB ``chunk_bytes`` and one worker per core, no compression; ``StreamingDataset`` on the
output folder (read in place, no cache copy) with ``shuffle`` and ``seed``; its
``StreamingDataLoader``. Inputs are given in source (class) order; a sample is a dict of
its fields' bytes and its label. Random access is its ``dataset[i]`` under a random sampler.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.adapters import (
    Batch,
    EpochSpec,
    MapView,
    collate_pairs,
    decode_image,
    files_under,
    module_missing,
    payload_from,
    random_loader,
    source_samples,
)
from benchmarks.datagen import Tree

CHUNK_BYTES = "64MB"


def read_item(item: tuple[dict[str, str], int]) -> dict[str, Any]:
    """``optimize``'s function: one sample's source files -> one sample dict."""
    paths, label = item
    return {**{field: Path(path).read_bytes() for field, path in paths.items()}, "label": label}


class Pair:
    """A sample dict -> ``(payload, label)``, its fields in the tree's order."""

    def __init__(self, fields: tuple[str, ...], decode: bool) -> None:
        self.fields, self.decode = fields, decode

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, int]:
        if self.decode:
            return decode_image(sample[self.fields[0]]), int(sample["label"])
        return payload_from([bytes(sample[f]) for f in self.fields]), int(sample["label"])


class LitDataAdapter:
    """LitData optimized chunks."""

    library = "litdata"

    def __init__(self, *, name: str) -> None:
        self.name = name

    def missing(self) -> str | None:
        return module_missing("litdata", "litdata")

    def pack(self, tree: Tree, work: Path, *, seed: int, num_workers: int) -> None:
        import litdata

        inputs = [({f: str(p) for f, p in zip(tree.fields, paths, strict=True)}, label)
                  for paths, _, label in source_samples(tree)]
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

        pair = Pair(tree.fields, spec.decode)
        if spec.access == "random":
            dataset = litdata.StreamingDataset(input_dir=str(work))
            loader: Any = random_loader(MapView(dataset, len(dataset), pair), spec)
        else:
            dataset = litdata.StreamingDataset(
                input_dir=str(work), shuffle=spec.shuffle, seed=spec.seed, transform=pair)
            loader = litdata.StreamingDataLoader(
                dataset, batch_size=spec.batch_size, num_workers=spec.num_workers,
                collate_fn=collate_pairs,
            )
        for _ in range(spec.num_epochs):
            yield loader
