"""DevicePrefetcher: CPU pass-through and conversion everywhere, the CUDA path where CUDA exists."""

from __future__ import annotations

import multiprocessing
from collections import namedtuple
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from shardio.torch.prefetch import DevicePrefetcher  # noqa: E402  (after the torch skip)

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the CUDA stream path needs a CUDA device"
)
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
Pair = namedtuple("Pair", ["images", "labels"])


def _images(batch: int = 2, seed: int = 0, h: int = 5, w: int = 4) -> Any:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, 3, h, w), dtype=torch.uint8, generator=gen)


def _nested(seed: int) -> dict[str, Any]:
    return {
        "pair": Pair(_images(seed=seed), torch.arange(2)),
        "extra": [_images(batch=1, seed=seed + 1)[0], "key", 3, None],
        "mask": torch.zeros((2, 5), dtype=torch.uint8),
        "float": torch.full((2, 3), 0.5),
    }


def _reference(x: Any, *, mean: Any = None, std: Any = None) -> Any:
    out = x.to(torch.float32) / 255
    if mean is not None:
        out = (out - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)
    return out


class _Loader:
    """An iterable with a length whose iterators record being closed."""

    def __init__(self, batches: list[Any]) -> None:
        self.batches = batches
        self.closed = 0

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        try:
            yield from self.batches
        finally:
            self.closed += 1


class _Movable:
    """A batch object with its own ``to``; records the calls it gets."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def to(self, device: Any, non_blocking: bool = False) -> _Movable:
        self.calls.append((torch.device(device), non_blocking))
        return self


# ---------------------------------------------------------------- CPU


def test_exported_as_shardio_device_prefetcher() -> None:
    import shardio

    assert shardio.DevicePrefetcher is DevicePrefetcher


def test_cpu_without_conversion_yields_the_very_same_batches() -> None:
    batches = [_nested(i) for i in range(3)]
    loader = _Loader(batches)
    out = list(DevicePrefetcher(loader, "cpu"))
    assert len(out) == 3
    assert all(a is b for a, b in zip(out, batches, strict=True))
    assert loader.closed == 1


def test_cpu_conversion_keeps_structure_and_leaves() -> None:
    batch = _nested(0)
    movable = _Movable()
    batch["movable"] = movable
    (out,) = DevicePrefetcher([batch], "cpu", convert_float=True, mean=MEAN, std=STD)
    assert type(out["pair"]) is Pair and type(out["extra"]) is list
    torch.testing.assert_close(
        out["pair"].images, _reference(batch["pair"].images, mean=MEAN, std=STD)
    )
    torch.testing.assert_close(
        out["extra"][0], _reference(batch["extra"][0], mean=MEAN, std=STD)
    )
    assert out["pair"].labels is batch["pair"].labels
    assert out["mask"] is batch["mask"], "2-D uint8 tensors are not images"
    assert out["float"] is batch["float"]
    assert out["extra"][1:] == ["key", 3, None]
    assert out["movable"] is movable and movable.calls == [], "CPU must not call .to()"


def test_convert_float_alone_divides_by_255_and_does_not_touch_the_input() -> None:
    images = _images(seed=4)
    before = images.clone()
    (out,) = DevicePrefetcher([(images, 1)], "cpu", convert_float=True)
    assert out[0].dtype == torch.float32
    torch.testing.assert_close(out[0], before.float() / 255)
    assert out[1] == 1
    assert torch.equal(images, before)
    assert float(out[0].min()) >= 0 and float(out[0].max()) <= 1


@pytest.mark.parametrize("convert_float", [False, True])
def test_channels_last_applies_to_4d_images(convert_float: bool) -> None:
    images = _images(batch=3, h=6, w=7)
    (out,) = DevicePrefetcher(
        [[images, images[0]]], "cpu", convert_float=convert_float, channels_last=True
    )
    batch, single = out
    assert batch.is_contiguous(memory_format=torch.channels_last)
    assert not batch.is_contiguous()
    expected = images.float() / 255 if convert_float else images
    torch.testing.assert_close(batch, expected)
    assert single.dim() == 3
    torch.testing.assert_close(single, expected[0])


def test_normalisation_refuses_a_channel_count_mismatch() -> None:
    gray = torch.zeros((2, 1, 4, 4), dtype=torch.uint8)
    prefetcher = DevicePrefetcher([gray], "cpu", convert_float=True, mean=MEAN, std=STD)
    with pytest.raises(ValueError, match=r"3 channels.*has 1"):
        next(iter(prefetcher))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"convert_float": True, "mean": MEAN}, "together"),
        ({"convert_float": True, "mean": MEAN, "std": STD[:2]}, "one value per channel"),
        ({"convert_float": True, "mean": MEAN, "std": (0.2, 0.0, 0.2)}, "must not contain 0"),
        ({"mean": MEAN, "std": STD}, "convert_float=True"),
    ],
)
def test_bad_normalisation_options_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DevicePrefetcher([], "cpu", **kwargs)


def test_len_delegates_to_the_loader() -> None:
    assert len(DevicePrefetcher(_Loader([1, 2, 3]), "cpu")) == 3
    with pytest.raises(TypeError, match="no len"):
        len(DevicePrefetcher(iter([1]), "cpu"))


def test_no_device_is_the_cpu_pass_through() -> None:
    batch = _nested(1)
    prefetcher = DevicePrefetcher([batch], None)
    assert prefetcher.device == torch.device("cpu")
    assert list(prefetcher) == [batch]
    (out,) = DevicePrefetcher([batch], None, convert_float=True)
    torch.testing.assert_close(out["pair"].images, _reference(batch["pair"].images))


@pytest.mark.parametrize("convert_float", [False, True])
def test_breaking_early_closes_the_loader_iterator(convert_float: bool) -> None:
    loader = _Loader([_nested(i) for i in range(5)])
    seen = 0
    for _ in DevicePrefetcher(loader, "cpu", convert_float=convert_float):
        seen += 1
        if seen == 2:
            break
    assert seen == 2
    assert loader.closed == 1


def test_re_iterating_starts_over() -> None:
    loader = _Loader([(_images(seed=i), i) for i in range(3)])
    prefetcher = DevicePrefetcher(loader, "cpu", convert_float=True)
    first = [label for _, label in prefetcher]
    second = [label for _, label in prefetcher]
    assert first == second == [0, 1, 2]
    assert loader.closed == 2


class _Range(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return torch.full((3, 2, 2), i, dtype=torch.uint8), i


def test_breaking_early_out_of_a_worker_dataloader_leaves_no_workers() -> None:
    loader = torch.utils.data.DataLoader(_Range(), batch_size=4, num_workers=2)
    prefetcher = DevicePrefetcher(loader, "cpu", convert_float=True)
    assert len(prefetcher) == 16
    for images, labels in prefetcher:
        torch.testing.assert_close(images[:, 0, 0, 0] * 255, labels.float())
        break
    assert multiprocessing.active_children() == []


class _Counting:
    """A resumable loader of ints whose state is how many batches it has given out."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.taken = 0
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        self.taken = self.start
        for i in range(self.start, self.n):
            self.taken = i + 1
            yield i
        self.start = 0

    def state_dict(self) -> dict[str, int]:
        return {"taken": self.taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.start = state["taken"]


@pytest.mark.parametrize("convert_float", [False, True])
def test_cpu_runs_one_ahead_and_its_state_counts_only_handed_over_batches(
    convert_float: bool,
) -> None:
    loader = _Counting(5)
    prefetcher = DevicePrefetcher(loader, "cpu", convert_float=convert_float)
    assert prefetcher.state_dict() == {"taken": 0}
    for i, batch in enumerate(prefetcher):
        assert batch == i
        # The same look-ahead as on CUDA: the next batch is already taken...
        assert loader.taken == min(i + 2, 5)
        # ...but a checkpoint counts only what the loop was handed.
        assert prefetcher.state_dict() == {"taken": i + 1}
    assert prefetcher.state_dict() == {"taken": 5}
    prefetcher.load_state_dict({"taken": 3})
    assert list(prefetcher) == [3, 4]


def test_state_of_a_loader_without_one_is_refused_with_what_to_use() -> None:
    prefetcher = DevicePrefetcher([1, 2], "cpu")
    assert list(prefetcher) == [1, 2]
    with pytest.raises(TypeError, match=r"has no state_dict\(\).*shardio.loader"):
        prefetcher.state_dict()
    with pytest.raises(TypeError, match="has no load_state_dict"):
        prefetcher.load_state_dict({})


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from shardio import ShardWriter, WriteOptions

    path = tmp_path_factory.mktemp("prefetch") / "ds"
    with ShardWriter(path, WriteOptions(max_shard_samples=32)) as writer:
        for i in range(90):
            writer.write({"__key__": f"k/{i:03d}", "bin": i.to_bytes(2, "little")})
    return path


def _epochs(prefetcher: Any, until: int) -> list[list[str]]:
    """Batches (as key lists) over as many ``iter()`` rounds as it takes to reach ``until``."""
    out: list[list[str]] = []
    for _ in range(3):
        out += [list(batch.keys) for batch in prefetcher]
        if len(out) >= until:
            break
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
def test_checkpoint_in_the_prefetch_loop_resumes_exactly(small_pack: Any, num_workers: int) -> None:
    import json

    import shardio

    def fresh() -> Any:
        dataset = shardio.StreamingDataset(small_pack, decode="raw", seed=7)
        batches = shardio.loader(dataset, batch_size=8, num_workers=num_workers)
        return DevicePrefetcher(batches, "cpu")

    prefetcher = fresh()  # the uninterrupted run: two epochs
    epoch0 = [list(batch.keys) for batch in prefetcher]
    reference = epoch0 + [list(batch.keys) for batch in prefetcher]
    del prefetcher
    n = len(epoch0)
    assert sorted(k for b in epoch0 for k in b) == [f"k/{i:03d}" for i in range(90)]
    for k in sorted({0, 1, n // 2, n - 1, n}):
        prefetcher = fresh()
        got: list[list[str]] = []
        state = prefetcher.state_dict()  # k == 0: saved before the first step
        for batch in prefetcher if k > 0 else ():
            got.append(list(batch.keys))  # the step trains on the batch, then checkpoints
            if len(got) == k:
                state = prefetcher.state_dict()
                break
        del prefetcher  # the job dies; a new one loads the checkpoint
        resumed = fresh()
        resumed.load_state_dict(json.loads(json.dumps(state)))
        got += _epochs(resumed, len(reference) - len(got))
        assert got == reference, f"checkpoint after {k} of {n} batches"


leaves = st.one_of(
    st.integers(),
    st.text(max_size=3),
    st.none(),
    st.builds(
        lambda shape, seed: torch.randint(
            0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
        ),
        st.lists(st.integers(1, 3), min_size=1, max_size=4).map(tuple),
        st.integers(0, 2**16),
    ),
    st.builds(lambda n: torch.arange(n, dtype=torch.int64), st.integers(0, 4)),
)
batches = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=2), inner, max_size=3),
    ),
    max_leaves=8,
)


def _assert_converted(out: Any, src: Any) -> None:
    """``out`` is ``src`` with each 3-D/4-D uint8 tensor divided by 255, all else as it was."""
    assert type(out) is type(src)
    if isinstance(src, torch.Tensor):
        if src.dtype == torch.uint8 and src.dim() in (3, 4):
            torch.testing.assert_close(out, src.float() / 255)
        else:
            assert out is src
    elif isinstance(src, dict):
        assert out.keys() == src.keys()
        for key in src:
            _assert_converted(out[key], src[key])
    elif isinstance(src, (list, tuple)):
        assert len(out) == len(src)
        for a, b in zip(out, src, strict=True):
            _assert_converted(a, b)
    else:
        assert out is src


@settings(max_examples=40, deadline=None)
@given(batch=batches)
def test_conversion_reaches_every_image_leaf_of_any_structure(batch: Any) -> None:
    (out,) = DevicePrefetcher([batch], "cpu", convert_float=True)
    _assert_converted(out, batch)


# ---------------------------------------------------------------- CUDA


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("pin", [False, True])
def test_cuda_batches_arrive_on_the_device_with_the_same_values(pin: bool) -> None:
    batches = [_nested(i) for i in range(6)]
    if pin:
        batches = [
            {**b, "pair": Pair(b["pair"].images.pin_memory(), b["pair"].labels.pin_memory())}
            for b in batches
        ]
    out = list(DevicePrefetcher(_Loader(batches), "cuda"))
    assert len(out) == 6
    for got, src in zip(out, batches, strict=True):
        assert type(got["pair"]) is Pair
        assert got["pair"].images.is_cuda and got["mask"].is_cuda
        assert torch.equal(got["pair"].images.cpu(), src["pair"].images)
        assert torch.equal(got["extra"][0].cpu(), src["extra"][0])
        assert got["extra"][1:] == ["key", 3, None]


@pytest.mark.gpu
@needs_cuda
def test_cuda_conversion_matches_the_cpu_conversion() -> None:
    batches = [Pair(_images(batch=4, seed=i, h=9, w=8), torch.arange(4)) for i in range(4)]
    options: dict[str, Any] = {
        "convert_float": True, "mean": MEAN, "std": STD, "channels_last": True
    }
    cpu = list(DevicePrefetcher(batches, "cpu", **options))
    gpu = list(DevicePrefetcher(batches, "cuda", **options))
    for a, b in zip(gpu, cpu, strict=True):
        assert a.images.is_cuda and a.images.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(a.images.cpu(), b.images)
        assert torch.equal(a.labels.cpu(), b.labels)


@pytest.mark.gpu
@needs_cuda
def test_cuda_values_survive_a_consumer_on_another_stream() -> None:
    batches = [(_images(batch=8, seed=i, h=64, w=64), i) for i in range(20)]
    consumer = torch.cuda.Stream()
    totals = []
    with torch.cuda.stream(consumer):
        for images, i in DevicePrefetcher(batches, "cuda", convert_float=True):
            # Heavy work on the consumer stream while the next copy is in flight.
            scratch = images.repeat(1, 4, 1, 1).mul_(2.0).sum()
            totals.append((i, scratch))
            del images
    torch.cuda.synchronize()
    for i, total in totals:
        expected = (batches[i][0].double() / 255 * 2).sum() * 4
        torch.testing.assert_close(total.double().cpu(), expected, rtol=1e-5, atol=1e-2)


@pytest.mark.gpu
@needs_cuda
def test_cuda_moves_objects_with_their_own_to_and_breaks_cleanly() -> None:
    movables = [_Movable() for _ in range(4)]
    loader = _Loader([(m, _images(seed=i)) for i, m in enumerate(movables)])
    for i, (movable, images) in enumerate(DevicePrefetcher(loader, "cuda")):
        assert movable is movables[i] and images.is_cuda
        assert movable.calls == [(torch.device("cuda", torch.cuda.current_device()), True)]
        if i == 1:
            break
    assert loader.closed == 1
    assert movables[3].calls == []
