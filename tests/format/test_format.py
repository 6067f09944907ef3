"""Formats v1 and v2: record framing, shard header and footer, the manifest, the record codec.

Covers ``shardio.format.frames``, ``shardio.format.record`` and ``shardio.format.manifest`` on bytes
and generated files; the backends' own files are covered in test_backends.py.
"""

from __future__ import annotations

import json
import math
import re
import struct
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import crc32c
import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from shardio.backends import create_shard, open_shard
from shardio.errors import (
    ChecksumError,
    ManifestError,
    ManifestNotFoundError,
    RecordEncodeError,
    ShardCorruptError,
    TruncatedShardError,
    UnsupportedVersionError,
)
from shardio.format.codecs import get_codec
from shardio.format.frames import (
    CODEC_NONE,
    CODEC_ZSTD,
    FRAME_SIZE,
    HEADER,
    HEADER_SIZES,
    HEADER_V2,
    SHARD_MAGIC,
    Header,
    RunBytes,
    check_frames,
    check_header,
    frame,
    pack_footer,
    pack_header,
    parse_index,
    unframe,
    unpack_footer,
)
from shardio.format.manifest import Manifest, ShardInfo, SkippedFile, load_manifest, write_manifest
from shardio.format.record import decode_frames, decode_record, encode_record, encode_sample
from shardio.synth import make_photo

# --- record framing ---------------------------------------------------------------------


@pytest.mark.parametrize("codec", [CODEC_NONE, CODEC_ZSTD])
@pytest.mark.parametrize("payload", [b"", b"x", bytes(range(256)) * 40])
def test_frame_round_trip(payload: bytes, codec: int) -> None:
    framed = frame(payload, codec)
    assert len(framed) == FRAME_SIZE + len(payload)
    got_codec, got = unframe(framed + b"next record", path="s.rec", record=0)
    assert (got_codec, bytes(got)) == (codec, payload)


def test_flipped_payload_byte_names_file_record_and_offset() -> None:
    framed = bytearray(frame(b"some payload bytes", CODEC_NONE))
    framed[FRAME_SIZE + 5] ^= 0x01
    with pytest.raises(ChecksumError) as info:
        unframe(bytes(framed), path="out/shard-00003.rec", record=17, offset=4096)
    message = str(info.value)
    assert "out/shard-00003.rec" in message
    assert "record 17" in message
    assert "byte 4096" in message
    assert (info.value.path, info.value.record, info.value.offset) == (
        "out/shard-00003.rec", 17, 4096
    )


@pytest.mark.parametrize("where", [FRAME_SIZE, 8])
def test_flipped_checked_byte_is_found_and_verify_false_skips_it(where: int) -> None:
    framed = bytearray(frame(b"payload", CODEC_NONE))
    framed[where] ^= 0x20
    with pytest.raises(ChecksumError):
        unframe(bytes(framed), path="s", record=0)
    if where >= FRAME_SIZE:
        _codec, payload = unframe(bytes(framed), path="s", record=0, verify=False)
        assert bytes(payload) != b"payload"


@pytest.mark.parametrize("keep", [0, 4, FRAME_SIZE - 1, FRAME_SIZE, FRAME_SIZE + 9])
def test_truncated_frame(keep: int) -> None:
    framed = frame(b"ten bytes!", CODEC_NONE)
    with pytest.raises(TruncatedShardError, match=r"s\.rec: record 3 at byte 99 is cut short"):
        unframe(framed[:keep], path="s.rec", record=3, offset=99)


@pytest.mark.parametrize("bit", [0, 3, 27, 31])
def test_frame_length_that_disagrees_with_the_index_is_refused_even_unverified(bit: int) -> None:
    framed = encode_record({"__key__": "k", "txt": "0123456789" * 3}, get_codec("none"))
    damaged = bytearray(framed)
    damaged[bit // 8] ^= 1 << (bit % 8)
    for verify in (True, False):
        with pytest.raises(ShardCorruptError, match=r"s\.rec: record 4 at byte 70"):
            decode_record(bytes(damaged), path="s.rec", record=4, offset=70, verify=verify)
        with pytest.raises(ShardCorruptError, match=r"s\.rec: record 4 at byte 70"):
            decode_frames([memoryview(bytes(damaged))], path="s.rec", first_record=4,
                          offset_of=lambda i: 70, verify=verify)
    assert decode_record(framed, path="s.rec", record=4, verify=False)["__key__"] == "k"


def test_record_whose_own_key_disagrees_with_the_key_block_is_refused() -> None:
    framed = encode_record({"__key__": "../escaped", "txt": b"x"}, get_codec("none"))
    assert decode_record(framed, path="s.rec", record=1, key="../escaped")["txt"] == b"x"
    with pytest.raises(ShardCorruptError, match=r"s\.rec: record 1 at byte 9 holds key "
                       r"'\.\./escaped' but the shard's key block says 'a/b'"):
        decode_record(framed, path="s.rec", record=1, offset=9, key="a/b")
    good = encode_record({"__key__": "a/a", "txt": b"y"}, get_codec("none"))
    block = [memoryview(good), memoryview(framed)]
    keys = ["zero", "a/a", "a/b"]
    with pytest.raises(ShardCorruptError, match="record 2 at byte 20 holds key") as info:
        decode_frames(block, path="s.rec", first_record=1, offset_of=lambda i: 10 * i, keys=keys)
    assert info.value.record == 2
    got = decode_frames(block, path="s.rec", first_record=1, offset_of=lambda i: 10 * i,
                        keys=["zero", "a/a", "../escaped"])
    assert [s["__key__"] for s in got] == ["a/a", "../escaped"]


def test_unknown_codec_id_is_refused() -> None:
    framed = frame(b"payload", 7)
    with pytest.raises(ShardCorruptError, match="unknown codec 7"):
        unframe(framed, path="s.rec", record=0)


@pytest.mark.parametrize(
    "framed",
    [frame(b"\xc1garbage", CODEC_NONE), frame(b"not zstd", CODEC_ZSTD),
     frame(msgpack.packb([1, 2]), CODEC_NONE), frame(msgpack.packb({1: 2}), CODEC_NONE)],
)
def test_payload_that_passes_its_checksum_but_does_not_decode(framed: bytes) -> None:
    with pytest.raises(ShardCorruptError, match=r"s\.rec: record 2 at byte 40 .* not decode"):
        decode_record(framed, path="s.rec", record=2, offset=40)
    block = [memoryview(frame(msgpack.packb({"a": 1}), CODEC_NONE)), memoryview(framed)]
    with pytest.raises(ShardCorruptError, match=r"s\.rec: record 2 at byte 40 .* not decode"):
        decode_frames(block, path="s.rec", first_record=1, offset_of=lambda i: 20 * i)


# --- shard header and footer --------------------------------------------------------------


def test_header_round_trip_and_errors() -> None:
    assert check_header(pack_header(), path="s.rec") == Header(2, "crc32c", 32)
    assert check_header(pack_header(1), path="s.rec") == Header(1, "crc32", 16)
    assert pack_header(1) == HEADER.pack(SHARD_MAGIC, 1, 0)  # v1's 16 bytes, unchanged
    with pytest.raises(TruncatedShardError, match=r"s\.rec"):
        check_header(pack_header()[:10], path="s.rec")
    with pytest.raises(TruncatedShardError, match=r"s\.rec: 20 bytes is too short for a v2"):
        check_header(pack_header()[:20], path="s.rec")
    with pytest.raises(ShardCorruptError, match="not a shardio shard"):
        check_header(b"PK\x03\x04" + bytes(28), path="s.rec")
    with pytest.raises(UnsupportedVersionError, match=r"s\.rec: .*version 3"):
        check_header(HEADER_V2.pack(SHARD_MAGIC, 3, 0, b"crc32c\0\0"), path="s.rec")


@pytest.mark.parametrize("name", [b"md5\0\0\0\0\0", b"crc32c\0x", b"crc32 \0\0"])
def test_header_naming_an_unknown_checksum_is_refused(name: bytes) -> None:
    with pytest.raises(ShardCorruptError, match=r"s\.rec: the shard header names checksum"):
        check_header(HEADER_V2.pack(SHARD_MAGIC, 2, 0, name), path="s.rec")


@pytest.mark.parametrize("flags", [1, 1 << 9, 1 << 31])
@pytest.mark.parametrize("version", [1, 2])
def test_header_with_a_flag_set_is_refused(flags: int, version: int) -> None:
    header = HEADER_V2.pack(SHARD_MAGIC, version, flags, b"crc32c\0\0")
    with pytest.raises(ShardCorruptError, match=r"s\.rec: shard header flags") as info:
        check_header(header, path="s.rec")
    assert info.value.offset == 12


def test_v1_frames_are_the_v1_bytes_and_v2_frames_name_crc32c() -> None:
    v1 = frame(b"payload", CODEC_ZSTD, "crc32")
    crc = zlib.crc32(b"payload", zlib.crc32(bytes((CODEC_ZSTD, 0, 0, 0))))
    assert v1 == struct.pack("<IIB3x", 7, crc, CODEC_ZSTD) + b"payload"  # the v1 layout
    v2 = frame(b"payload", CODEC_ZSTD)
    assert v2[8:12] == bytes((CODEC_ZSTD, 1, 0, 0))
    assert struct.unpack_from("<I", v2, 4)[0] == crc32c.crc32c(v2[8:])
    for framed in (v1, v2):
        assert bytes(unframe(framed, path="s", record=0)[1]) == b"payload"
    with pytest.raises(ShardCorruptError, match=r"names checksum id 0 .* crc32c is id 1"):
        unframe(v1, path="s", record=0, checksum="crc32c")


def shard_tail(num_records: int = 2, version: int = 2) -> bytes:
    """A minimal ``.rec`` layout written by hand: header, frames, index, keys and footer."""
    name = "crc32" if version == 1 else "crc32c"
    compute = zlib.crc32 if version == 1 else crc32c.crc32c
    frames = [frame(b"a" * i, CODEC_NONE, name) for i in range(num_records)]
    header = pack_header(version)
    body = header + b"".join(frames)
    offsets, chain, pos = [], [], len(header)
    for framed in frames:
        offsets.append(pos)
        chain.append(compute(body[:pos]))
        pos += len(framed)
    index = np.asarray([*offsets, pos], dtype="<u8").tobytes()
    if version > 1:
        index += np.asarray([*chain, compute(body)], dtype="<u4").tobytes()
    keys: bytes = msgpack.packb([str(i) for i in range(num_records)])
    tail = index + keys
    return body + tail + pack_footer(pos, pos + len(index), num_records, compute(tail), version)


@pytest.mark.parametrize("version", [1, 2])
def test_footer_round_trip(version: int) -> None:
    data = shard_tail(3, version)
    footer = unpack_footer(data, path="s.rec")
    assert (footer.num_records, footer.version) == (3, version)
    assert footer.size == (40 if version == 1 else 48)
    assert footer.checksum == ("crc32" if version == 1 else "crc32c")
    assert footer.index_offset == HEADER_SIZES[version] + sum(FRAME_SIZE + i for i in range(3))
    assert footer.keys_offset == footer.index_offset + (8 if version == 1 else 12) * 4
    tail = unpack_footer(data[-footer.size:], path="s.rec", size=len(data))
    assert tail == footer, "a remote reader parses the footer from the tail alone"
    index = parse_index(data[footer.index_offset : -footer.size], footer, path="s.rec")
    assert index.offsets.tolist()[0] == HEADER_SIZES[version]
    assert msgpack.unpackb(index.key_block) == ["0", "1", "2"]
    assert (index.chain is None) == (version == 1)


@pytest.mark.parametrize("version", [1, 2])
def test_footer_errors(version: int) -> None:
    data = shard_tail(2, version)
    size = 40 if version == 1 else 48
    with pytest.raises(TruncatedShardError, match="too short"):
        unpack_footer(data[:20], path="s.rec")
    with pytest.raises(TruncatedShardError, match="no shard footer"):
        unpack_footer(data[:-3], path="s.rec")
    v9 = data[:-12] + (9).to_bytes(4, "little") + data[-8:]
    with pytest.raises(UnsupportedVersionError, match="version 9"):
        unpack_footer(v9, path="s.rec")
    moved = bytearray(data)
    moved[-size + 8] += 8  # keys_offset
    with pytest.raises(ShardCorruptError, match="footer offsets are inconsistent"):
        unpack_footer(bytes(moved), path="s.rec")
    footer = unpack_footer(data, path="s.rec")
    index = bytearray(data[footer.index_offset : -size])
    index[3] ^= 1
    with pytest.raises(ChecksumError, match="record index and key block"):
        parse_index(bytes(index), footer, path="s.rec")


def test_run_is_checked_by_its_chain_with_one_call_and_the_bad_record_is_named() -> None:
    data = shard_tail(5)
    footer = unpack_footer(data, path="s.rec")
    index = parse_index(data[footer.index_offset : -footer.size], footer, path="s.rec")
    offsets = index.offsets.astype(np.int64)
    run = RunBytes(memoryview(data)[offsets[1] : offsets[5]], offsets[1:] - offsets[1], "crc32c",
                   index.chain[1:], int(offsets[1]))
    assert check_frames(run, path="s.rec", first_record=1) == [0, 0, 0, 0]
    damaged = bytearray(data)
    damaged[int(offsets[3]) + FRAME_SIZE + 1] ^= 4  # a payload byte of record 3
    run = replace(run, buffer=memoryview(bytes(damaged))[offsets[1] : offsets[5]])
    with pytest.raises(ChecksumError, match=rf"s\.rec: record 3 at byte {offsets[3]} fails"):
        check_frames(run, path="s.rec", first_record=1)
    assert check_frames(run, path="s.rec", first_record=1, verify=False) == [0] * 4


def test_records_shard_of_an_unknown_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "shard-00000.rec"
    writer = create_shard("records", path, version=2)
    writer.append("k", frame(b"x", CODEC_NONE))
    writer.finish()
    data = bytearray(path.read_bytes())
    data[8:12] = (4).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(UnsupportedVersionError, match=re.escape(f"{path}: written by shardio "
                                                                "format version 4")):
        open_shard("records", path)


def test_a_frame_of_another_checksum_is_refused_by_the_writer(tmp_path: Path) -> None:
    writer = create_shard("records", tmp_path / "s.rec", version=2)
    with pytest.raises(ValueError, match="must name checksum id 1"):
        writer.append("k", frame(b"x", CODEC_NONE, "crc32"))
    writer.abort()


def test_lmdb_shard_of_an_unknown_version_is_refused(tmp_path: Path) -> None:
    import lmdb

    path = tmp_path / "shard-00000.mdb"
    env = lmdb.open(str(path), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        txn.put(b"__shardio__", msgpack.packb({"format": "shardio", "version": 4}))
    env.close()
    with pytest.raises(UnsupportedVersionError, match=re.escape(f"{path}: written by shardio "
                                                                "format version 4")):
        open_shard("lmdb", path)


# --- manifest -------------------------------------------------------------------------------


def make_manifest() -> Manifest:
    shards = (
        ShardInfo("shard-00000.rec", 3, 0, 1000, "crc32:0000abcd"),
        ShardInfo("shard-00001.rec", 2, 3, 700, "crc32:12345678"),
    )
    return Manifest(
        backend="records", codec="zstd", num_samples=5, num_bytes=1700,
        fields=("image", "label"), shards=shards, classes=("cat", "dög ü"),
        class_to_idx={"cat": 0, "dög ü": 1}, seed=7, shuffle=True,
        options={"level": 3, "max_shard_samples": 3}, input_bytes=4000,
        skipped=(SkippedFile("cat/bad.jpg", "does not decode"),), shardio_version="0.1.0",
    )


def test_manifest_json_round_trip(tmp_path: Path) -> None:
    manifest = make_manifest()
    assert Manifest.from_json(json.loads(json.dumps(manifest.to_json()))) == manifest
    write_manifest(tmp_path, manifest)
    assert load_manifest(tmp_path) == manifest
    assert load_manifest(tmp_path / "manifest.json") == manifest
    on_disk = json.loads((tmp_path / "manifest.json").read_text(encoding="utf-8"))
    assert (on_disk["format"], on_disk["version"]) == ("shardio", 3)
    assert list(on_disk)[:2] == ["format", "version"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


def test_unlabelled_manifest_round_trip(tmp_path: Path) -> None:
    manifest = replace(make_manifest(), classes=None, class_to_idx=None, skipped=())
    write_manifest(tmp_path, manifest)
    got = load_manifest(tmp_path)
    assert got == manifest
    assert not got.is_labelled
    assert got.shard_sizes == (3, 2)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"num_samples": 6}, "shards hold 5 samples but num_samples is 6"),
        ({"shards": [{**json.loads(json.dumps(make_manifest().to_json()))["shards"][0]},
                     {"name": "shard-00001.rec", "num_samples": 2, "first_index": 4,
                      "num_bytes": 700, "checksum": "crc32:12345678"}]},
         "shard-00001.rec starts at sample 4, expected 3"),
    ],
)
def test_manifest_consistency_check(tmp_path: Path, change: dict[str, Any], words: str) -> None:
    data = {**make_manifest().to_json(), **change}
    (tmp_path / "manifest.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ManifestError, match=re.escape(words)) as info:
        load_manifest(tmp_path)
    assert str(tmp_path / "manifest.json") in str(info.value)


@pytest.mark.parametrize(
    ("text", "error", "words"),
    [
        (json.dumps({**make_manifest().to_json(), "version": 4}), UnsupportedVersionError,
         "format version 4 is not supported"),
        (json.dumps({**make_manifest().to_json(), "format": "webdataset"}), ManifestError,
         "not a shardio manifest"),
        (json.dumps([1, 2]), ManifestError, "not a shardio manifest"),
        ("{not json", ManifestError, "not valid JSON"),
        (json.dumps({**make_manifest().to_json(), "backend": "tar"}), ManifestError,
         "unknown backend 'tar'"),
        (json.dumps({k: v for k, v in make_manifest().to_json().items() if k != "shards"}),
         ManifestError, "malformed manifest"),
    ],
)
def test_manifest_errors(tmp_path: Path, text: str, error: type[Exception], words: str) -> None:
    (tmp_path / "manifest.json").write_text(text, encoding="utf-8")
    with pytest.raises(error, match=re.escape(words)) as info:
        load_manifest(tmp_path)
    assert str(tmp_path / "manifest.json") in str(info.value)


def test_members_a_later_writer_adds_are_ignored_missing_ones_are_not(tmp_path: Path) -> None:
    data = make_manifest().to_json()
    data["added_later"] = {"x": 1}
    data["shards"] = [{**s, "added_later": [1, 2]} for s in data["shards"]]
    data["skipped"] = [{**s, "added_later": True} for s in data["skipped"]]
    (tmp_path / "manifest.json").write_text(json.dumps(data), encoding="utf-8")
    assert load_manifest(tmp_path) == make_manifest()
    data["shards"] = [{k: v for k, v in s.items() if k != "first_index"} for s in data["shards"]]
    (tmp_path / "manifest.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ManifestError, match=r"malformed manifest.*first_index"):
        load_manifest(tmp_path)
    data["shards"] = ["shard-00000.rec"]
    (tmp_path / "manifest.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ManifestError, match="malformed manifest"):
        load_manifest(tmp_path)


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(ManifestNotFoundError, match=r"no manifest\.json") as info:
        load_manifest(tmp_path)
    assert isinstance(info.value, FileNotFoundError)


# --- the record codec -----------------------------------------------------------------------

DTYPES = ("<u1", "<i2", "<i4", ">i4", "<u8", "<i8", "<f2", "<f4", ">f8", "|b1", "<c8")

scalars = (
    st.binary(max_size=64)
    | st.text(max_size=32)
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | st.none()
)
arrays = st.sampled_from(DTYPES).flatmap(
    lambda dtype: hnp.arrays(
        np.dtype(dtype), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
    )
)
values = st.recursive(
    scalars | arrays,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12,
)
samples = st.dictionaries(st.text(max_size=12), values, max_size=5)


def same(a: Any, b: Any) -> bool:
    """Deep equality where NaN equals NaN and types must match exactly."""
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
            and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a)
                                                      == math.copysign(1, b))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


@pytest.mark.parametrize("codec", ["none", "zstd"])
@settings(max_examples=60, deadline=None)
@given(sample=samples)
def test_any_valid_sample_round_trips(codec: str, sample: dict[str, Any]) -> None:
    framed = encode_record(sample, get_codec(codec))
    got = decode_record(framed, path="s.rec", record=0)
    assert same(got, sample)
    [block] = decode_frames([memoryview(framed)], path="s.rec", first_record=0,
                            offset_of=lambda i: 0)
    assert same(block, sample)


def test_numpy_scalars_tuples_and_views_are_stored_as_plain_values() -> None:
    sample: dict[str, Any] = {
        "f": np.float32(1.5), "i": np.int64(-3), "t": (1, "a"), "m": memoryview(b"mv"),
        "b": bytearray(b"ba"), "strided": np.arange(12, dtype="<i4").reshape(3, 4)[:, ::2],
    }
    got = decode_record(encode_record(sample, get_codec("zstd")), path="s", record=0)
    assert got["f"] == 1.5 and type(got["f"]) is float
    assert got["i"] == -3 and type(got["i"]) is int
    assert got["t"] == [1, "a"]
    assert got["m"] == b"mv" and got["b"] == b"ba"
    assert np.array_equal(got["strided"], sample["strided"])


class Opaque:
    pass


@pytest.mark.parametrize(
    "value",
    [
        Opaque(),
        {1, 2},
        frozenset({"a"}),
        np.array([1, "a", None], dtype=object),
        np.zeros(2, dtype=[("x", "<i4"), ("y", "<f4")]),
        2**64,
        -(2**63) - 1,
        [1, [2, {"deep": Opaque()}]],
        {1: "int key"},
        [{"ok": {(1, 2): "tuple key"}}],
        ({b"bytes key": 1},),
    ],
    ids=lambda v: type(v).__name__,
)
def test_values_that_would_need_pickle_are_refused(value: object) -> None:
    with pytest.raises(RecordEncodeError):
        encode_record({"field": value}, get_codec("zstd"))


def test_non_str_field_name_is_refused() -> None:
    with pytest.raises(RecordEncodeError, match="field names must be str"):
        encode_sample({b"bytes": 1})  # type: ignore[dict-item]


def codec_byte(framed: bytes) -> int:
    return framed[8]


def test_jpeg_is_stored_as_is_and_text_is_compressed() -> None:
    jpeg = make_photo(np.random.default_rng(0), 64, 48)
    text = ("the same line of text, again and again\n" * 200).encode()
    zstd = get_codec("zstd")
    stored_jpeg = encode_record({"__key__": "a/x.jpg", "jpg": jpeg, "cls": 3}, zstd)
    stored_text = encode_record({"__key__": "a/x.txt", "txt": text}, zstd)
    assert codec_byte(stored_jpeg) == CODEC_NONE
    assert jpeg in stored_jpeg
    assert codec_byte(stored_text) == CODEC_ZSTD
    assert len(stored_text) < len(text) // 10
    assert codec_byte(encode_record({"txt": text}, get_codec("none"))) == CODEC_NONE
    for framed in (stored_jpeg, stored_text):
        assert decode_record(framed, path="s", record=0)["__key__"].startswith("a/x.")


def test_incompressible_bytes_are_stored_as_is() -> None:
    noise = np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    framed = encode_record({"bin": noise}, get_codec("zstd"))
    assert codec_byte(framed) == CODEC_NONE
    assert decode_record(framed, path="s", record=0) == {"bin": noise}


@pytest.mark.parametrize("count", [5, 200])  # a struct loop below VECTOR_MIN_RECORDS, numpy above
@pytest.mark.parametrize(
    ("at", "value", "verify", "error", "words"),
    [
        (0, 0x7F, False, ShardCorruptError, "frame header says"),
        (8, 4, False, ShardCorruptError, "names unknown codec"),
        (8, 7, True, ChecksumError, "fails its checksum"),
        (9, 1, False, ShardCorruptError, "names checksum id 0"),
        (10, 1, False, ShardCorruptError, "reserved bytes 0100"),
        (FRAME_SIZE, 1, True, ChecksumError, "fails its checksum"),
    ],
)
def test_a_damaged_frame_header_in_a_run_names_its_record(
    count: int, at: int, value: int, verify: bool, error: type[Exception], words: str
) -> None:
    frames = [frame(bytes([i % 200]) * (i % 9 + 1), i % 2) for i in range(count)]
    bounds = np.concatenate(([0], np.cumsum([len(f) for f in frames]))).astype(np.int64)
    data = b"".join(frames)
    run = RunBytes(memoryview(data), bounds, "crc32c", None, 100)
    assert check_frames(run, path="s.rec", first_record=7) == [i % 2 for i in range(count)]
    damaged = bytearray(data)
    target = count - 3
    damaged[int(bounds[target]) + at] ^= value
    run = replace(run, buffer=memoryview(bytes(damaged)))
    with pytest.raises(error, match=re.escape(words)) as info:
        check_frames(run, path="s.rec", first_record=7, verify=verify)
    assert info.value.record == 7 + target  # type: ignore[attr-defined]
    assert info.value.offset == 100 + int(bounds[target])  # type: ignore[attr-defined]
