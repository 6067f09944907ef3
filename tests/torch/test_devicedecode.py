"""DeviceDecoder: raw batches decoded on the GPU (nvJPEG), else on the CPU with the same pixels.

On a machine without CUDA every test runs the CPU path and the GPU path's plumbing
(batch call, per-image retry, CPU fallback, crop loop) through a stand-in for
``torchvision.io`` that decodes with Pillow; with CUDA and torchvision the same
tests run nvJPEG for real (``test_nvjpeg_*``).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from shardio.synth import make_photo

torch = pytest.importorskip("torch")

import shardio  # noqa: E402  (after the torch skip)
from shardio.decode.crop import CenterCrop, RandomResizedCrop  # noqa: E402
from shardio.errors import DecodeError  # noqa: E402
from shardio.torch.device_decode import (  # noqa: E402
    DeviceDecoder,
    _torchvision_io,
    jpeg_components,
    resize_on_device,
)
from shardio.torch.resize import resize_box  # noqa: E402

CUDA = torch.cuda.is_available() and _torchvision_io() is not None
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
"""Where the GPU path is tested: the device itself, else the CPU through the stand-in."""


def _photo(width: int, height: int, seed: int = 0, **kw: Any) -> bytes:
    return make_photo(np.random.default_rng(seed), width, height, **kw)


def _encode(mode: str, fmt: str, size: tuple[int, int] = (40, 30), **kw: Any) -> bytes:
    pixels = np.random.default_rng(3).integers(0, 256, (size[1], size[0], 3), np.uint8)
    image = Image.fromarray(pixels).convert(mode)
    out = io.BytesIO()
    image.save(out, fmt, **kw)
    return out.getvalue()


def _batch(datas: list[bytes | None], labels: list[int] | None = None) -> shardio.RecordBatch:
    samples: list[dict[str, Any]] = []
    for i, data in enumerate(datas):
        sample: dict[str, Any] = {"__key__": f"k/{i}", "__index__": 100 + i}
        if data is not None:
            sample["image"] = data
        if labels is not None:
            sample["label"] = labels[i]
        samples.append(sample)
    return shardio.RecordBatch.from_samples(samples)


class _PillowIO:
    """A stand-in for ``torchvision.io`` on CPU: decode_jpeg by Pillow, RuntimeError on bad
    bytes, with the calls it got recorded."""

    class ImageReadMode:
        RGB = "RGB"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def decode_jpeg(self, data: Any, *, mode: str, device: Any) -> Any:
        assert mode == "RGB"
        if isinstance(data, list):
            self.calls.append(len(data))
            return [self._one(t) for t in data]
        self.calls.append(1)
        return self._one(data)

    @staticmethod
    def _one(tensor: Any) -> Any:
        try:
            image = Image.open(io.BytesIO(tensor.numpy().tobytes())).convert("RGB")
            image.load()
        except OSError as exc:
            raise RuntimeError(f"nvjpeg stand-in: {exc}") from exc
        return torch.from_numpy(np.asarray(image).copy()).permute(2, 0, 1)


def _gpu_path(decoder: DeviceDecoder) -> _PillowIO:
    """Route ``decoder`` through its GPU path with the Pillow stand-in, on the CPU."""
    stand_in = _PillowIO()
    decoder._io = stand_in  # type: ignore[assignment]
    return stand_in


# ---------------------------------------------------------------- which JPEGs go to the GPU


@pytest.mark.parametrize(("mode", "kw", "want"), [
    ("RGB", {}, 3),
    ("RGB", {"progressive": True}, 3),
    ("L", {}, 1),
    ("CMYK", {}, None),
])
def test_jpeg_components_picks_what_nvjpeg_decodes(mode: str, kw: dict[str, Any],
                                                   want: int | None) -> None:
    assert jpeg_components(_encode(mode, "JPEG", **kw)) == want


def test_non_jpegs_and_cut_files_stay_on_the_cpu() -> None:
    jpeg = _encode("RGB", "JPEG")
    assert jpeg_components(_encode("RGB", "PNG")) is None
    assert jpeg_components(b"") is None and jpeg_components(b"\xff\xd8") is None
    # cut before the frame header, a length that runs past the end, cut in the image
    # data (nvJPEG might fill in what is missing: libjpeg refuses it), bytes after the end
    sof = jpeg.index(b"\xff\xc0")
    assert jpeg_components(jpeg[:sof]) is None
    assert jpeg_components(jpeg[: sof + 6]) is None
    assert jpeg_components(jpeg[:-10]) is None
    assert jpeg_components(jpeg + b"\0\0") is None
    assert jpeg_components(jpeg) == 3


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 400))
def test_jpeg_components_never_raises_on_damaged_headers(noise: bytes, at: int) -> None:
    data = bytearray(_encode("RGB", "JPEG"))
    data[at : at + len(noise)] = noise
    assert jpeg_components(bytes(data)) in (None, 1, 3)


# ---------------------------------------------------------------- the resize on the device


@pytest.mark.parametrize("flip", [False, True])
def test_resize_on_device_gives_the_cpu_resize_within_a_level(flip: bool) -> None:
    pixels = np.asarray(Image.open(io.BytesIO(_photo(90, 70))).convert("RGB"))
    box, size = (7.0, 5.0, 71.0, 60.0), (24, 32)
    want = np.empty((*size, 3), np.uint8)
    resize_box(pixels, box, want, flip)
    got = resize_on_device(torch.from_numpy(pixels.copy()).permute(2, 0, 1), box, size, flip)
    assert got.dtype == torch.uint8 and tuple(got.shape) == (3, *size)
    diff = np.abs(got.permute(1, 2, 0).numpy().astype(int) - want.astype(int))
    assert diff.max() <= 1


def test_a_box_of_the_output_size_is_cut_without_a_resize() -> None:
    image = torch.arange(3 * 6 * 8, dtype=torch.uint8).view(3, 6, 8)
    got = resize_on_device(image, (2, 1, 6, 4), (3, 4), False)
    assert torch.equal(got, image[:, 1:4, 2:6])


# ---------------------------------------------------------------- batches, both paths


def _photos(n: int, sizes: list[tuple[int, int]]) -> list[bytes]:
    return [_photo(*sizes[i % len(sizes)], seed=i) for i in range(n)]


def _pixels(data: bytes) -> Any:
    return torch.from_numpy(np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy()
                            ).permute(2, 0, 1)


@pytest.mark.parametrize("gpu_path", [False, True])
def test_full_images_of_one_size_stack_and_of_several_sizes_are_a_list(gpu_path: bool
                                                                       ) -> None:
    decoder = DeviceDecoder(DEVICE)
    nvjpeg = decoder.gpu
    if gpu_path and not nvjpeg:
        _gpu_path(decoder)
    same = _photos(4, [(40, 30)])
    images, labels = decoder(_batch(list(same), [1, 2, 3, 4]))
    assert isinstance(images, torch.Tensor) and tuple(images.shape) == (4, 3, 30, 40)
    assert labels is not None and labels.tolist() == [1, 2, 3, 4]
    for image, data in zip(images, same, strict=True):
        diff = (image.cpu().int() - _pixels(data).int()).abs()
        if nvjpeg:  # nvJPEG's IDCT and chroma upsampling are not libjpeg-turbo's: on an
            # H200, pixels differed by up to 9 levels and by 2.45 on average on these photos
            assert float(diff.float().mean()) < 4
        else:
            assert int(diff.max()) == 0
    mixed = _photos(3, [(40, 30), (24, 50)])
    images, labels = decoder(_batch(list(mixed)))
    assert labels is None and isinstance(images, list)
    assert [tuple(i.shape) for i in images] == [(3, 30, 40), (3, 50, 24), (3, 30, 40)]


def test_the_gpu_path_sends_one_call_a_batch_and_everything_else_to_the_cpu() -> None:
    decoder = DeviceDecoder("cpu", crop=CenterCrop(16))
    stand_in = _gpu_path(decoder)
    datas = [_photo(40, 30), _encode("RGB", "PNG"), _encode("CMYK", "JPEG"),
             _encode("L", "JPEG"), _photo(30, 40, seed=4)]
    images, _ = decoder(_batch(list(datas)))
    assert stand_in.calls == [3]  # the three JPEGs nvJPEG takes, in one call
    cpu = DeviceDecoder("cpu", crop=CenterCrop(16))
    want, _ = cpu(_batch(list(datas)))
    assert isinstance(images, torch.Tensor) and isinstance(want, torch.Tensor)
    assert tuple(images.shape) == (5, 3, 16, 16)
    for i, data in enumerate(datas):
        if i in (0, 3, 4):  # JPEGs: the CPU path resizes uint8 on the CPU, the GPU path floats
            assert (images[i].int() - want[i].int()).abs().max() <= 1
        else:  # the box cut from the full decode, then resized (Pillow's box resize on the
            # CPU path also weighs pixels just outside the box: no comparison with it here)
            pixels = _pixels(data).permute(1, 2, 0).numpy().copy()
            side = round(min(pixels.shape[:2]) * 224 / 256)
            left, top = round((40 - side) / 2), round((30 - side) / 2)
            ref = np.empty((16, 16, 3), np.uint8)
            resize_box(pixels, (left, top, left + side, top + side), ref, False)
            assert (images[i].permute(1, 2, 0).int() - torch.from_numpy(ref).int()
                    ).abs().max() <= 1


def test_one_image_nvjpeg_refuses_is_retried_alone_then_decoded_on_the_cpu() -> None:
    decoder = DeviceDecoder("cpu")
    refused = _photo(40, 30, seed=9)

    class Refusing(_PillowIO):
        def decode_jpeg(self, data: Any, *, mode: str, device: Any) -> Any:
            tensors = data if isinstance(data, list) else [data]
            self.calls.append(len(tensors))
            if any(t.numpy().tobytes() == refused for t in tensors):
                raise RuntimeError("nvjpeg: cannot decode this one")
            got = [self._one(t) for t in tensors]
            return got if isinstance(data, list) else got[0]

    stand_in = Refusing()
    decoder._io = stand_in  # type: ignore[assignment]
    datas = [_photo(40, 30), refused, _photo(40, 30, seed=2)]
    images, _ = decoder(_batch(list(datas)))
    assert stand_in.calls == [3, 1, 1, 1]  # the batch, then each alone
    assert isinstance(images, torch.Tensor)
    for image, data in zip(images, datas, strict=True):
        assert torch.equal(image, _pixels(data))  # the refused one decoded on the CPU


def test_a_cut_jpeg_never_reaches_nvjpeg_and_its_error_names_the_sample() -> None:
    decoder = DeviceDecoder("cpu")
    stand_in = _gpu_path(decoder)
    good = _photo(40, 30)
    with pytest.raises(DecodeError, match="k/1"):
        decoder(_batch([good, good[: len(good) // 2], good]))
    assert stand_in.calls == [2]


def test_a_failed_batch_call_keeps_the_images_that_decode() -> None:
    decoder = DeviceDecoder("cpu")

    class Picky(_PillowIO):
        def decode_jpeg(self, data: Any, *, mode: str, device: Any) -> Any:
            if isinstance(data, list):
                self.calls.append(len(data))
                raise RuntimeError("nvjpeg: one image of the batch failed")
            return super().decode_jpeg(data, mode=mode, device=device)

    stand_in = Picky()
    decoder._io = stand_in  # type: ignore[assignment]
    datas = _photos(3, [(40, 30)])
    images, _ = decoder(_batch(list(datas)))
    assert stand_in.calls == [3, 1, 1, 1]
    assert isinstance(images, torch.Tensor)
    for image, data in zip(images, datas, strict=True):
        assert torch.equal(image, _pixels(data))


@pytest.mark.parametrize("bad", ["missing", "garbage"])
def test_what_no_decoder_reads_is_named(bad: str) -> None:
    for gpu_path in (False, True):
        decoder = DeviceDecoder("cpu")
        if gpu_path:
            _gpu_path(decoder)
        datas: list[bytes | None] = [_photo(40, 30), None if bad == "missing" else b"\xff\xd8x"]
        with pytest.raises(DecodeError, match="k/1"):
            decoder(_batch(datas))
    with pytest.raises(KeyError, match="'photo'"):
        DeviceDecoder("cpu", image="photo")(_batch([_photo(40, 30)]))
    empty = shardio.RecordBatch.from_samples([])
    for gpu_path in (False, True):
        decoder = DeviceDecoder("cpu")
        if gpu_path:
            _gpu_path(decoder)
        with pytest.raises(ValueError, match="empty batch"):
            decoder(empty)
    with pytest.raises(TypeError, match="RandomResizedCrop"):
        DeviceDecoder("cpu", crop=(32, 32))  # type: ignore[arg-type]


def test_on_the_cpu_the_decoder_says_it_decodes_on_the_cpu() -> None:
    for decoder in (DeviceDecoder("cpu"), DeviceDecoder(None)):
        assert decoder.device == torch.device("cpu") and not decoder.gpu
        assert "CPU" in decoder.describe()


# ---------------------------------------------------------------- through the loader


@pytest.fixture
def pack(imagefolder_pack: Path) -> Path:
    return imagefolder_pack


def _by_index(pack: Path, crop: Any, seed: int, epochs: int) -> list[dict[int, Any]]:
    """Each epoch's crops by sample index, as StreamingDataset(crop=) decodes them.

    The decoded batches carry no indices: a raw loader of the same seed, read in
    lock-step, yields the same samples in the same order and names them.
    """
    decoded = shardio.loader(shardio.StreamingDataset(pack, decode="tensor", seed=seed,
                                                      crop=crop), batch_size=6, num_workers=0)
    raw = shardio.loader(shardio.StreamingDataset(pack, decode="raw", seed=seed),
                         batch_size=6, num_workers=0)
    got = []
    for _ in range(epochs):
        epoch: dict[int, Any] = {}
        for (images, _labels), batch in zip(decoded, raw, strict=True):
            epoch.update(zip(batch.indices.tolist(), images.clone(), strict=True))
        assert decoded.epoch == raw.epoch == len(got)
        got.append(epoch)
    return got


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("gpu_path", [False, True])
def test_every_sample_once_with_the_crop_the_dataset_draws(
    pack: Path, num_workers: int, gpu_path: bool
) -> None:
    crop, seed = RandomResizedCrop((20, 24)), 5
    reference = _by_index(pack, crop, seed, epochs=2)
    dataset = shardio.StreamingDataset(pack, decode="raw", seed=seed)
    loader = shardio.loader(dataset, batch_size=6, num_workers=num_workers)
    decoder = DeviceDecoder(DEVICE, crop=crop, seed=seed)
    if gpu_path and not decoder.gpu:
        _gpu_path(decoder)
    exact = not decoder.gpu and not gpu_path  # the dataset's own decoder
    for epoch in range(2):
        seen: list[int] = []
        for batch in loader:
            images, labels = decoder(batch, epoch=loader.epoch)
            assert isinstance(images, torch.Tensor) and images.device == decoder.device
            assert tuple(images.shape) == (len(batch), 3, 20, 24)
            assert labels is not None and torch.equal(labels.cpu(), batch.labels)
            for image, index in zip(images, batch.indices.tolist(), strict=True):
                diff = (image.cpu().int() - reference[loader.epoch][index].int()).abs()
                if exact:
                    assert int(diff.max()) == 0
                else:  # the same box decoded at full scale, where the dataset decodes at
                    # 1/2^k if the box allows and moves the box's edges onto that scale's
                    # pixels: a few levels on average; another box of the same image
                    # differs by 15 to 45 on these photos
                    assert float(diff.float().mean()) < 8, (index, float(diff.float().mean()))
                seen.append(index)
        assert sorted(seen) == list(range(48)), epoch


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA and torchvision (nvJPEG)")
def test_nvjpeg_decodes_on_the_device_and_names_itself() -> None:
    decoder = DeviceDecoder("cuda", crop=RandomResizedCrop(16))
    assert decoder.gpu and "nvjpeg" in decoder.describe()
    images, _ = decoder(_batch(_photos(4, [(40, 30), (64, 48)])))
    assert isinstance(images, torch.Tensor) and images.is_cuda


# ---------------------------------------------------------------- in the prefetcher

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_prefetcher_decodes_raw_batches_for_the_epoch_the_loader_reads(
    pack: Path, num_workers: int
) -> None:
    crop, seed = RandomResizedCrop((20, 24)), 5
    # lanes=1: the same order whatever num_workers is
    raw = shardio.loader(shardio.StreamingDataset(pack, decode="raw", seed=seed, lanes=1),
                         batch_size=6, num_workers=num_workers)
    decoded = shardio.loader(shardio.StreamingDataset(pack, decode="tensor", seed=seed,
                                                      crop=crop, lanes=1),
                             batch_size=6, num_workers=0)
    prefetcher = shardio.DevicePrefetcher(
        raw, DEVICE, decode=DeviceDecoder(DEVICE, crop=crop, seed=seed), convert_float=True,
        mean=MEAN, std=STD)
    reference = shardio.DevicePrefetcher(decoded, "cpu", convert_float=True, mean=MEAN, std=STD)
    nvjpeg = prefetcher.decode is not None and prefetcher.decode.gpu
    for _epoch in range(2):
        count = 0
        for (images, labels), (want, want_labels) in zip(prefetcher, reference, strict=True):
            assert images.device == prefetcher.device and images.dtype == torch.float32
            assert torch.equal(labels.cpu(), want_labels)
            diff = (images.cpu() - want).abs()  # in standard deviations of each channel
            if nvjpeg:  # nvJPEG's pixels at full scale against the dataset's 1/2^k decode
                assert float(diff.mean()) < 8 / 255 / min(STD)
            else:
                assert float(diff.max()) < 1e-5
            count += len(labels)
        assert count == 48
    assert raw.epoch == decoded.epoch == 1


def test_the_prefetcher_refuses_a_decoder_it_cannot_use(pack: Path) -> None:
    raw = shardio.loader(shardio.StreamingDataset(pack, decode="raw"), batch_size=6,
                         num_workers=0)
    with pytest.raises(ValueError, match="same device"):
        shardio.DevicePrefetcher(raw, "meta", decode=DeviceDecoder("cpu"))
    batches = list(raw)
    with pytest.raises(TypeError, match="has no epoch"):
        shardio.DevicePrefetcher(batches, "cpu", decode=DeviceDecoder(
            "cpu", crop=RandomResizedCrop(8)))
    # centre crops and full images do not depend on the epoch
    got = list(shardio.DevicePrefetcher(batches, "cpu", decode=DeviceDecoder(
        "cpu", crop=CenterCrop(8))))
    assert [tuple(images.shape) for images, _ in got] == [(len(b), 3, 8, 8) for b in batches]
