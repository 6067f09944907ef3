"""Packing MosaicML Streaming (MDS) datasets (``shardio.packing.sources.mds``).

The fixtures in ``tests/data/mds`` were written by streaming's own ``MDSWriter``
(``tests/data/mds/make.py`` says how: streaming imports torchvision, which does not
import beside this venv's torch); ``expected.json`` is what streaming reads back.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shardio.cli import main
from shardio.errors import BadInputError
from shardio.packing.pack import pack
from shardio.packing.writer import WriteOptions
from shardio.reading.reader import open_dataset

DATA = Path(__file__).parents[1] / "data" / "mds"
EXPECTED: list[dict[str, Any]] = json.loads((DATA / "expected.json").read_text())


def _read(out: Path) -> dict[str, dict[str, Any]]:
    with open_dataset(out) as reader:
        return {s["__key__"]: {k: v for k, v in s.items() if k not in ("__key__", "__index__")}
                for s in reader}


def _files(out: Path) -> dict[str, bytes]:
    return {n: (out / n).read_bytes() for n in sorted(os.listdir(out))}


def _copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(DATA / name, tmp_path / name))


def _edit_index(folder: Path, shard: int, **changes: Any) -> None:
    index = json.loads((folder / "index.json").read_text())
    for key, value in changes.items():
        where, _, inner = key.partition("__")
        if inner:
            index["shards"][shard][where][inner] = value
        else:
            index["shards"][shard][where] = value
    (folder / "index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("name", ["plain", "zstd"])
def test_every_sample_once_with_mds_bytes_and_values(tmp_path: Path, name: str) -> None:
    summary = pack(DATA / name, tmp_path / "out", num_workers=3,
                   options=WriteOptions(max_shard_samples=5))
    samples = _read(tmp_path / "out")
    assert summary.samples == len(EXPECTED) == len(samples) and not summary.skipped
    for i, want in enumerate(EXPECTED):
        got = samples[f"{i:09d}"]
        assert hashlib.sha256(got["image"]).hexdigest() == want["image_sha256"]
        assert got["blob"] == bytes.fromhex(want["blob"])
        assert got["caption"] == want["caption"].encode()
        assert got["label"] == str(want["label"]).encode()  # an int column: its value as text
    pack(DATA / name, tmp_path / "one", num_workers=1, options=WriteOptions(max_shard_samples=5))
    assert _files(tmp_path / "out") == _files(tmp_path / "one")


def test_compressed_and_plain_pack_to_the_same_bytes_and_cli_labels(tmp_path: Path) -> None:
    runner = CliRunner()
    for name in ("plain", "zstd"):
        result = runner.invoke(main, ["pack", str(DATA / name), str(tmp_path / name), "--from",
                                      "mds", "--label-field", "label", "--key-column",
                                      "caption", "--num-workers", "2", "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["samples"] == len(EXPECTED)
    assert _files(tmp_path / "plain") == _files(tmp_path / "zstd")
    samples = _read(tmp_path / "zstd")
    assert {k: s["label"] for k, s in samples.items()} == {
        e["caption"]: e["label"] for e in EXPECTED}
    assert set(samples["sample 3 é"]) == {"image", "blob", "label"}


@pytest.mark.parametrize(("name", "change", "says"), [
    ("plain", {"raw_data__bytes": 1700}, "the index says 1,700 bytes, the file holds"),
    ("plain", {"samples": 3}, "the index says 3 samples, the shard holds 2"),
    ("zstd", {"zip_data__bytes": 10}, "the index says 10 bytes, the file holds"),
    ("zstd", {"raw_data__bytes": 99}, "the index says 99 bytes decompressed, it decompresses"),
    ("plain", {"column_encodings": ["bytes", "str", "jpeg", "str_int"]}, "the index lists "
     "columns"),
    ("plain", {"raw_data__basename": "../plain/shard.00002.mds"}, "outside the dataset folder"),
])
def test_an_index_that_lies_is_refused_by_name(tmp_path: Path, name: str,
                                               change: dict[str, Any], says: str) -> None:
    folder = _copy(name, tmp_path)
    if "column_encodings" in change:  # every shard, so that the columns agree among shards
        for shard in range(6):
            _edit_index(folder, shard, **change)
    else:
        _edit_index(folder, 2, **change)
    with pytest.raises(BadInputError, match=says) as info:
        pack(folder, tmp_path / "out", num_workers=2, skip_bad=True)
    assert "index.json" in str(info.value) or "outside" in str(info.value)
    assert not (tmp_path / "out").exists() or not os.listdir(tmp_path / "out")
    assert sorted(os.listdir(tmp_path)) == [name, "out"] or sorted(os.listdir(tmp_path)) == [name]


def test_cut_shard_unknown_encoding_and_version_are_refused(tmp_path: Path) -> None:
    folder = _copy("plain", tmp_path)
    shard = folder / "shard.00001.mds"
    shard.write_bytes(shard.read_bytes()[:-40])
    with pytest.raises(BadInputError, match=r"shard 1 \(shard\.00001\.mds\): the index says"):
        pack(folder, tmp_path / "o1", num_workers=1)
    folder = _copy("zstd", tmp_path / "b")
    _edit_index(folder, 0, column_encodings=["pkl", "str", "jpeg", "int"])
    with pytest.raises(BadInputError, match="column 'blob' has MDS encoding 'pkl'"):
        pack(folder, tmp_path / "o2", num_workers=1)
    index = json.loads((folder / "index.json").read_text())
    (folder / "index.json").write_text(json.dumps({**index, "version": 1}))
    with pytest.raises(BadInputError, match="MDS index version 1"):
        pack(folder, tmp_path / "o3", num_workers=1)


def test_a_damaged_sample_is_bad_input_by_name(tmp_path: Path) -> None:
    folder = _copy("plain", tmp_path)
    shard = folder / "shard.00001.mds"
    data = bytearray(shard.read_bytes())
    first = struct.unpack_from("<I", data, 4)[0]  # the first sample's offset
    struct.pack_into("<I", data, first, struct.unpack_from("<I", data, first)[0] + 5)
    shard.write_bytes(bytes(data))
    with pytest.raises(BadInputError, match=r"shard\.00001\.mds#0: its column sizes do not add"):
        pack(folder, tmp_path / "out", num_workers=2)
    summary = pack(folder, tmp_path / "out", num_workers=2, skip_bad=True, overwrite=True)
    assert summary.samples == len(EXPECTED) - 1
    assert [p for p, _ in summary.skipped] == ["shard.00001.mds#0"]
    assert "000000002" not in _read(tmp_path / "out")


def test_a_folder_with_another_index_json_is_a_folder(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "index.json").write_text('{"files": 1}')
    (tmp_path / "src" / "a.txt").write_text("x")
    pack(tmp_path / "src", tmp_path / "out", num_workers=1)
    assert set(_read(tmp_path / "out")) == {"a", "index"}
    with pytest.raises(BadInputError, match="not an MDS dataset"):
        pack(tmp_path / "src", tmp_path / "o2", source_format="mds")


def test_resume_after_sigkill_is_identical(tmp_path: Path) -> None:
    from test_pack import _kill_midway

    _kill_midway(DATA / "zstd", tmp_path / "out", "records", label_field="label")
    options = WriteOptions(max_shard_samples=5)
    resumed = pack(DATA / "zstd", tmp_path / "out", options=options, label_field="label",
                   resume=True, num_workers=1)
    assert resumed.resumed_samples == 5 and resumed.samples == len(EXPECTED)
    pack(DATA / "zstd", tmp_path / "whole", options=options, label_field="label", num_workers=1)
    assert _files(tmp_path / "out") == _files(tmp_path / "whole")
