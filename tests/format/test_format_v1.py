"""Format v1 datasets keep reading exactly as before format v2.

The v1 writer is frozen here, byte layout by byte layout, from docs/format.md's
v1 sections (the shardio writer of commit 2a934e5 produced these same bytes for
the same samples: compared when this test was written), so no change to the
package's writer can move it. Every reader reads such a dataset: random access,
the stream, both torch datasets, ``verify``, and ``unpack``; damage is found as
it was.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import numpy as np
import pytest
import zstandard
from torch.utils.data import DataLoader

import shardio
from shardio.errors import ChecksumError
from shardio.reading.reader import open_dataset
from shardio.reading.stream import iter_samples

V1_FRAME = struct.Struct("<IIB3x")
V1_HEADER = b"SHARDIO\0" + struct.pack("<II", 1, 0)
V1_FOOTER = struct.Struct("<QQQII8s")


def v1_frame(sample: dict[str, Any], compress: bool) -> bytes:
    payload = msgpack.packb(sample, use_bin_type=True)
    codec = 0
    if compress:
        payload, codec = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(
            payload), 1
    crc = zlib.crc32(payload, zlib.crc32(bytes((codec, 0, 0, 0))))
    return V1_FRAME.pack(len(payload), crc, codec) + payload


def write_v1_records(path: Path, keys: list[str], frames: list[bytes]) -> None:
    body = V1_HEADER + b"".join(frames)
    offsets = np.cumsum([len(V1_HEADER)] + [len(f) for f in frames]).astype("<u8").tobytes()
    tail = offsets + msgpack.packb(keys, use_bin_type=True)
    footer = V1_FOOTER.pack(len(body), len(body) + len(offsets), len(keys), zlib.crc32(tail), 1,
                            b"SHARDIO\0")
    path.write_bytes(body + tail + footer)


def write_v1_lmdb(path: Path, keys: list[str], frames: list[bytes]) -> None:
    env = lmdb.open(str(path), subdir=False, lock=False, sync=False, metasync=False,
                    map_size=1 << 30, meminit=True, max_dbs=0, mode=0o644)
    packed = msgpack.packb(keys, use_bin_type=True)
    meta = {"format": "shardio", "version": 1, "num_records": len(keys),
            "keys_bytes": len(packed), "keys_crc32": zlib.crc32(packed)}
    items = [(i.to_bytes(8, "big"), framed) for i, framed in enumerate(frames)]
    items += [(b"__shardio__", msgpack.packb(meta, use_bin_type=True)),
              (b"__shardio_keys__", packed)]
    with env.begin(write=True) as txn:
        txn.cursor().putmulti(items, append=True)
    env.sync(True)
    env.close()


def samples_of(shard: int, count: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(shard)
    return [{"__key__": f"s{shard}/k{i:03d}", "bin": rng.bytes(int(rng.integers(0, 3000))),
             "txt": f"text {i} " * (i % 7), "cls": i % 3} for i in range(count)]


def write_v1_dataset(root: Path, backend: str) -> list[dict[str, Any]]:
    """A v1 dataset of two shards (one record zstd-compressed in three) and its samples."""
    root.mkdir()
    shards, everything = [], []
    for number, count in enumerate((7, 5)):
        samples = samples_of(number, count)
        frames = [v1_frame(s, compress=i % 3 == 0) for i, s in enumerate(samples)]
        keys = [s["__key__"] for s in samples]
        name = f"shard-{number:05d}.{'rec' if backend == 'records' else 'mdb'}"
        (write_v1_records if backend == "records" else write_v1_lmdb)(root / name, keys, frames)
        data = (root / name).read_bytes()
        shards.append({"name": name, "num_samples": count, "first_index": len(everything),
                       "num_bytes": len(data), "checksum": f"crc32:{zlib.crc32(data):08x}",
                       "keys_crc32": zlib.crc32(msgpack.packb(keys, use_bin_type=True))})
        everything += samples
    manifest = {"format": "shardio", "version": 1, "shardio_version": "0.1.0",
                "backend": backend, "codec": "zstd", "num_samples": len(everything),
                "num_bytes": sum(s["num_bytes"] for s in shards), "input_bytes": 0,
                "fields": ["bin", "txt", "cls"], "classes": None, "class_to_idx": None,
                "seed": None, "shuffle": False, "options": {}, "skipped": [], "shards": shards}
    (root / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return everything


@pytest.fixture(params=["records", "lmdb"])
def v1(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path / "v1"
    return root, write_v1_dataset(root, request.param)


def plain(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: bytes(v) if isinstance(v, memoryview) else v for k, v in sample.items()
            if k != "__index__"}


def test_every_reader_reads_a_v1_dataset_as_written(v1: tuple[Path, list[dict[str, Any]]]
                                                    ) -> None:
    root, expected = v1
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    with open_dataset(root) as reader:
        assert reader.manifest.version == 1
        assert [plain(reader.get(i)) for i in range(len(expected))] == expected
        order = np.random.default_rng(3).permutation(len(expected))
        streamed = list(iter_samples(reader, order, window=5, max_run=2))
        assert [s["__index__"] for s in streamed] == order.tolist()
        assert [plain(s) for s in streamed] == [expected[i] for i in order]
    dataset = shardio.StreamingDataset(root, decode="raw", batch_size=4, seed=1)
    loader = DataLoader(dataset, batch_size=4, collate_fn=list)
    got = sorted((plain(s) for batch in loader for s in batch), key=lambda s: s["__key__"])
    assert got == expected
    batches = list(shardio.loader(dataset, batch_size=4, num_workers=0))
    assert sorted(k for b in batches for k in b.keys) == sorted(s["__key__"] for s in expected)
    indexed = shardio.IndexedDataset(root, decode="raw")
    assert plain(indexed[len(expected) - 1]) == expected[-1]
    assert shardio.verify(root).ok
    assert {p.name: p.read_bytes() for p in root.iterdir()} == before, "reading wrote nothing"


def test_damage_in_a_v1_dataset_is_found_as_before(v1: tuple[Path, list[dict[str, Any]]]
                                                   ) -> None:
    root, expected = v1
    path = next(root.glob("shard-00000.*"))
    data = bytearray(path.read_bytes())
    at = data.find(v1_frame(expected[2], compress=False))  # record 2 is stored as it is
    assert at > 0
    data[at + 20] ^= 0x10  # a payload byte
    path.write_bytes(bytes(data))
    with open_dataset(root) as reader, pytest.raises(
            ChecksumError, match=rf"{path.name}: record 2 at byte \d+ fails its checksum"):
        list(iter_samples(reader, np.arange(len(expected)), window=8, max_run=4))
    report = shardio.verify(root)
    assert not report.ok and {f.shard for f in report.faults} == {path.name}
    if path.suffix == ".rec":  # verify never opens an LMDB file whose checksum is wrong
        assert [f.record for f in report.faults if f.record is not None] == [2]


def test_the_writer_forced_to_v1_writes_what_the_frozen_v1_writer_does(tmp_path: Path) -> None:
    from shardio.backends.records import RecordsShardWriter
    from shardio.format.codecs import get_codec
    from shardio.format.record import encode_record

    samples = samples_of(4, 6)
    frozen = [v1_frame(s, compress=False) for s in samples]
    ours = [encode_record(s, get_codec("none"), "crc32") for s in samples]
    assert ours == frozen
    write_v1_records(tmp_path / "frozen.rec", [s["__key__"] for s in samples], frozen)
    writer = RecordsShardWriter(tmp_path / "ours.rec", version=1)
    for sample, framed in zip(samples, ours, strict=True):
        writer.append(sample["__key__"], framed)
    writer.finish()
    assert (tmp_path / "ours.rec").read_bytes() == (tmp_path / "frozen.rec").read_bytes()
    assert os.path.getsize(tmp_path / "ours.rec") > 0


def test_damage_to_v1_shards_is_always_found_and_never_read_as_data(
        v1: tuple[Path, list[dict[str, Any]]]) -> None:
    """The corruption fuzz of tests/format/test_corruption_fuzz.py, on v1 files read today."""
    from benchmarks.stress_corruption import flip_cases, run_cases, truncate_cases

    root, _expected = v1
    rng = np.random.default_rng([5, len(root.name)])
    cases = flip_cases(root, 60, rng) + truncate_cases(root, 4, rng)
    outcomes = run_cases(root, cases, unpack=False)
    bad = [(case, out) for case, out in zip(cases, outcomes, strict=True)
           if not (out.get("found") is True and not out.get("crash") and not out.get("untyped")
                   and all(out[r] in ("raised", "exact") for r in ("get", "stream")))]
    assert not bad, f"{len(bad)} of {len(cases)} cases broke a guarantee, e.g. {bad[:3]}"
    assert sum(out["stream"] == "raised" for out in outcomes) > len(cases) // 5


def test_appending_to_a_v1_dataset_keeps_its_files_and_reads_both(
        v1: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    root, expected = v1
    before = {p.name: p.read_bytes() for p in root.iterdir() if p.name != "manifest.json"}
    src = tmp_path / "new"
    (src / "n").mkdir(parents=True)
    for i in range(5):
        (src / "n" / f"f{i}.bin").write_bytes(bytes([i]) * (100 + i))
    shardio.pack(src, root, append=True)
    manifest = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["version"] == 2, "the manifest lists v2 shards now"
    assert [s["checksum"].split(":")[0] for s in manifest["shards"]] == [
        "crc32", "crc32", *["crc32c"] * (len(manifest["shards"]) - 2)]
    assert all((root / name).read_bytes() == data for name, data in before.items())
    with open_dataset(root) as reader:
        got = [plain(reader.get(i)) for i in range(len(reader))]
    assert got[: len(expected)] == expected
    assert sorted(s["__key__"] for s in got[len(expected):]) == [f"n/f{i}" for i in range(5)]
    assert shardio.verify(root).ok
