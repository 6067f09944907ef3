"""Header bombs and hostile field values (issue 28, items 3 and 9) on real packed datasets.

A valid 16x16 JPEG whose frame header is patched to claim 12,000 x 12,000 pixels is
about 630 bytes; libjpeg fills the missing data in, so every decoder used to allocate
(and touch) the 432 MB it claims. 144 million pixels lies between Pillow's warning
(``MAX_IMAGE_PIXELS``) and its own refusal (twice that), so the Pillow paths are bombs
too, not only simplejpeg's. Every decode path must refuse it from the header with a
``DecodeError`` naming the sample, and a process's peak memory must not grow by the
claim: that is measured in a fresh subprocess with ``getrusage`` (peak RSS of the
process and of its DataLoader workers), never with a timing.
"""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import textwrap
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from torch.utils.data import DataLoader

import shardio
from shardio.decode.image import max_image_pixels
from shardio.errors import DecodeError
from shardio.synth import make_photo
from shardio.torch.device_decode import jpeg_frame

pytestmark = pytest.mark.slow

SIDE = 12_000
"""The claimed width and height: over Pillow's limit, under twice it."""
CLAIM_BYTES = SIDE * SIDE * 3
BOMB = "bomb"


def bomb_jpeg(width: int = SIDE, height: int = SIDE) -> bytes:
    """A small valid JPEG whose SOF0 header claims ``width`` x ``height``."""
    out = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(out, "JPEG")
    data = bytearray(out.getvalue())
    at = data.index(b"\xff\xc0")
    data[at + 5 : at + 7] = struct.pack(">H", height)
    data[at + 7 : at + 9] = struct.pack(">H", width)
    return bytes(data)


def _good(seed: int) -> bytes:
    return make_photo(np.random.default_rng(seed), 40, 32)


@pytest.fixture(scope="module")
def folder_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageFolder pack (2 classes, 6 images) with one bomb, key ``b/bomb``."""
    src = tmp_path_factory.mktemp("bombs-src")
    for cls in ("a", "b"):
        (src / cls).mkdir()
        for i in range(3):
            (src / cls / f"{i}.jpg").write_bytes(_good(i + (10 if cls == "b" else 0)))
    (src / "b" / f"{BOMB}.jpg").write_bytes(bomb_jpeg())
    out = tmp_path_factory.mktemp("bombs") / "pack"
    shardio.pack(src, out, imagefolder=True, num_workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def fields_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generic pack of ``jpg``/``cls`` samples, one of them the bomb (key ``bomb``)."""
    src = tmp_path_factory.mktemp("fields-src")
    for i in range(5):
        (src / f"s{i}.jpg").write_bytes(_good(i))
        (src / f"s{i}.cls").write_text(str(i % 2))
    (src / f"{BOMB}.jpg").write_bytes(bomb_jpeg())
    (src / f"{BOMB}.cls").write_text("1")
    out = tmp_path_factory.mktemp("fields") / "pack"
    shardio.pack(src, out, num_workers=1, progress=False)
    return out


def _bomb_key(path: Path) -> str:
    keys = [s["__key__"] for s in shardio.StreamingDataset(path, decode="raw", shuffle=False)]
    (key,) = [k for k in keys if BOMB in k]
    return str(key)


def _assert_names_bomb(exc: BaseException, key: str) -> None:
    text = str(exc)
    assert repr(key) in text, text
    assert f"{SIDE}x{SIDE}" in text or f"{SIDE * SIDE:,}" in text, text
    assert "MAX_IMAGE_PIXELS" in text, text


def test_the_bomb_is_small_and_claims_more_than_the_limit() -> None:
    data = bomb_jpeg()
    limit = max_image_pixels()
    assert len(data) < 1000
    assert limit is not None and limit < SIDE * SIDE <= 2 * limit
    assert jpeg_frame(data) == (3, SIDE, SIDE)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("decode", ["tensor", "pil"])
def test_a_dataloader_over_a_bomb_raises_decode_error_naming_it(
    folder_pack: Path, decode: str, workers: int,
) -> None:
    key = _bomb_key(folder_pack)
    ds = shardio.StreamingDataset(folder_pack, decode=decode, shuffle=False)  # type: ignore[arg-type]
    loader = DataLoader(ds, batch_size=None, num_workers=workers)
    with pytest.raises(DecodeError) as caught:
        for _ in loader:
            pass
    _assert_names_bomb(caught.value, key)


@pytest.mark.parametrize("workers", [0, 2])
def test_field_decoders_and_their_shared_block_refuse_the_bomb_naming_key_and_field(
    fields_pack: Path, workers: int,
) -> None:
    ds = shardio.StreamingDataset(fields_pack, fields=("jpg", "cls"), decode="tensor",
                                  shuffle=False)
    loader = DataLoader(ds, batch_size=None, num_workers=workers)
    with pytest.raises(DecodeError) as caught:
        for _ in loader:
            pass
    _assert_names_bomb(caught.value, BOMB)
    assert "field 'jpg'" in str(caught.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_shardio_loader_batches_and_crops_refuse_the_bomb(folder_pack: Path, workers: int,
                                                          ) -> None:
    key = _bomb_key(folder_pack)
    for crop in (None, shardio.CenterCrop(16), shardio.RandomResizedCrop(16)):
        ds = shardio.StreamingDataset(folder_pack, decode="tensor", crop=crop, shuffle=False)
        with pytest.raises(DecodeError) as caught:
            for _ in shardio.loader(ds, 4, num_workers=workers, persistent_workers=False):
                pass
        _assert_names_bomb(caught.value, key)


def test_indexed_dataset_with_a_center_crop_refuses_the_bomb(folder_pack: Path) -> None:
    key = _bomb_key(folder_pack)
    ds = shardio.IndexedDataset(folder_pack, decode="tensor", crop=shardio.CenterCrop(16))
    with pytest.raises(DecodeError) as caught:
        for i in range(len(ds)):
            ds[i]
    _assert_names_bomb(caught.value, key)


def test_device_decoder_cpu_path_refuses_the_bomb(folder_pack: Path) -> None:
    key = _bomb_key(folder_pack)
    ds = shardio.StreamingDataset(folder_pack, decode="raw", shuffle=False)
    for crop in (None, shardio.CenterCrop(16)):
        decoder = shardio.DeviceDecoder("cpu", crop=crop)
        with pytest.raises(DecodeError) as caught:
            for batch in shardio.loader(ds, 8, num_workers=0):
                decoder(batch)
        _assert_names_bomb(caught.value, key)


def test_preview_draws_the_bomb_as_a_placeholder_naming_it(folder_pack: Path,
                                                           tmp_path: Path) -> None:
    from shardio.ops.preview import make_sheet

    key = _bomb_key(folder_pack)
    drawn = make_sheet(folder_pack, n=16)
    bad = [p for p in drawn.problems if repr(key) in p]
    assert len(bad) == 1 and "MAX_IMAGE_PIXELS" in bad[0], drawn.problems
    assert shardio.preview(folder_pack, tmp_path / "sheet.png", n=16).stat().st_size > 0


def test_the_limit_is_pillows_setting_and_none_lifts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shardio.decode.image import decode_array

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(DecodeError, match=r"'small'.*16x16"):
        decode_array(bomb_jpeg(16, 16), key="small")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert decode_array(bomb_jpeg(16, 16), key="small").shape == (16, 16, 3)


# ------------------------------------------------------------------ peak memory

_MEASURE = """
import resource, sys
from torch.utils.data import DataLoader
import shardio
from shardio.errors import DecodeError

path, mode, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
kwargs = {"fields": ("jpg", "cls")} if mode == "fields" else {}
if mode == "crop":
    kwargs = {"crop": shardio.CenterCrop(16)}
ds = shardio.StreamingDataset(path, decode="tensor", shuffle=False, **kwargs)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
it = iter(DataLoader(ds, batch_size=None, num_workers=workers))
raised = False
try:
    for _ in it:
        pass
except DecodeError:
    raised = True
del it  # shuts the workers down and waits for them: their peak joins RUSAGE_CHILDREN
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(raised, before * 1024, after * 1024, children * 1024)
"""


@pytest.mark.parametrize(("pack", "mode", "workers"), [
    ("folder_pack", "tensor", 0), ("folder_pack", "tensor", 2), ("folder_pack", "crop", 2),
    ("fields_pack", "fields", 0), ("fields_pack", "fields", 2),
])
def test_peak_memory_does_not_grow_by_the_claimed_pixels(
    pack: str, mode: str, workers: int, request: pytest.FixtureRequest,
) -> None:
    path = request.getfixturevalue(pack)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(_MEASURE), str(path), mode,
                           str(workers)], capture_output=True, text=True, check=True)
    raised, before, after, children = done.stdout.split()
    # a quarter of the claim: far above what opening a few small images costs, far
    # below the 432 MB (or the 1.8 GB of simplejpeg then Pillow) a decode allocates
    assert int(after) - int(before) < CLAIM_BYTES // 4
    if workers:
        # a forked worker starts with its parent's pages counted in its own peak
        assert int(children) - int(after) < CLAIM_BYTES // 4
    assert raised == "True", done.stderr


# ------------------------------------------------------------------ field values (item 9)


def _npy_claiming(shape: tuple[int, ...]) -> bytes:
    """A .npy file (format 1.0) whose header claims ``shape`` of float64, with 16 data bytes."""
    header = f"{{'descr': '<f8', 'fortran_order': False, 'shape': {shape!r}, }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return (b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode()
            + bytes(16))


def _hostile_pack(root: Path, key: str) -> Path:
    """A generic pack of ``npy``/``json`` samples: one good, and ``key`` hostile."""
    src = root / "src"
    src.mkdir()
    good = io.BytesIO()
    np.save(good, np.arange(4.0))
    for name in ("ok", key):
        (src / f"{name}.npy").write_bytes(good.getvalue())
        (src / f"{name}.json").write_text(json.dumps({"a": [1, 2]}))
    if key == "huge":
        (src / "huge.npy").write_bytes(_npy_claiming((10**12,)))
    else:
        (src / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    shardio.pack(src, root / "pack", num_workers=1, progress=False)
    return root / "pack"


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(("key", "field", "says"), [
    ("huge", "npy", "claims shape (1000000000000,)"),
    ("deep", "json", "nested deeper"),
])
def test_hostile_npy_and_json_are_decode_errors_naming_key_and_field(
    tmp_path: Path, key: str, field: str, says: str, workers: int,
) -> None:
    path = _hostile_pack(tmp_path, key)
    errors: list[BaseException] = []
    index = shardio.IndexedDataset(path, fields=("npy", "json"))
    for i in range(len(index)):
        try:
            index[i]
        except DecodeError as exc:
            errors.append(exc)
    assert len(errors) == 1
    ds = shardio.StreamingDataset(path, fields=("npy", "json"), shuffle=False)
    with pytest.raises(DecodeError) as caught:
        for _ in DataLoader(ds, batch_size=None, num_workers=workers):
            pass
    for exc in (errors[0], caught.value):
        assert f"sample {key!r}" in str(exc) and f"field {field!r}" in str(exc), exc
        assert says in str(exc), exc


# ------------------------------------------------------------------ on_bad_image (item 16)


@pytest.fixture(scope="module")
def two_bombs_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageFolder pack of 10 good images and 2 bombs (keys ``*bomb*``)."""
    src = tmp_path_factory.mktemp("two-bombs-src")
    for cls in ("a", "b"):
        (src / cls).mkdir()
        for i in range(5):
            (src / cls / f"{i}.jpg").write_bytes(_good(i + (10 if cls == "b" else 0)))
        (src / cls / f"{BOMB}.jpg").write_bytes(bomb_jpeg())
    out = tmp_path_factory.mktemp("two-bombs") / "pack"
    shardio.pack(src, out, imagefolder=True, num_workers=1, progress=False)
    return out


def test_on_bad_image_takes_raise_or_skip(two_bombs_pack: Path) -> None:
    with pytest.raises(ValueError, match="'raise' or 'skip'"):
        shardio.StreamingDataset(two_bombs_pack, on_bad_image="ignore")  # type: ignore[arg-type]
    ds = shardio.StreamingDataset(two_bombs_pack, decode="tensor")
    assert ds.on_bad_image == "raise" and ds.skipped_images.count == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_leaves_bad_images_out_counts_them_and_warns(two_bombs_pack: Path,
                                                          workers: int) -> None:
    from shardio.torch.badimage import BadImageWarning

    ds = shardio.StreamingDataset(two_bombs_pack, decode="tensor", on_bad_image="skip")
    with pytest.warns(BadImageWarning, match="skipped") if workers == 0 else nullcontext():
        got = list(DataLoader(ds, batch_size=None, num_workers=workers))
    assert len(got) == len(ds) - 2 == 10
    skipped = ds.skipped_images
    assert skipped.count == 2
    assert sorted(skipped.keys) == sorted(k for k in _keys(two_bombs_pack) if BOMB in k)
    got = list(DataLoader(ds, batch_size=None, num_workers=workers))  # counts only grow
    assert len(got) == 10 and ds.skipped_images.count == 4


@pytest.mark.parametrize("workers", [0, 2])
def test_shardio_loader_skips_in_its_batch_decoder_and_warns_once_an_epoch(
    two_bombs_pack: Path, workers: int,
) -> None:
    from shardio.torch.badimage import BadImageWarning

    for crop in (None, shardio.CenterCrop(16)):
        ds = shardio.StreamingDataset(two_bombs_pack, decode="tensor", crop=crop,
                                      on_bad_image="skip", shuffle=False)
        loader = shardio.loader(ds, 4, num_workers=workers)
        with pytest.warns(BadImageWarning) as caught:
            images = [len(labels) for _images, labels in loader]
        assert sum(images) == 10
        assert [str(w.message) for w in caught if "skipped 2 sample" in str(w.message)]
        assert len([w for w in caught if w.category is BadImageWarning]) == 1
        assert ds.skipped_images.count == 2


def test_a_batch_decoder_leaves_out_an_image_that_fails_after_its_header() -> None:
    from shardio.torch.badimage import SkippedImages
    from shardio.torch.collate import ImageBatchDecoder

    good = [make_photo(np.random.default_rng(i), 32, 24) for i in range(3)]
    cut = good[1][: len(good[1]) // 2]  # the header reads; the pixels do not
    samples = [{"__key__": f"k{i}", "__index__": i, "image": data, "label": i}
               for i, data in enumerate([good[0], cut, good[2]])]
    with pytest.raises(DecodeError, match="'k1'"):
        ImageBatchDecoder()(samples)
    skipped = SkippedImages()
    images, labels = ImageBatchDecoder(skipped=skipped)(samples)
    assert labels.tolist() == [0, 2] and tuple(images.shape) == (2, 3, 24, 32)
    assert skipped.read().count == 1 and skipped.read().keys == ("k1",)
    assert ImageBatchDecoder(skipped=skipped)(samples[1:2]) is None


def test_skip_with_fields_in_workers_counts_over_processes(fields_pack: Path) -> None:
    ds = shardio.StreamingDataset(fields_pack, fields=("jpg", "cls"), decode="tensor",
                                  on_bad_image="skip")
    got = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert len(got) == 5
    assert ds.skipped_images.count == 1 and ds.skipped_images.keys == (BOMB,)


def _keys(path: Path) -> list[str]:
    return [str(s["__key__"]) for s in shardio.StreamingDataset(path, decode="raw")]

