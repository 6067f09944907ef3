"""``view_flat_map`` agrees with msgpack on every flat map and declines everything else."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio.batch import RecordBatch
from shardio.flatmap import view_flat_map

scalars = (
    st.binary(max_size=300)
    | st.text(max_size=40)
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.booleans()
    | st.none()
)
flat_maps = st.dictionaries(st.text(max_size=20), scalars, max_size=20)


def as_bytes(sample: dict[str, Any]) -> dict[str, Any]:
    return {k: v.tobytes() if isinstance(v, memoryview) else v for k, v in sample.items()}


@settings(max_examples=300, deadline=None)
@given(sample=flat_maps, big=st.binary(min_size=0, max_size=70_000))
def test_flat_maps_decode_like_msgpack(sample: dict[str, Any], big: bytes) -> None:
    sample = {**sample, "payload": big}
    packed = msgpack.packb(sample, use_bin_type=True)
    viewed = view_flat_map(memoryview(packed))
    assert viewed is not None
    assert as_bytes(viewed) == msgpack.unpackb(packed, raw=False)
    assert isinstance(viewed["payload"], memoryview)


@settings(max_examples=100, deadline=None)
@given(nested=st.dictionaries(st.text(max_size=5), st.lists(st.integers(-5, 5), max_size=3),
                              min_size=1, max_size=3))
def test_nested_values_are_declined(nested: dict[str, Any]) -> None:
    packed = msgpack.packb(nested, use_bin_type=True)
    assert view_flat_map(memoryview(packed)) is None


@settings(max_examples=300, deadline=None)
@given(data=st.binary(min_size=1, max_size=200))
def test_garbage_never_raises(data: bytes) -> None:
    result = view_flat_map(memoryview(data))
    if result is not None:
        assert as_bytes(result) == msgpack.unpackb(data, raw=False)


def test_record_batch_of_views_joins_when_pickled() -> None:
    block = memoryview(b"aaaabbbbbbcc")
    samples = [
        {"__key__": "a", "__index__": 0, "bin": block[0:4], "n": 1},
        {"__key__": "b", "__index__": 1, "bin": block[4:10], "n": 2},
        {"__key__": "c", "__index__": 2, "bin": block[10:12], "n": 3},
    ]
    batch = RecordBatch.from_samples(samples)
    assert [v.tobytes() for v in batch.bytes("bin")] == [b"aaaa", b"bbbbbb", b"cc"]
    assert batch.nbytes == 12
    copy = pickle.loads(pickle.dumps(batch))
    assert copy.buffer == b"aaaabbbbbbcc"
    assert [v.tobytes() for v in copy.bytes("bin")] == [b"aaaa", b"bbbbbb", b"cc"]
    assert copy.sample(1) == {"__key__": "b", "__index__": 1, "bin": b"bbbbbb", "n": 2}


def test_per_sample_stream_hands_out_bytes_and_batches_keep_views(tmp_path: Path) -> None:
    """Runs are decoded with views either way; a per-sample consumer gets owned bytes."""
    import numpy as np

    from shardio import ShardWriter
    from shardio.reader import DatasetReader
    from shardio.stream import iter_chunks, iter_samples

    big = bytes(range(256)) * 100  # large enough to be viewed in place
    with ShardWriter(tmp_path / "ds") as writer:
        for i in range(6):
            writer.write({"__key__": f"k{i}", "jpg": b"\xff\xd8\xff" + big + bytes([i]), "n": i})
    with DatasetReader(tmp_path / "ds") as reader:
        order = np.array([3, 1, 5, 0, 2, 4, 3])
        owned = list(iter_samples(reader, order, window=4, max_run=2))
        assert [type(s) for s in owned] == [dict] * 7
        assert all(type(s["jpg"]) is bytes and s["jpg"][-1] == s["n"] for s in owned)
        assert owned[0] is not owned[-1] and owned[0] == owned[-1], "each draw its own copy"
        viewed = [s for chunk in iter_chunks(reader, order, window=4, max_run=2, size=3,
                                             zero_copy=True) for s in chunk]
        assert all(type(s["jpg"]) is memoryview for s in viewed)
        assert [bytes(s["jpg"]) for s in viewed] == [s["jpg"] for s in owned]
