"""Packing Parquet files and ``datasets.save_to_disk`` folders (``packing.sources.tables``)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from shardio.errors import BadInputError
from shardio.packing.pack import pack
from shardio.reading.reader import open_dataset

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _png(seed: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), (seed, 0, 0)).save(out, format="PNG")
    return out.getvalue()


def _read(out: Path) -> tuple[dict[str, dict[str, Any]], tuple[str, ...] | None]:
    with open_dataset(out) as reader:
        return ({s["__key__"]: {k: v for k, v in s.items() if k != "__index__"} for s in reader},
                reader.manifest.classes)


def test_parquet_columns_become_fields_keyed_by_position(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    for part in range(2):
        rows = range(part * 5, part * 5 + 5)
        pq.write_table(pa.table({"png": [_png(i) for i in rows], "caption": [f"c{i}" for i in rows],
                                 "score": [i / 2 for i in rows]}),
                       tmp_path / "src" / f"part-{part}.parquet", row_group_size=2)
    summary = pack(tmp_path / "src", tmp_path / "out", num_workers=2)
    samples, classes = _read(tmp_path / "out")
    assert summary.samples == 10 and classes is None
    assert samples["000000007"] == {"__key__": "000000007", "png": _png(7), "caption": b"c7",
                                    "score": b"3.5"}


def test_parquet_key_column_and_refusals(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": ["a", "b"], "txt": [b"1", None]}), tmp_path / "t.parquet")
    with pytest.raises(BadInputError, match=r"t\.parquet#row1: column 'txt' is null"):
        pack(tmp_path / "t.parquet", tmp_path / "out", key_column="id", num_workers=1)
    summary = pack(tmp_path / "t.parquet", tmp_path / "out", key_column="id", skip_bad=True,
                   num_workers=1, overwrite=True)
    assert summary.samples == 1 and _read(tmp_path / "out")[0]["a"]["txt"] == b"1"
    (tmp_path / "two").mkdir()
    pq.write_table(pa.table({"x": [b"1"]}), tmp_path / "two" / "a.parquet")
    pq.write_table(pa.table({"y": [b"1"]}), tmp_path / "two" / "b.parquet")
    with pytest.raises(BadInputError, match=r"differ from those of a\.parquet"):
        pack(tmp_path / "two", tmp_path / "o2", num_workers=1)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(BadInputError, match="not a Parquet or Arrow table"):
        pack(tmp_path / "junk", tmp_path / "o3", num_workers=1)
    assert sorted(os.listdir(tmp_path)) == ["junk", "out", "t.parquet", "two"]  # no o2, o3


def test_hf_image_and_classlabel_from_save_to_disk_and_parquet(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"image": datasets.Image(),
                                  "label": datasets.ClassLabel(names=["cat", "dog", "emu"]),
                                  "text": datasets.Value("string")})
    images = [_png(i) for i in range(9)]
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in images], "label": [i % 3 for i in range(9)],
         "text": [f"t{i}" for i in range(9)]}, features=features)
    ds.save_to_disk(str(tmp_path / "saved"))
    ds.to_parquet(str(tmp_path / "hf.parquet"))
    for src, out in ((tmp_path / "saved", tmp_path / "a"),
                     (tmp_path / "hf.parquet", tmp_path / "b")):
        pack(src, out, num_workers=1)
        samples, classes = _read(out)
        assert classes == ("cat", "dog", "emu")
        assert len(samples) == 9
        for i in range(9):
            sample = samples[f"{i:09d}"]
            assert sample["image"] == images[i] and sample["label"] == i % 3
            assert sample["text"] == f"t{i}".encode()
    assert sorted(os.listdir(tmp_path / "a")) == sorted(os.listdir(tmp_path / "b"))


def test_hf_pack_exports_every_column_to_webdataset(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    wds = pytest.importorskip("webdataset")
    from shardio.ops.unpack import unpack_webdataset

    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["a", "b"])})
    ds = datasets.Dataset.from_dict({"image": [{"bytes": _png(i), "path": None} for i in range(4)],
                                     "text": ["x", "y", "z", "w"], "label": [0, 1, 1, 0]},
                                    features=features)
    ds.save_to_disk(str(tmp_path / "saved"))
    pack(tmp_path / "saved", tmp_path / "a", num_workers=1)
    unpack_webdataset(tmp_path / "a", tmp_path / "tars")
    read = {s["__key__"]: s for s in wds.WebDataset(str(tmp_path / "tars/shard-000000.tar"),
                                                   shardshuffle=False)}
    assert read["000000002"]["text"] == b"z" and read["000000002"]["label"] == b"1"
    assert read["000000002"]["image"] == _png(2)


def test_row_groups_spilled_in_parallel_give_the_same_samples_for_any_worker_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardio.packing.sources import tables as tablesource
    from shardio.packing.sources.inputbytes import read_range

    monkeypatch.setattr(tablesource, "TASK_ROWS", 3)  # many tasks: runs of 3 row groups of 1
    (tmp_path / "src").mkdir()
    for part in range(3):
        rows = range(part * 7, part * 7 + 7)
        pq.write_table(pa.table({"bin": pa.array([bytes([i]) * i for i in rows], pa.large_binary()),
                                 "txt": [None if i == 9 else f"t{i}" for i in rows],
                                 "n": list(rows)}),
                       tmp_path / "src" / f"p{part}.parquet", row_group_size=1)
    files = sorted(str(p) for p in (tmp_path / "src").iterdir())
    got = []
    for workers in (1, 3):
        (tmp_path / f"spill{workers}").mkdir()
        source = tablesource.scan_tables(files, spill_dir=str(tmp_path / f"spill{workers}"),
                                         num_workers=workers)
        got.append(([(s.key, s.fields, [read_range(p) for p in s.paths]) for s in source.samples],
                    source.bad, source.digest))
    assert got[0] == got[1]
    samples, bad, _ = got[0]
    assert [s[0] for s in samples] == [f"{i:09d}" for i in range(21) if i != 9]
    assert samples[10] == ("000000011", ("bin", "txt", "n"), [bytes([11]) * 11, b"t11", b"11"])
    assert bad == (("p1.parquet#row9", "column 'txt' is null; every field of a sample needs "
                    "a value"),)
    assert len(os.listdir(tmp_path / "spill3")) == 9  # 3 files of 7 row groups, 3 a task
