"""Decoding (decode.image) and the uint8 tensor collate (torch.collate) on real images."""

from __future__ import annotations

import importlib.metadata
import io
import re
import subprocess
import sys
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import PIL
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, features

from shardio.decode.image import decode_image, image_to_array, pil_backend
from shardio.errors import DecodeError, ShardioError
from shardio.synth import make_photo


def _encode(img: Image.Image, fmt: str, **params: Any) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **params)
    return out.getvalue()


def _photo(width: int, height: int, seed: int = 0) -> Image.Image:
    return Image.open(io.BytesIO(make_photo(np.random.default_rng(seed), width, height)))


def _reference(data: bytes) -> np.ndarray:
    """torchvision's pil_loader: open, then convert to RGB."""
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


INPUTS: dict[str, Callable[[], bytes]] = {
    "jpeg_rgb": lambda: make_photo(np.random.default_rng(3), 61, 47),
    "jpeg_gray": lambda: _encode(_photo(40, 30).convert("L"), "JPEG"),
    "jpeg_cmyk": lambda: _encode(_photo(40, 30).convert("CMYK"), "JPEG"),
    "png_rgb": lambda: make_photo(np.random.default_rng(4), 33, 21, fmt="PNG"),
    "png_rgba": lambda: _encode(_photo(32, 24).convert("RGBA"), "PNG"),
    "png_gray": lambda: _encode(_photo(32, 24).convert("L"), "PNG"),
    "png_palette": lambda: _encode(_photo(32, 24).convert("P"), "PNG"),
    "gif": lambda: _encode(_photo(20, 16).convert("P"), "GIF"),
    "webp": lambda: _encode(_photo(20, 16), "WEBP"),
}


@pytest.fixture(scope="module")
def big_jpeg() -> bytes:
    return make_photo(np.random.default_rng(7), 480, 400)


# ---------------------------------------------------------------- pil_backend


def test_pil_backend_names_the_installed_library_and_version() -> None:
    backend = pil_backend()
    assert re.fullmatch(r"(Pillow|pillow-simd) \d+\.\d+\.\d+\S*", backend), backend
    assert backend.endswith(" " + PIL.__version__)


@pytest.mark.parametrize(
    ("providers", "versions", "pil_version", "expected"),
    [
        (["pillow"], {"pillow": "11.0.0"}, "11.0.0", "Pillow 11.0.0"),
        (["Pillow-SIMD"], {"Pillow-SIMD": "9.5.0.post2"}, "9.5.0.post2", "pillow-simd 9.5.0.post2"),
        # pillow-simd installed over Pillow: both claim PIL; the files are the version PIL reports.
        (
            ["Pillow", "Pillow-SIMD"],
            {"Pillow": "10.4.0", "Pillow-SIMD": "9.5.0.post2"},
            "9.5.0.post2",
            "pillow-simd 9.5.0.post2",
        ),
        (
            ["Pillow-SIMD", "Pillow"],
            {"Pillow": "10.4.0", "Pillow-SIMD": "9.5.0.post2"},
            "10.4.0",
            "Pillow 10.4.0",
        ),
        ([], {}, "9.0.0.post1", "pillow-simd 9.0.0.post1"),
        ([], {}, "12.0.0", "Pillow 12.0.0"),
    ],
)
def test_pil_backend_tells_pillow_simd_from_pillow(
    monkeypatch: pytest.MonkeyPatch,
    providers: list[str],
    versions: dict[str, str],
    pil_version: str,
    expected: str,
) -> None:
    def version(name: str) -> str:
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(importlib.metadata, "packages_distributions", lambda: {"PIL": providers})
    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.setattr(PIL, "__version__", pil_version)
    pil_backend.cache_clear()
    try:
        assert pil_backend() == expected
    finally:
        pil_backend.cache_clear()


def test_decode_is_torch_free_and_exported_lazily() -> None:
    code = (
        "import sys, shardio, shardio.decode.image\n"
        "assert shardio.pil_backend is shardio.decode.image.pil_backend\n"
        "assert 'torch' not in sys.modules, 'shardio.decode.image imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- decode_image


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(
            kind,
            marks=pytest.mark.skipif(
                kind == "webp" and not features.check("webp"),
                reason="this Pillow build has no WebP support (built without libwebp)",
            ),
        )
        for kind in sorted(INPUTS)
    ],
)
def test_decode_matches_pil_loader_pixel_for_pixel(kind: str) -> None:
    data = INPUTS[kind]()
    img = decode_image(data)
    assert img.mode == "RGB"
    np.testing.assert_array_equal(image_to_array(img), _reference(data))


@pytest.mark.parametrize("kind", ["jpeg_rgb", "png_rgba"])
def test_decode_takes_a_memoryview_and_leaves_no_file_open(kind: str) -> None:
    data = INPUTS[kind]()
    img = decode_image(memoryview(data))
    assert getattr(img, "fp", None) is None
    np.testing.assert_array_equal(np.asarray(img.resize((8, 8))), np.asarray(
        Image.open(io.BytesIO(data)).convert("RGB").resize((8, 8))
    ))


def test_decode_to_grayscale_matches_convert_l() -> None:
    data = INPUTS["png_rgb"]()
    img = decode_image(data, mode="L")
    assert img.mode == "L"
    np.testing.assert_array_equal(
        image_to_array(img), np.asarray(Image.open(io.BytesIO(data)).convert("L"))
    )


def test_draft_decodes_a_large_jpeg_at_half_size(big_jpeg: bytes) -> None:
    img = decode_image(big_jpeg, draft_size=(240, 200))
    assert img.size == (240, 200)
    assert img.mode == "RGB"


@settings(max_examples=25, deadline=None)
@given(width=st.integers(1, 480), height=st.integers(1, 400))
def test_draft_is_never_smaller_than_asked_and_equals_pillow_draft(
    big_jpeg: bytes, width: int, height: int
) -> None:
    img = decode_image(big_jpeg, draft_size=(width, height))
    assert img.size[0] >= width and img.size[1] >= height
    assert img.size[0] <= 480 and img.size[1] <= 400
    if width <= 240 and height <= 200:
        assert img.size[0] < 480 and img.size[1] < 400
    with Image.open(io.BytesIO(big_jpeg)) as ref:
        ref.draft("RGB", (width, height))
        expected = np.asarray(ref.convert("RGB"))
    np.testing.assert_array_equal(image_to_array(img), expected)


def test_draft_is_ignored_for_png() -> None:
    data = make_photo(np.random.default_rng(5), 64, 48, fmt="PNG")
    img = decode_image(data, draft_size=(8, 6))
    assert img.size == (64, 48)
    np.testing.assert_array_equal(image_to_array(img), _reference(data))


@pytest.mark.parametrize("size", [(0, 10), (10, -1), (10,)])
def test_draft_size_must_be_two_positive_ints(size: Any, big_jpeg: bytes) -> None:
    with pytest.raises(ValueError, match="draft_size"):
        decode_image(big_jpeg, draft_size=size)


@pytest.mark.parametrize(
    "data",
    [b"", b"not an image at all", b"\xff\xd8\xff\xe0" + b"\x00" * 64, bytes(range(256)) * 4],
    ids=["empty", "text", "jpeg_magic_then_zeros", "binary"],
)
def test_undecodable_bytes_raise_decode_error_naming_the_key(data: bytes) -> None:
    with pytest.raises(DecodeError, match=re.escape("class_a/img_001.jpg")) as info:
        decode_image(data, key="class_a/img_001.jpg")
    err = info.value
    assert isinstance(err, ShardioError) and isinstance(err, ValueError)
    assert err.key == "class_a/img_001.jpg"
    assert err.__cause__ is not None
    assert f"{len(data)} bytes" in str(err)
    # The DataLoader re-raises worker errors as type(exc)(message).
    assert str(type(err)(str(err))) == str(err)


def test_truncated_jpeg_raises_decode_error(big_jpeg: bytes) -> None:
    with pytest.raises(DecodeError, match="cannot decode"):
        decode_image(big_jpeg[: len(big_jpeg) // 2])


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["jpeg_rgb", "png_rgb", "gif"]), cut=st.floats(0, 1))
def test_any_prefix_decodes_or_raises_decode_error(kind: str, cut: float) -> None:
    data = INPUTS[kind]()
    prefix = data[: int(len(data) * cut)]
    try:
        img = decode_image(prefix, key="k")
    except DecodeError as exc:
        assert exc.key == "k"
    else:
        assert img.mode == "RGB"


# ---------------------------------------------------------------- image_to_array


def test_image_to_array_is_hwc_uint8_and_read_only() -> None:
    img = decode_image(INPUTS["jpeg_rgb"]())
    arr = image_to_array(img)
    assert arr.shape == (47, 61, 3) and arr.dtype == np.uint8
    assert not arr.flags.writeable


def test_image_to_array_refuses_16_bit_images() -> None:
    with pytest.raises(ValueError, match="8-bit"):
        image_to_array(Image.new("I;16", (4, 4)))


# ---------------------------------------------------------------- collate (torch)


@pytest.fixture(scope="module")
def torch_mod() -> Any:
    return pytest.importorskip("torch")


def test_decode_tensor_is_uint8_chw_without_copy_warnings(torch_mod: Any) -> None:
    from shardio.torch.collate import decode_tensor

    data = INPUTS["jpeg_cmyk"]()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = decode_tensor(data)
    assert t.dtype == torch_mod.uint8 and tuple(t.shape) == (3, 30, 40)
    expected = torch_mod.from_numpy(_reference(data).copy()).permute(2, 0, 1)
    assert torch_mod.equal(t, expected)
    t[0, 0, 0] = 7  # writable, and only this tensor sees it
    assert int(t[0, 0, 0]) == 7


def test_decode_tensor_draft_and_error(torch_mod: Any, big_jpeg: bytes) -> None:
    from shardio.torch.collate import decode_tensor

    assert tuple(decode_tensor(big_jpeg, draft_size=(120, 100)).shape) == (3, 100, 120)
    with pytest.raises(DecodeError, match="'x'"):
        decode_tensor(b"junk", key="x")


def test_collate_stacks_equal_shapes_into_one_uint8_batch(torch_mod: Any) -> None:
    from shardio.torch.collate import collate_tensor, decode_tensor

    rng = np.random.default_rng(0)
    samples = [(decode_tensor(make_photo(rng, 24, 16)), label) for label in (3, 0, 2)]
    images, labels = collate_tensor(samples)
    assert isinstance(images, torch_mod.Tensor)
    assert images.dtype == torch_mod.uint8 and tuple(images.shape) == (3, 3, 16, 24)
    assert images.is_contiguous()
    for i, (image, _) in enumerate(samples):
        assert torch_mod.equal(images[i], image)
    assert labels.dtype == torch_mod.int64 and labels.tolist() == [3, 0, 2]


def test_collate_keeps_a_list_for_mixed_shapes(torch_mod: Any) -> None:
    from shardio.torch.collate import collate_tensor

    a = torch_mod.zeros((3, 4, 5), dtype=torch_mod.uint8)
    b = torch_mod.ones((3, 5, 4), dtype=torch_mod.uint8)
    images, labels = collate_tensor([(a, 1), (b, 2)])
    assert isinstance(images, list)
    assert torch_mod.equal(images[0], a) and torch_mod.equal(images[1], b)
    assert images[0].is_contiguous() and images[1].is_contiguous()
    # one storage for the whole batch: it crosses process boundaries as one segment
    assert images[0].untyped_storage().data_ptr() == images[1].untyped_storage().data_ptr()
    assert labels.tolist() == [1, 2] and labels.dtype == torch_mod.int64


def test_collate_refuses_what_is_not_image_label_pairs(torch_mod: Any) -> None:
    from shardio.torch.collate import collate_tensor

    image = torch_mod.zeros((3, 2, 2), dtype=torch_mod.uint8)
    with pytest.raises(ValueError, match="empty"):
        collate_tensor([])
    with pytest.raises(TypeError, match="sample 1"):
        collate_tensor([(image, 0), image])
    with pytest.raises(TypeError, match="decode='tensor'"):
        collate_tensor([(np.zeros((3, 2, 2), np.uint8), 0)])


class _JpegDataset:
    """A map-style dataset of JPEG bytes decoded to tensors in the worker."""

    def __init__(self, blobs: list[bytes]) -> None:
        self.blobs = blobs

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        from shardio.torch.collate import decode_tensor

        return decode_tensor(self.blobs[i]), i


def _collate_and_report_sharing(batch: Any) -> tuple[Any, Any, bool]:
    from shardio.torch.collate import collate_tensor

    images, labels = collate_tensor(batch)
    return images, labels, bool(images.is_shared())


def test_collated_batches_are_born_in_shared_memory_in_workers(torch_mod: Any) -> None:
    rng = np.random.default_rng(1)
    blobs = [make_photo(rng, 20, 12) for _ in range(6)]
    loader = torch_mod.utils.data.DataLoader(
        _JpegDataset(blobs), batch_size=3, num_workers=1, collate_fn=_collate_and_report_sharing
    )
    seen = []
    for images, labels, shared in loader:
        assert shared, "the worker's collate must allocate the batch in shared memory"
        assert images.dtype == torch_mod.uint8 and tuple(images.shape) == (3, 3, 12, 20)
        for row, label in zip(images, labels.tolist(), strict=True):
            expected = torch_mod.from_numpy(_reference(blobs[label]).copy()).permute(2, 0, 1)
            assert torch_mod.equal(row, expected)
        seen += labels.tolist()
    assert seen == list(range(6))


# ---------------------------------------------------------------- open_image (batch decoding)

JPEG_KINDS = {
    "jpeg_420": lambda: _encode(_photo(61, 47), "JPEG", subsampling=2, quality=90),
    "jpeg_422": lambda: _encode(_photo(61, 47), "JPEG", subsampling=1, quality=90),
    "jpeg_444": lambda: _encode(_photo(61, 47), "JPEG", subsampling=0, quality=95),
    "jpeg_progressive": lambda: _encode(_photo(64, 40), "JPEG", progressive=True),
}


@pytest.fixture(params=["pillow", "simplejpeg"])
def jpeg_decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every open_image test runs with Pillow alone and with simplejpeg for baseline JPEGs."""
    import shardio.decode.image

    fast = pytest.importorskip("simplejpeg") if request.param == "simplejpeg" else None
    monkeypatch.setattr(shardio.decode.image, "_simplejpeg", lambda: fast)
    return str(request.param)


@pytest.mark.parametrize("kind", sorted(set(INPUTS) - {"webp"}) + sorted(JPEG_KINDS))
def test_open_image_decodes_into_a_buffer_the_pixels_of_decode_image(
    kind: str, jpeg_decoder: str
) -> None:
    from shardio.decode.image import jpeg_decoder as which
    from shardio.decode.image import open_image

    data = {**INPUTS, **JPEG_KINDS}[kind]()
    pending = open_image(memoryview(data), key="k")
    out = np.full(pending.shape, 7, np.uint8)
    pending.decode_into(out)
    np.testing.assert_array_equal(out, _reference(data))
    assert which().split()[0].lower() in (jpeg_decoder, "pillow-simd", "pillow")


@pytest.mark.parametrize("kind", ["jpeg_rgb", "jpeg_gray", "jpeg_cmyk", *sorted(JPEG_KINDS)])
def test_decode_tensor_gives_the_pixels_of_pillow_with_either_decoder(
    kind: str, jpeg_decoder: str, torch_mod: Any
) -> None:
    from shardio.torch.collate import decode_tensor

    data = {**INPUTS, **JPEG_KINDS}[kind]()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t = decode_tensor(memoryview(data), key="k")
    np.testing.assert_array_equal(t.permute(1, 2, 0).numpy(), _reference(data))
    t[0, 0, 0] = 7  # writable, whichever decoder made it
    with pytest.raises(DecodeError, match="'k'"):
        decode_tensor(data[: len(data) // 2], key="k")


@pytest.mark.parametrize("private_helper", [True, False])
def test_shared_empty_is_shared_memory_of_the_size_asked(
    torch_mod: Any, monkeypatch: pytest.MonkeyPatch, private_helper: bool
) -> None:
    from shardio.torch.collate import shared_empty

    if not private_helper:  # torch without UntypedStorage._new_shared: share_memory_ instead
        monkeypatch.setattr(torch_mod.UntypedStorage, "_new_shared", None)
    flat = shared_empty(1000)
    assert flat.is_shared() and flat.dtype == torch_mod.uint8 and tuple(flat.shape) == (1000,)
    flat[999] = 5
    assert int(flat[999]) == 5


def test_open_image_draft_gives_the_draft_size(big_jpeg: bytes, jpeg_decoder: str) -> None:
    from shardio.decode.image import open_image

    pending = open_image(big_jpeg, draft_size=(120, 100))
    out = np.empty(pending.shape, np.uint8)
    pending.decode_into(out)
    assert pending.shape == (100, 120, 3)
    drafted = decode_image(big_jpeg, draft_size=(120, 100))
    np.testing.assert_array_equal(out, image_to_array(drafted))


def test_open_image_refuses_damaged_bytes_naming_the_key(
    big_jpeg: bytes, jpeg_decoder: str
) -> None:
    from shardio.decode.image import open_image

    with pytest.raises(DecodeError, match=re.escape("'a/b.jpg'")):
        open_image(b"not an image", key="a/b.jpg")
    pending = open_image(big_jpeg[: len(big_jpeg) // 2], key="a/c.jpg")  # the header is whole
    with pytest.raises(DecodeError, match=re.escape("'a/c.jpg'")) as info:
        pending.decode_into(np.empty(pending.shape, np.uint8))
    assert info.value.key == "a/c.jpg"


# ---------------------------------------------------------------- shardio.loader, decode="tensor"


@pytest.fixture(scope="module")
def image_packs(
    tmp_path_factory: pytest.TempPathFactory, imagefolder: Any
) -> dict[str, Any]:
    """``mixed``: the session ImageFolder (48-64 px, sizes differ); ``fixed``: 40x30 JPEGs."""
    import shardio

    root = tmp_path_factory.mktemp("decoded")
    rng = np.random.default_rng(5)
    for i in range(36):
        folder = root / "fixed" / f"class_{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"img_{i:03d}.jpg").write_bytes(make_photo(rng, 40, 30))
    out = {}
    for kind, src in (("mixed", imagefolder), ("fixed", root / "fixed")):
        out[kind] = root / f"{kind}-pack"
        shardio.pack(src, out[kind], num_workers=1, progress=False)
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["mixed", "fixed"])
def test_loader_decodes_each_batch_into_one_buffer_with_decode_tensor_pixels(
    torch_mod: Any, image_packs: dict[str, Any], kind: str, num_workers: int
) -> None:
    from shardio.torch.collate import decode_tensor
    from shardio.torch.dataset import StreamingDataset
    from shardio.torch.loader import loader

    path = image_packs[kind]
    raw = [([v.tobytes() for v in b.bytes("image")], b.labels.tolist())
           for b in loader(StreamingDataset(path, decode="raw", seed=2, lanes=2), batch_size=8,
                           num_workers=0)]
    decoded = loader(StreamingDataset(path, decode="tensor", seed=2, lanes=2), batch_size=8,
                     num_workers=num_workers)
    held = []
    for (blobs, labels), (images, got) in zip(raw, decoded, strict=True):
        assert got.dtype == torch_mod.int64 and got.tolist() == labels
        expected = [decode_tensor(blob) for blob in blobs]
        if len({e.shape for e in expected}) == 1:
            assert isinstance(images, torch_mod.Tensor) and images.dtype == torch_mod.uint8
            assert images.shape == (len(blobs), *expected[0].shape)
            assert images.is_contiguous(memory_format=torch_mod.channels_last)
        else:
            assert isinstance(images, list) and len(images) == len(blobs)
            base = images[0].untyped_storage().data_ptr()
            assert all(i.untyped_storage().data_ptr() == base for i in images)  # one buffer
        held.append((images, expected))
    assert kind == "mixed" or all(isinstance(images, torch_mod.Tensor) for images, _ in held)
    for images, expected in held:  # every batch held to the end: none was overwritten
        for image, want in zip(images, expected, strict=True):
            assert torch_mod.equal(image, want)
