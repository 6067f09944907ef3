"""Format v3 as pack writes it, and v2 beside it: what each writer writes, who reads it.

* every shard ``shardio pack`` writes (both backends, compressed or not) is read by the
  reference reader ``tools/read_v3.py`` (no shardio import) into the samples shardio
  yields;
* ``--format-version 2`` still writes version 2, read through a real DataLoader with 0
  and 2 workers: every sample once, bytes equal to the source files;
* a dataset keeps its version as it grows: appending to v2 writes v2 shards, to v3 v3
  ones; merging v3 with v2 is refused with a message that says what to do; merging
  v3 datasets with ``--prefix-keys`` rewrites keys and keeps every value's bytes.
"""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

import shardio
from shardio.errors import PackError
from shardio.packing.writer import WriteOptions
from shardio.synth import make_imagefolder

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("read_v3", ROOT / "tools" / "read_v3.py")
assert _spec is not None and _spec.loader is not None
read_v3 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(read_v3)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageFolder of 90 small JPEGs, plus a generic tree with JSON beside each image."""
    root = tmp_path_factory.mktemp("versions") / "tree"
    make_imagefolder(root, num_classes=3, per_class=30, seed=2, long_side=(40, 80))
    assert sorted(p.name for p in root.iterdir()) == ["class_00", "class_01", "class_02"]
    return root


def _manifest(path: Path) -> dict[str, Any]:
    return json.loads((path / "manifest.json").read_text())  # type: ignore[no-any-return]


def _stream(path: Path, workers: int) -> Counter[str]:
    seen: Counter[str] = Counter()
    dataset = shardio.StreamingDataset(path, decode="raw", shuffle=True, seed=3)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    for sample in loader:
        seen[sample["__key__"]] += 1
    return seen


@pytest.mark.parametrize("backend", ["records", "lmdb"])
@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_the_reference_reader_reads_what_pack_writes(tree: Path, tmp_path: Path, backend: str,
                                                     codec: str) -> None:
    out = tmp_path / "ds"
    shardio.pack(tree, out, options=WriteOptions(backend=backend, codec=codec,
                                                 max_shard_samples=40), progress=False)
    assert _manifest(out)["version"] == 3
    with shardio.open_dataset(out) as reader:
        expected = {s["__key__"]: s for s in reader}
    got: dict[str, dict[str, Any]] = {}
    for shard in _manifest(out)["shards"]:
        for sample in read_v3.read_shard(str(out / shard["name"])):
            got[sample["__key__"]] = sample
    assert got.keys() == expected.keys() and len(got) == 90
    for key, sample in got.items():
        want = {k: v for k, v in expected[key].items() if k != "__index__"}
        assert sample == want, key
        assert bytes(sample["image"]) == (tree / key).read_bytes()


@pytest.mark.parametrize("backend", ["records", "lmdb"])
def test_version_2_is_still_written_and_read(tree: Path, tmp_path: Path, backend: str) -> None:
    out = tmp_path / "v2"
    shardio.pack(tree, out, options=WriteOptions(backend=backend, version=2,
                                                 max_shard_samples=25), progress=False)
    assert _manifest(out)["version"] == 2
    head = (out / _manifest(out)["shards"][0]["name"]).read_bytes()
    if backend == "records":
        assert int.from_bytes(head[8:12], "little") == 2
    for workers in (0, 2):
        seen = _stream(out, workers)
        assert len(seen) == 90 and set(seen.values()) == {1}
    assert shardio.verify(out).ok


def test_append_keeps_the_datasets_version(tree: Path, tmp_path: Path) -> None:
    for version in (2, 3):
        out = tmp_path / f"v{version}"
        shardio.pack(tree, out, options=WriteOptions(version=version), include=["class_00/*"],
                     progress=False)
        shardio.pack(tree, out, append=True, include=["class_01/*"], progress=False)
        manifest = _manifest(out)
        assert manifest["version"] == version
        for shard in manifest["shards"]:
            head = (out / shard["name"]).read_bytes()[8:12]
            assert int.from_bytes(head, "little") == version, shard["name"]
        assert shardio.verify(out).ok
        assert sum(_stream(out, 0).values()) == 60


def test_merge_refuses_v3_beside_v2_and_rekeys_v3(tree: Path, tmp_path: Path) -> None:
    a, b, old = tmp_path / "a", tmp_path / "b", tmp_path / "old"
    shardio.pack(tree, a, include=["class_00/*"], progress=False)  # generic: key a/b/x, field jpg
    shardio.pack(tree, b, include=["class_01/*"], progress=False)
    shardio.pack(tree, old, options=WriteOptions(version=2), include=["class_02/*"],
                 progress=False)
    with pytest.raises(PackError, match=r"format version .*--format-version 3"):
        shardio.merge([a, old], tmp_path / "mixed")
    both = tmp_path / "both"
    shardio.merge([a, b], both, prefix_keys=True)
    assert _manifest(both)["version"] == 3
    assert shardio.verify(both).ok
    with shardio.open_dataset(both) as reader:
        for sample in reader:
            name, _, key = sample["__key__"].partition("/")
            assert name in ("a", "b")
            assert bytes(sample["jpg"]) == (tree / f"{key}.jpg").read_bytes()


def _blob(i: int) -> bytes:
    return bytes((i * 31 + k * 7) % 251 for k in range(3000))


@pytest.fixture
def blobs(tmp_path: Path) -> Path:
    """12 records of 3 KB in shards of 6, blocks of 3 records each (v3)."""
    out = tmp_path / "blobs"
    options = WriteOptions(codec="none", max_shard_samples=6, block_records=3)
    with shardio.ShardWriter(out, options) as writer:
        for i in range(12):
            writer.write({"__key__": f"k{i:02d}", "bin": _blob(i), "n": i})
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_a_flipped_byte_is_named_by_its_block_and_records_everywhere(
        blobs: Path, workers: int) -> None:
    shard = blobs / _manifest(blobs)["shards"][1]["name"]
    data = bytearray(shard.read_bytes())
    at = data.find(_blob(10))  # record 10: shard 1, record 4, in block 1 (records 3..5)
    data[at + 100] ^= 0x20
    shard.write_bytes(bytes(data))
    faults = shardio.verify(blobs).faults
    assert any(f.shard == shard.name and f.record == 3 and "block 1" in f.message
               and "(records 3..5)" in f.message for f in faults), faults
    with pytest.raises(shardio.errors.ChecksumError, match=r"block 1 .*\(records 3\.\.5\)"):
        for _ in torch.utils.data.DataLoader(shardio.StreamingDataset(blobs, shuffle=False),
                                             batch_size=None, num_workers=workers):
            pass
    indexed = shardio.IndexedDataset(blobs, decode="raw")
    assert indexed[8]["n"] == 8  # block 0 of shard 1: intact
    with pytest.raises(shardio.errors.ChecksumError, match="block 1"):
        indexed[9]  # block 1 of shard 1 holds records 9..11 of the dataset


def test_exchanged_v3_shards_are_refused_by_their_key_section(blobs: Path) -> None:
    first, second = (blobs / s["name"] for s in _manifest(blobs)["shards"])
    data = first.read_bytes()
    first.write_bytes(second.read_bytes())
    second.write_bytes(data)
    with shardio.open_dataset(blobs) as reader, pytest.raises(
            shardio.errors.ShardCorruptError, match="holds another shard's records"):
        reader.get(0)
    assert {f.shard for f in shardio.verify(blobs).faults} == {first.name, second.name}


def test_a_plan_reads_whole_stored_blocks(blobs: Path) -> None:
    manifest = shardio.read_manifest(blobs)
    assert manifest.block_records == 3
    for asked, planned in ((1, 3), (4, 3), (5, 6), (64, 63)):
        dataset = shardio.StreamingDataset(blobs, block_size=asked, shuffle=True)
        assert dataset.config.block_size == planned
    keys = [s["__key__"] for s in shardio.StreamingDataset(blobs, block_size=4, seed=1)]
    assert sorted(keys) == [f"k{i:02d}" for i in range(12)]
