"""Raw batches of a local dataset cross from workers as places in their shard files.

Through real ``shardio.loader`` DataLoaders on a generated pack whose records are
stored uncompressed (so a worker's samples are views of its maps): with 2 workers
every sample arrives exactly once with its bytes, its key (also non-ASCII), its int
and str fields and the fields it lacks, as views of the main process's own maps,
and without a shared-memory slot; a batch so received pickles and is the batch that
0 workers give.
"""

from __future__ import annotations

import builtins
import mmap
import os
import pickle
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest

from shardio import ShardWriter, WriteOptions
from shardio.reading.batch import RecordBatch
from shardio.torch.dataset import StreamingDataset
from shardio.torch.handover import views as shmview
from shardio.torch.loader import loader

NUM_SAMPLES = 120
BATCH = 8
SHARD = 25


def key(i: int) -> str:
    return f"k/{i:04d}"


def sample(i: int) -> dict[str, Any]:
    out: dict[str, Any] = {"__key__": key(i), "bin": bytes([i % 251]) * (3000 + 37 * i),
                           "n": i, "name": f"name-{i}"}
    if (i // SHARD) % 2:  # samples of every second shard lack the field (records of
        # one shape per shard, which a worker reads in place: flat maps of one shape)
        out["txt"] = bytes([i % 13]) * (2000 + i)
    return out


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("handover") / "ds"
    with ShardWriter(out, WriteOptions(max_shard_samples=SHARD, codec="none")) as writer:
        for i in range(NUM_SAMPLES):
            writer.write(sample(i))
    return out


def contents(batch: RecordBatch) -> list[dict[str, Any]]:
    return [dict(s) for s in batch]


def test_two_workers_deliver_places_in_files_exactly_once(pack: Path) -> None:
    run = loader(StreamingDataset(pack, decode="raw", seed=2), batch_size=BATCH, num_workers=2)
    for _epoch in range(2):
        seen: list[int] = []
        for batch in run:
            views = batch.bytes("bin")
            assert all(v is not None and type(v.obj) is mmap.mmap for v in views)
            if "txt" in batch.fields:  # not where no sample of the batch has it
                assert all(type(v.obj) is mmap.mmap for v in batch.bytes("txt") if v is not None)
            numbers = batch["n"].tolist()
            assert batch.indices.tolist() == numbers
            for got in contents(batch):
                i = got["n"]
                want = sample(i)
                assert got["__key__"] == want["__key__"] and got["name"] == want["name"], i
                assert got["bin"] == want["bin"] and got.get("txt") == want.get("txt"), i
            seen += numbers
        assert sorted(seen) == list(range(NUM_SAMPLES))
    # nothing of these batches went through a slot: no segment of this loader mapped
    assert not any(token == run._token for token, _pid, _slot in shmview._MAPPED)


def test_a_received_batch_pickles_and_equals_what_one_process_reads(pack: Path) -> None:
    alone = [contents(b) for b in loader(
        StreamingDataset(pack, decode="raw", seed=4), batch_size=BATCH, num_workers=0)]
    run = loader(StreamingDataset(pack, decode="raw", seed=4), batch_size=BATCH, num_workers=2)
    got: list[list[dict[str, Any]]] = []
    for batch in run:
        again = pickle.loads(pickle.dumps(batch))
        assert contents(again) == contents(batch)
        assert again.labels is None and again.fields == batch.fields
        got.append(contents(batch))
    assert sorted(s["n"] for b in got for s in b) == list(range(NUM_SAMPLES))
    if [s["n"] for b in got for s in b] == [s["n"] for b in alone for s in b]:
        assert got == alone  # the same order: the same batches


def test_places_the_reader_filed_are_those_each_view_gives(pack: Path) -> None:
    from shardio.torch.handover.ring import _MappedFiles

    files = _MappedFiles((str(pack.resolve()),))
    run = loader(StreamingDataset(pack, decode="raw", seed=6), batch_size=BATCH, num_workers=0)
    checked = 0
    for batch in run:
        assert batch.places is not None and batch._pieces is not None
        filed, asked = files._filed(batch), files._asked(batch._pieces)
        assert filed is not None and asked is not None
        assert filed[0] == asked[0]
        for got, want in zip(filed[1:], asked[1:], strict=True):
            assert [int(x) for x in got] == [int(x) for x in want]
        checked += 1
    assert checked == -(-NUM_SAMPLES // BATCH)


def test_compressed_records_with_non_ascii_keys_cross_through_the_slots(
    tmp_path: Path,
) -> None:
    # zstd records are inflated in the worker: their batches are copied into its slots
    out = tmp_path / "zstd"
    with ShardWriter(out, WriteOptions(max_shard_samples=SHARD, codec="zstd")) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"ключ/{i:04d}-é", "bin": bytes([i % 7]) * (500 + i)})
    run = loader(StreamingDataset(out, decode="raw", seed=3), batch_size=BATCH, num_workers=2)
    seen: list[int] = []
    for batch in run:
        assert isinstance(batch.buffer, memoryview)  # a view of the slot, not a copy
        for got in contents(batch):
            i = int(got["__key__"][5:9])
            assert got["__key__"] == f"ключ/{i:04d}-é" and got["bin"] == bytes([i % 7]) * (500 + i)
            seen.append(i)
    assert sorted(seen) == list(range(NUM_SAMPLES))


class _OpensInMain:
    """Counts opens of shard files (``.rec``) by this process, not by forked workers.

    Forked workers inherit the patched ``os.open``; the pid filter leaves their opens out.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pid = os.getpid()
        self.paths: list[str] = []
        real_os_open, real_open = os.open, builtins.open

        def os_open(path: Any, *args: Any, **kwargs: Any) -> int:
            self._note(path)
            return real_os_open(path, *args, **kwargs)

        def open_(file: Any, *args: Any, **kwargs: Any) -> Any:
            self._note(file)
            return real_open(file, *args, **kwargs)

        monkeypatch.setattr(os, "open", os_open)
        monkeypatch.setattr(builtins, "open", open_)

    def _note(self, path: Any) -> None:
        if os.getpid() == self.pid and isinstance(path, str | os.PathLike) and (
                os.fspath(path).endswith(".rec")):
            self.paths.append(os.fspath(path))


def _check_epoch(batches: Iterator[RecordBatch], stop: int | None = None) -> list[int]:
    """The sample numbers of an epoch's batches (up to ``stop`` batches), each checked."""
    seen: list[int] = []
    for count, batch in enumerate(batches, 1):
        for got in contents(batch):
            i = got["n"]
            assert got["bin"] == sample(i)["bin"] and got.get("txt") == sample(i).get("txt"), i
            seen.append(i)
        if count == stop:
            break
    return seen


@pytest.fixture()
def fresh_maps(monkeypatch: pytest.MonkeyPatch) -> None:
    """No shard file mapped in this process yet (earlier tests mapped the module's pack)."""
    monkeypatch.setattr(shmview, "_FILES", {})


def test_the_main_process_opens_no_shard_file(
    pack: Path, monkeypatch: pytest.MonkeyPatch, fresh_maps: None,
) -> None:
    run = loader(StreamingDataset(pack, decode="raw", seed=8), batch_size=BATCH, num_workers=2)
    opens = _OpensInMain(monkeypatch)
    for _epoch in range(2):
        assert sorted(_check_epoch(iter(run))) == list(range(NUM_SAMPLES))
    assert opens.paths == []
    assert len(shmview._FILES) == -(-NUM_SAMPLES // SHARD)  # every shard mapped, from the workers


@pytest.mark.parametrize("persistent", [True, False])
def test_an_epoch_left_early_then_every_sample_of_the_next(
    pack: Path, monkeypatch: pytest.MonkeyPatch, fresh_maps: None, persistent: bool,
) -> None:
    # batches queued when the loop stops are drained (persistent workers) or dropped with
    # their workers, the first one naming a file among them: the files still arrive
    run = loader(StreamingDataset(pack, decode="raw", seed=9), batch_size=BATCH, num_workers=2,
                 persistent_workers=persistent)
    opens = _OpensInMain(monkeypatch)
    first = _check_epoch(iter(run), stop=1)
    assert len(first) == BATCH
    # the next iter() starts the next epoch, with persistent workers or not
    assert sorted(_check_epoch(iter(run))) == list(range(NUM_SAMPLES))
    assert sorted(_check_epoch(iter(run))) == list(range(NUM_SAMPLES))
    assert opens.paths == [] and len(shmview._FILES) == -(-NUM_SAMPLES // SHARD)


def test_a_file_whose_descriptor_never_arrived_is_opened_by_path(
    pack: Path, monkeypatch: pytest.MonkeyPatch, fresh_maps: None,
) -> None:
    from shardio.torch.handover.ring import _MappedFiles

    files = _MappedFiles((str(pack.resolve()),))
    batches = list(loader(StreamingDataset(pack, decode="raw", seed=7), batch_size=BATCH,
                          num_workers=0))
    first = files.describe(batches[0])
    assert first is not None and first[2] is not None and all(first[2])  # a descriptor a file
    again = files.describe(batches[0])  # the same files: sent before
    assert again is not None and again[2] is None
    opens = _OpensInMain(monkeypatch)
    # the batch carrying the descriptors is dropped, never unpickled: opened by path
    assert contents(shmview.file_batch(again)) == contents(batches[0])
    assert sorted(opens.paths) == sorted(path for path, _dev, _ino in again[1])
    for handle in first[2]:  # what the worker's resource sharer would hold until it exits
        os.close(handle.detach())
    # a file's first batch, through the pickler a DataLoader's queue uses: no open
    monkeypatch.setattr(shmview, "_FILES", {})
    files._sent.clear()  # as a fresh worker's
    fresh = files.describe(batches[0])
    assert fresh is not None and fresh[2] is not None
    received = pickle.loads(ForkingPickler.dumps(fresh))
    opens.paths.clear()
    assert contents(shmview.file_batch(received)) == contents(batches[0])
    assert opens.paths == [] and set(shmview._FILES) == set(fresh[1])


def test_spawned_workers_send_their_descriptors(
    pack: Path, monkeypatch: pytest.MonkeyPatch, fresh_maps: None,
) -> None:
    run = loader(StreamingDataset(pack, decode="raw", seed=10), batch_size=BATCH,
                 num_workers=2, multiprocessing_context="spawn")
    opens = _OpensInMain(monkeypatch)
    assert sorted(_check_epoch(iter(run))) == list(range(NUM_SAMPLES))
    assert opens.paths == []
    assert len(shmview._FILES) == -(-NUM_SAMPLES // SHARD)  # places in files, not slots
