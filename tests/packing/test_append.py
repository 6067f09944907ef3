"""``shardio pack --append``: new shards after the old ones, one manifest swap, crash-safe."""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import shardio
from shardio.cli import main
from shardio.errors import BadInputError, PackError, StorageError
from shardio.format.manifest import MANIFEST_NAME, load_manifest
from shardio.packing.append import STAGING_NAME
from shardio.packing.journal import LOCK_NAME
from shardio.packing.writer import WriteOptions
from shardio.synth import make_photo


def make_tree(root: Path, classes: dict[str, range], seed: int = 0) -> dict[str, bytes]:
    """An ImageFolder ``root/<class>/img_<n>.jpg`` of tiny JPEGs; returns key -> file bytes."""
    rng = np.random.default_rng(seed)
    files = {}
    for name, numbers in classes.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for n in numbers:
            data = make_photo(rng, 16, 12)
            (root / name / f"img_{n:03d}.jpg").write_bytes(data)
            files[f"{name}/img_{n:03d}.jpg"] = data
    return files


@pytest.fixture
def grown(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes], dict[str, bytes]]:
    """A dataset of 16 images in 2 classes (4 shards), and a tree of 7 more: 3 new images of
    class_00 and a new class class_02 that sorts after the old ones."""
    old = make_tree(tmp_path / "old", {"class_00": range(8), "class_01": range(8, 16)}, seed=1)
    new = make_tree(tmp_path / "new", {"class_00": range(20, 23), "class_02": range(30, 34)},
                    seed=2)
    out = tmp_path / "ds"
    shardio.pack(tmp_path / "old", out, num_workers=1, options=WriteOptions(max_shard_samples=4))
    return tmp_path / "new", out, old, new


def streamed(out: Path, num_workers: int) -> list[tuple[str, bytes, int]]:
    """Every sample a DataLoader delivers from ``out``: key, image bytes, label."""
    ds = shardio.StreamingDataset(out, decode="raw", shuffle_buffer=8)
    got = []
    for batch in torch.utils.data.DataLoader(ds, batch_size=5, num_workers=num_workers):
        got += zip(batch["__key__"], batch["image"], batch["label"].tolist(), strict=True)
    return got


def test_append_adds_shards_and_classes_and_streams_every_sample_once(grown: tuple) -> None:
    src, out, old, new = grown
    old_shards = {n: os.stat(out / n).st_ino for n in os.listdir(out) if n != MANIFEST_NAME}
    summary = shardio.pack(src, out, append=True, num_workers=1,
                           options=WriteOptions(max_shard_samples=3))
    assert (summary.samples, summary.existing_samples, summary.shards) == (7, 16, 3)
    manifest = load_manifest(out)
    assert [s.name for s in manifest.shards] == [f"shard-{n:05d}.rec" for n in range(7)]
    assert manifest.classes == ("class_00", "class_01", "class_02")
    assert manifest.class_to_idx == {"class_00": 0, "class_01": 1, "class_02": 2}
    assert {n: os.stat(out / n).st_ino for n in old_shards} == old_shards  # old files untouched
    assert sorted(os.listdir(out)) == sorted([MANIFEST_NAME, *(s.name for s in manifest.shards)])
    report = shardio.verify(out)
    assert report.ok and report.num_records == 23, report.faults
    files = {**old, **new}
    for num_workers in (0, 2):
        got = streamed(out, num_workers)
        assert collections.Counter(k for k, _, _ in got) == collections.Counter(list(files))
        for key, image, label in got:
            assert image == files[key]
            assert label == manifest.class_to_idx[key.split("/")[0]]


KILLER = textwrap.dedent("""
    import os, signal, sys
    import shardio, shardio.packing.append
    from shardio.backends.records import RecordsShardWriter
    from shardio.packing.writer import WriteOptions

    src, out, where = sys.argv[1:]
    append = RecordsShardWriter.add

    def append_then_die(self, sample):
        append(self, sample)
        self.appended = getattr(self, "appended", 0) + 1
        if self.appended == 2 and self.path.name.startswith(".shard-00001"):
            os.kill(os.getpid(), signal.SIGKILL)  # the second new shard, half written

    def die(*args):
        os.kill(os.getpid(), signal.SIGKILL)  # every new shard renamed in, no manifest yet

    if where == "shard":
        RecordsShardWriter.add = append_then_die
    else:
        shardio.packing.append.write_manifest = die
    shardio.pack(src, out, append=True, num_workers=1, options=WriteOptions(max_shard_samples=3))
""")


@pytest.mark.parametrize("where", ["shard", "manifest"])
def test_append_killed_midway_leaves_the_old_dataset_and_a_retry_succeeds(
        grown: tuple, where: str) -> None:
    src, out, old, new = grown
    before = (out / MANIFEST_NAME).read_bytes()
    killed = subprocess.run([sys.executable, "-c", KILLER, str(src), str(out), where],
                            capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    assert (out / MANIFEST_NAME).read_bytes() == before
    report = shardio.verify(out)
    assert report.ok and report.num_records == 16, report.faults
    with shardio.open_dataset(out) as reader:
        assert sorted(reader.keys()) == sorted(old)
        assert reader.get(0)["image"] == old[reader.get(0)["__key__"]]
    leftovers = set(os.listdir(out)) - {MANIFEST_NAME, *(s.name for s in load_manifest(out).shards)}
    assert LOCK_NAME in leftovers  # unlocked: a killed writer's flock died with it
    if where == "shard":  # the staging folder holds the first new shard and the journal
        assert leftovers == {STAGING_NAME, LOCK_NAME}
        with pytest.raises(PackError, match=r"interrupted append.*--append instead of --resume"):
            shardio.pack(src, out, resume=True)
        shutil.copytree(out, out.with_name("copy"))
        assert shardio.pack(src, out.with_name("copy"), overwrite=True).samples == 7
        assert STAGING_NAME not in os.listdir(out.with_name("copy"))
        retry = shardio.pack(src, out, append=True, num_workers=1,
                             options=WriteOptions(max_shard_samples=3))
        assert retry.resumed_samples == 3 and retry.samples == 7
        expected = {**old, **new}
    else:  # new shards renamed in but named by no manifest; retried with other input
        assert {"shard-00004.rec", "shard-00005.rec", "shard-00006.rec"} <= leftovers
        shutil.rmtree(src / "class_00")
        retry = shardio.pack(src, out, append=True, num_workers=1,
                             options=WriteOptions(max_shard_samples=3))
        assert retry.samples == 4 and retry.resumed_samples == 0
        expected = {**old, **{k: v for k, v in new.items() if k.startswith("class_02")}}
    manifest = load_manifest(out)
    assert sorted(os.listdir(out)) == sorted([MANIFEST_NAME, *(s.name for s in manifest.shards)])
    report = shardio.verify(out)
    assert report.ok and report.num_records == len(expected), report.faults
    with shardio.open_dataset(out) as reader:
        assert {s["__key__"]: s["image"] for s in reader} == expected


def test_existing_keys_are_refused_or_skipped_and_counted(grown: tuple, tmp_path: Path) -> None:
    out = grown[1]
    before = (out / MANIFEST_NAME).read_bytes()
    with pytest.raises(PackError, match=r"16 sample key\(s\).*'class_0.*and 11 more.*"
                                        r"--skip-existing"):
        shardio.pack(tmp_path / "old", out, append=True)
    assert (out / MANIFEST_NAME).read_bytes() == before and STAGING_NAME not in os.listdir(out)
    nothing_new = shardio.pack(tmp_path / "old", out, append=True, skip_existing=True)
    assert (nothing_new.samples, nothing_new.existing_skipped) == (0, 16)
    assert (out / MANIFEST_NAME).read_bytes() == before
    extra = make_tree(tmp_path / "old", {"class_01": [99]}, seed=3)
    result = CliRunner().invoke(main, ["pack", str(tmp_path / "old"), str(out), "--append",
                                       "--skip-existing", "--json", "--num-workers", "1"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert (summary["samples"], summary["existing_samples"], summary["existing_skipped"]) == (
        1, 16, 16)
    with shardio.open_dataset(out) as reader:
        assert reader.get(16) == {"__key__": "class_01/img_099.jpg", "__index__": 16,
                                  "image": extra["class_01/img_099.jpg"], "label": 1}
    result = CliRunner().invoke(main, ["pack", str(tmp_path / "old"), str(out),
                                       "--skip-existing"])
    assert result.exit_code == 2 and "--skip-existing goes with --append" in result.output


def test_new_classes_must_sort_after_the_old_ones(grown: tuple, tmp_path: Path) -> None:
    _, out, _, _ = grown
    before = (out / MANIFEST_NAME).read_bytes()
    make_tree(tmp_path / "early", {"aaa": [1], "class_01": [50]})
    with pytest.raises(PackError, match=r"'aaa' sort before the existing class 'class_01'.*"
                                        r"change the label of 'class_00', 'class_01'"):
        shardio.pack(tmp_path / "early", out, append=True)
    generic = tmp_path / "generic"
    generic.mkdir()
    (generic / "x.bin").write_bytes(b"payload")
    with pytest.raises(BadInputError, match="outside every class folder"):
        shardio.pack(generic, out, append=True)  # SRC is read as the dataset was: ImageFolder
    with pytest.raises(PackError, match=r"ImageFolder pack.*--imagefolder"):
        shardio.pack(generic, out, append=True, imagefolder=False)
    assert (out / MANIFEST_NAME).read_bytes() == before and STAGING_NAME not in os.listdir(out)


def test_backend_and_codec_must_match(tmp_path: Path) -> None:
    files = make_tree(tmp_path / "a", {"cat": range(5)})
    make_tree(tmp_path / "b", {"cat": range(5, 9)}, seed=4)
    out = tmp_path / "ds"
    shardio.pack(tmp_path / "a", out, options=WriteOptions(backend="lmdb"), num_workers=1)
    with pytest.raises(PackError, match=r"backend 'lmdb'.*--backend lmdb"):
        shardio.pack(tmp_path / "b", out, append=True, options=WriteOptions())
    summary = shardio.pack(tmp_path / "b", out, append=True, num_workers=1)  # the dataset's
    assert summary.samples == 4 and load_manifest(out).shards[-1].name == "shard-00001.mdb"
    assert shardio.verify(out).ok
    with shardio.open_dataset(out) as reader:
        assert len(reader) == 9 and reader.get(0)["image"] == files[reader.get(0)["__key__"]]
    make_tree(tmp_path / "c", {"cat": range(9, 14)}, seed=5)
    result = CliRunner().invoke(main, ["pack", str(tmp_path / "c"), str(out), "--append",
                                       "--max-shard-samples", "2", "--num-workers", "1"])
    assert result.exit_code == 0, result.output  # backend and codec: the dataset's
    assert [(s.name, s.num_samples) for s in load_manifest(out).shards[-3:]] == [
        ("shard-00002.mdb", 2), ("shard-00003.mdb", 2), ("shard-00004.mdb", 1)]
    with pytest.raises(StorageError, match="appending to a dataset at a URL is not supported"):
        shardio.pack(tmp_path / "b", "memory://bucket/ds", append=True)
    assert shardio.pack(tmp_path / "b", tmp_path / "fresh", append=True).samples == 4
