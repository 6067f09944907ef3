"""Mixtures end to end: two packs of different sizes and backends, through real DataLoaders."""

from __future__ import annotations

import collections
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from storage_servers import HttpEndpoint
from torch.utils.data import DataLoader

import shardio
from shardio import RemoteOptions, ShardWriter, Source, StreamingDataset, WriteOptions
from shardio.errors import ResumeError

pytest_plugins = ("storage_plugin",)

SIZES = {"a": 240, "b": 60}


def payload(name: str, i: int) -> bytes:
    return f"{name}{i}".encode() * (3 + i % 5)


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``a``: 240 samples in records shards of 40; ``b``: 60 in LMDB shards of 25. The same
    keys ``k/0000``… in both: keys may repeat across sources."""
    root = tmp_path_factory.mktemp("mix")
    out = {}
    for name, backend, per_shard in (("a", "records", 40), ("b", "lmdb", 25)):
        options = WriteOptions(backend=backend, max_shard_samples=per_shard)
        with ShardWriter(root / name, options) as writer:
            for i in range(SIZES[name]):
                writer.write({"__key__": f"k/{i:04d}", "n": i, "src": name,
                              "bin": payload(name, i)})
        out[name] = root / name
    return out


def mix(packs: dict[str, Path], **kwargs: Any) -> StreamingDataset:
    sources = kwargs.pop("sources", None) or [Source(packs["a"], weight=3),
                                              Source(packs["b"], weight=1)]
    return StreamingDataset(sources, decode="raw", shuffle_buffer=32, block_size=4, **kwargs)


def drawn(batches: Any) -> list[tuple[int, int]]:
    """``(source, index)`` of every sample of DataLoader batches, each checked against its pack."""
    out = []
    for b in batches:
        sources, indices = b["__source__"].tolist(), b["__index__"].tolist()
        for s, i, n, src, data in zip(sources, indices, b["n"].tolist(), b["src"], b["bin"],
                                      strict=True):
            name = "ab"[s]
            assert (n, src, bytes(data)) == (i, name, payload(name, i))  # the right record
            out.append((s, i))
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
def test_three_to_one_per_epoch_without_repeats(packs: dict[str, Path], num_workers: int) -> None:
    ds = mix(packs, epoch_size=200)
    assert len(ds) == 200
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        got = drawn(DataLoader(ds, batch_size=16, num_workers=num_workers))
        assert collections.Counter(s for s, _ in got) == {0: 150, 1: 50}
        assert len(set(got)) == 200  # no repeats: neither source is upsampled
        epochs.append(got)
    assert epochs[0] != epochs[1] and set(epochs[0]) != set(epochs[1])  # other draws
    keys = collections.Counter(i for _, i in set(epochs[0]))
    assert max(keys.values()) == 2  # the same key from both sources, both delivered


def test_through_shardio_loader(packs: dict[str, Path]) -> None:
    ds = mix(packs, epoch_size=200)
    batches = shardio.loader(ds, batch_size=16, num_workers=2)
    assert len(batches) == 13
    for _epoch in range(2):
        got = []
        for n, batch in enumerate(batches, 1):
            assert n == len(batches) or len(batch.keys) == 16
            assert batch["n"].tolist() == batch.indices.tolist()
            got += list(zip(batch["__source__"].tolist(), batch.indices.tolist(), strict=True))
        assert collections.Counter(s for s, _ in got) == {0: 150, 1: 50}
        assert len(set(got)) == 200


def test_upsampled_source_over_two_ranks(packs: dict[str, Path]) -> None:
    ranks = [mix(packs, epoch_size=500, rank=r, world_size=2) for r in range(2)]
    got = [drawn(DataLoader(ds, batch_size=16, num_workers=2)) for ds in ranks]
    assert [len(g) for g in got] == [len(ranks[0]), len(ranks[1])] == [250, 250]
    times = collections.Counter(got[0] + got[1])
    assert collections.Counter(s for s, _ in got[0] + got[1]) == {0: 375, 1: 125}
    assert {times[(0, i)] for i in range(240)} == {1, 2}  # 375 = 240 + 135 drawn
    assert {times[(1, i)] for i in range(60)} == {2, 3}  # 125 = 2 × 60 + 5 drawn


def test_subsets(packs: dict[str, Path]) -> None:
    tenth = mix(packs, sources=[Source(packs["a"], num_samples=24)])
    first = [(s["__source__"], s["__index__"]) for s in tenth]
    assert len(tenth) == len(first) == len(set(first)) == 24 and {s for s, _ in first} == {0}
    tenth.set_epoch(1)
    assert {i for _, i in first} != {s["__index__"] for s in tenth}
    for same in (StreamingDataset(Source(packs["a"], num_samples=24), decode="raw"),
                 StreamingDataset(packs["a"], epoch_size=24, decode="raw")):
        assert len(same) == 24 == len({s["__index__"] for s in same})
    # fixed counts first, the weights share the rest
    fixed = mix(packs, epoch_size=100,
                sources=[Source(packs["a"], weight=5), Source(packs["b"], num_samples=10)])
    assert collections.Counter(s["__source__"] for s in fixed) == {0: 90, 1: 10}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_exact_resume_mid_epoch(packs: dict[str, Path], num_workers: int) -> None:
    def make() -> Any:  # 330 = 248 + 82: both sources upsampled, repeats to resume across
        return shardio.loader(mix(packs, epoch_size=330), batch_size=10, num_workers=num_workers)

    full = [b.indices.tolist() + b["__source__"].tolist() for b in make()]
    interrupted = make()
    for k, _batch in enumerate(interrupted):
        if k == 7:
            break
    resumed = make()
    resumed.load_state_dict(interrupted.state_dict())
    assert [b.indices.tolist() + b["__source__"].tolist() for b in resumed] == full[8:]
    # the dataset's own state after a main-process iteration resumes exactly too
    ds = mix(packs, epoch_size=330)
    whole = [(s["__source__"], s["__index__"]) for s in mix(packs, epoch_size=330)]
    for n, _sample in enumerate(ds, 1):
        if n == 77:
            break
    again = mix(packs, epoch_size=330)
    again.load_state_dict(ds.state_dict())
    assert [(s["__source__"], s["__index__"]) for s in again] == whole[77:]
    other = mix(packs, epoch_size=330, sources=[Source(packs["a"]), Source(packs["b"])])
    with pytest.raises(ResumeError, match="mix="):
        other.load_state_dict(ds.state_dict())  # other weights: another order


def test_bad_specs_are_refused_clearly(packs: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="no sources"):
        StreamingDataset([])
    with pytest.raises(TypeError, match=r"not a shardio\.Source"):
        StreamingDataset([Source(packs["a"]), str(packs["b"])])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="weight must be a finite number > 0, got 0"):
        StreamingDataset([Source(packs["a"], weight=0)])
    with pytest.raises(ValueError, match="give one"):
        StreamingDataset([Source(packs["a"], weight=2, num_samples=5)])
    with pytest.raises(ValueError, match="add up to 300, more than epoch_size=100"):
        StreamingDataset([Source(packs["a"], num_samples=300)], epoch_size=100)


def test_decoded_mixture_of_imagefolder_packs(
    imagefolder: Path, tmp_path: Path
) -> None:
    packed = tmp_path / "if"
    shardio.pack(imagefolder, packed)
    ds = StreamingDataset([Source(packed, weight=1), Source(packed, weight=1)],
                          epoch_size=20, decode="tensor")
    assert ds.classes == list(shardio.read_manifest(packed).classes or ())
    images, labels = next(iter(shardio.loader(ds, batch_size=20, num_workers=0)))
    assert len(images) == 20  # sizes differ: a list of CHW uint8 tensors
    assert all(image.dtype == torch.uint8 and image.shape[0] == 3 for image in images)
    assert set(labels.tolist()) <= set(range(len(ds.classes)))


@pytest.mark.servers
def test_local_and_remote_sources(packs: dict[str, Path], http: HttpEndpoint,
                                  tmp_path: Path) -> None:
    shutil.copytree(packs["b"], http.root / "b")
    remote = RemoteOptions(cache_dir=tmp_path / "cache", max_cache_bytes=64 << 20)
    ds = mix(packs, epoch_size=200, remote=remote,
             sources=[Source(packs["a"], weight=3), Source(f"{http.url}/b", weight=1)])
    got = drawn(DataLoader(ds, batch_size=16, num_workers=0))
    assert collections.Counter(s for s, _ in got) == {0: 150, 1: 50} and len(set(got)) == 200


def test_block_records_are_the_mixtures_only_where_its_sources_agree(tmp_path: Path) -> None:
    """A mixture's plan cuts its blocks at multiples of ``block_records``: that of the first
    source would cut a second source's stored blocks of another size in two."""
    made = {}
    for name, records in (("x", 8), ("y", 8), ("z", 5)):
        with ShardWriter(tmp_path / name, WriteOptions(block_records=records)) as writer:
            for i in range(40):
                writer.write({"__key__": f"k{i:03d}", "bin": payload(name, i)})
        made[name] = tmp_path / name
    same = StreamingDataset([Source(made["x"]), Source(made["y"])], decode="raw")
    assert same.reader.manifest.block_records == 8
    assert same.config.block_size % 8 == 0
    mixed = StreamingDataset([Source(made["x"]), Source(made["z"])], decode="raw")
    assert mixed.reader.manifest.block_records is None
    seen = collections.Counter((s["__source__"], s["__key__"]) for s in mixed)
    assert len(seen) == 80 and set(seen.values()) == {1}
