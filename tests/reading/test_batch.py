"""RecordBatch: the union of the samples' fields, None where a sample lacks one."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import shardio
from shardio.reading.batch import RecordBatch
from shardio.torch.dataset import StreamingDataset
from shardio.torch.loader import loader

NUM_STEMS = 60


def _texted(i: int) -> bool:
    """Only every fifth stem has a ``.txt``: most batches start with a sample without one."""
    return i % 5 == 3


@pytest.fixture(scope="module")
def partial_pack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    """A generic tree where every stem has ``.bin`` and only some a ``.txt``, packed."""
    root = tmp_path_factory.mktemp("partial")
    expected: dict[str, dict] = {}
    for i in range(NUM_STEMS):
        folder = root / "src" / f"g{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        sample: dict[str, bytes | None] = {"bin": bytes([i]) * (3 + i), "txt": None}
        (folder / f"s{i:03d}.bin").write_bytes(sample["bin"] or b"")
        if _texted(i):
            sample["txt"] = f"note {i}".encode()
            (folder / f"s{i:03d}.txt").write_bytes(sample["txt"])
        expected[f"g{i % 3}/s{i:03d}"] = sample
    shardio.pack(root / "src", root / "out", imagefolder=False, num_workers=1, progress=False)
    return root / "out", expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_batches_keep_fields_the_first_sample_lacks(
    partial_pack: tuple[Path, dict[str, dict]], num_workers: int
) -> None:
    path, expected = partial_pack
    dataset = StreamingDataset(path, decode="raw", seed=1)
    seen: dict[str, dict] = {}
    first_lacks_txt = 0
    for batch in loader(dataset, batch_size=8, num_workers=num_workers):
        assert isinstance(batch, RecordBatch)
        has_txt = [expected[key]["txt"] is not None for key in batch.keys]
        assert batch.fields == (["bin", "txt"] if any(has_txt) else ["bin"])
        first_lacks_txt += any(has_txt) and not has_txt[0]
        if any(has_txt):
            by_view = [None if v is None else v.tobytes() for v in batch.bytes("txt")]
            by_item = [None if v is None else v.tobytes() for v in batch["txt"]]
            assert by_view == by_item == [expected[key]["txt"] for key in batch.keys]
        for i, key in enumerate(batch.keys):
            sample = batch.sample(i)
            assert sample["bin"] == expected[key]["bin"]
            assert sample.get("txt") == expected[key]["txt"]
            assert key not in seen
            seen[key] = sample
    assert seen.keys() == expected.keys()
    assert first_lacks_txt > 0, "no batch exercised a field its first sample lacks"


def test_union_in_first_seen_order_survives_pickling_and_joining() -> None:
    block = memoryview(b"AAbbbCC")
    samples = [
        {"__key__": "a", "__index__": 0, "x": block[0:2], "n": 1},
        {"__key__": "b", "__index__": 1, "y": block[2:5], "x": b"", "n": 2},
        {"__key__": "c", "__index__": 2, "x": block[5:7], "m": "only here"},
    ]
    batch = RecordBatch.from_samples(samples)
    assert batch.fields == ["x", "y", "n", "m"]
    copy = pickle.loads(pickle.dumps(batch))  # the joined-buffer path a worker batch takes
    for b in (batch, copy):
        assert [None if v is None else v.tobytes() for v in b.bytes("x")] == [b"AA", b"", b"CC"]
        assert [None if v is None else v.tobytes() for v in b.bytes("y")] == [None, b"bbb", None]
        assert b["n"] == [1, 2, None] and b["m"] == [None, None, "only here"]
        assert b.sample(0) == {
            "__key__": "a", "__index__": 0, "x": b"AA", "y": None, "n": 1, "m": None
        }
        assert b.sample(1)["x"] == b"", "an empty value is not a missing one"
        assert [s["y"] for s in b] == [None, b"bbb", None]
    assert copy.nbytes == batch.nbytes == 7
    for b in (batch, copy):  # joined or in pieces: one error naming the field and the fields
        with pytest.raises(KeyError, match=r"'z'.*bytes fields: \['x', 'y'\]"):
            b.bytes("z")
        with pytest.raises(KeyError, match="'n'"):
            b.bytes("n")  # an int field is not a bytes field
