"""A window's shards decoded in one pass (shardio.windowdecode) give exactly what decoding
each shard on its own (shardio.columnar) gives, or None, and never a wrong value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_columnar import sample

from shardio.columnar import Columns, RunPart, decode_columns
from shardio.format import check_frames
from shardio.reader import DatasetReader
from shardio.windowdecode import ShardRuns, decode_window
from shardio.writer import ShardWriter, WriteOptions

PER_SHARD = 40


def write(out: Path, records: list[dict[str, Any]], codec: str = "zstd") -> Path:
    with ShardWriter(out, WriteOptions(codec=codec, max_shard_samples=PER_SHARD)) as writer:
        for record in records:
            writer.write(record)
    return out


def window(reader: DatasetReader, gaps: bool) -> list[tuple[ShardRuns, Any]]:
    """Every shard's records as two runs, checked; with ``gaps``, runs read through some."""
    out = []
    for k in range(len(reader.manifest.shards)):
        shard = reader.shard(k)
        parts = []
        for start, stop in ((0, 17), (17, PER_SHARD)):
            run = shard.read_run(start, stop)
            check_frames(run, path=shard.path, first_record=start, offset_of=shard.offset)
            only = [p for p in range(stop - start) if p % 3 != 1] if gaps else None
            parts.append(RunPart(run, start, only, True))
        out.append((ShardRuns(parts, shard.keys()), shard))
    return out


def values(columns: Columns) -> list[list[Any]]:
    """Each field's values, views (of a map, of inflated payloads) cut (``Columns.views``)."""
    out = []
    for values, view, starts, lengths in zip(columns.values, columns.views, columns.starts,
                                             columns.arrays, strict=True):
        if values is None:
            assert view is not None and starts is not None
            values = [view[a : a + n] for a, n in zip(starts.tolist(), lengths.tolist(),
                                                      strict=True)]
        out.append([bytes(v) if isinstance(v, memoryview) else v for v in values])
    return out


def same(mine: Columns, theirs: Columns) -> None:
    assert mine.keys == theirs.keys and mine.names == theirs.names
    assert mine.kinds == theirs.kinds and mine.source is theirs.source
    assert [v is None for v in mine.values] == [v is None for v in theirs.values]
    assert values(mine) == values(theirs)
    for a, b in zip(mine.arrays, theirs.arrays, strict=True):
        assert np.array_equal(a, b)
    for a, b in zip(mine.starts, theirs.starts, strict=True):
        assert (a is None) == (b is None)
        if mine.source is not None:  # places in the map (inflated: each in its own buffer)
            assert a is None or np.array_equal(a, b)


@pytest.mark.parametrize("shape", ["images", "tiny", "mixed"])
@pytest.mark.parametrize("codec", ["none", "zstd"])  # views of the maps; inflated payloads
@pytest.mark.parametrize("gaps", [False, True])
def test_a_window_decodes_as_its_shards_do_one_by_one(tmp_path: Path, shape: str, codec: str,
                                                      gaps: bool) -> None:
    root = write(tmp_path / "ds", [sample(i, shape) for i in range(4 * PER_SHARD)], codec)
    with DatasetReader(root) as reader:
        shards = window(reader, gaps)
        got = decode_window([s for s, _reader in shards])
        assert got is not None and len(got) == 4
        assert all((c.source is None) == (codec == "zstd") for c in got)
        for mine, (runs, shard) in zip(got, shards, strict=True):
            theirs = decode_columns(runs.parts, path=shard.path, keys=shard.keys(),
                                    verify=True, offset_of=shard.offset)
            assert theirs is not None
            same(mine, theirs)


@pytest.mark.parametrize("records", [
    # non-ASCII keys: their lengths in bytes are compared shard by shard
    [sample(i, "unicode_keys") for i in range(3 * PER_SHARD)],
    # one shard's records of another shape (an appended dataset's)
    [{"__key__": f"k/{i}", "bin": b"b" * i, **({"n": i} if i < PER_SHARD else {})}
     for i in range(3 * PER_SHARD)],
    # a key too long to lie in the first bytes gathered
    [{"__key__": "k" * 200 + str(i), "bin": b"b" * 500} for i in range(3 * PER_SHARD)],
    # a small field between two large values, in neither edge
    [{"__key__": f"k/{i}", "a": b"a" * 300, "n": i, "b": b"b" * 300}
     for i in range(3 * PER_SHARD)],
])
def test_what_one_pass_cannot_read_is_left_to_each_shard(tmp_path: Path,
                                                         records: list[dict[str, Any]]) -> None:
    root = write(tmp_path / "ds", records)
    with DatasetReader(root) as reader:
        assert decode_window([s for s, _reader in window(reader, False)]) is None


def test_a_record_holding_another_shards_key_is_refused(tmp_path: Path) -> None:
    from test_columnar import craft

    records = [{"__key__": f"k/{i}", "txt": b"x" * 10} for i in range(3 * PER_SHARD)]
    records[70] = {"__key__": "k/71", "txt": b"x" * 10}  # same length, another's key
    craft(tmp_path / "ds", records, max_shard_samples=PER_SHARD)
    with DatasetReader(tmp_path / "ds") as reader:
        assert decode_window([s for s, _reader in window(reader, False)]) is None


def test_a_window_of_many_records_a_shard_is_decoded_in_one_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardio.stream as stream
    from shardio.stream import iter_samples

    per_shard = 600
    with ShardWriter(tmp_path / "ds", WriteOptions(max_shard_samples=per_shard)) as writer:
        for i in range(3 * per_shard):
            writer.write(sample(i, "tiny"))
    calls: list[int] = []
    real = stream.decode_window

    def spy(shards: Any) -> Any:
        got = real(shards)
        calls.append(0 if got is None else len(got))
        return got

    monkeypatch.setattr(stream, "decode_window", spy)
    order = np.random.default_rng(0).permutation(3 * per_shard)
    with DatasetReader(tmp_path / "ds") as reader:
        expected = [reader.get(i) for i in order.tolist()]
        got = list(iter_samples(reader, order, window=3 * per_shard, max_run=64))
        assert got == expected and calls == [3]  # every shard's runs, decoded together
