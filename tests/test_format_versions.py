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
from shardio.synth import make_imagefolder
from shardio.writer import WriteOptions

ROOT = Path(__file__).resolve().parents[1]
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
