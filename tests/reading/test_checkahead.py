"""Record checksums computed on the checker thread ahead of the stream (reading.checkahead)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import shardio
from shardio.backends.records import RecordsShardReader
from shardio.errors import ChecksumError
from shardio.format.frames import first_failing
from shardio.packing.writer import ShardWriter, WriteOptions
from shardio.reading import checkahead
from shardio.torch.dataset import StreamingDataset


def payload(i: int) -> bytes:
    return bytes([i % 251]) * (3000 + i % 17)


def write(out: Path, num: int = 600) -> Path:
    with ShardWriter(out, WriteOptions(codec="none", max_shard_samples=200, version=2)) as writer:
        for i in range(num):
            writer.write({"__key__": f"k/{i:05d}", "bin": payload(i), "n": i})
    return out


def flip(root: Path, shard: str, record: int) -> None:
    path = root / shard
    reader = RecordsShardReader(path)
    at = reader.offset(record) + 40  # inside the payload
    reader.close()
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def test_an_epoch_is_checked_on_the_thread_and_delivers_every_sample(tmp_path: Path) -> None:
    root = write(tmp_path / "ds")
    loader = shardio.loader(StreamingDataset(root, shuffle=True, seed=3), batch_size=32,
                            num_workers=0)
    seen = []
    for batch in loader:
        for i, data, n in zip(batch.indices.tolist(), batch.bytes("bin"), batch["n"].tolist(),
                              strict=True):
            assert bytes(data) == payload(i) and n == i
            seen.append(i)
    assert sorted(seen) == list(range(600))


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_flipped_bit_is_named_though_checked_on_the_thread(tmp_path: Path,
                                                             shuffle: bool) -> None:
    root = write(tmp_path / "ds")
    flip(root, "shard-00001.rec", 77)
    ds = StreamingDataset(root, shuffle=shuffle, seed=1)
    with pytest.raises(ChecksumError, match=r"shard-00001\.rec: record 77 at byte"):
        for _batch in shardio.loader(ds, batch_size=16, num_workers=0):
            pass
    with pytest.raises(ChecksumError, match=r"shard-00001\.rec: record 77 at byte"):
        for _sample in ds:
            pass


def test_verify_off_hands_nothing_to_the_thread(tmp_path: Path) -> None:
    root = write(tmp_path / "ds")
    flip(root, "shard-00000.rec", 3)
    thread = checkahead.checker()
    before = thread.checked
    got = sorted(s["__index__"] for s in StreamingDataset(root, shuffle=True, verify=False))
    assert got == list(range(600)) and thread.checked == before


def test_the_thread_finds_the_first_failing_record_of_a_run(tmp_path: Path) -> None:
    root = write(tmp_path / "ds")
    flip(root, "shard-00002.rec", 150)
    reader = RecordsShardReader(root / "shard-00002.rec")
    try:
        run = reader.read_run(100, 200)
        check = checkahead.checker().submit(run)
        assert not check.passed() and check.failing == 50 == first_failing(run)
        good = checkahead.checker().submit(reader.read_run(0, 100))
        assert good.passed() and good.failing is None
    finally:
        reader.close()


def test_a_cancelled_check_is_skipped_and_never_passes() -> None:
    import threading

    import numpy as np

    from shardio.format.frames import RunBytes

    gate = checkahead.Check(RunBytes(memoryview(b""), np.zeros(1, np.int64), "crc32c"),
                            threading.Lock())
    gate.cancel()
    assert not gate._work()
    assert not gate.passed() and gate.run is None


def test_stopping_mid_window_then_a_new_epoch(tmp_path: Path) -> None:
    root = write(tmp_path / "ds", 2000)
    ds = StreamingDataset(root, shuffle=True, seed=5)
    loader = shardio.loader(ds, batch_size=16, num_workers=0)
    for _batch in loader:
        break  # the window's checks still queued are cancelled when it closes
    assert sum(len(b) for b in loader) == 2000


def _epoch_in_forked_workers(root: str) -> list[int]:
    loader = DataLoader(StreamingDataset(root, shuffle=True, seed=2), batch_size=None,
                        num_workers=2, multiprocessing_context="fork")
    return sorted(int(s["__index__"]) for s in loader)


def test_forked_workers_after_the_parent_used_the_thread(tmp_path: Path) -> None:
    root = write(tmp_path / "ds")
    parent = checkahead.checker()
    assert sum(1 for _ in StreamingDataset(root, shuffle=True)) == 600
    assert _epoch_in_forked_workers(str(root)) == list(range(600))
    assert checkahead.checker() is parent  # the parent keeps its own thread
    with multiprocessing.get_context("fork").Pool(1) as pool:
        child_pid, child_is_new = pool.apply(_child_checker)
    assert child_is_new and child_pid != parent.pid


def _child_checker() -> tuple[int, bool]:
    inherited = checkahead._CHECKER
    mine = checkahead.checker()
    return mine.pid, mine is not inherited


def test_a_reader_ahead_of_the_thread_checks_runs_itself(tmp_path: Path) -> None:
    import threading

    root = write(tmp_path / "ds")
    flip(root, "shard-00000.rec", 30)
    reader = RecordsShardReader(root / "shard-00000.rec")
    try:
        alone = checkahead.Check(reader.read_run(0, 20), threading.Lock())  # no thread has it
        assert alone.passed() and alone.run is None
        thread = checkahead.checker()
        before = thread.checked
        probe = thread.submit(reader.read_run(40, 60))  # left to the thread alone
        assert probe._done.acquire(timeout=60)  # released once the thread has run it
        probe._done.release()
        assert thread.checked == before + 1 and probe.passed()
        before = thread.checked
        runs = [(a, min(a + 3, 200)) for a in range(0, 200, 3)] * 5
        checks = [thread.submit(reader.read_run(a, b)) for a, b in runs]
        # taken in turn, as the stream does: each runs once, here or on the thread
        results = [check.passed() for check in checks]
        assert results == [not a <= 30 < b for a, b in runs]
        assert [c.failing for c in checks if c.failing is not None] == [30 - 30 // 3 * 3] * 5
        assert thread.checked - before <= len(runs)
    finally:
        reader.close()


@pytest.mark.parametrize(("cpus", "used"), [(1, False), (2, True)])
def test_the_thread_is_used_only_with_a_core_to_spare(tmp_path: Path, cpus: int, used: bool,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import shardio.reading.stream
    import shardio.torch.dataset

    root = write(tmp_path / "ds")
    calls: list[int] = []
    real = shardio.reading.stream._check_ahead

    def spy(reader: object, due: list[object], *rest: object) -> object:
        calls.append(len(due))
        return real(reader, due, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(shardio.reading.stream, "_check_ahead", spy)
    monkeypatch.setattr(shardio.torch.dataset, "available_cpus", lambda: cpus)
    loader = shardio.loader(StreamingDataset(root, shuffle=True), batch_size=50, num_workers=0)
    assert sum(len(b) for b in loader) == 600
    assert bool(calls) == used


def test_the_next_window_is_queued_on_the_thread_when_a_window_opens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # queued only as a window opened, a local window's checks were all due at once (its runs
    # are decoded together on its first sample): the reader took over about half of them
    import numpy as np

    from shardio.reading.reader import DatasetReader
    from shardio.reading.stream import _plan_window, gap_records, iter_samples

    root = write(tmp_path / "ds")
    queued: list[checkahead.Check] = []
    real = checkahead.Checker.submit

    def spy(self: checkahead.Checker, *args: object, **kwargs: object) -> checkahead.Check:
        check = real(self, *args, **kwargs)  # type: ignore[arg-type]
        queued.append(check)
        return check

    monkeypatch.setattr(checkahead.Checker, "submit", spy)
    order = np.random.default_rng(0).permutation(600).astype(np.int64)
    with DatasetReader(root) as reader:
        samples = iter_samples(reader, order, window=100, max_run=10)
        first = next(samples)
        firsts = np.asarray([0, 200, 400], np.int64)
        gap = gap_records(reader.manifest, 10)
        due = [_plan_window(order, w, w, 100, firsts, 10, gap).due for w in (0, 100)]
        assert len(queued) == len(due[0]) + len(due[1])
        rest = [first["__index__"]] + [next(samples)["__index__"] for _ in range(149)]
        assert rest == order[:150].tolist()
        samples.close()  # mid-window: the next window's checks not started are dropped
    assert all(check._state != checkahead._PENDING for check in queued)



def test_a_local_reader_takes_the_checks_the_thread_has_not_started_in_file_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the thread works through a window's checks in due order; the reader takes those of a
    # batch it has not started in file order, the order a cold disk delivers them
    import threading

    import numpy as np

    import shardio.reading.stream
    from shardio.reading.reader import DatasetReader
    from shardio.reading.stream import iter_samples

    root = write(tmp_path / "ds")
    planned: list[dict[Any, tuple[object, checkahead.Check]]] = []
    real_plan = shardio.reading.stream._check_ahead

    def plan_spy(*args: object) -> dict[Any, tuple[object, checkahead.Check]]:
        got = real_plan(*args)  # type: ignore[arg-type]
        planned.append(dict(got))  # the window pops what it takes
        return got  # type: ignore[return-value]

    ran: list[tuple[bool, int]] = []
    from shardio.format.frames import first_failing as real_failing

    def failing_spy(run: object) -> int | None:
        ran.append((threading.current_thread() is threading.main_thread(), id(run)))
        return real_failing(run)  # type: ignore[arg-type]

    monkeypatch.setattr(shardio.reading.stream, "_check_ahead", plan_spy)
    monkeypatch.setattr(checkahead, "first_failing", failing_spy)
    gate = threading.Event()
    def hold() -> None:
        gate.wait(60)

    checkahead.checker().later(hold)  # the thread starts none of them
    order = np.random.default_rng(1).permutation(600).astype(np.int64)
    try:
        with DatasetReader(root) as reader:
            samples = iter_samples(reader, order, window=100, max_run=10)
            assert next(samples)["__index__"] == order[0]
            due = list(planned[0].items())  # in due order
            taken = len(ran)  # the runs of the first gather of samples, not the window's
            assert 3 < taken < len(due)
            in_files = sorted(due[:taken], key=lambda item: item[0])
            assert in_files != due[:taken]
            assert ran == [(True, id(value[0])) for _run, value in in_files]
            gate.set()
            rest = [next(samples)["__index__"] for _ in range(299)]
            assert rest == order[1:300].tolist()
            samples.close()
    finally:
        gate.set()


def test_a_queued_job_keeps_its_result_and_a_job_that_raises_fails_its_check(
        tmp_path: Path) -> None:
    root = write(tmp_path / "ds")
    reader = RecordsShardReader(root / "shard-00000.rec")
    run = reader.read_run(0, 10)
    thread = checkahead.checker()
    good = thread.submit(run, lambda r: len(r.buffer))

    def broken(r: object) -> object:
        raise ChecksumError("a block of this run fails", path="x")

    bad = thread.submit(run, broken)
    assert good.passed() and good.result == len(run.buffer)
    assert not bad.passed() and isinstance(bad.error, ChecksumError)
    assert good.run is None and good.work is None  # nothing held once done
    del run
    reader.close()
