"""Issue 31, the first hour of a new user: items 2 (a device that is not there) and 6
(crops and fields).

A script asking for ``"cuda"`` on a machine without CUDA is told so instead of
training on the CPU without a word; the CPU is what ``"cpu"`` or ``device=None`` asks
for. ``crop=`` cuts the image fields of any pack read with ``fields=``, each field of
a sample by the same draw, exactly as the dataset's crop of that sample.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import shardio  # noqa: E402  (after the torch skip)

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
NO_CUDA = r"device 'cuda(:0)?' asked for, but CUDA is not available .*pass \"cpu\" or device=None"


@no_cuda
@pytest.mark.parametrize("device", ["cuda", "cuda:0", torch.device("cuda")])
def test_asking_for_cuda_without_cuda_raises_and_says_how_to_get_the_cpu(
    imagefolder_pack: Path, device: object
) -> None:
    raw = shardio.loader(shardio.StreamingDataset(imagefolder_pack, decode="raw"),
                         batch_size=4, num_workers=0)
    with pytest.raises(RuntimeError, match=NO_CUDA):
        shardio.DevicePrefetcher(raw, device)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match=NO_CUDA):
        shardio.DeviceDecoder(device)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match=NO_CUDA):
        shardio.DeviceDecoder()  # its default is "cuda"


@pytest.mark.parametrize("device", ["cpu", None])
def test_cpu_or_none_decodes_and_hands_over_on_the_cpu(
    imagefolder_pack: Path, device: str | None
) -> None:
    raw = shardio.loader(shardio.StreamingDataset(imagefolder_pack, decode="raw"),
                         batch_size=4, num_workers=0)
    decoder = shardio.DeviceDecoder(device, crop=shardio.CenterCrop(8))
    prefetcher = shardio.DevicePrefetcher(raw, device, decode=decoder, convert_float=True)
    assert decoder.device == prefetcher.device == torch.device("cpu")
    count = 0
    for images, labels in prefetcher:
        assert images.device.type == "cpu" and images.dtype == torch.float32
        assert tuple(images.shape[1:]) == (3, 8, 8) and len(labels) == len(images)
        count += len(labels)
    assert count == len(shardio.StreamingDataset(imagefolder_pack))


# ---------------------------------------------------------------- item 6: crops and fields

CROP = shardio.RandomResizedCrop((20, 24))
FIELDS = ("jpg", "seg.png", "cls")


@pytest.fixture(scope="module")
def generic_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pack of no ImageFolder: ``k<i>.jpg`` photos of several sizes, each with a PNG
    mask of its size (``seg.png``) and its number (``cls``)."""
    from shardio.synth import make_photo

    src = tmp_path_factory.mktemp("generic") / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for i in range(14):
        width, height = [(64, 48), (40, 72), (96, 96)][i % 3]
        (src / f"k{i:02d}.jpg").write_bytes(make_photo(rng, width, height))
        (src / f"k{i:02d}.seg.png").write_bytes(make_photo(rng, width, height, fmt="PNG"))
        (src / f"k{i:02d}.cls").write_text(f"{i}\n")
    out = src.parent / "pack"
    shardio.pack(src, out, options=shardio.WriteOptions(max_shard_samples=5), num_workers=1)
    return out


def _expected(pack: Path, crop: Any, seed: int, epoch: int) -> dict[int, tuple[Any, Any]]:
    """``cls -> (jpg crop, seg.png crop)`` as HWC arrays, cut by the crop the dataset
    builds (its seed, this epoch, each sample's index)."""
    from shardio.decode.crop import Cropper
    from shardio.torch.resize import resize_box

    cropper = Cropper(crop, seed, resize=resize_box)
    cropper.epoch = epoch
    want = {}
    for sample in shardio.IndexedDataset(pack, decode="raw"):
        crops = []
        for name in ("jpg", "seg.png"):
            pending = cropper.open(sample[name], sample["__index__"], sample["__key__"])
            pixels = np.empty(pending.shape, np.uint8)
            pending.decode_into(pixels)
            crops.append(pixels)
        want[int(sample["cls"])] = (crops[0], crops[1])
    return want


def _hwc(image: Any) -> Any:
    """A crop as HWC uint8 pixels, from a CHW tensor or a PIL image."""
    if isinstance(image, torch.Tensor):
        return image.permute(1, 2, 0).numpy()
    return np.asarray(image)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("decode", ["tensor", "pil"])
def test_crop_cuts_every_image_field_of_a_generic_pack_through_the_loader(
    generic_pack: Path, decode: str, num_workers: int
) -> None:
    dataset = shardio.StreamingDataset(generic_pack, decode=decode, fields=FIELDS, crop=CROP,
                                       seed=7)
    loader = shardio.loader(dataset, batch_size=4, num_workers=num_workers)
    for epoch in range(2):
        want = _expected(generic_pack, CROP, 7, epoch)
        seen = []
        for images, masks, numbers in loader:
            if decode == "tensor":  # one size: each image field stacks into one tensor
                assert tuple(images.shape[1:]) == tuple(masks.shape[1:]) == (3, 20, 24)
            for image, mask, number in zip(images, masks, numbers.tolist(), strict=True):
                assert np.array_equal(_hwc(image), want[number][0]), (epoch, number)
                assert np.array_equal(_hwc(mask), want[number][1]), (epoch, number)
                seen.append(number)
        assert loader.epoch == epoch and sorted(seen) == list(range(14))


def test_crop_cuts_image_fields_in_plain_dataloader_workers(generic_pack: Path) -> None:
    dataset = shardio.StreamingDataset(generic_pack, decode="tensor", fields=FIELDS,
                                       crop=CROP, seed=3)
    want = _expected(generic_pack, CROP, 3, 0)
    seen = []
    for images, masks, numbers in torch.utils.data.DataLoader(dataset, batch_size=4,
                                                              num_workers=2):
        for image, mask, number in zip(images, masks, numbers.tolist(), strict=True):
            assert np.array_equal(_hwc(image), want[number][0]), number
            assert np.array_equal(_hwc(mask), want[number][1]), number
            seen.append(number)
    assert sorted(seen) == list(range(14))


def test_indexed_center_crops_of_fields(generic_pack: Path) -> None:
    crop = shardio.CenterCrop((12, 16))
    want = _expected(generic_pack, crop, 0, 0)
    dataset = shardio.IndexedDataset(generic_pack, decode="pil", fields=FIELDS, crop=crop)
    for i in range(len(dataset)):
        image, mask, number = dataset[i]
        assert image.size == mask.size == (16, 12)
        assert np.array_equal(_hwc(image), want[number][0])
        assert np.array_equal(_hwc(mask), want[number][1])


def test_a_crop_of_raw_bytes_says_what_works_instead(generic_pack: Path) -> None:
    with pytest.raises(ValueError, match=r"decode='raw' yields their bytes: pass decode="
                                         r"'pil' or 'tensor' .*fields=\('jpg', 'cls'\)\)$"):
        shardio.StreamingDataset(generic_pack, decode="raw", fields=FIELDS, crop=CROP)
    with pytest.raises(ValueError, match=r"decode='raw'.*pass decode='pil' or 'tensor'"):
        shardio.StreamingDataset(generic_pack, crop=CROP)  # no fields: auto is raw here
