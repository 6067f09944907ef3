"""End to end through real DataLoaders: coverage, balance, order, resume, errors; both backends."""

from __future__ import annotations

import collections
import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

import shardio
from shardio import ShardWriter, WriteOptions, read_manifest
from shardio.errors import (
    ChecksumError,
    DecodeError,
    ManifestNotFoundError,
    ResumeError,
    ShardMissingError,
)
from shardio.reading.batch import RecordBatch
from shardio.torch.badimage import BadImageWarning
from shardio.torch.dataset import StreamingDataset
from shardio.torch.decoders import Decode
from shardio.torch.indexed import IndexedDataset
from shardio.torch.loader import loader
from shardio.torch.state import merge_states

NUM_SAMPLES = 301


def payload(i: int) -> bytes:
    return i.to_bytes(4, "little") * (20 + i % 13)


def write_dataset(out: Path, backend: str, num: int = NUM_SAMPLES, codec: str = "zstd") -> Path:
    options = WriteOptions(backend=backend, codec=codec, max_shard_samples=64)
    with ShardWriter(out, options) as writer:
        for i in range(num):
            writer.write({"__key__": f"s/{i:05d}", "bin": payload(i), "n": i})
    return out


@pytest.fixture(scope="module", params=["records", "lmdb"])
def dataset_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp(request.param) / "ds", request.param)


def indices_of(batch: dict[str, Any]) -> list[int]:
    for i, data, n in zip(
        batch["__index__"].tolist(), batch["bin"], batch["n"].tolist(), strict=True
    ):
        assert data == payload(i) and n == i  # right bytes with the right index
    return list(batch["__index__"].tolist())


@pytest.mark.parametrize("num_workers", [0, 1, 2, 3])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ranks_cover_the_dataset_with_equal_counts(
    dataset_dir: Path, num_workers: int, world_size: int
) -> None:
    per_rank = []
    for rank in range(world_size):
        ds = StreamingDataset(dataset_dir, rank=rank, world_size=world_size, shuffle_buffer=32)
        got = [
            i
            for batch in DataLoader(ds, batch_size=16, num_workers=num_workers)
            for i in indices_of(batch)
        ]
        assert len(got) == len(ds)
        per_rank.append(got)
    assert len({len(r) for r in per_rank}) == 1
    counts = collections.Counter(i for r in per_rank for i in r)
    assert set(counts) == set(range(NUM_SAMPLES))
    padding = len(per_rank[0]) * world_size - NUM_SAMPLES
    assert sum(counts.values()) - NUM_SAMPLES == padding < world_size
    if world_size == 1:
        assert max(counts.values()) == 1


@pytest.mark.parametrize(("rank", "world_size", "error", "message"), [
    (0, 0, ValueError, "rank=0 and world_size=0 do not fit"),
    (3, 3, ValueError, "rank=3 and world_size=3 do not fit"),
    (-1, 2, ValueError, "rank=-1 and world_size=2 do not fit"),
    (0, None, ValueError, "pass both rank and world_size"),
    ("1", 2, TypeError, "must be integers"),
])
def test_explicit_rank_and_world_size_are_refused_when_the_dataset_is_built(
    dataset_dir: Path, rank: Any, world_size: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"StreamingDataset\\(.*{message}"):
        StreamingDataset(dataset_dir, rank=rank, world_size=world_size)


def test_drop_last_drops_the_tail(dataset_dir: Path) -> None:
    got = []
    for rank in range(2):
        ds = StreamingDataset(dataset_dir, rank=rank, world_size=2, drop_last=True)
        got.append([s["__index__"] for s in ds])
    assert [len(g) for g in got] == [150, 150]
    assert len(set(got[0]) | set(got[1])) == 300


def order(ds: StreamingDataset, num_workers: int = 2) -> list[int]:
    return [
        i
        for batch in DataLoader(ds, batch_size=8, num_workers=num_workers)
        for i in batch["__index__"].tolist()
    ]


def test_same_seed_same_order_other_epoch_other_order(dataset_dir: Path) -> None:
    first = order(StreamingDataset(dataset_dir, seed=3, shuffle_buffer=64))
    assert first == order(StreamingDataset(dataset_dir, seed=3, shuffle_buffer=64))
    ds = StreamingDataset(dataset_dir, seed=3, shuffle_buffer=64)
    ds.set_epoch(1)
    assert order(ds) != first and sorted(order(ds)) == sorted(first)
    assert first != order(StreamingDataset(dataset_dir, seed=4, shuffle_buffer=64))
    unshuffled = [s["__index__"] for s in StreamingDataset(dataset_dir, shuffle=False)]
    assert unshuffled == list(range(NUM_SAMPLES))


def test_loader_advances_epochs_with_persistent_workers(dataset_dir: Path) -> None:
    ds = StreamingDataset(dataset_dir, decode="raw", shuffle_buffer=64)
    shard_loader = loader(ds, batch_size=16, num_workers=2)
    epochs = [[i for b in shard_loader for i in b.indices.tolist()] for _ in range(2)]
    assert epochs[0] != epochs[1]
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(NUM_SAMPLES))
    assert len(shard_loader) == sum(1 for _ in shard_loader)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_resume_reproduces_the_remaining_order(dataset_dir: Path, num_workers: int) -> None:
    def make() -> Any:
        return loader(
            StreamingDataset(dataset_dir, decode="raw", shuffle_buffer=40),
            batch_size=10,
            num_workers=num_workers,
        )

    full = [b.indices.tolist() for b in make()]
    interrupted = make()
    for k, _batch in enumerate(interrupted):
        if k == 12:
            break
    state = interrupted.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert [b.indices.tolist() for b in resumed] == full[13:]
    # and the epoch after the resumed one is the normal next epoch
    fresh = make()
    assert [b.indices.tolist() for b in fresh] == full
    assert [b.indices.tolist() for b in resumed] == [b.indices.tolist() for b in fresh]


def test_resume_with_other_worker_count_yields_each_unseen_sample_once(dataset_dir: Path) -> None:
    first = loader(StreamingDataset(dataset_dir, decode="raw"), batch_size=10, num_workers=2)
    seen: list[int] = []
    for k, batch in enumerate(first):
        seen += batch.indices.tolist()
        if k == 6:
            break
    state = first.state_dict()
    second = loader(StreamingDataset(dataset_dir, decode="raw"), batch_size=10, num_workers=3)
    second.load_state_dict(state)
    rest = [i for b in second for i in b.indices.tolist()]
    assert sorted(seen + rest) == list(range(NUM_SAMPLES))


def test_resume_under_another_world_size(dataset_dir: Path) -> None:
    states, seen = [], []
    for rank in range(2):
        run = loader(
            StreamingDataset(dataset_dir, decode="raw", rank=rank, world_size=2),
            batch_size=10,
            num_workers=1,
        )
        for k, batch in enumerate(run):
            seen += batch.indices.tolist()
            if k == 3:
                break
        states.append(run.state_dict())
    merged = merge_states(states)
    rest = []
    for rank in range(3):
        run = loader(
            StreamingDataset(dataset_dir, decode="raw", rank=rank, world_size=3),
            batch_size=10,
            num_workers=2,
        )
        run.load_state_dict(merged)
        rest.append([i for b in run for i in b.indices.tolist()])
    assert len({len(r) for r in rest}) == 1
    assert set(seen) | {i for r in rest for i in r} == set(range(NUM_SAMPLES))
    assert not set(seen) & {i for r in rest for i in r}


def test_plain_dataloader_resume_via_batch_count(dataset_dir: Path) -> None:
    def make() -> tuple[StreamingDataset, DataLoader[Any]]:
        ds = StreamingDataset(dataset_dir, shuffle_buffer=40, batch_size=10)
        return ds, DataLoader(ds, batch_size=10, num_workers=2)

    full = [b["__index__"].tolist() for b in make()[1]]
    assert len(full) == len(make()[1]) == 31 and [len(b) for b in full[-2:]] == [10, 1]
    ds, dl = make()
    for k, _batch in enumerate(dl):
        if k == 8:
            break
    with pytest.raises(ResumeError, match=r"num_batches=.*shardio\.loader"):
        ds.state_dict()  # workers read the epoch: the main process cannot know where they are
    again, dl = make()
    again.load_state_dict(ds.state_dict(num_batches=9))
    assert [b["__index__"].tolist() for b in dl] == full[9:]


def test_plain_dataloader_without_batch_size_refuses_a_guess(dataset_dir: Path) -> None:
    ds = StreamingDataset(dataset_dir, shuffle_buffer=40)
    for k, _batch in enumerate(DataLoader(ds, batch_size=10, num_workers=2)):
        if k == 8:
            break
    with pytest.raises(ResumeError, match=r"StreamingDataset\(\.\.\., batch_size=10\)"):
        ds.state_dict(num_batches=9, batch_size=10, num_workers=2)


def test_record_batch_carries_contiguous_fields(dataset_dir: Path) -> None:
    batch = next(
        iter(loader(StreamingDataset(dataset_dir, decode="raw"), batch_size=8, num_workers=0))
    )
    assert isinstance(batch, RecordBatch) and len(batch) == 8
    assert isinstance(batch.buffer, bytes) and batch.nbytes == sum(len(v) for v in batch["bin"])
    for i, view, n in zip(batch.indices.tolist(), batch.bytes("bin"), batch["n"], strict=True):
        assert bytes(view) == payload(i) and int(n) == i
    sample = batch.sample(0)
    assert sample["bin"] == payload(sample["__index__"])


def test_indexed_dataset_random_access(dataset_dir: Path) -> None:
    ds = IndexedDataset(dataset_dir)
    assert len(ds) == NUM_SAMPLES
    assert ds[123]["bin"] == payload(123) and ds[-1]["n"] == NUM_SAMPLES - 1
    twice = ds.__getitems__([5, 300, 5, 64])
    assert [s["n"] for s in twice] == [5, 300, 5, 64]
    assert twice[0] == twice[2] and twice[0] is not twice[2]  # each free to change
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True)
    got = [
        i
        for b in DataLoader(ds, batch_size=16, sampler=sampler, num_workers=2)
        for i in b["n"].tolist()
    ]
    assert sorted(got) == sorted(sampler)
    ds.close()


def corrupt_one_record(root: Path) -> Path:
    shard = sorted(root.glob("shard-00001.*"))[0]
    data = bytearray(shard.read_bytes())
    needle = payload(64 + 5)
    at = data.find(needle)
    assert at > 0
    data[at + 3] ^= 0xFF
    shard.write_bytes(bytes(data))
    return shard


@pytest.mark.parametrize("backend", ["records", "lmdb"])
def test_corrupt_record_surfaces_as_named_error(tmp_path: Path, backend: str) -> None:
    root = write_dataset(tmp_path / "ds", backend, codec="none")
    shard = corrupt_one_record(root)
    ds = StreamingDataset(root, shuffle=False)
    batches = iter(DataLoader(ds, batch_size=8, num_workers=2))
    with pytest.raises(ChecksumError) as info:
        for _ in batches:
            pass
    # v3: the block holding record 5 is named, with its records
    named = re.search(r"block \d+.* \(records (\d+)\.\.(\d+)\)", str(info.value))
    assert shard.name in str(info.value) and named is not None
    assert int(named[1]) <= 5 <= int(named[2])
    # stop the workers now: left to the cycle collector, the DataLoader's queues may be
    # finalized before it and each worker then waits out a 5 s join timeout (a later test's)
    getattr(batches, "_shutdown_workers", lambda: None)()


def test_missing_shard_and_missing_manifest(tmp_path: Path) -> None:
    root = write_dataset(tmp_path / "ds", "records")
    (root / "shard-00002.rec").unlink()
    with pytest.raises(ShardMissingError, match=r"shard-00002\.rec.*manifest\.json"):
        list(StreamingDataset(root, shuffle=False))
    with pytest.raises(ManifestNotFoundError, match="shardio pack"):
        StreamingDataset(tmp_path)


def test_stateful_dataloader_resumes_exactly(dataset_dir: Path) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def make() -> Any:
        return stateful.StatefulDataLoader(
            StreamingDataset(dataset_dir, shuffle_buffer=40), batch_size=10, num_workers=2
        )

    full = [b["__index__"].tolist() for b in make()]
    interrupted = make()
    for k, _batch in enumerate(interrupted):
        if k == 9:
            break
    resumed = make()
    resumed.load_state_dict(interrupted.state_dict())
    assert [b["__index__"].tolist() for b in resumed] == full[10:]


@pytest.fixture(scope="module")
def packed_imagefolder(imagefolder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("packed") / "ds"
    shardio.pack(imagefolder, out, num_workers=1, progress=False,
                 options=WriteOptions(max_shard_samples=10))
    return out


def plain_imagefolder(root: Path) -> tuple[list[str], list[tuple[bytes, int]]]:
    """What a plain ImageFolder reading of ``root`` yields: classes and (pixels, label) pairs."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    pairs = []
    for label, name in enumerate(classes):
        for path in sorted((root / name).rglob("*.jpg")):
            with Image.open(path) as img:
                pairs.append((img.convert("RGB").tobytes(), label))
    return classes, pairs


@pytest.mark.parametrize("num_workers", [0, 2])
def test_imagefolder_pack_yields_what_imagefolder_yields(
    imagefolder: Path, packed_imagefolder: Path, num_workers: int
) -> None:
    classes, expected = plain_imagefolder(imagefolder)
    ds = StreamingDataset(packed_imagefolder, target_transform=int)
    assert list(ds.manifest.classes or ()) == classes
    assert dict(ds.manifest.class_to_idx or {}) == {c: i for i, c in enumerate(classes)}
    got = []
    for images, labels in DataLoader(ds, batch_size=5, num_workers=num_workers,
                                     collate_fn=lambda b: tuple(zip(*b, strict=True))):
        for image, label in zip(images, labels, strict=True):
            assert isinstance(image, Image.Image) and image.mode == "RGB"
            assert type(label) is int
            got.append((image.tobytes(), label))
    assert sorted(got) == sorted(expected)


def test_tensor_decode_through_loader(imagefolder: Path, packed_imagefolder: Path) -> None:
    _, expected = plain_imagefolder(imagefolder)
    ds = StreamingDataset(packed_imagefolder, decode="tensor")
    got = []
    for images, labels in loader(ds, batch_size=6, num_workers=2):
        assert labels.dtype == torch.int64
        for image, label in zip(images, labels.tolist(), strict=True):
            assert image.dtype == torch.uint8 and image.shape[0] == 3
            got.append((image.permute(1, 2, 0).contiguous().numpy().tobytes(), label))
    assert sorted(got) == sorted(expected)


@pytest.mark.parametrize("crop", [None, 12])
def test_tensor_decode_through_a_plain_dataloader_with_workers(
    imagefolder: Path, packed_imagefolder: Path, crop: int | None
) -> None:
    _, expected = plain_imagefolder(imagefolder)
    if crop is not None:
        centre = shardio.CenterCrop(crop)
        reference = StreamingDataset(packed_imagefolder, decode="tensor", crop=centre)
        expected = sorted((image.permute(1, 2, 0).contiguous().numpy().tobytes(), label)
                          for image, label in reference)
    ds = StreamingDataset(packed_imagefolder, decode="tensor", batch_size=6,
                          **({} if crop is None else {"crop": shardio.CenterCrop(crop)}))
    got, blocks, batches = [], 0, 0
    for images, labels in DataLoader(ds, batch_size=6, num_workers=2,
                                     collate_fn=lambda b: tuple(zip(*b, strict=True))):
        # a worker decodes a group of samples into one block: one descriptor crosses
        blocks += len({image.untyped_storage().data_ptr() for image in images})
        batches += 1
        for image, label in zip(images, labels, strict=True):
            assert image.dtype == torch.uint8 and image.shape[0] == 3 and type(label) is int
            got.append((image.permute(1, 2, 0).contiguous().numpy().tobytes(), label))
    assert sorted(got) == sorted(expected)
    assert blocks <= 2 * batches < len(got)


@pytest.mark.parametrize("crop", [None, 12])
def test_indexed_tensor_decode_with_workers_shares_a_block_a_batch(
    packed_imagefolder: Path, crop: int | None
) -> None:
    options: dict[str, Any] = {} if crop is None else {"crop": shardio.CenterCrop(crop)}
    reference = IndexedDataset(packed_imagefolder, decode="tensor", **options)
    ds = IndexedDataset(packed_imagefolder, decode="tensor", **options)
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(5)).tolist()
    got, blocks = [], []
    for images, labels in DataLoader(ds, batch_size=6, num_workers=2, sampler=order,
                                     collate_fn=lambda b: tuple(zip(*b, strict=True))):
        blocks.append(len({image.untyped_storage().data_ptr() for image in images}))
        got += zip(images, labels, strict=True)
    assert blocks == [1] * len(blocks)  # __getitems__: a batch's images in one block
    assert len(got) == len(order)
    for i, (image, label) in zip(order, got, strict=True):
        want, want_label = reference[i]
        assert label == want_label and torch.equal(image, want)


def test_a_bad_image_fails_at_its_own_sample_in_a_worker(
    imagefolder: Path, tmp_path: Path
) -> None:
    files = sorted(imagefolder.rglob("*.jpg"))
    victim, junk = files[5:9:3]
    classes = sorted(p.name for p in imagefolder.iterdir() if p.is_dir())
    out = tmp_path / "ds"
    with ShardWriter(out, classes=classes) as writer:  # pack itself refuses both files
        for path in files:
            data = path.read_bytes()
            if path == victim:
                data = data[:-400]  # the header survives, the pixels do not
            elif path == junk:
                data = b"not an image at all"  # refused at its header, before any pixels
            writer.write({"__key__": path.relative_to(imagefolder).as_posix(), "image": data,
                          "label": classes.index(path.parent.name)})
    key = victim.relative_to(imagefolder).as_posix()
    raw = StreamingDataset(out, decode="raw", shuffle=False)
    keys = [s["__key__"] for s in raw]
    assert key in keys
    ds = StreamingDataset(out, decode="tensor", shuffle=False)
    got = 0
    with pytest.raises(Exception, match=re.escape(repr(key))):
        for _batch in DataLoader(ds, batch_size=1, num_workers=1, collate_fn=list):
            got += 1
    assert got == keys.index(key)  # every sample before it, none after
    indexed = IndexedDataset(out, decode="tensor")
    pair = [keys.index(key), keys.index(junk.relative_to(imagefolder).as_posix())]
    with pytest.raises(Exception, match=re.escape(repr(key))):  # the first bad one names it
        list(DataLoader(indexed, batch_size=2, sampler=pair, num_workers=1, collate_fn=list))


MISFITS = {"bad/no_label": "has no 'label'",
           "bad/label_99": "has label 99, not an index into the 2 classes",
           "bad/image_str": "has an image of type str, not bytes"}


@pytest.fixture(scope="module")
def misfit_pack(imagefolder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six good ImageFolder records and the three ``MISFITS``, under a manifest that names two
    classes (given after writing: the writer refuses such records for a dataset with classes)."""
    jpgs = [path.read_bytes() for path in sorted(imagefolder.rglob("*.jpg"))[:6]]
    out = tmp_path_factory.mktemp("misfit") / "ds"
    with ShardWriter(out, WriteOptions(max_shard_samples=4)) as writer:
        for i, data in enumerate(jpgs):
            writer.write({"__key__": f"good/{i}", "image": data, "label": i % 2})
        writer.write({"__key__": "bad/no_label", "image": jpgs[0]})
        writer.write({"__key__": "bad/label_99", "image": jpgs[1], "label": 99})
        writer.write({"__key__": "bad/image_str", "image": "x", "label": 0})
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.update(classes=["a", "b"], class_to_idx={"a": 0, "b": 1})
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.mark.parametrize("decode", ["pil", "tensor"])
def test_a_record_that_does_not_fit_the_imagefolder_layout_is_a_named_decode_error(
    misfit_pack: Path, decode: Decode
) -> None:
    raw = IndexedDataset(misfit_pack, decode="raw")
    at = {raw[i]["__key__"]: i for i in range(len(raw))}
    ds = IndexedDataset(misfit_pack, decode=decode)
    for key, problem in MISFITS.items():
        with pytest.raises(DecodeError, match=f"'{key}'.*{problem}.*does not fit the "
                           "dataset's layout.*shardio verify") as caught:
            ds[at[key]]
        assert caught.value.key == key
        with pytest.raises(DecodeError, match=re.escape(repr(key))):  # a batch in-process
            ds.__getitems__([at["good/0"], at[key]])
    # a worker's batch (tensor: its images decoded together into shared memory); one misfit
    # is enough there, as all three fail the one check before any image is opened
    with pytest.raises(DecodeError, match="'bad/image_str'"):
        list(DataLoader(ds, batch_size=2, sampler=[at["good/0"], at["bad/image_str"]],
                        num_workers=1, collate_fn=list))
    # streamed, such a record is skipped like an image that does not decode
    streamed = StreamingDataset(misfit_pack, decode=decode, on_bad_image="skip")
    labels = [label for _image, label in DataLoader(streamed, batch_size=None, num_workers=1)]
    assert sorted(labels) == [0, 0, 0, 1, 1, 1]
    assert streamed.skipped_images.count == len(MISFITS)


def test_shardio_loader_and_fields_refuse_a_label_outside_the_classes(misfit_pack: Path) -> None:
    # the loader's batch decoder (decode="tensor") skips each misfit, or names the first
    streamed = StreamingDataset(misfit_pack, decode="tensor", on_bad_image="skip")
    with pytest.warns(BadImageWarning, match="skipped 3 sample"):
        labels = [label for _images, batch in loader(streamed, batch_size=4, num_workers=0)
                  for label in batch.tolist()]
    assert sorted(labels) == [0, 0, 0, 1, 1, 1]
    with pytest.raises(DecodeError, match="does not fit the dataset's layout"):
        list(loader(StreamingDataset(misfit_pack, decode="tensor"), batch_size=4, num_workers=0))
    # fields= naming the label: a stored label must index the classes too
    raw = IndexedDataset(misfit_pack, decode="raw")
    at = {raw[i]["__key__"]: i for i in range(len(raw))}
    fields = IndexedDataset(misfit_pack, decode="tensor", fields=("image", "label"))
    assert fields[at["good/1"]][1] == 1
    with pytest.raises(DecodeError, match=f"'bad/label_99'.*{MISFITS['bad/label_99']}"):
        fields[at["bad/label_99"]]
    with pytest.raises(DecodeError, match="'bad/image_str'"):  # its images decoded together
        list(DataLoader(fields, batch_size=2, sampler=[at["good/0"], at["bad/image_str"]],
                        num_workers=1, collate_fn=list))


def test_loader_breaking_early_moves_on_to_the_next_epoch(dataset_dir: Path) -> None:
    def make() -> Any:
        return loader(StreamingDataset(dataset_dir, decode="raw"), batch_size=10, num_workers=0)

    reference = make()
    epochs = [[i for b in reference for i in b.indices.tolist()] for _ in range(2)]
    run = make()
    for k, _batch in enumerate(run):
        if k == 2:
            break
    assert run.state_dict()["epoch"] == 0
    assert [i for b in run for i in b.indices.tolist()] == epochs[1]
    assert run.state_dict()["epoch"] == 2  # epoch 1 finished: the next state starts epoch 2
    resumed = make()
    state = reference.state_dict()
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state


@pytest.fixture(scope="module")
def forty(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("forty") / "ds", "records", num=40)


@pytest.mark.parametrize("num_workers", [2, 3])
def test_every_batch_is_full_but_the_last(forty: Path, num_workers: int) -> None:
    run = loader(StreamingDataset(forty, decode="raw"), batch_size=16, num_workers=num_workers)
    assert [len(b) for b in run] == [16, 16, 8] and len(run) == 3
    dropping = loader(StreamingDataset(forty, decode="raw"), batch_size=16,
                      num_workers=num_workers, drop_last=True)
    assert [len(b) for b in dropping] == [16, 16] and len(dropping) == 2
    for drop_last, sizes in ((False, [16, 16, 8]), (True, [16, 16])):
        ds = StreamingDataset(forty, batch_size=16)
        plain = DataLoader(ds, batch_size=16, num_workers=num_workers, drop_last=drop_last)
        got = [b["__index__"].tolist() for b in plain]
        assert [len(b) for b in got] == sizes and len(plain) == len(sizes)
        assert len({i for b in got for i in b}) == sum(sizes)


def test_loader_follows_set_epoch(dataset_dir: Path) -> None:
    def epoch(number: int) -> list[int]:
        ds = StreamingDataset(dataset_dir, decode="raw", shuffle_buffer=64)
        ds.set_epoch(number)
        return [s["__index__"] for s in ds]

    ds = StreamingDataset(dataset_dir, decode="raw", shuffle_buffer=64)
    run = loader(ds, batch_size=50, num_workers=0)
    assert [i for b in run for i in b.indices.tolist()] == epoch(0)
    ds.set_epoch(5)
    assert [i for b in run for i in b.indices.tolist()] == epoch(5)
    assert run.epoch == 5
    assert [i for b in run for i in b.indices.tolist()] == epoch(6)  # then it counts on
    ds.set_epoch(6)  # the epoch just read, asked for again
    assert [i for b in run for i in b.indices.tolist()] == epoch(6)


def test_merge_states_refuses_states_of_other_runs(dataset_dir: Path) -> None:
    def state(rank: int, **options: Any) -> dict[str, Any]:
        ds = StreamingDataset(dataset_dir, decode="raw", rank=rank, world_size=2, **options)
        return ds.state_dict()

    assert merge_states([state(0), state(1)])["consumed"] == {"0": [0], "1": [0]}
    # v3: a plan's block size is a multiple of the blocks stored (``plan.whole_blocks``)
    stored = read_manifest(dataset_dir).block_records or 1
    planned = StreamingDataset(dataset_dir, decode="raw").config.block_size
    other_blocks = stored * (3 if planned != 3 * stored else 5)
    for other, what in (
        ({"seed": 1}, "seed=1; state 0 has seed=0"),
        ({"shuffle": False}, "shuffle=False"),
        ({"shuffle_buffer": 99, "block_size": 8}, "window=99"),
        ({"block_size": other_blocks}, f"block_size={other_blocks}"),
    ):
        with pytest.raises(ResumeError, match=what):
            merge_states([state(0), state(1, **other)])
    later = StreamingDataset(dataset_dir, decode="raw", rank=1, world_size=2)
    later.set_epoch(1)
    with pytest.raises(ResumeError, match="epoch=1"):
        merge_states([state(0), later.state_dict()])
    with pytest.raises(ResumeError, match="rank 0 appears twice"):
        merge_states([state(0), {**state(0), "consumed": {"0": [5]}}])
    with pytest.raises(ResumeError, match="window=99"):  # loading checks the order too
        StreamingDataset(dataset_dir, shuffle_buffer=99, block_size=128).load_state_dict(
            merge_states([state(0), state(1)])
        )


def test_only_a_pack_shuffled_when_written_has_its_first_window_read_block_first(
        tmp_path: Path) -> None:
    """``head_first`` yields the first window's first block before the rest: a shuffled
    pack's blocks are mixed already, a class-ordered one's are one class each."""
    src = tmp_path / "src"
    for c in range(4):
        (src / f"c{c}").mkdir(parents=True)
        for i in range(50):
            (src / f"c{c}" / f"{i}.bin").write_bytes(bytes([c, i]))
    for shuffle in (True, False):
        out = tmp_path / f"out-{shuffle}"
        shardio.pack(src, out, shuffle=shuffle, class_folders=True, progress=False)
        config = StreamingDataset(out, decode="raw").config
        assert config.head == (config.block_size if shuffle else 0)


def _damaged(state: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(state)
    at = out
    for key in path[:-1]:
        at = at[key]
    if path:
        at[path[-1]] = value
    else:
        out = value
    return out


@pytest.mark.parametrize(("path", "value"), [
    ((), {}), (("epoch",), None), (("epoch",), -1), (("consumed",), None),
    (("order",), 5), (("prior",), {}), (("num_workers",), 0), (("world_size",), 0),
    (("consumed", "0"), [-5]), (("consumed", "0"), [10 ** 12]), (("consumed",), {"9": [1]}),
])
def test_a_damaged_state_is_refused_with_a_resume_error(dataset_dir: Path, path: tuple[Any, ...],
                                                        value: Any) -> None:
    # these once came out as KeyError, TypeError, AttributeError, or (a negative count) as an
    # epoch that quietly yielded a few samples past the end
    ds = StreamingDataset(dataset_dir, decode="raw", batch_size=10)
    good = ds.state_dict(num_batches=1)
    with pytest.raises(ResumeError, match=re.escape(str(dataset_dir)) + "|state_dict"):
        StreamingDataset(dataset_dir, decode="raw", batch_size=10).load_state_dict(
            _damaged(good, path, value))
    for position in (-1, NUM_SAMPLES + 1, "3", 2.0):  # a DataLoader worker's own state
        with pytest.raises(ResumeError, match="position"):
            ds.load_state_dict({"epoch": 0, "split": [0, 1, 0, 1], "position": position})
    again = StreamingDataset(dataset_dir, decode="raw", batch_size=10)
    again.load_state_dict(good)
    assert len(list(again)) == NUM_SAMPLES - 10
