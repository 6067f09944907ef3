"""Format v3 (docs/format.md, §8): blocks round-trip, the reference reader agrees, and
every damage (a bit flip, a truncation, a hostile head) is refused with a typed error."""

from __future__ import annotations

import importlib.util
import io
import struct
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardio.errors import ShardCorruptError, ShardioError
from shardio.format.block import (
    ENTRY,
    HEAD,
    MAX_INFLATE_RATIO,
    RAW,
    ZSTD,
    decode_block,
    encode_block,
    read_head,
)
from shardio.format.blockfile import (
    FOOTER,
    RecFileWriter3,
    ShardIndex3,
    decode_keys,
    encode_keys,
    lmdb_entries,
    parse_lmdb,
    parse_rec,
)
from shardio.format.checksum import compute

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("read_v3", ROOT / "tools" / "read_v3.py")
assert _spec is not None and _spec.loader is not None
read_v3 = importlib.util.module_from_spec(_spec)
sys.modules["read_v3"] = read_v3
_spec.loader.exec_module(read_v3)

JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 8


def write_rec(samples: list[dict[str, Any]], *, bound: int = 256, level: int | None = 3) -> bytes:
    fh = io.BytesIO()
    writer = RecFileWriter3(fh, max_block_bytes=bound, level=level)
    for sample in samples:
        writer.append(sample)
    writer.finish()
    return fh.getvalue()


def read_rec(buf: bytes, path: str = "s.rec") -> list[dict[str, Any]]:
    """Every sample of a v3 ``.rec`` shard in memory, through shardio's modules."""
    index = parse_rec(buf[:32], buf, len(buf), path=path)
    assert index.block_offsets is not None
    return _samples(index, lambda b: memoryview(buf)[int(index.block_offsets[b]):  # type: ignore[index]
                                                      int(index.block_offsets[b + 1])], path)  # type: ignore[index]


def _samples(index: ShardIndex3, block_of: Any, path: str) -> list[dict[str, Any]]:
    out = []
    for b in range(index.num_blocks):
        first, stop = int(index.first_records[b]), int(index.first_records[b + 1])
        for k, sample in enumerate(decode_block(block_of(b), path=path, block=b,
                                                first_record=first, num_records=stop - first)):
            out.append({"__key__": index.keys[first + k], **sample})
    return out


def write_lmdb(path: Path, samples: list[dict[str, Any]], **options: Any) -> None:
    env = lmdb.open(str(path), subdir=False, lock=False, map_size=1 << 28, max_dbs=0)
    with env.begin(write=True) as txn:
        for key, value in lmdb_entries(samples, **options):
            txn.put(key, value)
    env.close()


def read_lmdb(path: Path) -> list[dict[str, Any]]:
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        index = parse_lmdb(txn.get(b"__shardio__"), txn.get(b"__shardio_index__"),
                           txn.get(b"__shardio_keys__"), env.stat()["entries"] - 3,
                           path=str(path))
        out = _samples(index, lambda b: txn.get(b.to_bytes(8, "big")), str(path))
    env.close()
    return out


def equal(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Samples equal, numpy arrays compared by dtype, shape and bytes."""
    def norm(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return ("nd", v.dtype.str, v.shape, v.tobytes())
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [norm(x) for x in v]
        return v
    return [norm(s) for s in a] == [norm(s) for s in b]


values = st.one_of(
    st.binary(max_size=64), st.binary(min_size=300, max_size=2000),  # over the bound: own block
    st.integers(-(1 << 63), (1 << 63) - 1), st.integers(1 << 63, (1 << 64) - 1),
    st.text(max_size=40), st.floats(allow_nan=False), st.booleans(), st.none(),
    st.lists(st.integers(-5, 5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(0, 9), max_size=2),
)
samples_strategy = st.lists(
    st.dictionaries(st.sampled_from(["image", "label", "txt", "meta", "é"]), values, max_size=4),
    max_size=30,
).map(lambda rows: [{"__key__": f"k/{i}é", **row} for i, row in enumerate(rows)])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=samples_strategy, level=st.sampled_from([None, 3]),
       bound=st.sampled_from([1, 256, 4096]))
def test_round_trip_module_and_reference_reader(samples: list[dict[str, Any]],
                                                level: int | None, bound: int) -> None:
    buf = write_rec(samples, bound=bound, level=level)
    assert read_rec(buf) == samples
    assert list(read_v3.read_rec(memoryview(buf))) == samples


def test_numpy_values_and_mixed_kinds_round_trip() -> None:
    samples = [{"__key__": "a", "x": np.arange(6, dtype="<f4").reshape(2, 3), "m": 1},
               {"__key__": "b", "x": np.zeros(0, "|u1"), "m": "one"},
               {"__key__": "c", "m": b"raw"}]
    buf = write_rec(samples, bound=1 << 20)
    assert equal(read_rec(buf), samples)
    assert equal(list(read_v3.read_rec(memoryview(buf))), samples)


@pytest.mark.parametrize("level", [None, 3])
def test_lmdb_shard_round_trips_through_both_readers(tmp_path: Path, level: int | None) -> None:
    samples = [{"__key__": f"f{i}", "data": bytes([i]) * (i * 50), "label": i % 3,
                **({"txt": "hello " * i} if i % 2 else {})} for i in range(40)]
    path = tmp_path / "shard.mdb"
    write_lmdb(path, samples, max_block_bytes=512, level=level)
    assert read_lmdb(path) == samples
    assert list(read_v3.read_shard(str(path))) == samples


def test_empty_shard_and_empty_samples() -> None:
    assert read_rec(write_rec([])) == []
    samples: list[dict[str, Any]] = [{"__key__": "a"}, {"__key__": "b", "v": b""}]
    buf = write_rec(samples)
    assert read_rec(buf) == samples == list(read_v3.read_rec(memoryview(buf)))


def _entries(block: bytes) -> list[tuple[str, int]]:
    head = read_head(block, path="b", block=0)
    return [(c.name, c.codec) for c in head.columns]


def test_compressible_columns_compress_and_media_stays_raw() -> None:
    samples = [{"__key__": f"k{i}", "image": JPEG, "caption": f"a photo of a cat number {i}",
                "label": i % 10} for i in range(200)]
    block = encode_block([{k: v for k, v in s.items() if k != "__key__"} for s in samples],
                         first_record=0, level=3)
    assert dict(_entries(block)) == {"image": RAW, "caption": ZSTD, "label": ZSTD}
    plain = encode_block([{k: v for k, v in s.items() if k != "__key__"} for s in samples],
                         first_record=0, level=None)
    assert {c for _n, c in _entries(plain)} == {RAW}
    assert len(block) < len(plain)
    assert len(write_rec(samples, level=3)) < len(write_rec(samples, level=None))


def _small_shard() -> bytes:
    samples = [{"__key__": f"k{i}", "b": bytes([i]) * 20, "n": i, "t": "txt" * i}
               for i in range(6)]
    return write_rec(samples, bound=64)


def test_every_bit_flip_is_refused_by_both_readers() -> None:
    buf = _small_shard()
    assert len(read_rec(buf)) == 6
    for at in range(len(buf)):
        for bit in range(8):
            bad = bytearray(buf)
            bad[at] ^= 1 << bit
            with pytest.raises(ShardioError):
                read_rec(bytes(bad))
            with pytest.raises((read_v3.FormatError, ValueError)):
                list(read_v3.read_rec(memoryview(bytes(bad))))


def test_every_truncation_is_refused_by_both_readers() -> None:
    buf = _small_shard()
    for size in range(len(buf)):
        with pytest.raises(ShardioError):
            read_rec(buf[:size])
        with pytest.raises((read_v3.FormatError, ValueError, struct.error)):
            list(read_v3.read_rec(memoryview(buf[:size])))


def _reseal(block: bytearray) -> bytes:
    """``block`` with its checksum made right again: what a hostile writer would do."""
    struct.pack_into("<I", block, 0, compute("crc32c", bytes(block[4:])))
    return bytes(block)


def _hostile_blocks() -> list[bytes]:
    block = bytearray(encode_block([{"t": "hello " * 50, "n": 1}] * 4, first_record=0, level=3))
    out = []
    for field, value in ((1, 1 << 31), (3, 1 << 31), (4, 1 << 31), (5, 1 << 40)):
        bad = bytearray(block)
        crc, *head = HEAD.unpack_from(bad)
        head[field - 1] = value
        HEAD.pack_into(bad, 0, crc, *head)
        out.append(_reseal(bad))
    # a column that claims 2**40 raw bytes (and another stored size), checksum made right
    first = HEAD.size
    for index, value in ((5, 1 << 40), (4, 1 << 40), (5, MAX_INFLATE_RATIO * 10_000)):
        bad = bytearray(block)
        fields = list(ENTRY.unpack_from(bad, first))
        fields[index] = value
        ENTRY.pack_into(bad, first, *fields)
        out.append(_reseal(bad))
    return out


def test_hostile_block_heads_are_refused_before_allocating() -> None:
    for bad in _hostile_blocks():
        tracemalloc.start()
        try:
            with pytest.raises(ShardCorruptError, match="block 7"):
                decode_block(bad, path="hostile.rec", block=7)
            _size, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20
        with pytest.raises(read_v3.FormatError):
            read_v3.read_block(memoryview(bad), 0, 4)


def test_hostile_footer_counts_are_refused_before_allocating() -> None:
    buf = bytearray(_small_shard())
    at = len(buf) - FOOTER.size
    index, keys, count, blocks, crc, version, magic = FOOTER.unpack_from(buf, at)
    for forged in ((index, keys, 1 << 40, blocks), (index, index + 16 * ((1 << 40) + 1), count,
                                                     1 << 40)):
        bad = bytearray(buf)
        FOOTER.pack_into(bad, at, *forged, crc, version, magic)
        tracemalloc.start()
        try:
            with pytest.raises(ShardCorruptError, match="footer offsets"):
                read_rec(bytes(bad), "forged.rec")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20


def test_a_block_read_from_the_wrong_place_is_refused() -> None:
    block = encode_block([{"n": 1}], first_record=5, level=None)
    with pytest.raises(ShardCorruptError, match="starts at record 5"):
        decode_block(block, path="s.rec", block=0, first_record=0, num_records=1)


def test_locate_finds_each_records_block() -> None:
    samples = [{"__key__": f"k{i}", "v": bytes(i % 7 * 40)} for i in range(50)]
    index = parse_rec(write_rec(samples, bound=100)[:32], write_rec(samples, bound=100),
                      len(write_rec(samples, bound=100)), path="s")
    for record in range(50):
        block, pos = index.locate(record)
        assert int(index.first_records[block]) + pos == record
        assert pos < int(index.first_records[block + 1] - index.first_records[block])


@given(st.lists(st.text(max_size=12), max_size=40), st.booleans())
def test_a_key_section_decodes_to_its_keys_by_index_slice_and_iteration(
        keys: list[str], compressed: bool) -> None:
    got = decode_keys(encode_keys(keys, 3 if compressed else None), len(keys), path="s.rec")
    assert got == keys and list(got) == keys and len(got) == len(keys)
    assert [got[i] for i in range(-len(keys), len(keys))] == keys + keys
    assert got[1:-1] == keys[1:-1] and got[::2] == keys[::2]
    positions = [len(keys) - 1, 0, len(keys) // 2, 0] if keys else []
    take = getattr(got, "take", None)  # an ASCII column's (non-ASCII keys are a list)
    assert take is None or take(positions) == [keys[i] for i in positions]
    with pytest.raises(IndexError):
        got[len(keys)]
