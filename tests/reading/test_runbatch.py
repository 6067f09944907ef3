"""Batches gathered from a window's columns equal ``RecordBatch.from_samples`` of the same samples.

A generic pack whose samples differ in fields and kinds (a field only some have, ints
in some shards and str in others, bools, floats, numpy arrays, large zero-copy bytes)
is streamed with ``iter_chunks`` across windows and runs; each chunk's columnar batch
must equal the batch built from its sample dicts, field for field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardio import ShardWriter, WriteOptions
from shardio.reading.batch import RecordBatch
from shardio.reading.gather import Chunk, _one_window_batch
from shardio.reading.reader import DatasetReader
from shardio.reading.stream import iter_chunks, iter_samples


def sample(i: int) -> dict[str, Any]:
    out: dict[str, Any] = {"__key__": f"k/{i:04d}", "bin": bytes([i % 251]) * (i % 37)}
    if i % 3:
        out["txt"] = f"text {i}".encode()  # only some samples have it
    out["n"] = i if i < 120 else f"n{i}"  # ints in the first shards, str later
    if i % 5 == 0:
        out["flag"] = bool(i % 2)
    if i % 7 == 0:
        out["arr"] = np.arange(i % 4, dtype=np.float32)
    if i % 11 == 0:
        out["big"] = bytes(20_000 + i)  # viewed in place (zero copy)
    return out


@pytest.fixture(scope="module")
def generic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runbatch") / "ds"
    with ShardWriter(root, WriteOptions(max_shard_samples=40)) as writer:
        for i in range(200):
            writer.write(sample(i))
    return root


def same(a: RecordBatch, b: RecordBatch) -> None:
    assert a.keys == b.keys and a.indices.tolist() == b.indices.tolist()
    assert sorted(a.fields) == sorted(b.fields)
    assert sorted(a.offsets) == sorted(b.offsets)
    for name in a.offsets:
        got = [None if v is None else bytes(v) for v in a.bytes(name)]
        assert got == [None if v is None else bytes(v) for v in b.bytes(name)], name
    for name, column in a.values.items():
        other = b.values[name]
        assert type(column) is type(other), name
        if name == "arr":
            assert all(x is y for x, y in zip(column, other, strict=True))
        else:
            assert list(column) == list(other), name
    assert {k: v.tolist() for k, v in a.missing.items()} == {
        k: v.tolist() for k, v in b.missing.items()}


@pytest.mark.parametrize(("window", "size"), [(64, 16), (50, 64), (1000, 7), (30, 1)])
def test_columnar_batches_equal_batches_of_the_sample_dicts(generic: Path, window: int,
                                                             size: int) -> None:
    order = np.random.default_rng(window).permutation(200)
    order = np.concatenate([order, order[:9]])  # a padded tail draws samples twice
    seen: list[int] = []
    with DatasetReader(generic) as reader:
        for chunk in iter_chunks(reader, order, window=window, max_run=8, size=size,
                                 zero_copy=True):
            assert isinstance(chunk, Chunk) and 1 <= len(chunk) <= size
            batch = RecordBatch.from_samples(chunk)
            same(batch, RecordBatch.from_samples(list(chunk)))
            seen += batch.indices.tolist()
    assert seen == order.tolist()


def test_a_field_no_sample_of_the_batch_has_is_left_out(generic: Path) -> None:
    with DatasetReader(generic) as reader:
        [chunk] = list(iter_chunks(reader, np.array([1, 2]), window=8, max_run=4, size=2))
    batch = RecordBatch.from_samples(chunk)
    assert "big" not in batch.fields and "arr" not in batch.fields and "flag" not in batch.fields
    assert batch.values["n"].tolist() == [1, 2]
    assert [bytes(v) for v in batch.bytes("txt")] == [b"text 1", b"text 2"]


def written(kind: str, i: int) -> dict[str, Any]:
    """Sample ``i`` of a pack of ``kind`` as written."""
    if kind == "generic":
        return sample(i)
    out = {"__key__": f"u/{i:04d}", "image": bytes([i % 251]) * (9_000 + i), "label": i % 5,
           "txt": f"t{i}".encode()}
    if kind == "compressed":  # every record inflated
        out["image"] = bytes([i % 7]) * 3_000
    if kind == "sparse" and i >= 120:
        del out["txt"]  # the last two shards lack a field the others have
    return out


def build(kind: str, generic: Path, tmp_path: Path) -> Path:
    """The generic pack, or one whose records share one shape (decoded field by field):
    its large bytes mapped in place (``uniform``), or every record compressed."""
    if kind == "generic":
        return generic
    root = tmp_path / kind
    codec = "zstd" if kind == "compressed" else "none"
    with ShardWriter(root, WriteOptions(max_shard_samples=40, codec=codec)) as writer:
        for i in range(200):
            writer.write(written(kind, i))
    return root


@pytest.mark.parametrize("kind", ["generic", "uniform", "compressed", "sparse"])
def test_the_one_window_path_builds_what_the_sample_dicts_build(
        generic: Path, tmp_path: Path, kind: str) -> None:
    root = build(kind, generic, tmp_path)
    order = np.random.default_rng(4).permutation(200)
    fast = placed = 0
    with DatasetReader(root) as reader:
        for chunk in iter_chunks(reader, order, window=64, max_run=8, size=16, zero_copy=True):
            assert isinstance(chunk, Chunk)
            batch = chunk.record_batch()
            same(batch, RecordBatch.from_samples(chunk.samples()))
            if len(chunk.parts) == 1 and _one_window_batch(*chunk.parts[0]) is not None:
                fast += 1
            if batch.places is not None:  # each piece is the bytes at its place in its map
                placed += 1
                maps, starts = batch.places
                pieces = [b"" if v is None else bytes(v) for name in batch.offsets
                          for v in batch.bytes(name)]
                assert [b"" if m is None else bytes(m[a : a + len(p)]) for m, a, p in zip(  # type: ignore[index]
                    maps, starts.tolist(), pieces, strict=True)] == pieces
    if kind != "generic":  # one kind a field in every run: every batch of one window
        assert fast >= 10
        # views of the map know their places; inflated payloads do not
        assert placed == (0 if kind == "compressed" else fast)


@pytest.mark.parametrize("zero_copy", [False, True])
@pytest.mark.parametrize("kind", ["generic", "uniform", "compressed", "sparse"])
def test_samples_handed_out_one_by_one_are_the_samples_written(
        generic: Path, tmp_path: Path, kind: str, zero_copy: bool) -> None:
    root = build(kind, generic, tmp_path)
    order = np.random.default_rng(9).permutation(200)
    with DatasetReader(root) as reader:
        got = list(iter_samples(reader, order, window=70, max_run=8, zero_copy=zero_copy))
    assert [s["__index__"] for s in got] == order.tolist()
    for s in got:
        assert type(s["__index__"]) is int
        want = written(kind, s["__index__"])
        assert set(s) == {*want, "__index__"}  # a field a sample lacks stays absent
        for name, value in want.items():
            if isinstance(value, np.ndarray):
                assert np.array_equal(s[name], value)
            elif isinstance(value, bytes):
                assert bytes(s[name]) == value
                # owned samples hold bytes; zero-copy ones may hold views of the runs read
                assert type(s[name]) is bytes or zero_copy
            else:
                assert s[name] == value and type(s[name]) is type(value)


@pytest.mark.parametrize("placed", [False, True])
@pytest.mark.parametrize("kind", ["generic", "uniform", "compressed", "sparse"])
def test_samples_made_field_by_field_are_the_samples_made_one_by_one(
        generic: Path, tmp_path: Path, kind: str, placed: bool) -> None:
    root = build(kind, generic, tmp_path)
    order = np.random.default_rng(3).permutation(200)
    compared = 0
    with DatasetReader(root) as reader:
        for chunk in iter_chunks(reader, order, window=64, max_run=8, size=16, zero_copy=True):
            for columns, ranks in chunk.parts:
                columns.placed = placed
                for owned in (False, True):
                    got = columns.samples(ranks, owned=owned)
                    want = [columns.sample(rank, owned=owned) for rank in ranks]
                    assert [type(s) for s in got] == [type(s) for s in want]
                    for a, b in zip(got, want, strict=True):
                        assert list(a) == list(b)  # the same fields, in the same order
                        for name in a:
                            assert type(a[name]) is type(b[name]), name
                            if isinstance(a[name], np.ndarray):
                                assert a[name] is b[name]
                            elif isinstance(a[name], memoryview):
                                assert bytes(a[name]) == bytes(b[name])
                            else:
                                assert a[name] == b[name], name
                            if hasattr(b[name], "source"):  # FileBytes: the same place
                                assert (a[name].source, a[name].offset) == (
                                    b[name].source, b[name].offset)
                    compared += len(ranks)
    assert compared == 2 * len(order)
