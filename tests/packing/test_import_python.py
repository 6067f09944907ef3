"""Packing Python objects (``packing.sources.objects``): datasets, map-style datasets, iterables."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from shardio.errors import BadInputError
from shardio.packing.pack import pack
from shardio.packing.writer import WriteOptions
from shardio.reading.reader import open_dataset

SMALL = WriteOptions(max_shard_samples=5)


def _jpeg(seed: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (seed % 256, 40, 90)).save(out, format="JPEG", quality=70)
    return out.getvalue()


def _read(out: Path) -> tuple[dict[str, dict[str, Any]], tuple[str, ...] | None]:
    with open_dataset(out) as reader:
        return ({s["__key__"]: {k: v for k, v in s.items() if k not in ("__key__", "__index__")}
                 for s in reader}, reader.manifest.classes)


def _files(out: Path) -> dict[str, bytes]:
    return {n: (out / n).read_bytes() for n in sorted(os.listdir(out))}


class Pairs:
    """A torchvision-style map-style dataset: ``(image, label)`` and ``classes``, no files."""

    classes = ("cat", "dog", "emu")

    def __init__(self, images: list[Any]) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.images[index], index % 3


class Records:
    """A map-style dataset of dicts; index ``broken`` raises."""

    def __init__(self, count: int, broken: int | None = None) -> None:
        self.count, self.broken = count, broken

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index == self.broken:
            raise ValueError(f"record {index} is corrupt")
        return {"jpg": _jpeg(index), "txt": f"caption {index}", "meta": {"i": index},
                "arr": np.arange(index + 1, dtype=np.int16), "label": np.int64(index % 4)}


def test_map_style_dicts_every_sample_once_same_bytes_for_any_worker_count(
        tmp_path: Path) -> None:
    dataset = Records(23)
    one = pack(dataset, tmp_path / "one", num_workers=1, options=SMALL)
    three = pack(dataset, tmp_path / "three", num_workers=3, options=SMALL)
    samples, classes = _read(tmp_path / "three")
    assert one.samples == three.samples == 23 and classes is None and not one.notes
    assert _files(tmp_path / "one") == _files(tmp_path / "three")
    for i in range(23):
        sample = samples[f"{i:09d}"]
        assert sample["jpg"] == _jpeg(i) and sample["txt"] == f"caption {i}".encode()
        assert sample["meta"] == b'{"i": 0}'.replace(b"0", str(i).encode())
        assert np.array_equal(np.load(io.BytesIO(sample["arr"])), np.arange(i + 1))
        assert sample["label"] == i % 4


def test_pil_pairs_keep_their_file_bytes_and_classes(tmp_path: Path) -> None:
    for i in range(6):
        (tmp_path / f"{i}.jpg").write_bytes(_jpeg(i))
    opened = [Image.open(tmp_path / f"{i}.jpg") for i in range(6)]
    summary = pack(Pairs(opened), tmp_path / "out", num_workers=2)
    samples, classes = _read(tmp_path / "out")
    assert classes == ("cat", "dog", "emu") and not summary.notes
    assert {k: (s["image"], s["label"]) for k, s in samples.items()} == {
        f"{i:09d}": (_jpeg(i), i % 3) for i in range(6)}


def test_pil_images_without_a_file_become_png_and_the_summary_says_so(tmp_path: Path) -> None:
    made = [Image.new("RGB", (5, 3), (i, 2 * i, 3)) for i in range(4)]
    summary = pack(Pairs(made), tmp_path / "out", num_workers=1)
    samples, _ = _read(tmp_path / "out")
    assert summary.notes and "4 PIL image(s)" in summary.notes[0] and "PNG" in summary.notes[0]
    assert json.loads(json.dumps(summary.to_json()))["notes"] == list(summary.notes)
    for i in range(4):
        image = Image.open(io.BytesIO(samples[f"{i:09d}"]["image"]))
        assert image.format == "PNG" and image.tobytes() == made[i].tobytes()


def test_a_dataset_naming_its_files_packs_the_files(tmp_path: Path) -> None:
    for cls in ("a", "b"):
        (tmp_path / "src" / cls).mkdir(parents=True)
        for i in range(3):
            (tmp_path / "src" / cls / f"{i}.jpg").write_bytes(_jpeg(i + 10 * (cls == "b")))

    class Folder:  # torchvision's ImageFolder shape; items would be transformed tensors
        root = str(tmp_path / "src")
        classes = ("a", "b")
        samples = tuple((str(tmp_path / "src" / c / f"{i}.jpg"), n)
                        for n, c in enumerate(classes) for i in range(3))

        def __len__(self) -> int:
            return len(self.samples)

        def __getitem__(self, index: int) -> Any:
            raise AssertionError("the files are packed, not the items")

    pack(Folder(), tmp_path / "out", num_workers=1)
    samples, classes = _read(tmp_path / "out")
    assert classes == ("a", "b")
    assert samples["b/2.jpg"] == {"image": _jpeg(12), "label": 1}
    assert len(samples) == 6


def test_a_raising_index_is_reported_by_index_not_a_crash(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match=r"Records/\[7\]: dataset\[7\] raised ValueError: "
                                            r"record 7 is corrupt"):
        pack(Records(12, broken=7), tmp_path / "out", num_workers=2)
    assert not (tmp_path / "out" / "manifest.json").exists()
    summary = pack(Records(12, broken=7), tmp_path / "out", num_workers=2, skip_bad=True,
                   overwrite=True)
    assert summary.samples == 11 and [p for p, _ in summary.skipped] == ["[7]"]
    assert "000000007" not in _read(tmp_path / "out")[0]


def test_an_iterable_of_dicts_with_keys(tmp_path: Path) -> None:
    rows = ({"__key__": f"k{i}", "__url__": "ignored", "bin": bytes([i]) * i} for i in range(1, 9))
    pack(rows, tmp_path / "out", num_workers=1)
    assert _read(tmp_path / "out")[0] == {f"k{i}": {"bin": bytes([i]) * i} for i in range(1, 9)}

    def broken() -> Any:
        yield {"bin": b"x"}
        raise OSError("the stream broke")

    with pytest.raises(BadInputError, match=r"raised OSError after 1 samples"):
        pack(broken(), tmp_path / "o2", num_workers=1)
    with pytest.raises(BadInputError, match="key 'a' is given twice"):
        pack([{"__key__": "a", "x": b"1"}, {"__key__": "a", "x": b"2"}], tmp_path / "o3")


def test_hf_dataset_object_keeps_image_bytes_and_classlabel(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["x", "y"])})
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": _jpeg(i), "path": None} for i in range(8)],
         "text": [f"t{i}" for i in range(8)], "label": [i % 2 for i in range(8)]},
        features=features)
    subset = ds.select([6, 1, 3])  # an indices mapping: rows in the selection's order
    summary = pack(subset, tmp_path / "out", num_workers=2)
    samples, classes = _read(tmp_path / "out")
    assert summary.samples == 3 and classes == ("x", "y") and not summary.notes
    assert samples["000000000"] == {"image": _jpeg(6), "text": b"t6", "label": 0}
    assert samples["000000002"] == {"image": _jpeg(3), "text": b"t3", "label": 1}


def test_torch_dataset_of_tensors(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    class Tensors(torch.utils.data.Dataset):  # type: ignore[misc, name-defined]
        def __len__(self) -> int:
            return 9

        def __getitem__(self, index: int) -> tuple[Any, Any]:
            return torch.full((2, 3), float(index)), torch.tensor(index % 2)

    pack(Tensors(), tmp_path / "out", num_workers=2)
    samples, _ = _read(tmp_path / "out")
    assert len(samples) == 9
    assert np.array_equal(np.load(io.BytesIO(samples["000000004"]["npy"])), np.full((2, 3), 4.0))
    assert samples["000000004"]["label"] == 0
