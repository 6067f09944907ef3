"""What a local ``.rec`` dataset asks the kernel to read ahead, and when.

On a cold page cache, opening a shard faults in its header and its tail through the map,
and each such fault reads the device's whole read-ahead window before it returns; a
window's shards are therefore hinted (``advise_open``) before they are opened. The next
window's runs are hinted once the current one is decoded, so its reads do not get in
front of the reads the first batch waits for. Neither changes what is read: the epochs
here are checked sample by sample.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import shardio
import shardio.backends.records as records
import shardio.reading.stream as stream
from shardio.backends.records import PAGE, RecordsShardReader, advise_open
from shardio.format.frames import unpack_footer
from shardio.synth import make_tiny_tree

NUM_FILES = 600
WINDOW = 100


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """600 small files in 12 shards of 50 records."""
    src = tmp_path_factory.mktemp("src")
    make_tiny_tree(src, num_files=NUM_FILES)
    out = tmp_path_factory.mktemp("packed") / "ds"
    shardio.pack(src, out, options=shardio.WriteOptions(max_shard_samples=50, version=2), seed=3)
    return out


def _fadvise_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    calls: list[tuple[int, int, int]] = []
    real = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        calls.append((offset, length, advice))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    return calls


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise only")
def test_advise_open_asks_for_the_header_page_and_the_whole_tail(
    packed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = shardio.read_manifest(packed)
    calls = _fadvise_calls(monkeypatch)
    for info in manifest.shards:
        calls.clear()
        path = packed / info.name
        fd = advise_open(path, info.num_bytes, info.num_samples)
        assert fd is not None
        os.close(fd)
        footer = unpack_footer(path.read_bytes(), path=str(path))
        assert all(advice == os.POSIX_FADV_WILLNEED for _o, _n, advice in calls)
        (head, head_len, _), (tail, tail_len, _) = calls
        assert (head, head_len) == (0, PAGE)
        # footer, index and keys: everything opening the shard reads at its end
        assert tail <= footer.index_offset
        assert tail + tail_len == info.num_bytes


def test_advise_open_leaves_a_missing_file_to_the_open(tmp_path: Path) -> None:
    assert advise_open(tmp_path / "gone.rec", 1 << 20, 100) is None  # the open names it
    with pytest.raises(shardio.ShardMissingError, match=r"gone\.rec"):
        RecordsShardReader(tmp_path / "gone.rec")


def test_every_local_shard_is_hinted_before_it_is_opened_and_its_file_opened_once(
    packed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, str]] = []
    real_advise, real_init, real_open = records.advise_open, RecordsShardReader.__init__, os.open

    def advise(path: str | Path, size: int, num_records: int) -> int | None:
        events.append(("hint", Path(path).name))
        return real_advise(path, size, num_records)

    def init(self: RecordsShardReader, path: str | Path, fd: int | None = None) -> None:
        events.append(("open", Path(path).name))
        real_init(self, path, fd)

    def os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith(".rec"):
            events.append(("os.open", Path(path).name))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr("shardio.reading.reader.advise_open", advise)
    monkeypatch.setattr(RecordsShardReader, "__init__", init)
    monkeypatch.setattr(os, "open", os_open)
    dataset = shardio.StreamingDataset(packed, decode="raw", shuffle_buffer=WINDOW, seed=1)
    keys = [sample["__key__"] for sample in dataset]
    assert sorted(keys) == sorted({*keys}) and len(keys) == NUM_FILES
    opened = [name for kind, name in events if kind == "open"]
    assert len(opened) == len(shardio.read_manifest(packed).shards)
    for name in opened:
        assert events.index(("hint", name)) < events.index(("open", name))
    # the hint's descriptor is the reader's: one open of each file, as without hints
    files = [name for kind, name in events if kind == "os.open"]
    assert sorted(files) == sorted(opened)


def test_the_next_window_is_hinted_once_this_one_is_decoded(
    packed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, str, int, int]] = []
    real_hint, real_load = RecordsShardReader.will_need, stream._OpenWindow.load

    def will_need(self: RecordsShardReader, start: int, stop: int) -> None:
        events.append(("hint", Path(self.path).name, start, stop))
        real_hint(self, start, stop)

    def load(window: Any, r: int) -> Any:
        # each run as it is decoded (when its first sample is due)
        shard, start, stop = window._runs[r]
        if not window._loaded[r]:
            events.append(("decode", Path(window._reader.shard(shard).path).name, start, stop))
        return real_load(window, r)

    monkeypatch.setattr(RecordsShardReader, "will_need", will_need)
    monkeypatch.setattr(stream._OpenWindow, "load", load)
    dataset = shardio.StreamingDataset(packed, decode="raw", shuffle_buffer=WINDOW, seed=2,
                                       block_size=10)
    keys = [sample["__key__"] for sample in dataset]
    assert len(keys) == len(set(keys)) == NUM_FILES
    first = next(i for i, event in enumerate(events) if event[0] == "decode")
    hinted_first = [event for event in events[:first] if event[0] == "hint"]
    # before the first window is decoded, its runs alone are hinted: the next window's
    # reads would have been sorted in front of those it waits for
    assert WINDOW <= sum(stop - start for _k, _n, start, stop in hinted_first) < 2 * WINDOW
    # every run decoded was hinted before it was decoded
    for i, (kind, *run) in enumerate(events):
        if kind == "decode":
            assert ("hint", *run) in events[:i]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts /proc/self/fd")
def test_a_truncated_shard_hinted_before_its_open_fails_by_name_and_leaks_no_descriptor(
    packed: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "ds"
    copy.mkdir()
    for path in packed.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    victim = sorted(copy.glob("*.rec"))[3]
    victim.write_bytes(victim.read_bytes()[:-100])  # the manifest says 100 bytes more
    before = len(os.listdir("/proc/self/fd"))
    dataset = shardio.StreamingDataset(copy, decode="raw", shuffle_buffer=WINDOW, seed=0)
    with pytest.raises(shardio.TruncatedShardError, match=victim.name):
        for _sample in dataset:
            pass
    del dataset
    import gc

    gc.collect()
    # the hinted shards' descriptors, the truncated one's among them, are all closed
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise only")
def test_a_large_run_is_hinted_only_where_its_pages_are_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "ds"
    with shardio.ShardWriter(out, shardio.WriteOptions(codec="none", version=2)) as writer:
        for i in range(16):
            writer.write({"__key__": f"k/{i}", "bin": bytes([i]) * (256 << 10)})
    path = next(out.glob("*.rec"))
    path.read_bytes()  # every page cached
    reader = RecordsShardReader(path)
    calls = _fadvise_calls(monkeypatch)
    reader.will_need(0, 8)  # 2 MB, cached: nothing to read ahead
    reader.will_need(3, 4)  # 256 KB: hinted without asking where its pages are
    assert [(offset, length) for offset, length, _advice in calls] == [
        (reader.offset(3), reader.offset(4) - reader.offset(3))]
    fd = os.open(path, os.O_RDONLY)  # out of the page cache (nothing of it is mapped yet)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    calls.clear()
    if records.RecordsShardReader._cached(reader, reader.offset(8)):
        pytest.skip("this file system kept the pages cached")
    reader.will_need(8, 16)
    assert [(offset, length, advice) for offset, length, advice in calls] == [
        (reader.offset(8), reader.offset(16) - reader.offset(8), os.POSIX_FADV_WILLNEED)]
    reader.close()
