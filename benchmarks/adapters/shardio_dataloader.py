"""shardio read the way most users keep it: a plain ``torch.utils.data.DataLoader``.

``StreamingDataset(decode="raw", batch_size=b)`` yields one sample dict per sample and
the user's own collate function (here: the payloads and labels as lists) builds each
batch; nothing of ``shardio.loader`` or ``RecordBatch`` is used. Packs are the
``shardio-records`` adapter's (same options, same work folder layout).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks.adapters import Batch, EpochSpec
from benchmarks.adapters.shardio_packs import ShardioAdapter, UserCollate
from benchmarks.datagen import Tree


class ShardioDataLoaderAdapter(ShardioAdapter):
    """``StreamingDataset`` (raw dicts, or ``decode="tensor"``) + ``DataLoader`` + user collate."""

    def epochs(self, tree: Tree, work: Path, spec: EpochSpec) -> Iterator[Iterable[Batch]]:
        from torch.utils.data import DataLoader

        import shardio

        if spec.decode:
            dataset = shardio.StreamingDataset(work, decode="tensor", shuffle=spec.shuffle,
                                               seed=spec.seed, batch_size=spec.batch_size,
                                               verify=spec.verify)
            collate: Any = _decoded_pairs
        else:
            dataset = shardio.StreamingDataset(work, decode="raw", shuffle=spec.shuffle,
                                               seed=spec.seed, batch_size=spec.batch_size,
                                               verify=spec.verify)
            collate = UserCollate(tree)
        loader = DataLoader(dataset, batch_size=spec.batch_size, num_workers=spec.num_workers,
                            collate_fn=collate, persistent_workers=spec.num_workers > 0)
        for epoch in range(spec.num_epochs):
            dataset.set_epoch(epoch)
            yield loader


def _decoded_pairs(samples: Sequence[tuple[Any, int]]) -> Batch:
    return [s[0] for s in samples], [int(s[1]) for s in samples]
