"""One conformance suite for every shard backend, plus the lmdb backend's own checks.

Every test that takes ``backend`` runs against ``records`` and ``lmdb`` alike:
the protocol in ``shardio.backends`` is the contract, not either implementation.
"""

from __future__ import annotations

import os
import random
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import crc32c
import lmdb
import msgpack
import pytest

from shardio.backends import create_shard, open_shard, shard_name
from shardio.backends.lmdb import KEYS_KEY, META_KEY, LmdbShardReader
from shardio.errors import (
    ChecksumError,
    PackError,
    ShardCorruptError,
    ShardioError,
    ShardMissingError,
    TruncatedShardError,
    UnsupportedVersionError,
)
from shardio.format.frames import CODEC_NONE, CODEC_ZSTD, frame, unframe

SIZES = (0, 1, 7, 100, 2000, 2100, 5000, 40_000, 3, 12)


def make_frames(seed: int = 0, sizes: tuple[int, ...] = SIZES) -> list[bytes]:
    """Frames with random payloads of mixed sizes: inline and overflow values for LMDB."""
    rng = random.Random(seed)
    return [frame(rng.randbytes(n), (CODEC_NONE, CODEC_ZSTD)[i % 2]) for i, n in enumerate(sizes)]


def write_shard(backend: str, path: Path, frames: list[bytes]) -> tuple[int, str]:
    writer = create_shard(backend, path, version=2)
    for i, framed in enumerate(frames):
        writer.append(f"dir/sample_{i:03d}", framed)
    return writer.finish()


@pytest.fixture
def frames() -> list[bytes]:
    return make_frames()


@pytest.fixture
def shard(tmp_path: Path, backend: str, frames: list[bytes]) -> Path:
    path = tmp_path / shard_name(backend, 0)
    write_shard(backend, path, frames)
    return path


@pytest.fixture
def reader(backend: str, shard: Path) -> Iterator[object]:
    opened = open_shard(backend, shard)
    yield opened
    opened.close()


def test_finish_reports_size_and_crc32_of_the_file(backend: str, tmp_path: Path) -> None:
    path = tmp_path / "one"
    size, checksum = write_shard(backend, path, make_frames())
    data = path.read_bytes()
    assert size == len(data)
    assert checksum == f"crc32c:{crc32c.crc32c(data):08x}"  # format v2's file checksum
    assert os.listdir(tmp_path) == ["one"], "no lock, scratch or temporary file may be left"


def test_records_read_back_by_index(backend: str, shard: Path, frames: list[bytes]) -> None:
    reader = open_shard(backend, shard)
    try:
        assert reader.num_records == len(frames)
        assert reader.path == str(shard)
        for i in reversed(range(len(frames))):
            assert bytes(reader.frame(i)) == frames[i]
            unframe(reader.frame(i), path=reader.path, record=i, offset=reader.offset(i))
        for bad in (-1, len(frames)):
            with pytest.raises(IndexError):
                reader.frame(bad)
    finally:
        reader.close()


@pytest.mark.parametrize(("start", "stop"), [(0, None), (0, 10), (3, 7), (9, 10), (4, 4), (0, 0)])
def test_scan_yields_a_range_in_order(
    backend: str, shard: Path, frames: list[bytes], start: int, stop: int | None
) -> None:
    reader = open_shard(backend, shard)
    try:
        got = [(i, bytes(f)) for i, f in reader.scan(start, stop)]
        end = len(frames) if stop is None else stop
        assert got == [(i, frames[i]) for i in range(start, end)]
        assert [bytes(f) for f in reader.read_frames(start, end)] == frames[start:end]
        reader.will_need(start, end)
    finally:
        reader.close()


def test_keys_in_record_order(backend: str, shard: Path, frames: list[bytes]) -> None:
    reader = open_shard(backend, shard)
    try:
        assert list(reader.keys()) == [f"dir/sample_{i:03d}" for i in range(len(frames))]
    finally:
        reader.close()


def test_frames_stay_valid_after_close(backend: str, shard: Path, frames: list[bytes]) -> None:
    reader = open_shard(backend, shard)
    held = [reader.frame(i) for i in range(len(frames))]
    reader.close()
    assert [bytes(f) for f in held] == frames


def test_empty_shard(backend: str, tmp_path: Path) -> None:
    path = tmp_path / shard_name(backend, 0)
    size, _ = write_shard(backend, path, [])
    assert size == path.stat().st_size
    reader = open_shard(backend, path)
    try:
        assert reader.num_records == 0
        assert list(reader.scan()) == []
        assert list(reader.keys()) == []
        with pytest.raises(IndexError):
            reader.frame(0)
    finally:
        reader.close()


def test_abort_removes_the_partial_file(backend: str, tmp_path: Path) -> None:
    path = tmp_path / f".{shard_name(backend, 0)}.tmp"
    writer = create_shard(backend, path, version=2)
    for i, framed in enumerate(make_frames()):
        writer.append(str(i), framed)
    writer.abort()
    assert os.listdir(tmp_path) == []


def test_identical_input_gives_identical_files(backend: str, tmp_path: Path) -> None:
    frames = make_frames(seed=5, sizes=tuple(range(0, 30_000, 997)))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = write_shard(backend, tmp_path / "a" / "s", frames)
    (tmp_path / "b" / "s").write_bytes(b"stale bytes from an interrupted run" * 1000)
    second = write_shard(backend, tmp_path / "b" / "s", frames)
    assert first == second
    assert (tmp_path / "a" / "s").read_bytes() == (tmp_path / "b" / "s").read_bytes()


def test_missing_file(backend: str, tmp_path: Path) -> None:
    path = tmp_path / shard_name(backend, 3)
    with pytest.raises(ShardMissingError, match=re.escape(str(path))):
        open_shard(backend, path)


@pytest.mark.parametrize("keep", [0.0, 0.1, 0.5, 0.9, 0.999])
def test_truncated_shard_is_refused(backend: str, shard: Path, keep: float) -> None:
    data = shard.read_bytes()
    shard.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ShardCorruptError, match=re.escape(str(shard))):
        reader = open_shard(backend, shard)
        reader.close()


@pytest.mark.parametrize("content", [b"", b"x" * 50, bytes(range(256)) * 64])
def test_garbage_file_is_refused(backend: str, tmp_path: Path, content: bytes) -> None:
    path = tmp_path / shard_name(backend, 0)
    path.write_bytes(content)
    with pytest.raises(ShardCorruptError, match=re.escape(str(path))):
        open_shard(backend, path)


def test_other_backend_file_is_refused(backend: str, tmp_path: Path) -> None:
    other = "lmdb" if backend == "records" else "records"
    path = tmp_path / "shard"
    write_shard(other, path, make_frames())
    with pytest.raises(ShardCorruptError, match=re.escape(str(path))):
        open_shard(backend, path)


@pytest.mark.parametrize("record", [4, 7])
def test_flipped_payload_byte_fails_the_record_checksum(
    backend: str, shard: Path, frames: list[bytes], record: int
) -> None:
    data = bytearray(shard.read_bytes())
    payload = frames[record][12:]
    at = data.find(payload)
    assert at >= 0 and data.find(payload, at + 1) < 0
    data[at + len(payload) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    reader = open_shard(backend, shard)
    try:
        for i in range(reader.num_records):
            framed = reader.frame(i)
            if i == record:
                with pytest.raises(ChecksumError, match=re.escape(f"{shard}: record {record} ")):
                    unframe(framed, path=reader.path, record=i, offset=reader.offset(i))
            else:
                unframe(framed, path=reader.path, record=i, offset=reader.offset(i))
    finally:
        reader.close()


# --- lmdb: its metadata entries and the error boundary --------------------------------


def rewrite_lmdb_entry(path: Path, key: bytes, value: bytes | None) -> None:
    """Replace (or with ``None`` delete) one entry of a finished lmdb shard in place."""
    env = lmdb.open(str(path), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        if value is None:
            txn.delete(key)
        else:
            txn.put(key, value)
    env.close()


def lmdb_meta(**changes: object) -> bytes:
    """The metadata entry a shard of ``make_frames()`` holds, with ``changes`` applied."""
    keys = msgpack.packb([f"dir/sample_{i:03d}" for i in range(len(SIZES))])
    meta = {
        "format": "shardio", "version": 2, "checksum": "crc32c", "num_records": len(SIZES),
        "keys_bytes": len(keys), "keys_crc32": zlib.crc32(keys),
    }
    return msgpack.packb({**meta, **changes}, use_bin_type=True)  # type: ignore[no-any-return]


@pytest.fixture
def lmdb_shard(tmp_path: Path) -> Path:
    path = tmp_path / shard_name("lmdb", 0)
    write_shard("lmdb", path, make_frames())
    return path


def _frames_in_child(reader: LmdbShardReader, out: Any) -> None:
    out.put([bytes(framed) for _index, framed in reader.scan()])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_reads_the_lmdb_shard_its_parent_opened(lmdb_shard: Path) -> None:
    """The reader is a map of the file, which a child inherits (liblmdb's environments were
    not, and such a reader had to be opened again in the child)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    reader = LmdbShardReader(lmdb_shard)
    try:
        out = context.SimpleQueue()
        child = context.Process(target=_frames_in_child, args=(reader, out))
        child.start()
        got = out.get()
        child.join(60)
        assert child.exitcode == 0
        assert got == make_frames() == [bytes(f) for _i, f in reader.scan()]
    finally:
        reader.close()


def test_lmdb_layout(lmdb_shard: Path) -> None:
    env = lmdb.open(str(lmdb_shard), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        meta = msgpack.unpackb(txn.get(META_KEY))
        keys = msgpack.unpackb(txn.get(KEYS_KEY))
        records = [(k, v) for k, v in txn.cursor() if len(k) == 8]
    env.close()
    assert {k: meta[k] for k in ("format", "version", "num_records")} == {
        "format": "shardio", "version": 2, "num_records": len(SIZES)
    }
    assert meta["checksum"] == "crc32c"
    assert keys == [f"dir/sample_{i:03d}" for i in range(len(SIZES))]
    assert records == [(i.to_bytes(8, "big"), f) for i, f in enumerate(make_frames())]
    assert not lmdb_shard.with_name(lmdb_shard.name + "-lock").exists()


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        (lmdb_meta(), None, ""),
        (None, ShardCorruptError, "not a shardio shard"),
        (lmdb_meta(version=4), UnsupportedVersionError, "version 4"),
        (lmdb_meta(checksum="md5"), ShardCorruptError, "checksum 'md5'"),
        (lmdb_meta(format="webdataset"), ShardCorruptError, "not a shardio shard"),
        (lmdb_meta(num_records=3), ShardCorruptError, "does not match"),
        (b"\xc1\xc1 not msgpack", ShardCorruptError, "not a shardio shard"),
        (msgpack.packb([1, 2]), ShardCorruptError, "not a shardio shard"),
    ],
)
def test_lmdb_metadata_is_checked(
    lmdb_shard: Path, value: bytes | None, error: type[Exception] | None, words: str
) -> None:
    rewrite_lmdb_entry(lmdb_shard, META_KEY, value)
    if error is None:
        LmdbShardReader(lmdb_shard).close()
        return
    with pytest.raises(error, match=re.escape(str(lmdb_shard))) as info:
        LmdbShardReader(lmdb_shard)
    assert words in str(info.value)


@pytest.mark.parametrize("value", [None, msgpack.packb(["only", "two"]), b"\x92\xa1a"])
def test_lmdb_damaged_key_list(lmdb_shard: Path, value: bytes | None) -> None:
    rewrite_lmdb_entry(lmdb_shard, KEYS_KEY, value)
    with pytest.raises(ShardCorruptError, match=re.escape(str(lmdb_shard))):
        reader = LmdbShardReader(lmdb_shard)
        try:
            reader.keys()
        finally:
            reader.close()


def test_lmdb_missing_record_is_named(lmdb_shard: Path) -> None:
    rewrite_lmdb_entry(lmdb_shard, (4).to_bytes(8, "big"), None)
    rewrite_lmdb_entry(lmdb_shard, b"zzzz", b"keeps the entry count")
    missing = re.escape(f"{lmdb_shard}: record (v3: block) 4 is missing")
    with pytest.raises(ShardCorruptError, match=missing):
        LmdbShardReader(lmdb_shard)  # refused at open: the check lists every entry


def test_lmdb_value_longer_than_its_frame(lmdb_shard: Path) -> None:
    rewrite_lmdb_entry(lmdb_shard, (2).to_bytes(8, "big"), make_frames()[2] + b"extra")
    reader = LmdbShardReader(lmdb_shard)
    try:
        with pytest.raises(ShardCorruptError, match=re.escape(f"{lmdb_shard}: record 2")):
            reader.frame(2)
    finally:
        reader.close()


def test_lmdb_reader_closed_is_a_value_error(lmdb_shard: Path) -> None:
    reader = LmdbShardReader(lmdb_shard)
    scan = reader.scan()
    next(scan)
    reader.close()
    reader.close()
    with pytest.raises(ValueError, match="closed"):
        reader.frame(1)
    with pytest.raises(ValueError, match="closed"):
        next(scan)


LMDB_ERRORS = sorted(
    (c for c in vars(lmdb).values() if isinstance(c, type) and issubclass(c, lmdb.Error)),
    key=lambda c: c.__name__,
)


@pytest.mark.parametrize("error", LMDB_ERRORS, ids=lambda c: c.__name__)
def test_every_lmdb_error_while_writing_is_a_pack_error(
    lmdb_shard: Path, monkeypatch: pytest.MonkeyPatch, error: type[lmdb.Error]
) -> None:
    """Reading needs no liblmdb (the check locates every value); writing does."""
    exc = error("mdb_env_open", 0)

    def refuse(*args: object, **kwargs: object) -> None:
        raise exc

    monkeypatch.setattr(lmdb, "open", refuse)
    open_shard("lmdb", lmdb_shard).close()
    with pytest.raises(PackError, match=r"x\.mdb"):
        create_shard("lmdb", lmdb_shard.with_name("x.mdb"), version=2)


def test_lmdb_writer_grows_its_map(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardio.backends.lmdb as backend_lmdb

    monkeypatch.setattr(backend_lmdb, "INITIAL_MAP_BYTES", 64 * 1024)
    monkeypatch.setattr(backend_lmdb, "BATCH_BYTES", 100_000)
    frames = make_frames(seed=3, sizes=(30_000,) * 40)
    write_shard("lmdb", tmp_path / "grown", frames)
    reader = LmdbShardReader(tmp_path / "grown")
    try:
        assert [bytes(f) for _, f in reader.scan()] == frames
    finally:
        reader.close()


def test_lmdb_truncated_below_last_page_names_size(lmdb_shard: Path) -> None:
    data = lmdb_shard.read_bytes()
    lmdb_shard.write_bytes(data[: len(data) - 4096])
    said = re.escape(f"{lmdb_shard}: shard is {len(data) - 4096} bytes")
    with pytest.raises(TruncatedShardError, match=said):
        LmdbShardReader(lmdb_shard)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts /proc/self/fd")
@pytest.mark.parametrize("damage", ["header", "footer", "index"])
def test_a_records_shard_refused_on_open_leaves_no_descriptor(tmp_path: Path, damage: str) -> None:
    path = tmp_path / shard_name("records", 0)
    write_shard("records", path, make_frames())
    data = bytearray(path.read_bytes())
    at = {"header": 0, "footer": len(data) - 1, "index": len(data) - 60}[damage]
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):  # a reader that skips damaged shards and goes on opens many
        with pytest.raises(ShardioError, match=re.escape(path.name)):
            open_shard("records", path)
    assert len(os.listdir("/proc/self/fd")) == before
