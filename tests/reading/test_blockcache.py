"""Random reads through the block cache (``DatasetReader.get_many``) give what a front-to-back
read gives, whatever the budget (none, a few blocks, all) and whether the checker thread
checks the blocks ahead, and never serve damaged bytes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio import DatasetReader, ShardWriter, WriteOptions
from shardio.errors import ChecksumError, ShardCorruptError

NUM_SAMPLES = 300


def _sample(i: int) -> dict[str, object]:
    sample: dict[str, object] = {"__key__": f"k/{i:04d}", "bin": bytes([i % 251]) * (40 + i % 90),
                                 "label": i % 7, "text": "word " * (i % 13)}
    if i % 3:  # a field some records lack
        sample["meta"] = {"i": i, "odd": bool(i % 2)}
    return sample


@pytest.fixture(scope="module", params=["records", "lmdb"])
def packed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp(request.param) / "ds"
    # small blocks, several shards: random reads cross blocks and shards
    options = WriteOptions(backend=request.param, max_shard_samples=120, block_records=16)
    with ShardWriter(path, options) as writer:
        for i in range(NUM_SAMPLES):
            writer.write(_sample(i))
    return path


def _expected(path: Path) -> list[dict[str, object]]:
    with DatasetReader(path) as reader:
        return [s for shard in range(len(reader.manifest.shards))
                for s in reader.iter_shard(shard)]


@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("budget", [0, 4096, 64 << 20])
def test_random_reads_equal_the_stored_order_read(packed: Path, budget: int, ahead: bool) -> None:
    expected = _expected(packed)
    order = list(range(NUM_SAMPLES)) * 2
    random.Random(budget).shuffle(order)
    with DatasetReader(packed, block_cache_bytes=budget) as reader:
        got = reader.get_many(order, decode_ahead=ahead)
        assert got == [expected[i] for i in order]
        assert [reader.get(i) for i in order[:50]] == [expected[i] for i in order[:50]]
        assert reader._blocks._held <= budget


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, NUM_SAMPLES - 1), max_size=40), st.integers(0, 20_000),
       st.booleans())
def test_any_order_any_budget(packed: Path, order: list[int], budget: int, ahead: bool) -> None:
    expected = _EXPECTED.setdefault(packed, _expected(packed))
    with DatasetReader(packed, block_cache_bytes=budget) as reader:
        assert reader.get_many(order, decode_ahead=ahead) == [expected[i] for i in order]


_EXPECTED: dict[Path, list[dict[str, object]]] = {}


def test_a_sample_handed_out_is_the_callers(packed: Path) -> None:
    with DatasetReader(packed) as reader:
        first = reader.get(5)
        first["bin"] = b"changed"
        first["label"] = -1
        assert reader.get(5) == _expected(packed)[5]


@pytest.mark.parametrize("ahead", [False, True])
def test_a_damaged_block_is_refused_on_every_read(tmp_path: Path, ahead: bool) -> None:
    path = tmp_path / "ds"
    with ShardWriter(path, WriteOptions(block_records=16)) as writer:
        for i in range(NUM_SAMPLES):
            writer.write(_sample(i))
    shard = next(path.glob("*.rec"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 3] ^= 0x10
    shard.write_bytes(bytes(data))
    with DatasetReader(path) as reader:
        failures = 0
        for i in range(NUM_SAMPLES):
            try:
                assert reader.get(i) == _sample(i) | {"__index__": i}
            except (ChecksumError, ShardCorruptError) as exc:
                assert str(shard) in str(exc)
                failures += 1
        assert failures  # the damaged block's records, each time asked
        with pytest.raises((ChecksumError, ShardCorruptError), match="block"):
            reader.get_many(list(range(NUM_SAMPLES)), decode_ahead=ahead)
        # the blocks after it, checked on the thread, are served to a later read
        assert reader.get_many([NUM_SAMPLES - 1], decode_ahead=ahead) == [
            _sample(NUM_SAMPLES - 1) | {"__index__": NUM_SAMPLES - 1}]

