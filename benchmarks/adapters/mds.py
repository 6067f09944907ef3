"""MosaicML Streaming: ``MDSWriter`` shards, read by ``StreamingDataset`` from a local folder.

Configured as its documentation describes for data already on local disk: ``local=`` the
MDS folder and no ``remote``, default shard size (64 MiB) and no compression, the default
``py1e`` shuffle seeded with ``shuffle_seed``, ``batch_size`` given to the dataset, and its
``StreamingDataLoader``. Samples are written in source (class) order, as its writer takes
them: a ``bytes`` column per field and an ``int`` label. Random access is its
``dataset[i]`` under a random sampler.

``import streaming`` also imports its ready-made dataset zoo (``streaming.vision`` needs
torchvision, which does not load beside this torch). The MDS path never touches the zoo,
so when torchvision is absent the three zoo packages are registered as empty modules
before the import (see ``import_streaming``).
"""

from __future__ import annotations

import importlib.util
import sys
import types
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

_ZOO = ("streaming.vision", "streaming.text", "streaming.multimodal")


def import_streaming() -> Any:
    """Import ``streaming`` without its torchvision-bound dataset zoo when torchvision is absent."""
    if importlib.util.find_spec("torchvision") is None:
        for name in _ZOO:
            sys.modules.setdefault(name, types.ModuleType(name))
    import streaming

    return streaming


class MosaicAdapter:
    """MosaicML Streaming MDS shards."""

    library = "mosaicml-streaming"

    def __init__(self, *, name: str) -> None:
        self.name = name

    def missing(self) -> str | None:
        return module_missing("streaming", "mosaicml-streaming")

    def pack(self, tree: Tree, work: Path, *, seed: int, num_workers: int) -> None:
        streaming = import_streaming()
        columns = {**{field: "bytes" for field in tree.fields}, "label": "int"}
        with streaming.MDSWriter(out=str(work), columns=columns) as sink:
            for paths, _, label in source_samples(tree):
                sink.write({**{f: p.read_bytes() for f, p in zip(tree.fields, paths, strict=True)},
                            "label": label})

    def data_files(self, tree: Tree, work: Path) -> list[Path]:
        return files_under(work)

    def epochs(self, tree: Tree, work: Path, spec: EpochSpec) -> Iterator[Iterable[Batch]]:
        streaming = import_streaming()
        from streaming.base.util import clean_stale_shared_memory

        decode, fields = spec.decode, tree.fields

        def pair(sample: dict[str, Any]) -> tuple[Any, int]:
            if decode:
                return decode_image(sample[fields[0]]), int(sample["label"])
            return payload_from([sample[f] for f in fields]), int(sample["label"])

        class PairDataset(streaming.StreamingDataset):  # type: ignore[misc,name-defined]
            def __getitem__(self, index: int) -> tuple[Any, int]:
                return pair(super().__getitem__(index))

        clean_stale_shared_memory()
        if spec.access == "random":
            plain = streaming.StreamingDataset(local=str(work), remote=None, shuffle=False)
            loader: Any = random_loader(MapView(plain, plain.num_samples, pair), spec)
        else:
            dataset = PairDataset(
                local=str(work), remote=None, shuffle=spec.shuffle, shuffle_seed=spec.seed,
                batch_size=spec.batch_size,
            )
            loader = streaming.StreamingDataLoader(
                dataset, batch_size=spec.batch_size, num_workers=spec.num_workers,
                collate_fn=collate_pairs,
            )
        for _ in range(spec.num_epochs):
            yield loader
