"""fields=: a WebDataset-style pack decoded by field name, through real DataLoaders and loader."""

from __future__ import annotations

import collections
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

import shardio
from shardio import ShardWriter, WriteOptions
from shardio.decode.fields import Fields, field_kind, is_image_field
from shardio.errors import DecodeError
from shardio.synth import make_photo
from shardio.torch.collate import collate_fields
from shardio.torch.dataset import StreamingDataset
from shardio.torch.indexed import IndexedDataset

NUM = 24
WIDTH, HEIGHT = 40, 30


def _key(i: int) -> str:
    return f"part{i % 2}/s{i:03d}"


@pytest.fixture(scope="module")
def web_pack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """``x.jpg + x.cls + x.json`` (+ ``x.seg.png``, ``x.npy``, ``x.txt`` on some), packed
    generically; returns the pack and, per key, the files' bytes."""
    root = tmp_path_factory.mktemp("web")
    src = root / "src"
    rng = np.random.default_rng(5)
    files: dict[str, dict[str, bytes]] = {}
    for i in range(NUM):
        key = _key(i)
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        mask = Image.fromarray((np.arange(WIDTH * HEIGHT).reshape(HEIGHT, WIDTH) * i % 256)
                               .astype(np.uint8))
        seg, arr = io.BytesIO(), io.BytesIO()
        mask.save(seg, "PNG")
        np.save(arr, np.arange(i + 1, dtype=np.float32).reshape(1, -1))
        fields = {"jpg": make_photo(rng, WIDTH, HEIGHT), "cls": f"{i % 5}\n".encode(),
                  "json": json.dumps({"key": key, "i": i, "tags": ["a", str(i)]}).encode(),
                  "seg.png": seg.getvalue(), "npy": arr.getvalue()}
        if i % 3:  # a third of the samples have no caption
            fields["txt"] = f"caption {i} ünïcode".encode()
        for name, data in fields.items():
            (src / f"{key}.{name}").write_bytes(data)
        files[key] = fields
    out = root / "out"
    shardio.pack(src, out, options=WriteOptions(max_shard_samples=7), num_workers=1)
    return out, files


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _check_pil(sample: Any, files: dict[str, Any]) -> str:
    image, label, meta = sample
    assert isinstance(image, Image.Image) and image.mode == "RGB"
    assert type(label) is int and isinstance(meta, dict)
    key = meta["key"]
    assert np.array_equal(np.asarray(image), _pixels(files[key]["jpg"]))
    assert label == int(files[key]["cls"]) and meta == json.loads(files[key]["json"])
    return str(key)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_streaming_yields_pil_int_dict_exactly_once(
    web_pack: tuple[Path, dict[str, Any]], num_workers: int
) -> None:
    out, files = web_pack
    ds = StreamingDataset(out, decode="pil", fields=("jpg", "cls", "json"), shuffle_buffer=8)
    keys = [_check_pil(s, files) for s in DataLoader(ds, batch_size=None,
                                                      num_workers=num_workers)]
    assert sorted(keys) == sorted(files)  # every sample, exactly once


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_collates_tensor_tuples(
    web_pack: tuple[Path, dict[str, Any]], num_workers: int
) -> None:
    out, files = web_pack
    ds = StreamingDataset(out, decode="tensor", fields=("jpg", "cls", "json", "npy"))
    seen = []
    for images, labels, metas, arrays in shardio.loader(ds, batch_size=5,
                                                         num_workers=num_workers):
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, HEIGHT, WIDTH)
        assert labels.dtype == torch.int64 and len(labels) == len(images) == len(metas)
        assert isinstance(metas, list) and isinstance(arrays, list)  # dicts, ragged arrays
        for image, label, meta, array in zip(images, labels.tolist(), metas, arrays, strict=True):
            key = meta["key"]
            assert np.array_equal(image.permute(1, 2, 0).numpy(), _pixels(files[key]["jpg"]))
            assert label == int(files[key]["cls"])
            assert np.array_equal(array, np.arange(meta["i"] + 1, dtype=np.float32)[None])
            seen.append(key)
    assert sorted(seen) == sorted(files)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_indexed_dataset_decodes_fields(
    web_pack: tuple[Path, dict[str, Any]], num_workers: int
) -> None:
    out, files = web_pack
    pil = IndexedDataset(out, fields=("jpg", "cls", "json"))  # decode "auto" is PIL here
    assert _check_pil(pil[-1], files) == _check_pil(pil[len(pil) - 1], files)
    ds = IndexedDataset(out, decode="tensor", fields=("jpg", "cls", "json"))
    got = []
    for images, labels, metas in DataLoader(ds, batch_size=4, num_workers=num_workers,
                                            collate_fn=collate_fields):
        assert images.shape == (len(metas), 3, HEIGHT, WIDTH)
        assert labels.tolist() == [int(files[m["key"]]["cls"]) for m in metas]
        got += [m["key"] for m in metas]
    assert got == [_check_pil(pil[i], files) for i in range(len(pil))]  # in index order
    raw = IndexedDataset(out, decode="raw", fields=("cls", "json"))
    assert raw.__getitems__([1, 0]) == [raw[1], raw[0]]  # tuples of fields, not the dicts
    assert all(type(s) is tuple and len(s) == 2 for s in raw.__getitems__([1, 0]))


def test_raw_mode_keeps_image_bytes_and_decodes_the_rest(
    web_pack: tuple[Path, dict[str, Any]],
) -> None:
    out, files = web_pack
    for jpg, label, seg, text, meta in StreamingDataset(
        out, decode="raw", fields=Fields(("jpg", "cls", "seg.png", "txt", "json"),
                                         missing="none")):
        key = meta["key"]
        assert jpg == files[key]["jpg"] and seg == files[key]["seg.png"]
        assert label == int(files[key]["cls"])
        assert text == (files[key]["txt"].decode() if "txt" in files[key] else None)


def test_dotted_names_decode_by_last_extension_and_decoders_override(
    web_pack: tuple[Path, dict[str, Any]],
) -> None:
    out, files = web_pack
    ds = IndexedDataset(out, fields=("seg.png", "json"))
    seg, meta = ds[0]
    assert isinstance(seg, Image.Image) and seg.mode == "RGB" and seg.size == (WIDTH, HEIGHT)

    def mask(data: bytes) -> np.ndarray:
        return np.asarray(Image.open(io.BytesIO(data)))

    spec = Fields(("seg.png", "cls", "json"), decoders={"seg.png": mask, "cls": bytes})
    seg, label, meta = IndexedDataset(out, fields=spec)[0]
    assert seg.shape == (HEIGHT, WIDTH) and np.array_equal(
        seg, np.asarray(Image.open(io.BytesIO(files[meta["key"]]["seg.png"]))))
    assert label == files[meta["key"]]["cls"]  # kept raw by decoders={"cls": bytes}


def test_transforms_per_field_then_transform_on_the_tuple(
    web_pack: tuple[Path, dict[str, Any]],
) -> None:
    out, files = web_pack
    spec = Fields(("cls", "json"), transforms=(lambda c: c * 10, None))
    ds = StreamingDataset(out, fields=spec, transform=lambda t: (t[1]["key"], t[0]))
    got = dict(DataLoader(ds, batch_size=None, num_workers=2))
    assert got == {key: int(f["cls"]) * 10 for key, f in files.items()}


def test_missing_field_is_an_error_naming_key_and_field_or_none(
    web_pack: tuple[Path, dict[str, Any]],
) -> None:
    out, files = web_pack
    ds = IndexedDataset(out, fields=("json", "txt"))
    with shardio.open_dataset(out) as reader:
        index = next(i for i in range(len(reader)) if "txt" not in reader.get(i))
        key = reader.get(index)["__key__"]
    assert "txt" not in files[key]
    with pytest.raises(DecodeError, match=rf"sample '{key}' \(index {index}\) field 'txt' "
                                          r"is missing.*missing='none'") as info:
        ds[index]
    assert info.value.key == key
    with pytest.raises(DecodeError, match="field 'txt' is missing"):  # from a worker too
        list(DataLoader(StreamingDataset(out, fields=("txt",)), batch_size=None, num_workers=2))
    lenient = IndexedDataset(out, fields=Fields(("json", "txt"), missing="none"))
    assert lenient[index] == (json.loads(files[key]["json"]), None)


def test_undecodable_values_name_key_and_field(tmp_path: Path) -> None:
    out = tmp_path / "bad"
    with ShardWriter(out) as writer:
        writer.write({"__key__": "k/1", "jpg": b"not an image", "cls": b"cat\n",
                      "json": b"{oops", "txt": b"\xff\xfe", "npy": _object_npy(),
                      "index": True})
    cases = {"jpg": "image", "cls": "int", "json": "json", "txt": "text", "npy": "npy",
             "index": "int"}
    for name, kind in cases.items():
        ds = IndexedDataset(out, fields=(name,))
        with pytest.raises(DecodeError, match=rf"sample 'k/1' \(index 0\) field '{name}' does "
                                              rf"not decode as {kind} .*decoders=\{{'{name}'"):
            ds[0]

    def broken(data: bytes) -> Any:
        raise KeyError("no such thing")

    ds = IndexedDataset(out, fields=Fields(("cls",), decoders={"cls": broken}))
    with pytest.raises(KeyError) as info:  # the user's error, its type kept, with a note
        ds[0]
    assert "sample 'k/1' (index 0) field 'cls' failed in decoders['cls']" in "".join(
        getattr(info.value, "__notes__", []))


def _object_npy() -> bytes:
    out = io.BytesIO()
    np.save(out, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return out.getvalue()


def test_values_stored_by_shardwriter_decode_as_stored(tmp_path: Path) -> None:
    out = tmp_path / "native"
    with ShardWriter(out) as writer:
        writer.write({"__key__": "a", "cls": 7, "json": {"x": [1, 2]}, "txt": "hé",
                      "npy": np.eye(2, dtype=np.int16), "bin": b"\x00\x01", "n": 3})
    cls, meta, text, array, data, n = IndexedDataset(
        out, fields=("cls", "json", "txt", "npy", "bin", "n"))[0]
    assert (cls, meta, text, data, n) == (7, {"x": [1, 2]}, "hé", b"\x00\x01", 3)
    assert array.dtype == np.int16 and np.array_equal(array, np.eye(2))


def test_imagefolder_pack_keeps_its_pairs_and_takes_fields(imagefolder: Path,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "if"
    shardio.pack(imagefolder, out, num_workers=1)
    pairs = IndexedDataset(out)
    named = IndexedDataset(out, fields=("image", "label"))
    for i in (0, len(pairs) - 1):
        (a, la), (b, lb) = pairs[i], named[i]
        assert np.array_equal(np.asarray(a), np.asarray(b)) and la == lb and type(lb) is int
    with pytest.raises(ValueError, match=r"target_transform .* transforms="):
        IndexedDataset(out, fields=("image", "label"), target_transform=int)


def test_bad_arguments_are_refused_early(web_pack: tuple[Path, dict[str, Any]]) -> None:
    out, _ = web_pack
    with pytest.raises(ValueError, match=r"no field 'jpeg' in this dataset; its samples have "
                                         r"fields \[.*'jpg'"):
        StreamingDataset(out, fields=("jpeg", "cls"))
    with pytest.raises(ValueError, match=r"name the fields to decode, e\.g\. fields="):
        StreamingDataset(out, decode="pil")
    with pytest.raises(TypeError, match="tuple of field names"):
        Fields("jpg")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"decoders for \['png'\], which are not among"):
        Fields(("jpg",), decoders={"png": bytes})
    with pytest.raises(ValueError, match="transforms has 1 entries for 2 fields"):
        Fields(("jpg", "cls"), transforms=(None,))
    with pytest.raises(ValueError, match="missing must be"):
        Fields(("jpg",), missing="skip")  # type: ignore[arg-type]


def test_field_kinds_by_last_extension() -> None:
    kinds = {"jpg": "image", "x.JPEG": "image", "seg.png": "image", "image": "image",
             "tiff": "image", "cls": "int", "label": "int", "a.index": "int", "txt": "text",
             "text": "text", "json": "json", "meta.json": "json", "npy": "npy",
             "gif": "bytes", "bin": "bytes", "png.txt": "text"}
    assert {name: field_kind(name) for name in kinds} == kinds
    assert is_image_field("x.webp") and not is_image_field("images")


def test_collate_fields_by_position() -> None:
    small, big = torch.zeros(3, 2, 2, dtype=torch.uint8), torch.ones(3, 4, 2, dtype=torch.uint8)
    image = Image.new("RGB", (2, 2))
    stacked, labels, ragged, others = collate_fields(
        [(small, 1, small, image), (small + 1, 2, big, None)])
    assert stacked.shape == (2, 3, 2, 2) and stacked[1].eq(1).all()
    assert labels.tolist() == [1, 2] and labels.dtype == torch.int64
    assert [r.shape for r in ragged] == [small.shape, big.shape] and ragged[1].eq(1).all()
    assert others == [image, None]
    assert collate_fields([{"a": 1}, {"a": 2}])["a"].tolist() == [1, 2]  # not tuples
    assert collate_fields([image, image]) == [image, image]
    counts = collections.Counter(type(x).__name__ for x in collate_fields([(1.5,), (2.5,)])[0])
    assert counts == {"float": 2}


@pytest.mark.parametrize("indexed", [False, True])
def test_tensor_fields_in_workers_share_a_block_and_keep_their_values(
    web_pack: tuple[Path, dict[str, Any]], indexed: bool
) -> None:
    out, files = web_pack
    spec = Fields(("jpg", "seg.png", "cls", "json", "txt"), missing="none")
    ds: Any = (IndexedDataset(out, decode="tensor", fields=spec) if indexed else
               StreamingDataset(out, decode="tensor", fields=spec, batch_size=6))
    seen = []
    for batch in DataLoader(ds, batch_size=6, num_workers=2, collate_fn=list):
        images = [t for sample in batch for t in sample[:2]]
        # a worker decodes a group's (a batch's) image fields into one shared block
        assert len({t.untyped_storage().data_ptr() for t in images}) <= 2 < len(images)
        for jpg, seg, label, meta, txt in batch:
            key = meta["key"]
            assert np.array_equal(jpg.permute(1, 2, 0).numpy(), _pixels(files[key]["jpg"]))
            assert np.array_equal(seg.permute(1, 2, 0).numpy(), _pixels(files[key]["seg.png"]))
            assert label == int(files[key]["cls"]) and meta == json.loads(files[key]["json"])
            assert txt == (files[key]["txt"].decode() if "txt" in files[key] else None)
            seen.append(key)
    assert sorted(seen) == sorted(files)


def test_a_bad_image_field_in_a_worker_fails_at_its_sample_naming_the_field(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(2)
    out = tmp_path / "out"
    with ShardWriter(out) as writer:  # pack itself refuses a JPEG cut short
        for i in range(6):
            photo = make_photo(rng, WIDTH, HEIGHT)
            writer.write({"__key__": f"s{i}", "jpg": photo if i != 3 else photo[:-300],
                          "cls": f"{i}".encode()})
    ds = StreamingDataset(out, decode="tensor", fields=("jpg", "cls"), shuffle=False)
    got = []
    with pytest.raises(Exception, match=r"'s3'.*field 'jpg'"):
        for batch in DataLoader(ds, batch_size=1, num_workers=1, collate_fn=list):
            got.append(batch[0][1])
    assert got == [0, 1, 2]  # every sample before it, none after


def test_a_group_without_image_values_decodes_none_of_them() -> None:
    from shardio.decode.fields import FieldDecoder

    def refuse(values: list[Any], samples: list[Any]) -> list[Any]:
        raise AssertionError(f"asked to decode {samples}")

    decoder = FieldDecoder(Fields(("jpg", "cls"), missing="none"), mode="tensor",
                           image=bytes, path="p", images=refuse)
    samples = [{"__key__": "a", "cls": b"1"}, {"__key__": "b", "cls": b"2"}]
    parts = decoder.decode_group(samples)
    assert [decoder.complete(s, p) for s, p in zip(samples, parts, strict=True)] == [
        (None, 1), (None, 2)]
