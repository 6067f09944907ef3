"""Windows of local shards decoded field by field (shardio.columnar) give exactly what
record-by-record decoding gives, and every fault record-by-record decoding names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_memory_pages import resident_kb

from shardio.batch import RecordBatch
from shardio.codecs import get_codec
from shardio.errors import ShardCorruptError
from shardio.reader import DatasetReader
from shardio.record import encode_record
from shardio.stream import iter_chunks, iter_samples
from shardio.writer import ShardWriter, WriteOptions

NUM = 300


def sample(i: int, shape: str) -> dict[str, Any]:
    if shape == "images":  # JPEG-like bytes: stored uncompressed, parsed in the map
        return {"__key__": f"c{i % 3}/img_{i:04d}.jpg", "image": b"\xff\xd8" + bytes([i % 256]) * (
            20000 + 37 * i), "label": i % 3}
    if shape == "tiny":  # text: zstd, inflated (on the checker thread when it checks)
        return {"__key__": f"t/{i:05d}", "txt": f"line {i} ".encode() * (1 + i % 9),
                "n": i * 7 - 1000, "big": 2**40 + i, "tag": f"é{i}"}
    if shape == "mixed":  # some records compressed, some not, in the same runs
        body = (b"\xff\xd8" + bytes(range(256)) * 4) if i % 2 else b"abc" * 400
        return {"__key__": f"m/{i}", "bin": body, "n": i}
    if shape == "generic":  # fields some records lack: not one shape, record by record
        out: dict[str, Any] = {"__key__": f"g/{i}", "txt": b"t%d" % i}
        if i % 4 == 0:
            out["extra"] = {"nested": [i, None, 1.5]}
        return out
    assert shape == "unicode_keys"
    return {"__key__": f"ключ/{i}", "bin": b"v" * (i % 50), "n": i}


SHAPES = ["images", "tiny", "mixed", "generic", "unicode_keys"]


@pytest.fixture(scope="module", params=SHAPES)
def dataset(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp(request.param) / "ds"
    with ShardWriter(out, WriteOptions(codec="zstd", max_shard_samples=110)) as writer:
        for i in range(NUM):
            writer.write(sample(i, request.param))
    return out, request.param


def plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview) else value


@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.parametrize(("window", "max_run", "take"), [(300, 16, None), (64, 8, None),
                                                         (300, 16, 3), (50, 128, 2)])
def test_every_sample_equals_random_access(dataset: tuple[Path, str], verify: bool,
                                           window: int, max_run: int, take: int | None) -> None:
    root, _shape = dataset
    order = np.random.default_rng(window).permutation(NUM)
    if take is not None:  # a worker's scattered part: runs read through gaps
        order = order[order % take == 0]
    with DatasetReader(root, verify=verify) as reader:
        expected = {i: reader.get(i) for i in range(NUM)}
        got = [{k: plain(v) for k, v in s.items()}
               for s in iter_samples(reader, order, window=window, max_run=max_run)]
        assert got == [expected[i] for i in order.tolist()]
        seen: list[int] = []
        for chunk in iter_chunks(reader, order, window=window, max_run=max_run, size=32,
                                 zero_copy=True):
            batch = RecordBatch.from_samples(chunk)
            for k, i in enumerate(batch.indices.tolist()):  # a field a sample lacks is None
                assert batch.sample(k) == {**dict.fromkeys(batch.fields), **expected[i]}
            assert [{k: plain(v) for k, v in s.items()} for s in chunk] == [
                expected[i] for i in batch.indices.tolist()]
            seen += batch.indices.tolist()
        assert seen == order.tolist()
        owned = [s for chunk in iter_chunks(reader, order, window=window, max_run=max_run,
                                            size=32) for s in chunk]
        assert owned == [expected[i] for i in order.tolist()]
        assert not any(type(v) is memoryview for s in owned for v in s.values())


def test_the_common_shapes_take_the_columnar_path(dataset: tuple[Path, str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    import shardio.stream as stream

    root, shape = dataset

    def decoded(name: str) -> list[bool]:
        """Whether each call of ``stream.<name>`` decoded (returned other than None)."""
        calls: list[bool] = []
        real = getattr(stream, name)

        def spy(*args: Any, **kwargs: Any) -> Any:
            out = real(*args, **kwargs)
            calls.append(out is not None)
            return out

        monkeypatch.setattr(stream, name, spy)
        return calls

    results, windows = decoded("decode_columns"), decoded("decode_window")
    by_record: list[object] = []
    real_run = stream.read_run

    def record_by_record(reader: Any, run: Any, *args: Any, **kwargs: Any) -> Any:
        by_record.append(run)
        return real_run(reader, run, *args, **kwargs)

    monkeypatch.setattr(stream, "read_run", record_by_record)
    with DatasetReader(root) as reader:
        order = np.random.default_rng(1).permutation(NUM)  # samples of a run far apart
        assert len(list(iter_samples(reader, order, window=NUM, max_run=32))) == NUM
    columnar = shape in ("images", "tiny", "mixed")
    # every shard of a window at once (three shards: one window spans them), else each shard
    # on its own; non-ASCII keys are compared shard by shard
    assert windows == [shape in ("images", "tiny", "mixed")]
    assert bool(results) == (not windows[0])
    assert all(results) == columnar, results
    # a run filed field by field is not decoded again record by record for its next sample
    # (each sample of the per-sample path once did, checksums included)
    assert by_record == [] if columnar else len(by_record) == len(set(by_record))


def craft(out: Path, records: list[dict[str, Any]], max_shard_samples: int | None = None
          ) -> None:
    """Shards whose key blocks say ``k/<i>`` while record ``i`` holds ``records[i]``."""
    codec = get_codec("none")
    with ShardWriter(out, WriteOptions(codec="none",
                                       max_shard_samples=max_shard_samples)) as writer:
        for i, record in enumerate(records):
            writer._write_encoded(f"k/{i}", encode_record(record, codec), ["txt"])


@pytest.mark.parametrize("per_shard", [None, 40])  # one shard; a window of five at once
def test_a_record_holding_another_key_is_named(tmp_path: Path, per_shard: int | None) -> None:
    records = [{"__key__": f"k/{i}", "txt": b"x" * 10} for i in range(200)]
    records[150] = {"__key__": "k/15", "txt": b"x" * 10}  # same length, another's key
    craft(tmp_path / "ds", records, per_shard)
    where = "shard-00000.rec: record 150" if per_shard is None else "shard-00003.rec: record 30"
    with DatasetReader(tmp_path / "ds") as reader, pytest.raises(
            ShardCorruptError, match=where + r" at byte \d+ holds key 'k/15' but the shard's "
                                     r"key block says 'k/150'"):
        list(iter_samples(reader, np.arange(200), window=200, max_run=64))


@pytest.mark.parametrize(("at", "value", "message"), [
    (8, 9, r"record 120 at byte \d+ names unknown codec 9"),
    (0, 0, r"record 120 at byte \d+ is \d+ bytes in the shard's index but its frame header"),
    (10, 1, r"record 120 at byte \d+ names checksum id 1 \(reserved bytes 0100\)"),
])
@pytest.mark.parametrize("per_shard", [None, 40])
def test_a_damaged_frame_header_is_named_without_checksums(tmp_path: Path, at: int, value: int,
                                                           message: str,
                                                           per_shard: int | None) -> None:
    from shardio.backends.records import RecordsShardReader

    craft(tmp_path / "ds", [{"__key__": f"k/{i}", "txt": b"y" * 30} for i in range(200)],
          per_shard)
    shard = sorted((tmp_path / "ds").glob("*.rec"))[0 if per_shard is None else 3]
    reader = RecordsShardReader(shard)
    offset = reader.offset(120 if per_shard is None else 0)
    reader.close()
    data = bytearray(shard.read_bytes())
    data[offset + at] = value
    shard.write_bytes(bytes(data))
    if per_shard is not None:  # record 120 is shard 3's first
        message = message.replace("record 120", "shard-00003.rec: record 0")
    with DatasetReader(tmp_path / "ds", verify=False) as reader, pytest.raises(
            ShardCorruptError, match=message):
        list(iter_samples(reader, np.arange(200), window=200, max_run=64))


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps")
@pytest.mark.parametrize("drop_decoded", [False, True])
def test_a_worker_that_hands_places_over_drops_a_window_once_decoded(
        tmp_path: Path, drop_decoded: bool) -> None:
    out = tmp_path / "ds"
    with ShardWriter(out, WriteOptions(codec="none")) as writer:
        for i in range(64):
            writer.write({"__key__": f"k/{i}", "bin": bytes([i]) * (256 << 10)})
    shard = next(out.glob("*.rec")).resolve()
    with DatasetReader(out) as reader:
        chunks = iter_chunks(reader, np.random.default_rng(0).permutation(64), window=64,
                             max_run=8, size=8, zero_copy=True, drop_decoded=drop_decoded)
        chunk = next(chunks)  # the whole window decoded, its first batch handed out
        resident = resident_kb(shard)
        assert [bytes(v) for v in RecordBatch.from_samples(chunk).bytes("bin")] == [
            bytes([i]) * (256 << 10) for i in RecordBatch.from_samples(chunk).indices.tolist()]
        chunks.close()
    if drop_decoded:
        assert resident < 4 << 10  # a few MB at most of a 16 MB window
    else:
        assert resident > 12 << 10  # the window is mapped until it closes
