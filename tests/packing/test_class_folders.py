"""pack(class_folders=True): generic samples labelled by their top-level folder (DatasetFolder).

A tree of class folders holding any files (audio, arrays, binary) packs with one field
per file, as a generic folder does, and a ``label``: the folder's index among the sorted
top-level folders, with ``classes`` and ``class_to_idx`` in the manifest. Checked end to
end: the labels of every sample through real DataLoaders, the class attributes, unpack
back to the same tree, append of a new class, and the inputs it refuses.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardio
from shardio.cli import main
from shardio.errors import BadInputError, PackError
from shardio.format.codecs import get_codec
from shardio.format.manifest import CLASS_FOLDERS, load_manifest
from shardio.format.record import encode_record
from shardio.packing.sources.files import scan_source

torch = pytest.importorskip("torch")

CLASSES = ("cat", "dog", "zebra")


def _tree(root: Path, classes: tuple[str, ...] = CLASSES, per_class: int = 7) -> dict[str, bytes]:
    """Class folders of ``.wav``-like files (and a nested folder), with a ``.txt`` beside some:
    ``{relative path: bytes}``."""
    rng = np.random.default_rng(3)
    files: dict[str, bytes] = {}
    for c in classes:
        for i in range(per_class):
            folder = f"{c}/take{i % 2}"
            files[f"{folder}/s{i}.wav"] = b"RIFF" + rng.bytes(int(rng.integers(50, 400)))
            if i % 3 == 0:
                files[f"{folder}/s{i}.txt"] = f"{c} {i}".encode()
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, bytes]]:
    root = tmp_path_factory.mktemp("classes") / "src"
    return root, _tree(root)


@pytest.fixture(scope="module")
def packed(tree: tuple[Path, dict[str, bytes]], tmp_path_factory: pytest.TempPathFactory
           ) -> Path:
    out = tmp_path_factory.mktemp("classes-pack") / "out"
    summary = shardio.pack(tree[0], out, class_folders=True, num_workers=2, progress=False,
                           options=shardio.WriteOptions(max_shard_samples=5))
    assert summary.class_folders and not summary.imagefolder and summary.samples == 21
    return out


def _label_of(key: str) -> int:
    return CLASSES.index(key.split("/", 1)[0])


def test_the_manifest_names_the_classes_and_the_fields(packed: Path) -> None:
    manifest = load_manifest(packed)
    assert manifest.classes == CLASSES and manifest.class_to_idx == {"cat": 0, "dog": 1,
                                                                     "zebra": 2}
    assert manifest.layout == CLASS_FOLDERS and not manifest.is_imagefolder
    assert set(manifest.fields) == {"wav", "txt", "label"}
    assert manifest.options["class_folders"] is True


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_sample_once_with_its_files_and_its_folder_label(
    packed: Path, tree: tuple[Path, dict[str, bytes]], num_workers: int
) -> None:
    files = tree[1]
    dataset = shardio.StreamingDataset(packed, seed=1)  # decode="auto": raw here
    seen = []
    for batch in shardio.loader(dataset, batch_size=4, num_workers=num_workers):
        assert batch.labels is not None
        for i, key in enumerate(batch.keys):
            assert int(batch.labels[i]) == _label_of(key)
            assert batch.bytes("wav")[i] == files[f"{key}.wav"]
            # a batch has the fields some sample of it has
            text = batch.bytes("txt")[i] if "txt" in batch.fields else None
            assert (text is None) == (f"{key}.txt" not in files)
            seen.append(key)
    assert sorted(seen) == sorted({rel.rsplit(".", 1)[0] for rel in files})


def test_fields_decode_the_files_and_the_label(packed: Path) -> None:
    dataset = shardio.StreamingDataset(packed, fields=("wav", "label"), shuffle=False)
    pairs = list(dataset)
    assert sorted(label for _, label in pairs) == [0] * 7 + [1] * 7 + [2] * 7
    assert all(isinstance(wav, bytes) and wav.startswith(b"RIFF") for wav, _ in pairs)


def test_the_class_attributes_are_torchvisions(packed: Path) -> None:
    indexed = shardio.IndexedDataset(packed)
    assert indexed.classes == list(CLASSES)
    assert indexed.class_to_idx == {"cat": 0, "dog": 1, "zebra": 2}
    assert indexed.targets == [_label_of(indexed[i]["__key__"]) for i in range(len(indexed))]


def test_unpack_gives_back_the_tree_without_label_files(
    packed: Path, tree: tuple[Path, dict[str, bytes]], tmp_path: Path
) -> None:
    shardio.unpack(packed, tmp_path / "back")
    got = {p.relative_to(tmp_path / "back").as_posix(): p.read_bytes()
           for p in (tmp_path / "back").rglob("*") if p.is_file()}
    assert got == tree[1]


def test_cat_prints_the_file_not_the_label(packed: Path, tree: tuple[Path, dict[str, bytes]]
                                           ) -> None:
    dataset = shardio.IndexedDataset(packed)
    key = next(dataset[i]["__key__"] for i in range(len(dataset))
               if f"{dataset[i]['__key__']}.txt" not in tree[1])
    result = CliRunner().invoke(main, ["cat", str(packed), key], catch_exceptions=False)
    assert result.exit_code == 0 and result.stdout_bytes == tree[1][f"{key}.wav"]


def test_loose_files_and_label_files_are_bad_input(tmp_path: Path) -> None:
    src = tmp_path / "src"
    _tree(src, per_class=2)
    (src / "readme.wav").write_bytes(b"top")
    (src / "dog" / "take0" / "s0.label").write_bytes(b"7")
    with pytest.raises(BadInputError, match=r"readme\.wav: a loose file at the top"):
        shardio.pack(src, tmp_path / "out", class_folders=True, progress=False)
    summary = shardio.pack(src, tmp_path / "out", class_folders=True, skip_bad=True,
                           progress=False)
    reasons = dict(summary.skipped)
    assert "loose file" in reasons["readme.wav"]
    assert "field is 'label'" in reasons["dog/take0/s0.label"]
    assert "left out with the rest of sample" in reasons["dog/take0/s0.wav"]
    assert summary.samples == 5


def test_class_folders_and_imagefolder_exclude_each_other(tree: tuple[Path, dict[str, bytes]],
                                                          tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pass one of the two"):
        shardio.pack(tree[0], tmp_path / "out", class_folders=True, imagefolder=True)
    result = CliRunner().invoke(main, ["pack", str(tree[0]), str(tmp_path / "out"),
                                       "--class-folders", "--imagefolder"])
    assert result.exit_code == 2 and "pass one of the two" in result.output


def test_the_cli_packs_class_folders_and_says_so(tree: tuple[Path, dict[str, bytes]],
                                                 tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["pack", str(tree[0]), str(tmp_path / "out"),
                                       "--class-folders", "--num-workers", "1", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["class_folders"] is True
    text = CliRunner().invoke(main, ["pack", str(tree[0]), str(tmp_path / "out2"),
                                     "--class-folders", "--num-workers", "1"]).output
    assert "(class folders)" in text


def test_append_reads_src_as_class_folders_and_adds_a_class(tmp_path: Path) -> None:
    src, more = tmp_path / "src", tmp_path / "more"
    _tree(src, classes=("a", "b"), per_class=3)
    _tree(more, classes=("b", "c"), per_class=3)
    for p in more.rglob("*"):  # keys new to the dataset
        if p.is_file():
            p.rename(p.with_name("new_" + p.name))
    out = tmp_path / "out"
    shardio.pack(src, out, class_folders=True, progress=False)
    summary = shardio.pack(more, out, append=True, progress=False)  # the dataset's layout
    assert summary.class_folders and summary.samples == 6
    manifest = load_manifest(out)
    assert manifest.classes == ("a", "b", "c") and manifest.layout == CLASS_FOLDERS
    labels = {s["__key__"]: s["label"] for s in shardio.IndexedDataset(out)}
    assert labels and all(("a", "b", "c").index(k.split("/")[0]) == v for k, v in labels.items())
    with pytest.raises(PackError, match="--class-folders"):
        shardio.pack(more, out, append=True, imagefolder=False, progress=False,
                     skip_existing=True)


def test_a_resume_never_mixes_class_folder_and_generic_packs(
        tree: tuple[Path, dict[str, bytes]]) -> None:
    # a resume continues only a pack of the same source digest and options
    generic = scan_source(tree[0], imagefolder=False)
    labelled = scan_source(tree[0], class_folders=True)
    assert generic.classes is None and labelled.classes == CLASSES
    assert generic.digest != labelled.digest
    assert [s.key for s in generic.samples] == [s.key for s in labelled.samples]
    assert [s.label for s in labelled.samples] == [_label_of(s.key) for s in labelled.samples]


def test_a_file_that_fails_to_read_is_named_with_its_extension(
        tree: tuple[Path, dict[str, bytes]], tmp_path: Path,
        unreadable: Callable[[str], None]) -> None:
    unreadable(str(tree[0] / "dog" / "take1" / "s3.wav"))
    summary = shardio.pack(tree[0], tmp_path / "out", class_folders=True, num_workers=1,
                           skip_bad=True, progress=False)
    assert dict(summary.skipped) == {
        "dog/take1/s3.wav": "cannot be read (Permission denied)",
        "dog/take1/s3.txt": "left out with the rest of sample 'dog/take1/s3' because "
                            "dog/take1/s3.wav is bad"}
    assert summary.samples == 20


def test_verify_passes_a_class_folder_pack_and_names_a_label_not_its_folder(
        packed: Path, tmp_path: Path) -> None:
    report = shardio.verify(packed)
    assert report.ok and report.num_records == 21, report.faults
    # a record whose label is another class than its folder: re-encode one record of a
    # copy with the wrong label, keeping every checksum valid, as a writer bug would
    # (the public ShardWriter writes ImageFolder records only when given classes)
    out = tmp_path / "wrong"
    manifest = load_manifest(packed)
    codec = get_codec("zstd")
    # format v2: frames written as given (a v3 writer takes samples)
    with shardio.ShardWriter(out, shardio.WriteOptions(version=2),
                             classes=list(CLASSES)) as writer:
        for sample in shardio.IndexedDataset(packed):
            sample = {k: v for k, v in sample.items() if k != "__index__"}
            if sample["__key__"] == "dog/take0/s0":
                sample["label"] = 2
            writer._write_encoded(sample["__key__"], encode_record(sample, codec),
                                  [k for k in sample if k != "__key__"])
    data = json.loads((out / "manifest.json").read_text())
    data["options"]["class_folders"] = manifest.options["class_folders"]
    (out / "manifest.json").write_text(json.dumps(data))
    faults = shardio.verify(out).faults
    assert [f.message for f in faults if "folder 'dog'" in f.message], faults
    assert len(faults) == 1


def test_merged_class_folder_packs_verify_and_unpack_without_losing_labels(
        tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    _tree(one / "src", per_class=2)
    _tree(two / "src", per_class=2)
    for root in (one, two):
        shardio.pack(root / "src", root / root.name, class_folders=True, progress=False)
    # the same keys in both: merged under prefixes, the keys leave their class folders
    summary = shardio.merge([one / "one", two / "two"], tmp_path / "merged",
                            prefix_keys=True)
    assert summary.samples == 12
    merged = load_manifest(tmp_path / "merged")
    assert merged.classes == CLASSES and "class_folders" not in merged.options
    assert shardio.verify(tmp_path / "merged").ok
    shardio.unpack(tmp_path / "merged", tmp_path / "back")
    labels = {p.relative_to(tmp_path / "back").as_posix(): json.loads(p.read_text())
              for p in (tmp_path / "back").rglob("*.label")}
    assert len(labels) == 12  # written as files: the folders no longer say them
    assert all(v == _label_of(k.split("/", 1)[1]) for k, v in labels.items())
