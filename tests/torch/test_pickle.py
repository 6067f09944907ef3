"""Datasets used in the parent still reach DataLoader workers under every start method.

``fork`` copies the parent (the datasets reopen their shards in the child);
``spawn`` and ``forkserver`` pickle the dataset, open maps and LMDB
environments included unless the reader leaves them out. One DataLoader per
start method and dataset type, reading a records and an LMDB pack at once.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from torch.utils.data import ChainDataset, ConcatDataset, DataLoader

from shardio import ShardWriter, WriteOptions
from shardio.reading.batch import RecordBatch
from shardio.torch.dataset import StreamingDataset
from shardio.torch.indexed import IndexedDataset

BACKENDS = ("records", "lmdb")
NUM_SAMPLES = 45
START_METHODS = [
    pytest.param(m, marks=pytest.mark.skipif(
        m not in multiprocessing.get_all_start_methods(), reason=f"no {m} on this platform"
    ))
    for m in ("fork", "spawn", "forkserver")
]


def payload(backend: str, i: int) -> bytes:
    return f"{backend}:{i}:".encode() * (1 + i % 7)


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One small pack per backend, several shards each, keys prefixed by the backend."""
    out = {}
    for backend in BACKENDS:
        path = tmp_path_factory.mktemp(backend) / "ds"
        with ShardWriter(path, WriteOptions(backend=backend, max_shard_samples=16)) as writer:
            for i in range(NUM_SAMPLES):
                writer.write({"__key__": f"{backend}/{i:03d}", "bin": payload(backend, i)})
        out[backend] = path
    return out


def _check_exactly_once(loader: DataLoader[dict[str, object]]) -> None:
    seen: list[str] = []
    for batch in loader:
        assert isinstance(batch, RecordBatch)
        for key, data in zip(batch.keys, batch.bytes("bin"), strict=True):
            backend, number = key.split("/")
            assert data is not None and data.tobytes() == payload(backend, int(number))
            seen.append(key)
    expected = sorted(f"{b}/{i:03d}" for b in BACKENDS for i in range(NUM_SAMPLES))
    assert sorted(seen) == expected


@pytest.mark.parametrize("method", START_METHODS)
def test_indexed_dataset_used_in_the_parent_reaches_workers(
    packs: dict[str, Path], method: str
) -> None:
    datasets = [IndexedDataset(packs[b], decode="raw") for b in BACKENDS]
    try:
        for ds in datasets:  # open shards (an mmap, an LMDB environment) in the parent
            assert ds[0]["__key__"].endswith("/000") and ds[-1]["__key__"].endswith("/044")
        loader = DataLoader(
            ConcatDataset(datasets), batch_size=8, shuffle=True, num_workers=2,
            multiprocessing_context=method, collate_fn=RecordBatch.from_samples,
        )
        _check_exactly_once(loader)
        assert datasets[1][-1]["bin"] == payload("lmdb", NUM_SAMPLES - 1), "parent still reads"
    finally:  # an LMDB shard left open would refuse the next test's open of it
        for ds in datasets:
            ds.close()


@pytest.mark.parametrize("method", START_METHODS)
def test_streaming_dataset_used_in_the_parent_reaches_workers(
    packs: dict[str, Path], method: str
) -> None:
    datasets = [StreamingDataset(packs[b], decode="raw", seed=5) for b in BACKENDS]
    try:
        for ds in datasets:  # the dataset's own reader opens a shard in the parent
            assert ds.reader.get(NUM_SAMPLES - 1)["bin"] == payload(ds.manifest.backend, 44)
        loader = DataLoader(
            ChainDataset(datasets), batch_size=8, num_workers=2,
            multiprocessing_context=method, collate_fn=RecordBatch.from_samples,
        )
        _check_exactly_once(loader)
    finally:
        for ds in datasets:
            ds.reader.close()
