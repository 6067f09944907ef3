"""Many readers of one LMDB shard in one process, across fork, and after the file is replaced.

py-lmdb refuses a second environment on a file this process already has open,
so readers share one (``shardio.backends.lmdbenv``). Each test opens one file
at least twice in a process, which the former one-environment-per-reader code
refused with a message calling the shard damaged.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest
from torch.utils.data import DataLoader

import shardio.backends.lmdb as lmdb_backend
import shardio.backends.lmdbenv as lmdbenv
from shardio import ShardWriter, WriteOptions
from shardio.backends.lmdb import LmdbShardReader
from shardio.errors import ShardCorruptError, ShardioError
from shardio.reading.batch import RecordBatch
from shardio.reading.reader import DatasetReader
from shardio.torch.dataset import StreamingDataset
from shardio.torch.indexed import IndexedDataset

NUM_SAMPLES = 40
SHARD_SAMPLES = 16


def payload(tag: str, i: int) -> bytes:
    return f"{tag}:{i}:".encode() * (1 + i % 5)


def write_pack(out: Path, tag: str, *, overwrite: bool = False) -> Path:
    """An LMDB pack of 40 samples in 3 shards whose bytes say ``tag``."""
    options = WriteOptions(backend="lmdb", max_shard_samples=SHARD_SAMPLES, version=2)
    with ShardWriter(out, options, overwrite=overwrite) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"s/{i:03d}", "bin": payload(tag, i)})
    return out


@pytest.fixture
def pack(tmp_path: Path) -> Path:
    return write_pack(tmp_path / "ds", "a")


def first_shard(dataset: Path) -> Path:
    return sorted(dataset.glob("*.mdb"))[0]


def assert_released(dataset: Path) -> None:
    """No environment of ours is left on any shard: py-lmdb would refuse an outside open."""
    for shard in dataset.glob("*.mdb"):
        lmdb.open(str(shard), subdir=False, readonly=True, lock=False).close()


def test_two_dataset_readers_read_independently(pack: Path) -> None:
    first, second = DatasetReader(pack), DatasetReader(pack)
    try:
        scan = iter(first)  # first holds shard 0 open in the middle of a scan
        assert next(scan)["bin"] == payload("a", 0)
        assert [second.get(i)["bin"] for i in range(NUM_SAMPLES)] == [
            payload("a", i) for i in range(NUM_SAMPLES)
        ]
        assert next(scan)["bin"] == payload("a", 1)
        first.close()
        assert second.get(3)["__key__"] == "s/003", "closing one reader closed the other's shard"
        assert [s["__key__"] for s in second.iter_shard(0)][-1] == f"s/{SHARD_SAMPLES - 1:03d}"
    finally:
        first.close()
        second.close()
    assert_released(pack)


def test_indexed_and_streaming_dataset_on_one_path(pack: Path) -> None:
    indexed = IndexedDataset(pack, decode="raw")
    streaming = StreamingDataset(pack, decode="raw", seed=3)
    try:
        assert indexed[0]["bin"] == payload("a", 0)
        assert streaming.reader.get(NUM_SAMPLES - 1)["bin"] == payload("a", NUM_SAMPLES - 1)
        seen = {
            key: data.tobytes()
            for batch in DataLoader(streaming, batch_size=8, num_workers=0,
                                    collate_fn=RecordBatch.from_samples)
            for key, data in zip(batch.keys, batch.bytes("bin"), strict=True)
            if data is not None
        }
        assert seen == {f"s/{i:03d}": payload("a", i) for i in range(NUM_SAMPLES)}
        assert [indexed[i]["bin"] for i in range(NUM_SAMPLES)] == [
            payload("a", i) for i in range(NUM_SAMPLES)
        ]
    finally:
        indexed.close()
        streaming.reader.close()
    assert_released(pack)


def test_fork_after_use_in_the_parent(pack: Path) -> None:
    indexed = IndexedDataset(pack, decode="raw")
    streaming = StreamingDataset(pack, decode="raw", seed=4)
    try:  # two readers of every shard open in the parent when the workers fork
        assert [indexed[i]["bin"] for i in range(NUM_SAMPLES)][-1] == payload("a", 39)
        assert streaming.reader.get(0)["bin"] == payload("a", 0)
        loader = DataLoader(streaming, batch_size=8, num_workers=2,
                            multiprocessing_context="fork", collate_fn=RecordBatch.from_samples)
        keys = [key for batch in loader for key in batch.keys]
        assert sorted(keys) == [f"s/{i:03d}" for i in range(NUM_SAMPLES)]
        assert indexed[NUM_SAMPLES - 1]["bin"] == payload("a", 39), "the parent still reads"
    finally:
        indexed.close()
        streaming.reader.close()


def test_forked_child_opens_a_shard_its_parent_holds(pack: Path) -> None:
    """A child never uses its parent's environment, and may open the file afresh."""
    shard = str(first_shard(pack))
    held = [LmdbShardReader(shard), LmdbShardReader(shard)]  # inherited, still referenced
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports through the pipe and never returns into pytest
        result: dict[str, object] = {}
        try:
            try:
                held[0].frame(0)
            except ShardioError as exc:
                result["inherited"] = str(exc)
            held[1].close()  # must not close the parent's environment, nor fail
            checked: list[str] = []
            check = lmdb_backend.check_lmdb_file

            def recording_check(path: str) -> object:
                checked.append(path)
                return check(path)

            lmdb_backend.check_lmdb_file = recording_check  # this process only: it exits below
            fresh = LmdbShardReader(shard)  # maps the file itself, proved again
            result["checked"] = checked
            result["frame"] = bytes(fresh.frame(2)).hex()
            result["keys"] = list(fresh.keys()[:2])
            fresh.close()
        except BaseException as exc:
            result["error"] = repr(exc)
        finally:
            os.write(write, json.dumps(result).encode())
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        result = json.loads(pipe.read())
    os.waitpid(pid, 0)
    try:
        assert "error" not in result, result
        assert result["keys"] == ["s/000", "s/001"]
        assert result["checked"] == [shard], "the child used the parent's environment"
        assert bytes.fromhex(str(result["frame"])) == bytes(held[0].frame(2))
        assert "opened before the process forked" in str(result["inherited"])
        assert shard in str(result["inherited"])
        assert held[1].frame(1) == held[0].frame(1), "the parent's readers still read"
    finally:
        for reader in held:
            reader.close()
    assert_released(pack)


def test_replaced_file_is_read_fresh(pack: Path) -> None:
    old = DatasetReader(pack)
    try:
        assert old.get(0)["bin"] == payload("a", 0)  # its environment maps the old files
        write_pack(pack, "b", overwrite=True)  # the same paths, new files
        new, again = DatasetReader(pack), DatasetReader(pack)
        try:
            assert new.get(0)["bin"] == payload("b", 0), "served the replaced file"
            assert again.get(5)["bin"] == payload("b", 5)
            assert old.get(1)["bin"] == payload("a", 1), "the old reader keeps its own file"
            old.close()
            assert [new.get(i)["bin"] for i in range(NUM_SAMPLES)] == [
                payload("b", i) for i in range(NUM_SAMPLES)
            ]
        finally:
            new.close()
            again.close()
    finally:
        old.close()
    assert_released(pack)


def test_hard_linked_copy_shares_the_file(pack: Path, tmp_path: Path) -> None:
    """A dataset snapshot of hard links (``cp -al``) is the same files under other paths."""
    copy = tmp_path / "snapshot"
    copy.mkdir()
    for item in pack.iterdir():
        os.link(item, copy / item.name)
    with DatasetReader(pack) as original, DatasetReader(copy) as linked:
        assert original.get(0)["bin"] == linked.get(0)["bin"] == payload("a", 0)
        assert linked.get(NUM_SAMPLES - 1)["bin"] == payload("a", NUM_SAMPLES - 1)
    assert_released(pack)


def test_threads_open_one_shard_at_once(pack: Path) -> None:
    shard = str(first_shard(pack))
    errors: list[BaseException] = []
    together = threading.Barrier(6, timeout=30)

    def read() -> None:
        try:
            for _ in range(5):
                together.wait()  # all open at once: the first environment is made in a race
                reader = LmdbShardReader(shard)
                try:
                    together.wait()  # and all hold it at once
                    assert reader.keys()[3] == "s/003"
                finally:
                    reader.close()
        except BaseException as exc:
            errors.append(exc)
            together.abort()

    threads = [threading.Thread(target=read) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert_released(pack)


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (None, "already holds the file open"),
        (lambda path: lmdb.Error(f"{path}: {os.strerror(24)}"), "too many open files"),
        (lambda path: lmdb.MemoryError(f"{path}: {os.strerror(12)}"), "out of memory"),
        (lambda path: lmdb.ReadonlyError(f"{path}: {os.strerror(13)}"), "permission denied"),
        (lambda path: lmdb.DiskError(f"{path}: {os.strerror(28)}"), "not damage in the file"),
    ],
    ids=["outside environment", "EMFILE", "ENOMEM", "EACCES", "other"],
)
def test_open_failures_of_a_sound_file_say_what_happened(
    pack: Path, monkeypatch: pytest.MonkeyPatch, make: Callable[[str], lmdb.Error] | None,
    words: str,
) -> None:
    shard = str(first_shard(pack))
    outside = None
    if make is None:  # an environment shardio does not manage holds the file
        outside = lmdb.open(shard, subdir=False, readonly=True, lock=False)
    else:
        exc = make(shard)

        def refuse(*args: object, **kwargs: object) -> None:
            raise exc

        monkeypatch.setattr(lmdb, "open", refuse)
    try:
        with pytest.raises(ShardioError, match=re.escape(shard)) as info:
            LmdbShardReader(shard)
    finally:
        if outside is not None:
            outside.close()
    assert not isinstance(info.value, ShardCorruptError), info.value
    assert words in str(info.value) and lmdbenv.REPACK not in str(info.value)
    monkeypatch.undo()
    assert_released(pack)
