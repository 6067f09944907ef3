"""shardio, one adapter per backend: ``shardio.pack`` then ``StreamingDataset`` + ``loader``.

Raw epochs take each batch as a ``RecordBatch`` and hand on its zero-copy payload views
(``batch.bytes(field)``, one per field); decoded epochs use ``decode="tensor"``, which
decodes in the workers. Labels come from the pack (ImageFolder, or ``class_folders=True``
for the other trees), exactly as the other systems store them. Random access is
``IndexedDataset`` under a DataLoader's random sampler (its ``__getitems__`` fetches a
batch), with the user's own collate (``UserCollate``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.adapters import (
    Batch,
    EpochSpec,
    files_under,
    module_missing,
    payload_from,
    random_loader,
)
from benchmarks.datagen import Tree


def payload_fields(tree: Tree) -> tuple[str, ...]:
    """The fields holding the original bytes: ``image`` for ImageFolder packs, else suffixes."""
    return ("image",) if tree.kind == "images" else tree.fields


class UserCollate:
    """What a training script writes: take each sample's payload fields and its label."""

    def __init__(self, tree: Tree) -> None:
        self.fields = payload_fields(tree)
        self.tree = tree

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> Batch:
        payloads = [payload_from([s[f] for f in self.fields]) for s in samples]
        if "label" in samples[0]:  # every pack but one of an older harness stores it
            return payloads, [int(s["label"]) for s in samples]
        return payloads, [self.tree.label_of(s["__key__"]) for s in samples]


class ShardioAdapter:
    """shardio with one backend; ``pack_shuffle=False`` keeps the source (class) order."""

    library = "shardio"

    def __init__(self, *, name: str, backend: str, pack_shuffle: bool = True,
                 version: int | None = None) -> None:
        self.name = name
        self.backend = backend
        self.pack_shuffle = pack_shuffle
        self.version = version
        """The format version to write (None: the release's); v2 measures what v3 replaced."""

    def missing(self) -> str | None:
        reason = module_missing("shardio", "shardio")
        if reason is None and self.backend == "lmdb":
            reason = module_missing("lmdb", "lmdb")
        return reason

    def pack(self, tree: Tree, work: Path, *, seed: int, num_workers: int) -> None:
        import shardio

        shardio.pack(
            tree.root,
            work,
            options=shardio.WriteOptions(backend=self.backend, **(
                {} if self.version is None else {"version": self.version})),
            # the tiny tree's class folders hold .bin files: their labels are stored, as
            # every peer stores them, instead of parsed from each key while reading
            class_folders=tree.kind != "images",
            seed=seed,
            shuffle=self.pack_shuffle,
            num_workers=num_workers,
            overwrite=True,
        )

    def data_files(self, tree: Tree, work: Path) -> list[Path]:
        return files_under(work)

    def epochs(self, tree: Tree, work: Path, spec: EpochSpec) -> Iterator[Iterable[Batch]]:
        import shardio

        if spec.access == "random":
            indexed = shardio.IndexedDataset(work, decode="raw", verify=spec.verify)
            loader: Any = random_loader(indexed, spec, UserCollate(tree))
            for _ in range(spec.num_epochs):
                yield loader
            return
        decode = "tensor" if spec.decode else "raw"
        dataset = shardio.StreamingDataset(work, decode=decode, shuffle=spec.shuffle,
                                           seed=spec.seed, verify=spec.verify)
        loader = shardio.loader(dataset, batch_size=spec.batch_size,
                                num_workers=spec.num_workers)
        for _ in range(spec.num_epochs):
            yield _batches(loader, tree, decode=spec.decode)


def _batches(loader: Iterable[Any], tree: Tree, *, decode: bool) -> Iterator[Batch]:
    fields = payload_fields(tree)
    for batch in loader:
        if decode:
            images, labels = batch
            yield list(images), labels.tolist()
            continue
        columns = [batch.bytes(f) for f in fields]
        payloads = columns[0] if len(columns) == 1 else list(zip(*columns, strict=True))
        if batch.labels is not None:
            yield payloads, batch.labels.tolist()
        else:
            yield payloads, [tree.label_of(key) for key in batch.keys]
