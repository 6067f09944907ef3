"""``shardio merge``: several datasets into one, shard files hard-linked, keys kept unique."""

from __future__ import annotations

import collections
import errno
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import shardio
from shardio.cli import main
from shardio.errors import OutputExistsError, PackError
from shardio.format.manifest import load_manifest
from shardio.packing.writer import WriteOptions
from shardio.synth import make_photo, make_tiny_tree


def make_tree(root: Path, classes: dict[str, range | list[int]], seed: int = 0) -> dict[str, bytes]:
    """An ImageFolder ``root/<class>/img_<n>.jpg`` of tiny JPEGs; returns key -> file bytes."""
    rng = np.random.default_rng(seed)
    files = {}
    for name, numbers in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for n in numbers:
            files[f"{name}/img_{n:03d}.jpg"] = data = make_photo(rng, 16, 12)
            (root / name / f"img_{n:03d}.jpg").write_bytes(data)
    return files


def pack(src: Path, out: Path, backend: str = "records") -> Path:
    shardio.pack(src, out, num_workers=1,
                 options=WriteOptions(backend=backend, max_shard_samples=5))
    return out


@pytest.fixture
def two_packs(tmp_path: Path, backend: str) -> tuple[Path, Path, dict[str, bytes]]:
    """Two ImageFolder packs with the same classes and other images: 10 and 6 samples."""
    a = make_tree(tmp_path / "src-a", {"cat": range(5), "dog": range(5, 10)}, seed=1)
    b = make_tree(tmp_path / "src-b", {"cat": range(10, 13), "dog": range(13, 16)}, seed=2)
    return (pack(tmp_path / "src-a", tmp_path / "a", backend),
            pack(tmp_path / "src-b", tmp_path / "b", backend), {**a, **b})


def test_merge_links_shards_and_streams_every_sample_once(
        two_packs: tuple, tmp_path: Path, backend: str) -> None:
    a, b, files = two_packs
    summary = shardio.merge([a, b], tmp_path / "all")
    out = tmp_path / "all"
    manifest = load_manifest(out)
    inputs = [a / s.name for s in load_manifest(a).shards] + [
        b / s.name for s in load_manifest(b).shards]
    assert (summary.samples, summary.shards, summary.linked) == (16, len(inputs), len(inputs))
    assert [s.name for s in manifest.shards] == [
        f"shard-{n:05d}{'.rec' if backend == 'records' else '.mdb'}" for n in range(len(inputs))]
    for shard, source in zip(manifest.shards, inputs, strict=True):
        assert os.path.samefile(out / shard.name, source)
        assert os.stat(source).st_nlink == 2
    assert manifest.classes == ("cat", "dog") and manifest.options["merge"] == {
        "inputs": ["a", "b"], "prefix_keys": False}
    report = shardio.verify(out)
    assert report.ok and report.num_records == 16, report.faults
    for num_workers in (0, 2):
        ds = shardio.StreamingDataset(out, decode="raw")
        got: list[Any] = []
        for batch in torch.utils.data.DataLoader(ds, batch_size=4, num_workers=num_workers):
            got += zip(batch["__key__"], batch["image"], batch["label"].tolist(), strict=True)
        assert collections.Counter(k for k, _, _ in got) == collections.Counter(list(files))
        assert all(image == files[key] and label == (key[:3] == "dog")
                   for key, image, label in got)


def test_key_collisions_are_refused_and_prefix_keys_rewrites_the_keys(
        tmp_path: Path, backend: str) -> None:
    make_tiny_tree(tmp_path / "tiny", num_files=30, seed=3, files_per_folder=10)
    a, b = pack(tmp_path / "tiny", tmp_path / "a", backend), pack(
        tmp_path / "tiny", tmp_path / "b", backend)
    with pytest.raises(PackError, match=r"30 key\(s\) are in more than one input: 'd00/d00/"
                                        r".*\(in .*a and .*b\).*--prefix-keys"):
        shardio.merge([a, b], tmp_path / "all")
    assert not (tmp_path / "all").exists()
    summary = shardio.merge([a, b], tmp_path / "all", prefix_keys=True)
    assert summary.rewritten == summary.shards == 2 * len(load_manifest(a).shards)
    report = shardio.verify(tmp_path / "all")
    assert report.ok and report.num_records == 60, report.faults
    with shardio.open_dataset(a) as reader:
        original = {s.pop("__key__"): s for s in reader}
    with shardio.open_dataset(tmp_path / "all") as reader:
        merged = {s.pop("__key__"): s for s in reader}
        assert set(reader.keys()) == set(merged)
    assert set(merged) == {f"{p}/{k}" for p in "ab" for k in original}
    for key, sample in merged.items():
        prefix, _, old = key.partition("/")
        first = original[old]["__index__"] + (0 if prefix == "a" else 30)
        assert sample == {**original[old], "__index__": first}  # every field's bytes kept
    assert load_manifest(tmp_path / "all").options["merge"]["prefix_keys"] is True


def test_prefixed_jpeg_records_keep_their_stored_bytes(two_packs: tuple, tmp_path: Path) -> None:
    a, b, files = two_packs
    result = CliRunner().invoke(main, ["merge", str(a), str(b), str(tmp_path / "all"),
                                       "--prefix-keys", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert (summary["samples"], summary["linked"]) == (16, 0)
    with shardio.open_dataset(tmp_path / "all") as reader:
        got = {s["__key__"]: s["image"] for s in reader}
    assert got == {f"{'a' if int(k[-7:-4]) < 10 else 'b'}/{k}": v for k, v in files.items()}


@pytest.mark.parametrize("backend", ["records"])
def test_merge_copies_when_it_cannot_link(two_packs: tuple, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, _ = two_packs
    shards = len(load_manifest(a).shards) + len(load_manifest(b).shards)
    copied = shardio.merge([a, b], tmp_path / "copied", link=False)
    assert (copied.copied, copied.linked) == (shards, 0)

    def cross_device(src: Any, dst: Any) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)  # as if OUT were on another filesystem
    fallback = shardio.merge([a, b], tmp_path / "fallback")
    assert (fallback.copied, fallback.linked) == (shards, 0)
    for out in (tmp_path / "copied", tmp_path / "fallback"):
        assert all(os.stat(out / s.name).st_nlink == 1 for s in load_manifest(out).shards)
        assert not any(n.startswith(".") for n in os.listdir(out))
        assert shardio.verify(out).ok


@pytest.mark.parametrize("backend", ["records"])
def test_merge_refuses_mismatched_inputs_and_a_used_output(
        two_packs: tuple, tmp_path: Path) -> None:
    a, b, _ = two_packs
    lmdb = pack(tmp_path / "src-b", tmp_path / "b-lmdb", "lmdb")
    with pytest.raises(PackError, match=r"differ in backend .*'records'.*'lmdb'"):
        shardio.merge([a, lmdb], tmp_path / "all")
    make_tree(tmp_path / "src-c", {"cat": [40], "cow": [41]})
    with pytest.raises(PackError, match=r"differ in classes.*'cow'.*same class list"):
        shardio.merge([a, pack(tmp_path / "src-c", tmp_path / "c")], tmp_path / "all")
    # the same classes packed as class folders: records {jpg, label}, not {image, label};
    # once merged into a dataset that verify and unpack called damaged
    folders = tmp_path / "b-folders"
    shardio.pack(tmp_path / "src-b", folders, num_workers=1, class_folders=True)
    with pytest.raises(PackError, match=r"differ in layout .*'imagefolder'.*'classfolders'"):
        shardio.merge([a, folders], tmp_path / "all")
    assert not (tmp_path / "all").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="absent or an empty folder"):
        shardio.merge([a, b], tmp_path / "used")
    with pytest.raises(PackError, match="share one"):
        shardio.merge([a, tmp_path / "src-b" / ".." / "a"], tmp_path / "all", prefix_keys=True)
    assert os.listdir(tmp_path / "used") == ["notes.txt"]
