"""Readers give their shards' mapped pages back (``shardio.backends.records``).

A DataLoader worker taking every other batch reads a scattered half of each block,
and the kernel maps the records next to each one it reads too (fault-around), so a
window's pages are dropped widened to whole ``FAULT_AROUND`` blocks. Checked on real
shards: what a process keeps mapped (``/proc/self/smaps``), that every view still
reads its bytes after a drop, and that real ``shardio.loader`` DataLoaders with 0 and
2 workers deliver every sample once, with its bytes, with windows closing all along.
"""

from __future__ import annotations

import mmap
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from shardio import ShardWriter, WriteOptions
from shardio.backends.records import RecordsShardReader
from shardio.reading.checkahead import checker
from shardio.torch.dataset import StreamingDataset
from shardio.torch.loader import loader

NUM_SAMPLES = 96
RECORD_BYTES = 48 << 10
"""Smaller than ``FAULT_AROUND``: a record read maps its neighbours' pages too."""

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_DONTNEED"),
    reason="reads /proc/self/smaps and uses MADV_DONTNEED",
)


def payload(i: int) -> bytes:
    return bytes([i % 251, (i * 7) % 256]) * (RECORD_BYTES // 2)


def _pack(out: Path, version: int) -> Path:
    with ShardWriter(out, WriteOptions(max_shard_samples=48, codec="none",
                                       version=version)) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"s/{i:04d}", "bin": payload(i)})
    return out


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What pack writes (format v3)."""
    return _pack(tmp_path_factory.mktemp("pages") / "ds", 3)


@pytest.fixture(scope="module")
def pack_v2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Format v2, one frame a record: for the tests that drop pages around records."""
    return _pack(tmp_path_factory.mktemp("pages-v2") / "ds", 2)


def resident_kb(path: Path) -> int:
    """Resident kilobytes of this process's mappings of ``path``."""
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:
                inside = len(head) >= 6 and head[-1] == str(path)
            elif inside and head[0] == "Rss:":
                total += int(head[1])
    return total


def first_shard(pack: Path) -> Path:
    return sorted(pack.glob("*.rec"))[0]


@linux_only
def test_drop_pages_takes_the_neighbours_mapped_around_a_record(pack_v2: Path) -> None:
    path = first_shard(pack_v2)
    reader = RecordsShardReader(path)
    try:
        opened = resident_kb(path)  # the header, index and key block, read on open
        frame = reader.frame(10)
        assert sum(frame[::4096]) >= 0  # read one byte a page: the kernel maps around them
        assert (resident_kb(path) - opened) * 1024 > frame.nbytes  # more than the record
        reader.drop_pages(10, 11)
        assert resident_kb(path) <= opened  # the record and its neighbours are gone
        assert payload(10) in frame.tobytes()  # and it reads from the file again
    finally:
        del frame
        reader.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_delivers_each_sample_once_with_its_bytes(pack: Path, num_workers: int) -> None:
    # a window of 16 samples: windows close (and drop their pages) all through the epoch
    dataset = StreamingDataset(pack, decode="raw", seed=5, shuffle_buffer=16, block_size=4)
    run = loader(dataset, batch_size=8, num_workers=num_workers)
    for _epoch in range(2):
        seen: list[str] = []
        for batch in run:
            keys = list(batch.keys)
            for key, view in zip(keys, batch.bytes("bin"), strict=True):
                assert view is not None and view.tobytes() == payload(int(key[2:])), key
            seen += keys
        assert sorted(seen) == [f"s/{i:04d}" for i in range(NUM_SAMPLES)]


def test_worker_batches_are_views_of_the_main_process_own_map(pack: Path) -> None:
    # records stored uncompressed are views of the worker's map: the batch crosses as
    # places in the shard files, and here its samples view this process's map of them
    run = loader(StreamingDataset(pack, decode="raw", seed=1), batch_size=8, num_workers=2)
    seen: list[str] = []
    for batch in run:
        views = batch.bytes("bin")
        assert all(type(v.obj) is mmap.mmap for v in views)
        for key, view in zip(batch.keys, views, strict=True):
            assert view.tobytes() == payload(int(key[2:])), key
        seen += list(batch.keys)
    assert sorted(seen) == [f"s/{i:04d}" for i in range(NUM_SAMPLES)]


def test_a_rewritten_shard_file_is_refused(pack: Path, tmp_path: Path) -> None:
    from shardio.torch.handover import views as shmview
    path = first_shard(pack)
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    st = copy.stat()
    assert shmview._mapped_file((str(copy), st.st_dev, st.st_ino)).nbytes == st.st_size
    with pytest.raises(RuntimeError, match="not the file a DataLoader worker read"):
        shmview._mapped_file((str(copy), st.st_dev, st.st_ino + 1))


@linux_only
def test_drop_pages_keeps_the_spans_asked_for(pack_v2: Path) -> None:
    # a window's close keeps the next window's runs, which the checker thread has mapped
    path = first_shard(pack_v2)
    reader = RecordsShardReader(path)
    try:
        opened = resident_kb(path)
        frames = [reader.frame(i) for i in range(48)]
        assert sum(sum(f[::4096]) for f in frames) >= 0  # every page mapped
        whole = resident_kb(path) - opened
        reader.drop_pages(0, 48, keep=[(20, 24), (30, 31)])
        kept = resident_kb(path)  # what was read on open may go too: it is in the span
        wanted = sum(f.nbytes for f in frames[20:24] + frames[30:31]) // 1024
        assert wanted <= kept <= opened + wanted + 2 * 4 * 2  # and a page each side at most
        assert kept < opened + whole
        assert [f.tobytes() for f in frames[18:26]] == [
            reader.frame(i).tobytes() for i in range(18, 26)]
        reader.drop_pages(0, 48)
        assert resident_kb(path) <= opened
    finally:
        del frames
        reader.close()


@linux_only
def test_windows_read_with_checks_a_window_ahead_give_their_pages_back(pack: Path) -> None:
    # with checks queued a window ahead, a window's drop spares the next window's runs;
    # after the last window nothing the epoch mapped stays
    import numpy as np

    from shardio.reading.reader import DatasetReader
    from shardio.reading.stream import iter_samples

    paths = sorted(pack.glob("*.rec"))
    order = np.random.default_rng(2).permutation(NUM_SAMPLES).astype(np.int64)
    with DatasetReader(pack) as reader:
        for s in range(len(paths)):
            reader.shard(s)
        opened = sum(resident_kb(p) for p in paths)
        seen = []
        for sample in iter_samples(reader, order, window=16, max_run=4, check_ahead=True):
            assert sample["bin"] == payload(sample["__index__"])
            seen.append(sample["__index__"])
        assert seen == order.tolist()
        # each window's pages are dropped on the checker thread, before its queued checks
        assert checker().flush(60)
        assert sum(resident_kb(p) for p in paths) <= opened


@linux_only
def test_a_drop_run_later_holds_the_map_until_it_runs(pack_v2: Path) -> None:
    # the drop the checker thread runs later: nothing goes before it runs, the pages go
    # when it does, and a reader closed meanwhile leaves its map until then (no other
    # mapping can take its addresses and lose pages to the drop)
    path = first_shard(pack_v2)
    reader = RecordsShardReader(path)
    jobs: list[Callable[[], None]] = []
    opened = resident_kb(path)
    frame = reader.frame(10)
    assert sum(frame[::4096]) >= 0
    mapped = resident_kb(path)
    assert mapped > opened
    reader.drop_pages(0, 48, later=jobs.append)
    assert len(jobs) == 1 and resident_kb(path) == mapped  # queued, not run
    del frame
    reader.close()
    assert resident_kb(path) == mapped  # the job's view keeps the map
    jobs.pop()()
    assert resident_kb(path) == 0  # dropped, and the map let go with the job's view
    again = RecordsShardReader(path)
    try:
        assert payload(10) in again.frame(10).tobytes()
    finally:
        again.close()


def test_later_jobs_run_before_queued_checks_and_errors_stop_nothing(pack: Path) -> None:
    path = first_shard(pack)
    reader = RecordsShardReader(path)
    try:
        thread = checker()
        ran: list[str] = []
        release = threading.Lock()
        release.acquire()
        thread.later(release.acquire)  # holds the thread while the rest is queued
        before = thread.checked
        checks = [thread.submit(reader.read_run(a, a + 4)) for a in range(0, 40, 4)]

        def fail() -> None:
            ran.append("fail")
            raise RuntimeError("a job that fails")

        thread.later(fail)
        # run before the checks queued ahead of it: none of them has started yet
        thread.later(lambda: ran.append(f"after, checks started: {thread.checked - before}"))
        release.release()
        assert thread.flush(60)
        assert ran == ["fail", "after, checks started: 0"]
        assert all(check.passed() for check in checks)  # the thread goes on checking
    finally:
        reader.close()


@linux_only
def test_the_main_process_gives_an_epochs_pages_back_at_its_end(pack: Path) -> None:
    # batches cross as places in the shard files, which this process maps: an epoch
    # shorter than shmview.DROP_BYTES never reached a drop, and kept them all mapped
    paths = sorted(pack.glob("*.rec"))
    run = loader(StreamingDataset(pack, decode="raw", seed=2), batch_size=8, num_workers=2)
    for _epoch in range(2):
        mapped_during = 0
        for batch in run:
            for key, view in zip(batch.keys, batch.bytes("bin"), strict=True):
                assert view.tobytes() == payload(int(key[2:])), key  # read: mapped here
            mapped_during = max(mapped_during, sum(resident_kb(p) for p in paths))
        assert mapped_during * 1024 >= RECORD_BYTES  # the batches' pages were mapped here
        assert sum(resident_kb(p) for p in paths) == 0  # and are given back at the end
