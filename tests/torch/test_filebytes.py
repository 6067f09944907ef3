"""Samples through a plain DataLoader with workers: bytes values cross as places in the files.

A worker's ``FileBytes`` (a ``bytes``) pickles through ``multiprocessing`` as its shard
file, offset and length; the main process reads it from the file. Checked end to end
with real DataLoaders, and the edges: plain ``pickle``, a file rewritten or cut between
the worker's read and the main process's, more files than descriptors kept.
"""

from __future__ import annotations

import copy
import os
import pickle
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

from shardio import ShardWriter, WriteOptions
from shardio.backends.records import RecordsShardReader
from shardio.reading.filebytes import FileBytes, file_bytes
from shardio.torch.dataset import StreamingDataset
from shardio.torch.handover import ring as shmring
from shardio.torch.handover import views as shmview

NUM = 120


def payload(i: int) -> bytes:
    return bytes([i % 251]) * (3000 + 17 * i)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("filebytes") / "ds"
    # uncompressed, so each payload is a view of the shard's map in the worker
    with ShardWriter(out, WriteOptions(codec="none", max_shard_samples=32)) as writer:
        for i in range(NUM):
            writer.write({"__key__": f"k/{i:04d}", "data": payload(i), "n": i})
    return out


def user_collate(samples: list[dict[str, Any]]) -> tuple[list[Any], list[int], list[str]]:
    """What a training script writes; it also reports each value's type in the worker."""
    return ([s["data"] for s in samples], [s["n"] for s in samples],
            [type(s["data"]).__name__ for s in samples])


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 2])
def test_plain_dataloader_hands_out_every_sample_once_as_bytes(dataset: Path,
                                                                num_workers: int) -> None:
    ds = StreamingDataset(dataset, decode="raw", shuffle=True, seed=3, batch_size=8)
    seen: list[int] = []
    kinds: set[str] = set()
    for data, numbers, made in DataLoader(ds, batch_size=8, num_workers=num_workers,
                                          collate_fn=user_collate):
        for value, n in zip(data, numbers, strict=True):
            assert type(value) is bytes and value == payload(n)
        seen += numbers
        kinds.update(made)
    assert sorted(seen) == list(range(NUM))
    # a worker's collate sees bytes that know their place; one process copies as before
    assert kinds == ({"FileBytes"} if num_workers else {"bytes"})


def _value(dataset: Path, n: int = 3) -> tuple[RecordsShardReader, FileBytes, int]:
    """Sample ``n``'s payload as the stream makes it: copied out of its shard's map."""
    reader = RecordsShardReader(dataset / f"shard-{n // 32:05d}.rec")
    record = n % 32
    block = reader.read_run(record, record + 1)  # the stored block holding it
    start = block.offset + bytes(block.buffer).index(payload(n))
    view = reader._view[start : start + len(payload(n))]
    return reader, file_bytes(view, reader._mmap, start), n


def test_other_pickling_gives_plain_bytes(dataset: Path) -> None:
    reader, value, record = _value(dataset)
    assert isinstance(value, bytes) and value == payload(record)
    for again in (pickle.loads(pickle.dumps(value)), copy.copy(value), copy.deepcopy(value)):
        assert type(again) is bytes and again == payload(record)
    reader.close()


def test_multiprocessing_pickles_a_place_and_reads_it_back(dataset: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shmring, "_PLACED", [])
    monkeypatch.setattr(shmview, "_READS", type(shmview._READS)())
    reader, value, record = _value(dataset)
    assert type(pickle.loads(bytes(ForkingPickler.dumps(value)))) is bytes  # no roots: its bytes
    assert len(ForkingPickler.dumps(value)) > len(value)
    shmring.place_file_bytes((str(dataset.resolve()),))
    sent = bytes(ForkingPickler.dumps(value))
    assert len(sent) < 1000 < len(value)  # its place, not its contents
    got = pickle.loads(sent)
    assert type(got) is bytes and got == payload(record)
    reader.close()
    for fd in shmview._READS.values():
        os.close(fd)


def _place(dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, Path]:
    """A place pickled for a copy of the dataset's first shard, and that copy."""
    monkeypatch.setattr(shmview, "_READS", type(shmview._READS)())
    copied = tmp_path / "ds"
    copied.mkdir()
    (copied / "shard-00000.rec").write_bytes((dataset / "shard-00000.rec").read_bytes())
    monkeypatch.setattr(shmring, "_PLACED", [])
    shmring.place_file_bytes((str(copied.resolve()),))
    reader, value, _n = _value(copied, 31)
    sent = bytes(ForkingPickler.dumps(value))
    reader.close()
    return sent, copied / "shard-00000.rec"


def test_a_file_rewritten_meanwhile_is_refused_naming_it(dataset: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    sent, path = _place(dataset, tmp_path, monkeypatch)
    st = path.stat()
    fresh = path.with_suffix(".new")
    fresh.write_bytes(path.read_bytes())
    fresh.replace(path)  # same bytes, another file (as a re-pack writes it)
    # the first place of a file brings the worker's descriptor: the file it read, still
    assert pickle.loads(sent) == payload(31)
    for fd in shmview._READS.values():
        os.close(fd)
    # one without (the descriptor never came): opened by path, and refused
    monkeypatch.setattr(shmview, "_READS", type(shmview._READS)())
    with pytest.raises(RuntimeError, match=r"shard-00000\.rec is not the file a DataLoader"):
        shmview.file_bytes((str(path.resolve()), st.st_dev, st.st_ino), 0, 10)


def test_a_file_cut_meanwhile_is_refused_naming_it(dataset: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    sent, path = _place(dataset, tmp_path, monkeypatch)
    os.truncate(path, 100)
    with pytest.raises(RuntimeError, match=r"shard-00000\.rec ends before byte"):
        pickle.loads(sent)
    for fd in shmview._READS.values():
        os.close(fd)


def test_descriptors_kept_are_bounded(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shmring, "_PLACED", [])
    monkeypatch.setattr(shmview, "_READS", type(shmview._READS)())
    monkeypatch.setattr(shmview, "MAX_READ_FILES", 2)
    shmring.place_file_bytes((str(dataset.resolve()),))
    shards = sorted(p.name for p in dataset.glob("shard-*.rec"))
    assert len(shards) >= 3
    for _round in range(2):
        for shard in range(len(shards)):
            reader, value, n = _value(dataset, 32 * shard + 1)
            got = pickle.loads(bytes(ForkingPickler.dumps(value)))
            assert got == payload(n)
            assert len(shmview._READS) <= 2
            reader.close()
    for fd in shmview._READS.values():
        os.close(fd)
