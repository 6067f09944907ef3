"""The whole path to the device: pack → shardio.loader → DevicePrefetcher, on the CPU and on CUDA.

Each test runs on the CPU everywhere and again on CUDA where a device exists, so the
fallback and the real path check the same promises: every sample once per epoch, its
pixels or bytes unchanged, labels with their images. On CUDA, ``shardio.loader`` turns
``pin_memory`` on, so a worker's batch crosses through its shared-memory slot, is pinned
by the DataLoader's thread and copied on the prefetcher's side stream: paths the CPU
never takes.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import shardio  # noqa: E402  (after the torch skip)
from shardio.synth import make_photo  # noqa: E402
from shardio.torch.collate import decode_tensor  # noqa: E402
from shardio.torch.prefetch import DevicePrefetcher  # noqa: E402

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the CUDA path needs a CUDA device"
)
DEVICES = ["cpu", pytest.param("cuda", marks=[needs_cuda, pytest.mark.gpu])]
SIZE = (40, 30)  # every image of the fixed tree: batches stack into (B, 3, H, W)


def _digest(image: Any) -> str:
    """A decoded image's identity: its shape and its pixels in CHW order."""
    pixels = image.detach().cpu().contiguous().numpy()
    return f"{tuple(pixels.shape)}:{hashlib.blake2b(pixels.tobytes(), digest_size=16).hexdigest()}"


def _tree(root: Path, sizes: list[tuple[int, int]]) -> Path:
    """An ImageFolder of 3 classes, image ``i`` of size ``sizes[i % len(sizes)]``."""
    rng = np.random.default_rng(5)
    for i in range(45):
        folder = root / f"class_{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        width, height = sizes[i % len(sizes)]
        (folder / f"img_{i:03d}.jpg").write_bytes(make_photo(rng, width, height))
    return root


def _expected(tree: Path) -> Counter[tuple[int, str]]:
    """(label, pixels) of every source image, decoded on its own from the source file."""
    classes = sorted(p.name for p in tree.iterdir())
    return Counter(
        (classes.index(path.parent.name), _digest(decode_tensor(path.read_bytes())))
        for path in sorted(tree.rglob("*.jpg"))
    )


@pytest.fixture(scope="module")
def fixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Counter[tuple[int, str]]]:
    """A pack of images all of one size, and what each epoch must deliver."""
    base = tmp_path_factory.mktemp("device")
    tree = _tree(base / "tree", [SIZE])
    shardio.pack_imagefolder(tree, base / "pack", options=shardio.WriteOptions(
        max_shard_samples=8), num_workers=1, progress=False)
    return base / "pack", _expected(tree)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Counter[tuple[int, str]]]:
    """A pack of images of three sizes: batches are lists of (3, H, W) views."""
    base = tmp_path_factory.mktemp("device-mixed")
    tree = _tree(base / "tree", [SIZE, (33, 47), (21, 20)])
    shardio.pack_imagefolder(tree, base / "pack", options=shardio.WriteOptions(
        max_shard_samples=8), num_workers=1, progress=False)
    return base / "pack", _expected(tree)


def _on(device: str, tensor: Any) -> bool:
    return bool(tensor.device.type == device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_decoded_images_reach_the_device_once_each_with_their_pixels(
    fixed: tuple[Path, Counter[tuple[int, str]]], device: str, num_workers: int
) -> None:
    path, expected = fixed
    dataset = shardio.StreamingDataset(path, decode="tensor", seed=3)
    batches = shardio.loader(dataset, batch_size=7, num_workers=num_workers)
    prefetcher = DevicePrefetcher(batches, device)
    for epoch in range(3):  # more epochs than a worker's ring has slots for one
        got: Counter[tuple[int, str]] = Counter()
        for images, labels in prefetcher:
            assert _on(device, images) and _on(device, labels)
            assert images.dtype == torch.uint8 and images.shape[1:] == (3, SIZE[1], SIZE[0])
            got.update((int(label), _digest(image)) for image, label in zip(
                images, labels.tolist(), strict=True))
        assert got == expected, f"epoch {epoch}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_images_of_several_sizes_reach_the_device_as_views_once_each(
    mixed: tuple[Path, Counter[tuple[int, str]]], device: str, num_workers: int
) -> None:
    path, expected = mixed
    dataset = shardio.StreamingDataset(path, decode="tensor", seed=4)
    prefetcher = DevicePrefetcher(shardio.loader(dataset, batch_size=6,
                                                 num_workers=num_workers), device)
    got: Counter[tuple[int, str]] = Counter()
    for images, labels in prefetcher:
        assert isinstance(images, list) and len(images) == len(labels)
        assert all(_on(device, image) and image.dim() == 3 for image in images)
        got.update((int(label), _digest(image)) for image, label in zip(
            images, labels.tolist(), strict=True))
    assert got == expected


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_normalised_images_on_the_device_match_the_cpu_arithmetic(
    fixed: tuple[Path, Counter[tuple[int, str]]], device: str, num_workers: int
) -> None:
    path, _ = fixed
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

    def epoch(target: str, convert: bool) -> list[Any]:
        dataset = shardio.StreamingDataset(path, decode="tensor", seed=9)
        loader = shardio.loader(dataset, batch_size=8, num_workers=num_workers)
        options: dict[str, Any] = {"convert_float": True, "mean": mean, "std": std,
                                   "channels_last": True} if convert else {}
        return [(images.cpu(), labels.cpu()) for images, labels in
                DevicePrefetcher(loader, target, **options)]

    raw = epoch("cpu", convert=False)
    converted = epoch(device, convert=True)
    assert len(raw) == len(converted) == -(-45 // 8)
    m = torch.tensor(mean).view(1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)
    for (pixels, labels), (floats, same_labels) in zip(raw, converted, strict=True):
        assert floats.dtype == torch.float32
        assert torch.equal(labels, same_labels)
        torch.testing.assert_close(floats, (pixels.float() / 255 - m) / s, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_raw_batches_pass_the_prefetcher_with_their_bytes(
    fixed: tuple[Path, Counter[tuple[int, str]]], device: str, num_workers: int
) -> None:
    path, _ = fixed
    reference = {s["__key__"]: bytes(s["image"]) for s in shardio.StreamingDataset(
        path, decode="raw", shuffle=False)}
    dataset = shardio.StreamingDataset(path, decode="raw", seed=1)
    prefetcher = DevicePrefetcher(shardio.loader(dataset, batch_size=5,
                                                 num_workers=num_workers), device)
    for _ in range(2):
        got: dict[str, bytes] = {}
        for batch in prefetcher:
            for key, data in zip(batch.keys, batch.bytes("image"), strict=True):
                assert key not in got, f"{key} delivered twice"
                got[key] = bytes(data or b"")
        assert got == reference


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("num_workers", [0, 2])
def test_on_cuda_the_loader_pins_decoded_batches(
    fixed: tuple[Path, Counter[tuple[int, str]]], num_workers: int
) -> None:
    path, _ = fixed
    dataset = shardio.StreamingDataset(path, decode="tensor", seed=3)
    seen = 0
    for images, labels in shardio.loader(dataset, batch_size=7, num_workers=num_workers):
        # pinned, the prefetcher's copy is asynchronous and needs no staging copy of its own
        assert images.is_pinned() and labels.is_pinned()
        seen += len(labels)
    assert seen == 45


@pytest.fixture
def fake_pinning(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record the pinned buffers ``shardio.loader`` asks for; without CUDA, fake them.

    With CUDA the buffers are really page-locked and the DataLoader's pin thread runs:
    it must find each batch pinned and leave it as it is (it would pin each tensor on
    its own otherwise). Without CUDA the DataLoader pins nothing, so the pinned path is
    taken with plain memory; what is checked is that shardio builds each batch over one
    buffer of its own.
    """
    from shardio.torch.handover import pinned
    made: list[Any] = []
    real = pinned.empty

    def empty(nbytes: int) -> Any:
        made.append(real(nbytes) if torch.cuda.is_available()
                    else torch.empty(nbytes, dtype=torch.uint8))
        return made[-1]

    if not torch.cuda.is_available():
        monkeypatch.setattr(pinned, "enabled", lambda pin_memory: pin_memory is not False)
    monkeypatch.setattr(pinned, "empty", empty)
    return made


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_pinned_batch_of_several_sizes_is_one_buffer_of_its_own(
    mixed: tuple[Path, Counter[tuple[int, str]]], fake_pinning: list[Any], num_workers: int
) -> None:
    path, expected = mixed
    dataset = shardio.StreamingDataset(path, decode="tensor", seed=4)
    held = list(shardio.loader(dataset, batch_size=6, num_workers=num_workers,
                               prefetch_factor=1))
    buffers = {t.untyped_storage().data_ptr() for t in fake_pinning}
    assert len(fake_pinning) == len(held) == -(-45 // 6)
    got: Counter[tuple[int, str]] = Counter()
    for images, labels in held:  # every batch held to the end: its worker's slot went back
        bases = {image.untyped_storage().data_ptr() for image in images}
        assert len(bases) == 1 and bases <= buffers, "one pinned buffer a batch"
        got.update((int(label), _digest(image)) for image, label in zip(
            images, labels.tolist(), strict=True))
    assert got == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_pinned_batches_of_one_size_are_views_of_their_buffer(
    fixed: tuple[Path, Counter[tuple[int, str]]], fake_pinning: list[Any], num_workers: int
) -> None:
    path, expected = fixed
    dataset = shardio.StreamingDataset(path, decode="tensor", seed=4)
    held = list(shardio.loader(dataset, batch_size=7, num_workers=num_workers))
    assert len(fake_pinning) == len(held)
    buffers = {t.untyped_storage().data_ptr() for t in fake_pinning}
    got: Counter[tuple[int, str]] = Counter()
    for images, labels in held:
        assert images.untyped_storage().data_ptr() in buffers
        assert images.is_contiguous(memory_format=torch.channels_last)
        got.update((int(label), _digest(image)) for image, label in zip(
            images, labels.tolist(), strict=True))
    assert got == expected


def test_without_pinning_no_pinned_buffer_is_asked_for(
    fixed: tuple[Path, Counter[tuple[int, str]]], fake_pinning: list[Any]
) -> None:
    path, _ = fixed
    dataset = shardio.StreamingDataset(path, decode="tensor", seed=4)
    for num_workers in (0, 2):
        assert sum(len(labels) for _, labels in shardio.loader(
            dataset, batch_size=7, num_workers=num_workers, pin_memory=False)) == 45
    assert fake_pinning == []
