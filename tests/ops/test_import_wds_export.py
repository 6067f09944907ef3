"""``shardio unpack --format webdataset``: tars that the real ``webdataset`` reads back."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from PIL import Image

from shardio.cli import main
from shardio.errors import OutputExistsError, ShardCorruptError, UnsafeKeyError
from shardio.ops.unpack import unpack_webdataset
from shardio.packing.pack import pack
from shardio.packing.writer import ShardWriter, WriteOptions
from shardio.reading.reader import open_dataset

wds = pytest.importorskip("webdataset")


def _read(out: Path) -> dict[str, dict[str, Any]]:
    with open_dataset(out) as reader:
        return {s["__key__"]: {k: v for k, v in s.items() if k != "__index__"} for s in reader}


def _wds(folder: Path) -> list[dict[str, Any]]:
    urls = sorted(str(p) for p in folder.glob("shard-*.tar"))
    return [{k: v for k, v in s.items() if k not in ("__url__", "__local_path__")}
            for s in wds.WebDataset(urls, shardshuffle=False)]


def _generic_tree(root: Path) -> None:
    for i in range(25):
        folder = root / f"part{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"item{i:03d}.txt").write_bytes(f"text {i}".encode() * (i + 1))
        (folder / f"item{i:03d}.json").write_bytes(b'{"i": %d}' % i)


def test_round_trip_shardio_webdataset_shardio_is_identical(tmp_path: Path) -> None:
    _generic_tree(tmp_path / "src")
    pack(tmp_path / "src", tmp_path / "a", num_workers=1)
    summary = unpack_webdataset(tmp_path / "a", tmp_path / "tars", max_shard_bytes=2000)
    assert summary.num_samples == 25 and summary.num_files == 50
    assert len(list((tmp_path / "tars").glob("shard-*.tar"))) > 1
    original = _read(tmp_path / "a")
    with open_dataset(tmp_path / "a") as reader:
        order = list(reader.keys())
    read_back = _wds(tmp_path / "tars")
    assert [s["__key__"] for s in read_back] == order  # sample for sample, in dataset order
    assert {s["__key__"]: s for s in read_back} == original
    pack(tmp_path / "tars", tmp_path / "b", num_workers=1)
    assert _read(tmp_path / "b") == original


def test_imagefolder_becomes_image_and_cls(imagefolder: Path, tmp_path: Path) -> None:
    pack(imagefolder, tmp_path / "a", num_workers=1)
    unpack_webdataset(tmp_path / "a", tmp_path / "tars")
    original = _read(tmp_path / "a")
    read_back = {s["__key__"]: s for s in _wds(tmp_path / "tars")}
    assert len(read_back) == len(original)
    for key, sample in original.items():
        stem, _, ext = key.partition(".")
        assert read_back[stem][ext.lower()] == sample["image"]
        assert int(read_back[stem]["cls"]) == sample["label"]
    pack(tmp_path / "tars", tmp_path / "b", label_field="cls", num_workers=1)
    again = _read(tmp_path / "b")
    for key, sample in original.items():
        stem, _, ext = key.partition(".")
        assert again[stem]["label"] == sample["label"]
        assert again[stem][ext.lower()] == sample["image"]


def test_unsafe_keys_and_existing_output_are_refused(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "bad", WriteOptions()) as writer:
        writer.write({"__key__": "../up", "txt": b"x"})
    with pytest.raises(ShardCorruptError, match=r"'\.\.' component"):
        unpack_webdataset(tmp_path / "bad", tmp_path / "tars")
    assert not list((tmp_path / "tars").glob("*.tar")) and not (tmp_path / "up.txt").exists()
    with ShardWriter(tmp_path / "dotted", WriteOptions()) as writer:
        writer.write({"__key__": "a.b", "txt": b"x"})
    with pytest.raises(UnsafeKeyError, match="WebDataset would split"):
        unpack_webdataset(tmp_path / "dotted", tmp_path / "t2")
    _generic_tree(tmp_path / "src")
    pack(tmp_path / "src", tmp_path / "ok", num_workers=1)
    unpack_webdataset(tmp_path / "ok", tmp_path / "t3")
    with pytest.raises(OutputExistsError):
        unpack_webdataset(tmp_path / "ok", tmp_path / "t3")
    unpack_webdataset(tmp_path / "ok", tmp_path / "t3", overwrite=True)


def test_cli_format_webdataset(tmp_path: Path) -> None:
    _generic_tree(tmp_path / "src")
    pack(tmp_path / "src", tmp_path / "a", num_workers=1)
    result = CliRunner().invoke(main, ["unpack", str(tmp_path / "a"), str(tmp_path / "tars"),
                                       "--format", "webdataset", "--shard-bytes", "4KB"])
    assert result.exit_code == 0, result.output
    assert len(_wds(tmp_path / "tars")) == 25


def test_tars_are_deterministic(tmp_path: Path) -> None:
    image = io.BytesIO()
    Image.new("RGB", (4, 4)).save(image, format="PNG")
    with ShardWriter(tmp_path / "ds", WriteOptions()) as writer:
        writer.write({"__key__": "k", "png": image.getvalue(), "label": 3})
    unpack_webdataset(tmp_path / "ds", tmp_path / "t1")
    unpack_webdataset(tmp_path / "ds", tmp_path / "t2")
    assert (tmp_path / "t1/shard-000000.tar").read_bytes() == (
        tmp_path / "t2/shard-000000.tar").read_bytes()
    assert _wds(tmp_path / "t1")[0]["label"] == b"3"


def test_tars_packed_with_named_labels_export_their_labels(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    with wds.TarWriter(str(tmp_path / "src" / "a.tar")) as sink:
        for i, name in enumerate(["moth", "ant", "moth"]):
            sink.write({"__key__": f"k{i}", "txt": b"x" * (i + 1), "cls": name.encode()})
    pack(tmp_path / "src", tmp_path / "a", label_field="cls", num_workers=1)
    unpack_webdataset(tmp_path / "a", tmp_path / "tars")
    labels = {s["__key__"]: int(s["label"]) for s in _wds(tmp_path / "tars")}
    assert labels == {"k0": 1, "k1": 0, "k2": 1}  # indices into the classes ant, moth
