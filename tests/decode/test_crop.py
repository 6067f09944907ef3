"""crop=: fixed-size crops chosen from the header, decoded at the least JPEG scale covering them."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from shardio.decode.crop import CenterCrop, Cropper, RandomResizedCrop
from shardio.errors import DecodeError
from shardio.synth import make_photo

torch = pytest.importorskip("torch")

import shardio  # noqa: E402  (after the torch skip)


def _photo(width: int, height: int, seed: int = 0) -> bytes:
    return make_photo(np.random.default_rng(seed), width, height)


def _decode(cropper: Cropper, data: bytes, index: int = 0) -> np.ndarray:
    pending = cropper.open(data, index)
    out = np.empty(pending.shape, np.uint8)
    pending.decode_into(out)
    return out


def _reference(data: bytes, box: Any, size: tuple[int, int], flip: bool) -> np.ndarray:
    """A full-size decode, then the box resized: torchvision's way on a PIL image."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    resized = image.resize((size[1], size[0]), Image.Resampling.BILINEAR, box=box)
    if flip:
        resized = resized.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(resized)


# ---------------------------------------------------------------- boxes


@settings(max_examples=300, deadline=None)
@given(height=st.integers(1, 3000), width=st.integers(1, 3000), seed=st.integers(0, 2**32),
       low=st.floats(0.01, 1.0), spread=st.floats(0.0, 1.0))
def test_random_boxes_lie_inside_the_image_with_the_allowed_area_or_fall_back(
    height: int, width: int, seed: int, low: float, spread: float
) -> None:
    crop = RandomResizedCrop(224, scale=(low, low + (1 - low) * spread))
    (left, top, right, bottom), _ = crop.box(height, width, np.random.default_rng(seed))
    assert 0 <= left < right <= width and 0 <= top < bottom <= height
    w, h = right - left, bottom - top
    # a try: w and h are an allowed area and ratio's sides, each rounded to a whole pixel
    area_lo, area_hi = (w - 0.5) * (h - 0.5), (w + 0.5) * (h + 0.5)
    ratio_lo, ratio_hi = (w - 0.5) / (h + 0.5), (w + 0.5) / max(h - 0.5, 1e-9)
    tried_area = (area_lo <= crop.scale[1] * width * height * (1 + 1e-9)
                  and area_hi >= crop.scale[0] * width * height * (1 - 1e-9)
                  and ratio_lo <= crop.ratio[1] and ratio_hi >= crop.ratio[0])
    # the fallback: the whole image, or its centre at the nearest allowed ratio
    fallback = (w == width or h == height) and left == (width - w) // 2 and top == (
        height - h) // 2
    assert tried_area or fallback


def test_boxes_depend_on_seed_epoch_and_index_only() -> None:
    def boxes(seed: int, epoch: int) -> list[Any]:
        cropper = Cropper(RandomResizedCrop(32), seed)
        cropper.epoch = epoch
        data = _photo(80, 60)
        return [(p.box, p.flip) for p in (cropper.open(data, i) for i in range(20))]

    assert boxes(1, 0) == boxes(1, 0)
    assert boxes(1, 0) != boxes(1, 1) and boxes(1, 0) != boxes(2, 0)
    assert len(set(boxes(1, 0))) == 20  # every sample its own box
    flips = [flip for _, flip in boxes(3, 0) + boxes(4, 0) + boxes(5, 0)]
    assert 10 <= sum(flips) <= 50, "about half mirrored"


def test_center_crop_is_the_centred_square_of_its_ratio() -> None:
    (left, top, right, bottom), flip = CenterCrop(224, ratio=0.5).box(300, 400, None)
    assert (left, top, right, bottom) == (125, 75, 275, 225) and not flip
    assert CenterCrop(8, ratio=1.0).box(5, 8, None)[0] == (2, 0, 7, 5), "whole pixels"


@pytest.mark.parametrize("bad", [
    {"size": 0}, {"size": (3,)}, {"size": (4, -1)}, {"size": 224, "scale": (0.5, 0.2)},
    {"size": 224, "scale": (0.0, 1.0)}, {"size": 224, "ratio": (2.0, 1.0)},
])
def test_bad_random_crops_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RandomResizedCrop(**bad)


def test_bad_center_crops_and_crop_types_are_refused() -> None:
    with pytest.raises(ValueError):
        CenterCrop(224, ratio=0)
    with pytest.raises(TypeError, match=r"RandomResizedCrop or shardio\.CenterCrop"):
        Cropper("224", 0)  # type: ignore[arg-type]


# ---------------------------------------------------------------- pixels


@pytest.mark.parametrize("crop", [RandomResizedCrop((24, 32)), CenterCrop(40, ratio=1.0)])
def test_a_crop_that_needs_full_scale_equals_the_full_decode_resized(crop: Any) -> None:
    data = _photo(60, 45)  # every box of this image is too small for a reduced decode
    cropper = Cropper(crop, seed=5)
    for index in range(8):
        pending = cropper.open(data, index)
        got = _decode(cropper, data, index)
        assert got.shape == (*crop.output, 3)
        assert np.array_equal(got, _reference(data, pending.box, crop.output, pending.flip))


def test_a_reduced_scale_decode_stays_close_to_the_full_decode() -> None:
    data = _photo(1600, 1200, seed=3)
    cropper = Cropper(RandomResizedCrop(64, scale=(0.5, 1.0)), seed=2)
    image = Image.open(io.BytesIO(data))
    for index in range(6):
        pending = cropper.open(data, index)
        got = _decode(cropper, data, index).astype(np.int16)
        want = _reference(data, pending.box, (64, 64), pending.flip).astype(np.int16)
        assert np.abs(got - want).mean() < 6  # libjpeg's DCT scaling, then the same resize
    image.draft("RGB", (1600 // 8, 1200 // 8))
    assert image.size == (200, 150), "boxes of half the area or more decode at 1/8 here"


def test_a_flipped_crop_is_the_mirror_of_the_same_box() -> None:
    data = _photo(50, 40)
    cropper = Cropper(RandomResizedCrop(16, flip=True), seed=0)
    index = next(i for i in range(50) if cropper.open(data, i).flip)
    unflipped = Cropper(RandomResizedCrop(16, flip=False), seed=0)
    assert unflipped.open(data, index).box == cropper.open(data, index).box
    assert np.array_equal(_decode(cropper, data, index), _decode(unflipped, data, index)[:, ::-1])


@pytest.mark.parametrize("fmt,mode", [("PNG", "RGB"), ("JPEG", "L"), ("PNG", "RGBA")])
def test_other_formats_and_modes_crop_to_rgb(fmt: str, mode: str) -> None:
    buf = io.BytesIO()
    Image.new(mode, (30, 20), color=(100,) * len(mode)).save(buf, fmt)
    got = _decode(Cropper(CenterCrop(8), 0), buf.getvalue())
    assert got.shape == (8, 8, 3) and got.dtype == np.uint8


def test_damaged_bytes_raise_a_decode_error_naming_the_sample() -> None:
    data = bytearray(_photo(40, 30))
    with pytest.raises(DecodeError, match="k/7"):
        Cropper(CenterCrop(8), 0).open(b"not an image", 0, key="k/7")
    data[200:] = b"\x00" * (len(data) - 200)
    # some Pillow versions refuse the cut file on opening, others only on decoding it
    with pytest.raises(DecodeError, match="k/8"):
        pending = Cropper(CenterCrop(8), 0).open(bytes(data[:300]), 0, key="k/8")
        pending.decode_into(np.empty(pending.shape, np.uint8))


# ---------------------------------------------------------------- the dataset's resize


def _fast(cropper: Cropper) -> Cropper:
    from shardio.torch.resize import resize_box

    return Cropper(cropper.crop, cropper.seed, resize=resize_box)


@pytest.mark.parametrize("crop", [RandomResizedCrop((24, 32)), CenterCrop(40, ratio=0.9)])
def test_the_dataset_resize_gives_pillows_pixels_within_a_level(crop: Any) -> None:
    pytest.importorskip("simplejpeg")
    data = _photo(60, 45)
    plain = Cropper(crop, seed=5)
    for index in range(8):
        want = _decode(plain, data, index).astype(np.int16)
        got = _decode(_fast(plain), data, index).astype(np.int16)
        assert np.abs(got - want).mean() < 1 and np.abs(got - want).max() <= 8


@settings(max_examples=60, deadline=None)
@given(width=st.integers(1, 80), height=st.integers(1, 80), out=st.integers(1, 40),
       seed=st.integers(0, 2**16), center=st.booleans())
def test_the_fast_path_crops_any_image_size_to_the_output(
    width: int, height: int, out: int, seed: int, center: bool,
) -> None:
    pytest.importorskip("simplejpeg")
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(
        0, 256, (height, width, 3), np.uint8)).save(buf, "JPEG")
    crop: Any = CenterCrop(out) if center else RandomResizedCrop(out, scale=(0.01, 1.0))
    fast = _fast(Cropper(crop, seed))
    pending = fast.open(buf.getvalue(), seed)
    left, top, right, bottom = pending.box
    assert 0 <= left < right <= width and 0 <= top < bottom <= height
    got = np.empty(pending.shape, np.uint8)
    pending.decode_into(got)
    assert got.shape == (out, out, 3)
    if pending.denom == 1:  # a full-scale decode: the box cut, then resized by Pillow
        # (torchvision's way; resize(box=) would also blend in pixels outside a small box)
        cut = Image.open(buf).convert("RGB").crop(tuple(int(v) for v in pending.box))
        want = np.asarray(cut.resize((out, out), Image.Resampling.BILINEAR))
        if pending.flip:
            want = want[:, ::-1]
        assert np.abs(got.astype(np.int16) - want).mean() < 2


class _Recording:
    """simplejpeg, with the shape of every array it decodes recorded."""

    def __init__(self, module: Any) -> None:
        self.module, self.shapes = module, []

    def decode_jpeg(self, *args: Any, **kwargs: Any) -> Any:
        pixels = self.module.decode_jpeg(*args, **kwargs)
        self.shapes.append(pixels.shape[:2])
        return pixels


def test_the_fast_path_decodes_jpegs_at_a_power_of_two_scale_covering_the_box(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import shardio.decode.crop

    recording = _Recording(pytest.importorskip("simplejpeg"))
    monkeypatch.setattr(shardio.decode.crop, "_simplejpeg", lambda: recording)
    data = _photo(1600, 1200, seed=3)
    plain = Cropper(RandomResizedCrop(224, scale=(0.05, 1.0)), seed=2)
    scales = {(math.ceil(1200 / d), math.ceil(1600 / d)): d for d in (1, 2, 4, 8)}
    for index in range(16):
        pending = _fast(plain).open(data, index)
        out = np.empty(pending.shape, np.uint8)
        pending.decode_into(out)
        d = scales[recording.shapes[-1]]  # KeyError: a scale that is not 1/2^k
        drawn = plain.open(data, index).box
        width, height = drawn[2] - drawn[0], drawn[3] - drawn[1]
        assert width / d >= 224 and height / d >= 224, "the drawn box covers 224x224"
        assert d == 8 or width / d / 2 < 224 or height / d / 2 < 224, "at the least such scale"
        # the box cut is the drawn one with its edges on whole pixels of the scale
        assert all(v % d == 0 or v in (1600, 1200) for v in pending.box)
        assert max(abs(a - b) for a, b in zip(pending.box, drawn, strict=True)) <= d / 2
        want = _reference(data, pending.box, (224, 224), pending.flip).astype(np.int16)
        assert np.abs(out.astype(np.int16) - want).mean() < 3  # libjpeg's DCT scaling
    assert len(set(recording.shapes)) > 1, "boxes of several scales"


@pytest.mark.parametrize("fmt,mode", [("PNG", "RGB"), ("JPEG", "CMYK")])
def test_what_simplejpeg_cannot_decode_goes_through_pillow(fmt: str, mode: str) -> None:
    buf = io.BytesIO()
    Image.new(mode, (30, 20), color=(90,) * len(mode)).save(buf, fmt)
    plain = Cropper(CenterCrop(8), 0)
    assert np.array_equal(_decode(_fast(plain), buf.getvalue()), _decode(plain, buf.getvalue()))


def test_damaged_bytes_on_the_fast_path_raise_a_decode_error_naming_the_sample() -> None:
    pytest.importorskip("simplejpeg")
    data = bytearray(_photo(40, 30))
    data[200:] = b"\x00" * (len(data) - 200)
    with pytest.raises(DecodeError, match="k/9"):
        pending = _fast(Cropper(CenterCrop(8), 0)).open(bytes(data), 0, key="k/9")
        pending.decode_into(np.empty(pending.shape, np.uint8))


# ---------------------------------------------------------------- through the dataset


@pytest.fixture
def pack(imagefolder_pack: Path) -> Path:
    return imagefolder_pack


def _epochs(pack: Path, num_workers: int, epochs: int = 2, **kw: Any) -> list[Any]:
    dataset = shardio.StreamingDataset(pack, decode="tensor", seed=11, lanes=1,
                                       crop=RandomResizedCrop((20, 24)), **kw)
    loader = shardio.loader(dataset, batch_size=5, num_workers=num_workers)
    return [[(images.clone(), labels.clone()) for images, labels in loader]
            for _ in range(epochs)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_batches_are_one_tensor_and_the_crops_do_not_depend_on_workers(
    pack: Path, num_workers: int
) -> None:
    reference = _epochs(pack, 0)
    got = reference if num_workers == 0 else _epochs(pack, num_workers)
    for epoch in got:
        assert sum(len(labels) for _, labels in epoch) == 48
        for images, labels in epoch:
            assert images.shape == (len(labels), 3, 20, 24) and images.dtype == torch.uint8
            assert images.is_contiguous(memory_format=torch.channels_last)
    for mine, theirs in zip(got, reference, strict=True):
        for (a, la), (b, lb) in zip(mine, theirs, strict=True):
            assert torch.equal(la, lb) and torch.equal(a, b)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_each_epoch_draws_new_boxes_for_the_same_samples(pack: Path, num_workers: int) -> None:
    first, second = _epochs(pack, num_workers, shuffle=False)  # same order, epoch 0 then 1
    for (a, la), (b, lb) in zip(first, second, strict=True):
        assert torch.equal(la, lb) and not torch.equal(a, b)


def test_the_per_sample_path_crops_as_the_batch_path(pack: Path) -> None:
    batched = _epochs(pack, 0, epochs=1)[0]
    dataset = shardio.StreamingDataset(pack, decode="tensor", seed=11, lanes=1,
                                       crop=RandomResizedCrop((20, 24)), batch_size=5)
    plain = list(torch.utils.data.DataLoader(dataset, batch_size=5))
    for (a, la), (b, lb) in zip(batched, plain, strict=True):
        assert torch.equal(la, lb) and torch.equal(a.contiguous(), b.contiguous())
    pil = shardio.StreamingDataset(pack, decode="pil", seed=11, lanes=1, batch_size=5,
                                   crop=RandomResizedCrop((20, 24)))
    image, _ = next(iter(pil))
    assert image.size == (24, 20) and image.mode == "RGB"
    assert np.array_equal(np.asarray(image), batched[0][0][0].permute(1, 2, 0).numpy())


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resumed_epoch_sees_the_same_crops(pack: Path, num_workers: int) -> None:
    reference = _epochs(pack, num_workers, epochs=1)[0]
    dataset = shardio.StreamingDataset(pack, decode="tensor", seed=11, lanes=1,
                                       crop=RandomResizedCrop((20, 24)))
    loader = shardio.loader(dataset, batch_size=5, num_workers=num_workers)
    for n, _ in enumerate(loader, 1):
        if n == 4:
            state = loader.state_dict()
            break
    fresh = shardio.StreamingDataset(pack, decode="tensor", seed=11, lanes=1,
                                     crop=RandomResizedCrop((20, 24)))
    resumed = shardio.loader(fresh, batch_size=5, num_workers=num_workers)
    resumed.load_state_dict(state)
    rest = [(images.clone(), labels.clone()) for images, labels in resumed]
    assert len(rest) == len(reference) - 4
    for (a, la), (b, lb) in zip(rest, reference[4:], strict=True):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_center_crops_are_the_same_every_epoch(pack: Path) -> None:
    dataset = shardio.StreamingDataset(pack, decode="tensor", shuffle=False,
                                       crop=CenterCrop(16))
    loader = shardio.loader(dataset, batch_size=8, num_workers=0)
    first, second = ([images.clone() for images, _ in loader] for _ in range(2))
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert first[0].shape == (8, 3, 16, 16)


@pytest.mark.parametrize("kw", [{"decode": "raw"}, {"decode": "tensor", "draft_size": (8, 8)},
                                {"decode": "raw", "fields": ("image", "label")}])
@pytest.mark.parametrize("kind", ["StreamingDataset", "IndexedDataset"])
def test_crop_is_refused_where_it_cannot_apply(pack: Path, kw: dict[str, Any], kind: str
                                               ) -> None:
    with pytest.raises(ValueError, match="crop="):
        getattr(shardio, kind)(pack, crop=CenterCrop(8), **kw)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_indexed_center_crops_are_the_crops_of_each_sample(pack: Path, num_workers: int
                                                           ) -> None:
    raw = shardio.IndexedDataset(pack, decode="raw")
    cropper = _fast(Cropper(CenterCrop((12, 16)), 0))  # what the datasets build
    want = {}
    for i in range(len(raw)):
        pixels = _decode(cropper, raw[i]["image"], i)
        want[i] = (torch.from_numpy(pixels).permute(2, 0, 1), raw[i]["label"])
    indexed = shardio.IndexedDataset(pack, decode="tensor", crop=CenterCrop((12, 16)))
    order = list(torch.utils.data.RandomSampler(
        indexed, generator=torch.Generator().manual_seed(0)))
    loader = torch.utils.data.DataLoader(indexed, batch_size=5, sampler=order,
                                         num_workers=num_workers)
    got = [(image, int(label)) for images, labels in loader
           for image, label in zip(images, labels, strict=True)]
    assert sorted(order) == list(range(48)) and len(got) == 48
    for index, (image, label) in zip(order, got, strict=True):
        assert image.shape == (3, 12, 16) and label == want[index][1]
        assert torch.equal(image, want[index][0])


def test_indexed_dataset_refuses_random_crops_and_names_the_streaming_one(pack: Path) -> None:
    with pytest.raises(ValueError, match=r"CenterCrop only.*StreamingDataset\(crop="):
        shardio.IndexedDataset(pack, decode="tensor", crop=RandomResizedCrop(8))  # type: ignore[arg-type]


def test_sizes_of_the_output_follow_size() -> None:
    assert RandomResizedCrop(7).output == (7, 7)
    assert CenterCrop((3, 5)).output == (3, 5)
    assert math.isclose(CenterCrop(1).ratio, 0.875)


def test_describe_names_the_decoder_and_resize_a_jpeg_takes() -> None:
    assert Cropper(CenterCrop(8), 0).describe().endswith("(draft scale)")
    pytest.importorskip("simplejpeg")
    assert _fast(Cropper(CenterCrop(8), 0)).describe().startswith("simplejpeg ")
