"""Read a mixture of datasets as one: their shards numbered one after another.

``MixtureReader`` opens one ``DatasetReader`` per ``shardio.Source`` (local or
a URL, exactly as a single dataset is opened) and offers what
``shardio.reading.stream.iter_samples`` reads through: a manifest whose shards are
every source's, in source order, with first indices running on, and each
shard by that number. The plan (``shardio.order.mix.MixConfig``) gives global
indices in that numbering; ``tagged`` turns each sample's back into its
source's own ``__index__`` and adds ``__source__``. Torch-free.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from shardio.backends import ShardFileReader
from shardio.format.manifest import Manifest
from shardio.format.record import INDEX_FIELD
from shardio.order.mix import (
    SOURCE_FIELD,
    MixConfig,
    Source,
    check_sources,
    resolve_counts,
    source_labels,
)
from shardio.order.plan import PlanConfig
from shardio.reading.reader import DatasetReader
from shardio.storage.options import RemoteOptions


def joined_manifest(manifests: Sequence[Manifest]) -> Manifest:
    """One manifest listing every source's shards, source after source.

    Counts and fields add up; ``classes`` are kept only when every source has
    the same (a label then means one class in every source). Backend, codec
    and options are the first source's: each source's shards are still
    opened by its own reader. ``block_records`` (a v3 block's records, which
    the plan cuts its blocks at and a remote first batch groups records by) is
    kept only when every source has the same: a second source's stored blocks
    would otherwise be cut by the first's size, each read for two plan blocks.
    """
    shards, first = [], 0
    for manifest in manifests:
        for info in manifest.shards:
            shards.append(replace(info, first_index=first))
            first += info.num_samples
    head = manifests[0]
    same = all((m.classes, m.class_to_idx) == (head.classes, head.class_to_idx) for m in manifests)
    options = dict(head.options)
    if len({m.block_records for m in manifests}) > 1:
        options.pop("block_records", None)
    return replace(
        head,
        options=options,
        num_samples=first,
        num_bytes=sum(m.num_bytes for m in manifests),
        input_bytes=sum(m.input_bytes for m in manifests),
        fields=tuple(dict.fromkeys(f for m in manifests for f in m.fields)),
        shards=tuple(shards),
        classes=head.classes if same else None,
        class_to_idx=head.class_to_idx if same else None,
        skipped=(),
    )


class MixtureReader:
    """The datasets of a mixture read as one, with each epoch's count per source."""

    def __init__(
        self,
        sources: Sequence[Source],
        *,
        epoch_size: int | None = None,
        verify: bool = True,
        remote: RemoteOptions | None = None,
        num_processes: int = 1,
    ) -> None:
        """Open every source's manifest now (shards on first use) and fix the counts.

        Raises:
            ValueError: a bad list of sources or ``epoch_size`` (see
                ``shardio.order.mix.check_sources`` and ``resolve_counts``).
            TypeError: an item of ``sources`` is not a ``shardio.Source``.
        """
        self.sources = check_sources(sources)
        readers = tuple(
            DatasetReader(s.path, verify=verify, remote=remote, num_processes=num_processes)
            for s in self.sources
        )
        sizes = [r.manifest.num_samples for r in readers]
        self.counts = resolve_counts(sizes, self.sources, epoch_size)
        """Samples each source gives per epoch."""
        self.labels = source_labels(self.sources)
        """Each source's ``__source__``."""
        self.verify = verify
        self._attach(readers)

    def _attach(self, readers: tuple[DatasetReader, ...]) -> None:
        self.readers = readers
        self.manifest = joined_manifest([r.manifest for r in readers])
        self.root = " + ".join(str(r.root) for r in readers)
        """The sources' folders or URLs, for messages."""
        self.remote = next((r.remote for r in readers if r.remote is not None), None)
        """The resolved ``RemoteOptions`` of the first remote source; None if all are local."""
        self._firsts = [0]
        self._shards: list[tuple[int, int]] = []
        """Per shard number: (source, the source's own shard number)."""
        for n, reader in enumerate(readers):
            self._firsts.append(self._firsts[-1] + reader.manifest.num_samples)
            self._shards += [(n, k) for k in range(len(reader.manifest.shards))]

    def mix_config(self, config: PlanConfig) -> MixConfig:
        """``config`` (the order settings a single dataset would have) for this mixture."""
        return MixConfig(
            shard_sizes=self.manifest.shard_sizes,
            seed=config.seed,
            shuffle=config.shuffle,
            block_size=config.block_size,
            window=config.window,
            drop_last=config.drop_last,
            head=config.head,
            source_shards=tuple(len(r.manifest.shards) for r in self.readers),
            counts=self.counts,
        )

    def reopened(self, *, num_processes: int | None = None,
                 block_records: int | None = None) -> MixtureReader:
        """The same sources and manifests (never read again) with nothing open.

        ``block_records`` as ``DatasetReader.reopened``: a mixture's blocks are cut per
        source shard from its first record, as a single dataset's are.
        """
        clone: MixtureReader = object.__new__(MixtureReader)
        clone.__dict__.update(self.__dict__)
        clone._attach(tuple(r.reopened(num_processes=num_processes, block_records=block_records)
                            for r in self.readers))
        return clone

    @property
    def is_remote(self) -> bool:
        """Whether a source is read from a URL: the stream then reads a process's part of a
        block as one run (one range taken once a window, not once a record), as it does
        for a single remote dataset."""
        return any(reader.is_remote for reader in self.readers)

    def shard(self, shard: int) -> ShardFileReader:
        """The open reader of shard number ``shard`` (counting every source's shards)."""
        source, own = self._shards[shard]
        return self.readers[source].shard(own)

    def opened(self, shard: int) -> ShardFileReader | None:
        """The reader of shard ``shard`` if it is open now, without opening it."""
        source, own = self._shards[shard]
        return self.readers[source].opened(own)

    def prefetch(self, shards: Iterable[int]) -> None:
        """Start opening ``shards`` where an open is a round trip (remote sources)."""
        by_source: dict[int, list[int]] = {}
        for shard in shards:
            source, own = self._shards[shard]
            by_source.setdefault(source, []).append(own)
        for source, own_shards in by_source.items():
            self.readers[source].prefetch(own_shards)

    def close(self) -> None:
        """Release every source's open shards."""
        for reader in self.readers:
            reader.close()

    def tagged(self, samples: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """``samples`` with their source's own ``__index__`` and their ``__source__``.

        Each is a new dict: a sample drawn twice in one window is one decoded
        dict, and a transform must not see the other draw's changes.
        """
        firsts, labels = self._firsts, self.labels
        for sample in samples:
            index = sample[INDEX_FIELD]
            source = bisect.bisect_right(firsts, index) - 1
            yield {**sample, INDEX_FIELD: index - firsts[source], SOURCE_FIELD: labels[source]}


def open_reader(
    path: str | os.PathLike[str] | Source | Sequence[Source],
    *,
    epoch_size: int | None = None,
    verify: bool = True,
    remote: RemoteOptions | None = None,
) -> DatasetReader | MixtureReader:
    """A ``DatasetReader`` for one dataset path, a ``MixtureReader`` for sources.

    A path with ``epoch_size`` is a mixture of that one source: each epoch
    draws ``epoch_size`` of its samples.
    """
    if isinstance(path, Source):
        path = [path]
    if isinstance(path, (str, os.PathLike)):
        if epoch_size is None:
            return DatasetReader(path, verify=verify, remote=remote)
        path = [Source(path)]
    return MixtureReader(path, epoch_size=epoch_size, verify=verify, remote=remote)
