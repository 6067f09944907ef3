"""``shardio.verify``: a clean dataset passes; every kind of damage is found and located."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardio import ShardCorruptError, ShardWriter, WriteOptions, open_dataset, read_manifest
from shardio.format.codecs import get_codec
from shardio.format.manifest import file_checksum
from shardio.format.record import encode_record
from shardio.ops.verify import VerifyReport, verify
from shardio.reading.stream import iter_samples

NUM_SAMPLES = 10
PER_SHARD = 4


def blob(i: int) -> bytes:
    """Incompressible bytes unique to sample ``i``, so a test can find them in a shard."""
    return np.random.default_rng(1000 + i).integers(0, 256, 3000, dtype=np.uint8).tobytes()


@pytest.fixture
def dataset(tmp_path: Path, backend: str) -> Path:
    """10 samples in shards of 4: shard 0 holds k0..k3, shard 1 k4..k7, shard 2 k8, k9."""
    out = tmp_path / "ds"
    options = WriteOptions(backend=backend, codec="none", max_shard_samples=PER_SHARD,
                           version=2)  # record-level faults: v3's are in test_format_versions
    with ShardWriter(out, options) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"k{i}", "bin": blob(i), "txt": f"sample {i}"})
    return out


def flip_byte_of(dataset: Path, i: int) -> str:
    """Flip one byte in the middle of sample ``i``'s blob; return its shard's file name."""
    shard = read_manifest(dataset).shards[i // PER_SHARD].name
    path = dataset / shard
    data = bytearray(path.read_bytes())
    at = data.find(blob(i))
    assert at > 0, "blob not found in its shard"
    data[at + 1500] ^= 0x40
    path.write_bytes(bytes(data))
    return shard


def test_clean_dataset_passes(dataset: Path) -> None:
    report = verify(dataset)
    assert report.ok, report.faults
    assert report.faults == ()
    assert report.num_shards == 3
    assert report.num_records == NUM_SAMPLES
    assert report.num_bytes == read_manifest(dataset).num_bytes


def test_report_is_json_ready(dataset: Path) -> None:
    flip_byte_of(dataset, 2)
    data = json.loads(json.dumps(verify(dataset).to_json()))
    assert data["ok"] is False
    assert {"shard", "record", "offset", "message"} <= set(data["faults"][0])


def test_flipped_byte_names_shard_and_record(dataset: Path, backend: str) -> None:
    shard = flip_byte_of(dataset, 5)
    report = verify(dataset)
    assert not report.ok
    if backend == "lmdb":  # a damaged LMDB file is never opened: the checksum names the shard
        assert [(f.shard, f.record) for f in report.faults] == [(shard, None)]
        assert "checksum" in report.faults[0].message
        return
    record_faults = [f for f in report.faults if f.record is not None]
    assert len(record_faults) == 1
    fault = record_faults[0]
    assert fault.shard == shard
    assert fault.record == 5 - PER_SHARD
    assert shard in fault.message and f"record {fault.record}" in fault.message
    assert "'k5'" in fault.message
    file_faults = [f for f in report.faults if f.record is None]
    assert [f.shard for f in file_faults] == [shard]
    assert "checksum" in file_faults[0].message
    assert report.num_records == NUM_SAMPLES


def test_every_fault_is_collected(dataset: Path, backend: str) -> None:
    first = flip_byte_of(dataset, 1)
    second = flip_byte_of(dataset, 9)
    report = verify(dataset)
    located = sorted((f.shard, f.record) for f in report.faults if f.record is not None)
    if backend == "lmdb":  # a damaged LMDB file is never opened: one checksum fault per shard
        assert located == []
        assert sorted(f.shard for f in report.faults) == [first, second]
        return
    assert located == [(first, 1), (second, 1)]


def test_truncated_shard(dataset: Path) -> None:
    shard = read_manifest(dataset).shards[0]
    path = dataset / shard.name
    os.truncate(path, shard.num_bytes - 100)
    report = verify(dataset)
    assert not report.ok
    assert [f.shard for f in report.faults] == [shard.name]
    assert shard.name in report.faults[0].message
    assert str(shard.num_bytes) in report.faults[0].message
    assert report.num_records == NUM_SAMPLES - PER_SHARD


def test_missing_shard(dataset: Path) -> None:
    shard = read_manifest(dataset).shards[1].name
    (dataset / shard).unlink()
    report = verify(dataset)
    assert not report.ok
    assert [f.shard for f in report.faults] == [shard]
    assert "missing" in report.faults[0].message and shard in report.faults[0].message


def test_record_count_disagreeing_with_manifest(dataset: Path) -> None:
    manifest_file = dataset / "manifest.json"
    data = json.loads(manifest_file.read_text())
    data["shards"][2]["num_samples"] += 1
    data["num_samples"] += 1
    manifest_file.write_text(json.dumps(data))
    report = verify(dataset)
    assert not report.ok
    assert [f.shard for f in report.faults] == [data["shards"][2]["name"]]
    assert "3" in report.faults[0].message and "2" in report.faults[0].message


def test_unknown_manifest_version(dataset: Path) -> None:
    manifest_file = dataset / "manifest.json"
    data = json.loads(manifest_file.read_text())
    data["version"] = 99
    manifest_file.write_text(json.dumps(data))
    report = verify(dataset)
    assert not report.ok
    assert len(report.faults) == 1
    assert report.faults[0].shard == "manifest.json"
    assert "99" in report.faults[0].message and "version" in report.faults[0].message


def test_missing_manifest_is_a_fault(tmp_path: Path) -> None:
    report = verify(tmp_path)
    assert not report.ok
    assert report.faults[0].shard == "manifest.json"
    assert "pack" in report.faults[0].message


def test_manifest_total_bytes_checked(dataset: Path) -> None:
    manifest_file = dataset / "manifest.json"
    data = json.loads(manifest_file.read_text())
    data["num_bytes"] += 1
    manifest_file.write_text(json.dumps(data))
    report = verify(dataset)
    assert [f.shard for f in report.faults] == ["manifest.json"]
    assert "num_bytes" in report.faults[0].message


def test_quick_checks_only_file_checksums(dataset: Path) -> None:
    clean: VerifyReport = verify(dataset, quick=True)
    assert clean.ok and clean.quick
    assert clean.num_records == 0
    assert clean.num_bytes == read_manifest(dataset).num_bytes
    shard = flip_byte_of(dataset, 6)
    report = verify(dataset, quick=True)
    assert not report.ok
    assert [(f.shard, f.record) for f in report.faults] == [(shard, None)]
    assert report.num_records == 0


def test_file_checksum_matches_writer(dataset: Path) -> None:
    for shard in read_manifest(dataset).shards:
        assert file_checksum(dataset / shard.name, "crc32c") == shard.checksum


def test_verify_leaves_dataset_readable(dataset: Path) -> None:
    assert verify(dataset, progress=True).ok
    with open_dataset(dataset) as reader:
        assert [s["__key__"] for s in reader] == [f"k{i}" for i in range(NUM_SAMPLES)]


# --- records that disagree with their key block or the manifest -------------------------


def write_crafted(out: Path, backend: str, records: list[tuple[str, dict[str, Any]]],
                  fields: list[str], classes: list[str] | None = None) -> None:
    """Records framed as given, under the key-block keys given (as a tampered shard can be)."""
    codec = get_codec("none")
    with ShardWriter(out, WriteOptions(backend=backend, codec="none", version=2),
                     classes=classes) as w:
        for key, sample in records:
            w._write_encoded(key, encode_record(sample, codec), fields)


@pytest.mark.parametrize(
    ("record", "words"),
    [
        ({"__key__": "other", "txt": "x"}, "holds key 'other' but the shard's key block says 'b'"),
        ({"__key__": "b", "txt": "x", "a/../b": b"x"}, r"field\(s\) \['a/\.\./b'\] that the "
         r"manifest does not list"),
        ({"__key__": "b"}, None),
    ],
)
def test_record_disagreeing_with_key_block_or_manifest_is_named(
    tmp_path: Path, backend: str, record: dict[str, Any], words: str | None
) -> None:
    out = tmp_path / "ds"
    write_crafted(out, backend, [("a", {"__key__": "a", "txt": "x"}), ("b", record)], ["txt"])
    report = verify(out)
    shard = read_manifest(out).shards[0].name
    if words is None:  # a record without some listed field is fine
        assert report.ok, report.faults
        return
    assert not report.ok
    assert [(f.shard, f.record) for f in report.faults] == [(shard, 1)]
    assert re.search(words, report.faults[0].message), report.faults[0].message


def test_manifest_field_no_record_holds_is_a_fault(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    write_crafted(out, "records", [("a", {"__key__": "a", "txt": "x"})], ["txt", "jpg"])
    report = verify(out)
    assert [(f.shard, f.record) for f in report.faults] == [("manifest.json", None)]
    assert "fields lists ['jpg'], which no record holds" in report.faults[0].message


@pytest.mark.parametrize(
    ("sample", "words"),
    [
        ({"image": b"x", "label": 2}, r"label 2, not an index into the 2 classes"),
        ({"image": b"x", "label": 1, "txt": "x"}, r"field\(s\) \['txt'\] that the manifest"),
        ({"image": "x", "label": 1}, "image of type str"),
        ({"jpg": b"x", "label": 1}, r"field\(s\) \['jpg'\] that the manifest"),
        ({"image": b"x"}, r"has fields \['image'\]; a dataset with classes holds exactly"),
    ],
)
def test_labelled_record_its_readers_cannot_use_is_a_fault(
    tmp_path: Path, sample: dict[str, Any], words: str
) -> None:
    out = tmp_path / "ds"
    good = {"__key__": "a", "image": b"x", "label": 0}
    write_crafted(out, "records", [("a", good), ("b", {"__key__": "b", **sample})],
                  ["image", "label"], classes=["cat", "dog"])
    report = verify(out)
    assert [f.record for f in report.faults] == [1]
    assert re.search(words, report.faults[0].message), report.faults[0].message


def test_key_used_twice_is_a_fault(tmp_path: Path, backend: str) -> None:
    out = tmp_path / "ds"
    records = [(k, {"__key__": k, "txt": "x"}) for k in ("a", "b", "a")]
    with ShardWriter(out, WriteOptions(backend=backend, max_shard_samples=2,
                                      version=2)) as writer:
        codec = get_codec("zstd")
        for key, sample in records:
            writer._keys.discard(key)  # the public write refuses a duplicate key
            writer._write_encoded(key, encode_record(sample, codec), ["txt"])
    report = verify(out)
    second = read_manifest(out).shards[1].name
    assert [(f.shard, f.record) for f in report.faults] == [(second, 0)]
    assert "key 'a', which another record already has" in report.faults[0].message


@pytest.mark.parametrize(
    ("where", "words"),
    [
        (lambda size: 12, "shard header flags"),
        (lambda size: 3, "not a shardio shard"),
        # the v2 footer's last 48 bytes: index offset, keys offset, count, index checksum, ...
        (lambda size: size - 22, "record index and key block .* fail their checksum"),
        (lambda size: size - 49, "record index and key block .* fail their checksum"),
        (lambda size: size - 38, "footer offsets are inconsistent"),
    ],
)
def test_damaged_region_of_a_records_shard_is_named(
    tmp_path: Path, where: Any, words: str
) -> None:
    out = tmp_path / "ds"
    with ShardWriter(out, WriteOptions(codec="none", version=2)) as writer:
        for i in range(3):
            writer.write({"__key__": f"k{i}", "bin": blob(i)})
    path = out / read_manifest(out).shards[0].name
    data = bytearray(path.read_bytes())
    data[where(len(data))] ^= 0x01
    path.write_bytes(bytes(data))
    report = verify(out)
    messages = [f.message for f in report.faults]
    assert len(messages) == 2, messages
    assert "file checksum" in messages[0]
    assert re.search(words, messages[1]), messages[1]


# --- shard files exchanged ----------------------------------------------------------------


def exchange(a: Path, b: Path) -> None:
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)


def test_exchanged_shards_of_equal_size_are_refused_by_every_reader(dataset: Path) -> None:
    """Size and record count match (LMDB files grow by whole pages), so the key block decides."""
    first, second = (dataset / s.name for s in read_manifest(dataset).shards[:2])
    assert first.stat().st_size == second.stat().st_size
    exchange(first, second)
    with open_dataset(dataset) as reader:
        for index in (0, 5):
            with pytest.raises(ShardCorruptError, match="holds another shard's records"):
                reader.get(index)
        assert reader.get(9)["__key__"] == "k9", "the shard left alone still reads"
    with open_dataset(dataset) as reader, pytest.raises(ShardCorruptError):
        list(iter_samples(reader, np.arange(NUM_SAMPLES), window=4, max_run=2))
    report = verify(dataset)
    assert {f.shard for f in report.faults} == {first.name, second.name}


def test_manifest_without_key_block_crcs_still_reads(dataset: Path) -> None:
    """Manifests written before ``keys_crc32`` existed have none; nothing is checked then."""
    path = dataset / "manifest.json"
    data = json.loads(path.read_text())
    assert all(isinstance(s["keys_crc32"], int) for s in data["shards"])
    for shard in data["shards"]:
        del shard["keys_crc32"]
    path.write_text(json.dumps(data))
    assert verify(dataset).ok
    with open_dataset(dataset) as reader:
        assert [s["__key__"] for s in reader] == [f"k{i}" for i in range(NUM_SAMPLES)]


def test_pack_and_writer_record_each_shards_key_block_crc(tmp_path: Path, tiny_tree: Path,
                                                         backend: str) -> None:
    from shardio.backends import stored_keys_crc32
    from shardio.packing.pack import pack

    out = tmp_path / "packed"
    pack(tiny_tree, out, options=WriteOptions(backend=backend, max_shard_samples=100),
         num_workers=1)
    manifest = read_manifest(out)
    assert len(manifest.shards) == 3
    with open_dataset(out) as reader:
        for number, info in enumerate(manifest.shards):
            assert info.keys_crc32 == stored_keys_crc32(reader.shard(number))
