"""Each system reading its own format from S3 (``bench_remote``), with its own cache and budget.

The formats are written by the local adapters (``adapters.<system>.pack``) and uploaded
as they are; these readers only read. Every reader reaches the server the way its
documentation describes, from the standard environment (``remote_servers.s3_environment``:
``AWS_ENDPOINT_URL``, and ``S3_ENDPOINT_URL`` for MosaicML), keeps its downloads in
``RemoteSpec.cache_dir`` and, given ``max_cache_bytes``, its own budget setting:

* shardio: ``StreamingDataset(url, remote=RemoteOptions(cache_dir=, max_cache_bytes=))``;
  budget: ``max_cache_bytes``.
* mosaicml: ``StreamingDataset(remote=url, local=cache_dir, cache_limit=)``; budget:
  ``cache_limit``.
* litdata: ``StreamingDataset(input_dir=url, cache_dir=, max_cache_size=)``; budget:
  ``max_cache_size``.
* webdataset: ``WebDataset`` of the shards' ``http://`` URLs (its ``gopen`` pipes each
  through ``curl``); it streams and caches nothing, so it has no budget.

Shuffling, batching, workers and what each batch yields are as in the local adapters, so
a batch is ``(payloads, labels)`` of the original bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from benchmarks.adapters import Batch, EpochSpec, collate_pairs, module_missing, payload_from
from benchmarks.datagen import Tree


@dataclass(frozen=True)
class RemoteSpec:
    """Where a system's uploaded pack is and how its reader may cache it."""

    url: str
    """``s3://bucket/prefix`` of the uploaded folder."""
    http_url: str
    """The same folder over plain HTTP through the link (``http://127.0.0.1:PORT/bucket/prefix``)."""
    files: tuple[str, ...]
    """Relative names of the uploaded files (WebDataset is given its shards' URLs)."""
    cache_dir: Path
    max_cache_bytes: int | None
    """The reader's cache budget; None: its default (for every system here: room for all)."""
    fork_fix: bool = True
    """Drop the S3 client MosaicML's DataLoader workers inherit from the parent (see there)."""


class RemoteReader(Protocol):
    """What every system offers ``bench_remote``."""

    name: str
    library: str
    has_budget: bool
    """Whether the system has a cache budget setting."""
    client_modules: tuple[str, ...]
    """The object-store client it imports on first use, which ``remote_child`` imports with
    the library before any clock starts (``import litdata`` imports boto3 itself; shardio and
    MosaicML import theirs lazily, which counted their import in the first batch)."""

    def missing(self) -> str | None:
        """Why this system cannot read remotely here, or None."""

    def epochs(self, tree: Tree, remote: RemoteSpec, spec: EpochSpec) -> Iterator[Iterable[Batch]]:
        """Build the dataset and loader once (on the first ``next()``), then yield epochs."""


class ShardioReader:
    """shardio ``StreamingDataset`` on an ``s3://`` URL through its node cache."""

    library = "shardio"
    has_budget = True
    client_modules = ("s3fs",)

    def __init__(self, *, name: str) -> None:
        self.name = name

    def missing(self) -> str | None:
        reason = module_missing("shardio", "shardio")
        if reason is None:
            import shardio

            if not hasattr(shardio, "RemoteOptions"):
                return "this shardio has no RemoteOptions (remote read path not there yet)"
        return reason

    def epochs(self, tree: Tree, remote: RemoteSpec, spec: EpochSpec) -> Iterator[Iterable[Batch]]:
        import shardio
        from benchmarks.adapters.shardio_packs import _batches

        options = shardio.RemoteOptions(cache_dir=remote.cache_dir,
                                        max_cache_bytes=remote.max_cache_bytes)
        dataset = shardio.StreamingDataset(remote.url, decode="raw", shuffle=spec.shuffle,
                                           seed=spec.seed, remote=options)
        loader = shardio.loader(dataset, batch_size=spec.batch_size,
                                num_workers=spec.num_workers)
        for _ in range(spec.num_epochs):
            yield _batches(loader, tree, decode=False)


class MosaicReader:
    """MosaicML Streaming MDS shards from ``remote=``, cached in ``local=``."""

    library = "mosaicml-streaming"
    has_budget = True
    client_modules = ("boto3",)

    def __init__(self, *, name: str) -> None:
        self.name = name

    def missing(self) -> str | None:
        return module_missing("streaming", "mosaicml-streaming")

    def epochs(self, tree: Tree, remote: RemoteSpec, spec: EpochSpec) -> Iterator[Iterable[Batch]]:
        from streaming.base.util import clean_stale_shared_memory

        from benchmarks.adapters.mds import import_streaming

        streaming = import_streaming()

        fields = tree.fields

        class PairDataset(streaming.StreamingDataset):  # type: ignore[misc,name-defined]
            def __getitem__(self, index: int) -> tuple[Any, int]:
                sample = super().__getitem__(index)
                return payload_from([sample[f] for f in fields]), int(sample["label"])

        clean_stale_shared_memory()
        dataset = PairDataset(
            remote=remote.url, local=str(remote.cache_dir), shuffle=spec.shuffle,
            shuffle_seed=spec.seed, batch_size=spec.batch_size,
            cache_limit=remote.max_cache_bytes,
        )
        loader = streaming.StreamingDataLoader(
            dataset, batch_size=spec.batch_size, num_workers=spec.num_workers,
            collate_fn=collate_pairs,
            worker_init_fn=_drop_inherited_clients if remote.fork_fix else None,
        )
        for _ in range(spec.num_epochs):
            yield loader


def _drop_inherited_clients(worker_id: int) -> None:
    """In a forked MosaicML worker, forget the boto3 client the parent built for ``index.json``.

    The parent's client keeps its connection open in a pool; forked workers inherit the
    pool and send their shard GETs over the same socket, so two processes read each
    other's response bytes: shards shifted by a few KB (a sample that fails to decode,
    or wrong bytes passed on: MDS keeps no checksum by default) or a request that waits
    for bytes another process took (60 s, MosaicML's download timeout, then a retry).
    ``clean_up()`` is what MosaicML itself calls before retrying a failed download.
    """
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    if info is not None:
        for stream in info.dataset.streams:
            stream._downloader.clean_up()


class _Pair:
    """A LitData sample -> ``(payload, label)``, its fields in the tree's order (picklable:
    LitData's workers get it)."""

    def __init__(self, fields: tuple[str, ...]) -> None:
        self.fields = fields

    def __call__(self, sample: dict[str, Any]) -> tuple[Any, int]:
        return payload_from([bytes(sample[f]) for f in self.fields]), int(sample["label"])


class LitDataReader:
    """LitData chunks from an ``s3://`` ``input_dir``, cached in ``cache_dir``."""

    library = "litdata"
    has_budget = True
    client_modules = ("boto3", "obstore")

    def __init__(self, *, name: str) -> None:
        self.name = name

    def missing(self) -> str | None:
        return module_missing("litdata", "litdata")

    def epochs(self, tree: Tree, remote: RemoteSpec, spec: EpochSpec) -> Iterator[Iterable[Batch]]:
        import litdata
        import litdata.streaming.downloader as downloader

        # Its chunk GETs go through obstore, whose fixed client options refuse a plain-HTTP
        # endpoint (real S3 is HTTPS; obstore ignores AWS_ALLOW_HTTP once options are given):
        # allow HTTP, change nothing else. Set before the workers fork, so they inherit it.
        options = getattr(downloader, "_OBSTORE_CLIENT_OPTIONS", None)
        if isinstance(options, dict):
            downloader._OBSTORE_CLIENT_OPTIONS = {**options, "allow_http": True}
        dataset = litdata.StreamingDataset(
            input_dir=remote.url, cache_dir=str(remote.cache_dir), shuffle=spec.shuffle,
            seed=spec.seed, max_cache_size=remote.max_cache_bytes, transform=_Pair(tree.fields),
        )
        loader = litdata.StreamingDataLoader(
            dataset, batch_size=spec.batch_size, num_workers=spec.num_workers,
            collate_fn=collate_pairs,
        )
        for _ in range(spec.num_epochs):
            yield loader


class WebDatasetReader:
    """WebDataset tar shards streamed over HTTP (``gopen`` runs ``curl`` per shard)."""

    library = "webdataset"
    has_budget = False
    client_modules = ()  # curl, a process per shard

    def __init__(self, *, name: str) -> None:
        self.name = name

    def missing(self) -> str | None:
        return module_missing("webdataset", "webdataset")

    def epochs(self, tree: Tree, remote: RemoteSpec, spec: EpochSpec) -> Iterator[Iterable[Batch]]:
        import webdataset as wds

        from benchmarks.adapters.wds import SHUFFLE_BUFFER, _raw

        urls = [f"{remote.http_url}/{name}" for name in remote.files if name.endswith(".tar")]
        dataset = wds.WebDataset(
            urls, shardshuffle=len(urls) if spec.shuffle else False, seed=spec.seed,
            workersplitter=wds.split_by_worker, nodesplitter=wds.single_node_only,
            empty_check=False,
        )
        if spec.shuffle:
            dataset = dataset.shuffle(SHUFFLE_BUFFER)
        dataset = dataset.to_tuple(*tree.fields, "cls").map(_raw)
        dataset = dataset.batched(spec.batch_size, collation_fn=collate_pairs, partial=True)
        loader = wds.WebLoader(dataset, batch_size=None, num_workers=spec.num_workers)
        for _ in range(spec.num_epochs):
            yield loader


READERS: dict[str, type] = {
    "shardio-records": ShardioReader,
    "shardio-lmdb": ShardioReader,
    "mosaicml": MosaicReader,
    "litdata": LitDataReader,
    "webdataset": WebDatasetReader,
}
"""System -> its remote reader; its format is written by the local adapter of the same name."""


def get_reader(name: str) -> RemoteReader:
    """The remote reader of system ``name`` (a key of ``READERS``)."""
    try:
        cls = READERS[name]
    except KeyError:
        raise ValueError(f"unknown system {name!r}; choose from {', '.join(READERS)}") from None
    reader: RemoteReader = cls(name=name)
    return reader
