"""WebDataset: ``ShardWriter`` tar shards, read by ``WebDataset`` with a shuffle buffer.

Configured as its documentation describes for local shards: ~100 MB shards (the low end
of its advice, so both workers get shards on these small sets), shard shuffling, a
1,000-sample shuffle buffer, ``split_by_worker``, batching inside the pipeline and a
``WebLoader`` with ``batch_size=None``. Samples are written in source (class) order, as
its writer takes them, one tar member per field plus ``cls``; WebDataset does not shuffle
at write time.
"""

from __future__ import annotations

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
    payload_from,
    source_samples,
)
from benchmarks.datagen import Tree

MAX_SHARD_BYTES = 100_000_000
SHUFFLE_BUFFER = 1000


def _raw(sample: tuple[Any, ...]) -> tuple[Any, int]:
    return payload_from(sample[:-1]), int(sample[-1])


def _decoded(sample: tuple[Any, ...]) -> tuple[Any, int]:
    return decode_image(sample[0]), int(sample[-1])


class WebDatasetAdapter:
    """WebDataset tar shards."""

    library = "webdataset"

    def __init__(self, *, name: str) -> None:
        self.name = name

    def missing(self) -> str | None:
        return module_missing("webdataset", "webdataset")

    def pack(self, tree: Tree, work: Path, *, seed: int, num_workers: int) -> None:
        import webdataset as wds

        work.mkdir(parents=True, exist_ok=True)
        pattern = str(work / "shard-%06d.tar")
        with wds.ShardWriter(pattern, maxsize=MAX_SHARD_BYTES, verbose=0) as sink:
            for paths, key, label in source_samples(tree):
                sink.write({"__key__": key, "cls": label,
                            **{f: p.read_bytes() for f, p in zip(tree.fields, paths, strict=True)}})

    def data_files(self, tree: Tree, work: Path) -> list[Path]:
        return files_under(work)

    def epochs(self, tree: Tree, work: Path, spec: EpochSpec) -> Iterator[Iterable[Batch]]:
        import webdataset as wds

        urls = [str(p) for p in sorted(work.glob("shard-*.tar"))]
        dataset = wds.WebDataset(
            urls,
            shardshuffle=len(urls) if spec.shuffle else False,
            seed=spec.seed,
            workersplitter=wds.split_by_worker,
            nodesplitter=wds.single_node_only,
            empty_check=False,
        )
        if spec.shuffle:
            dataset = dataset.shuffle(SHUFFLE_BUFFER)
        dataset = dataset.to_tuple(*tree.fields, "cls").map(_decoded if spec.decode else _raw)
        dataset = dataset.batched(spec.batch_size, collation_fn=collate_pairs, partial=True)
        loader = wds.WebLoader(dataset, batch_size=None, num_workers=spec.num_workers)
        for _ in range(spec.num_epochs):
            yield loader
