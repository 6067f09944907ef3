"""Batches cross from workers through shared memory each worker reuses (``torch.handover.ring``).

Through real ``shardio.loader`` DataLoaders on a generated pack: batches and views
the consumer holds stay intact while workers keep writing; slots are reused
when batches are dropped, grown when a batch does not fit, and a consumer that
keeps every batch gets copies instead of stalling a worker; nothing of ours is
left in ``/dev/shm`` after a normal run or after a worker is SIGKILLed while it
holds slots, and the epoch then continues exactly.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from shardio import ShardWriter, WriteOptions
from shardio.reading.batch import RecordBatch
from shardio.torch.dataset import StreamingDataset
from shardio.torch.handover import views as shmview
from shardio.torch.loader import loader

pytestmark = pytest.mark.slow

NUM_SAMPLES = 160
BATCH = 8
SHM = Path("/dev/shm")


def payload(i: int) -> bytes:
    """40 bytes to 320 KB, growing along the stored order: small records and zero-copy views
    both occur, and unshuffled batches outgrow the first slots (1 MB)."""
    return bytes([i % 251]) * (40 + 2000 * i)


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ring") / "ds"
    # format v2: its compressed payloads are inflated, so batches cross through the ring (v3
    # stores these runs of one byte raw: they cross as places in the files)
    with ShardWriter(out, WriteOptions(max_shard_samples=50, version=2)) as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"__key__": f"s/{i:04d}", "bin": payload(i), "n": i})
    return out


def check(views: list[Any], keys: list[str]) -> None:
    for key, view in zip(keys, views, strict=True):
        assert view is not None and view.tobytes() == payload(int(key[2:])), key


def segments(run: Any) -> dict[tuple[int, int], int]:
    """``(worker pid, slot) -> generation`` of the segments the main process has mapped."""
    return {(pid, slot): entry[0] for (token, pid, slot), entry in shmview._MAPPED.items()
            if token == run._token}


def ours(pids: set[int]) -> list[str]:
    """Entries of /dev/shm made by these processes (torch names its segments torch_<pid>_…)."""
    return [n for n in os.listdir(SHM)
            if "shardio" in n or any(n.startswith(f"torch_{p}_") for p in pids)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_held_batches_and_views_stay_intact(pack: Path, num_workers: int) -> None:
    run = loader(StreamingDataset(pack, decode="raw", seed=3), batch_size=BATCH,
                 num_workers=num_workers, prefetch_factor=1)
    held: list[RecordBatch] = []
    views: list[tuple[list[Any], list[str]]] = []
    for k, batch in enumerate(run):
        if k % 2:
            held.append(batch)  # the whole batch
        else:
            views.append((batch.bytes("bin"), list(batch.keys)))  # only its views
    assert len(held) + len(views) == NUM_SAMPLES // BATCH
    for batch in held:
        check(batch.bytes("bin"), batch.keys)
        assert [int(k[2:]) for k in batch.keys] == batch["n"].tolist() == batch.indices.tolist()
    for kept, keys in views:
        check(kept, keys)
    seen = sorted([k for b in held for k in b.keys] + [k for _, ks in views for k in ks])
    assert seen == [f"s/{i:04d}" for i in range(NUM_SAMPLES)]
    if num_workers:
        # 20 batches, 10 held per worker, 5 slots each (prefetch_factor + 4): the rest copied
        through_ring = sum(isinstance(b.buffer, memoryview) for b in held)
        assert 0 < through_ring < len(held)
        assert len(segments(run)) <= 2 * 5


def test_dropped_batches_give_their_slot_back_and_slots_grow(pack: Path) -> None:
    # unshuffled: batches grow along the stored order, so a slot must be grown
    run = loader(StreamingDataset(pack, decode="raw", shuffle=False), batch_size=BATCH,
                 num_workers=2, prefetch_factor=2)
    for _epoch in range(2):
        for batch in run:
            assert isinstance(batch.buffer, memoryview)  # every batch through the ring
            check(batch.bytes("bin"), batch.keys)
    mapped = segments(run)
    assert len({pid for pid, _slot in mapped}) == 2
    assert len(mapped) <= 2 * 6  # 40 batches through at most prefetch_factor + 4 slots each
    assert max(mapped.values()) > len(mapped) // 2, "no slot was ever grown"
    token = run._token
    del run, batch
    gc.collect()
    assert not any(t == token for t, _pid, _slot in shmview._MAPPED)


def test_nothing_left_in_dev_shm_after_a_run(pack: Path) -> None:
    run = loader(StreamingDataset(pack, decode="raw"), batch_size=BATCH, num_workers=2)
    total = sum(len(b) for b in run)
    pids = {pid for pid, _slot in segments(run)}
    assert total == NUM_SAMPLES and len(pids) == 2
    del run
    gc.collect()
    assert not ours(pids | {os.getpid()})


class Gate:
    """A transform run in the workers: sample ``at`` waits until the file ``open`` exists."""

    def __init__(self, at: int, folder: Path) -> None:
        self.at, self.folder = at, folder

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        if sample["__index__"] == self.at:
            if not (self.folder / "open").exists():
                (self.folder / "blocked").write_text(str(os.getpid()))
            while not (self.folder / "open").exists():
                time.sleep(0.01)
        return sample


def test_sigkilled_worker_leaves_nothing_and_the_epoch_continues(
    pack: Path, tmp_path: Path
) -> None:
    order = [b.indices.tolist() for b in loader(  # in the lanes 2 workers read
        StreamingDataset(pack, decode="raw", seed=5, lanes=2), batch_size=BATCH, num_workers=0)]
    gated = 7  # worker 1's fourth batch waits, its earlier batches held by the consumer
    ds = StreamingDataset(pack, decode="raw", seed=5, transform=Gate(order[gated][0], tmp_path))
    run = loader(ds, batch_size=BATCH, num_workers=2, collate_fn=RecordBatch.from_samples)
    batches = iter(run)
    delivered = [next(batches) for _ in range(gated)]
    assert all(isinstance(b.buffer, memoryview) for b in delivered)
    pids = {pid for pid, _slot in segments(run)}
    killed: list[int] = []

    def kill_the_blocked_worker() -> None:
        while not (tmp_path / "blocked").exists():
            time.sleep(0.01)
        killed.append(int((tmp_path / "blocked").read_text()))
        time.sleep(0.2)
        os.kill(killed[0], signal.SIGKILL)

    killer = threading.Thread(target=kill_the_blocked_worker)
    killer.start()
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid"):
        next(batches)
    killer.join()
    assert killed[0] in pids
    assert not ours({killed[0]})
    for batch in delivered:  # the dead worker's batches are still readable
        check(batch.bytes("bin"), batch.keys)
    (tmp_path / "open").touch()
    rest = [b.indices.tolist() for b in run]
    assert [b.indices.tolist() for b in delivered] + rest == order
    pids |= {pid for pid, _slot in segments(run)}
    del run, batches, delivered
    gc.collect()
    assert not ours(pids | {os.getpid()})


def _buffer_and_more(samples: list[dict[str, Any]]) -> tuple[Any, Any]:
    """A collate that writes part of its batch into ``batch_buffer`` and makes the rest
    elsewhere, larger than the room a slot keeps after the buffer."""
    import torch

    from shardio.torch.collate import batch_buffer

    ns = [int(s["n"]) for s in samples]
    head = batch_buffer(8 * len(ns)).view(torch.int64)
    head.copy_(torch.tensor(ns))
    tail = torch.tensor(ns, dtype=torch.int64).repeat_interleave(20_000)  # 160 KB a sample
    return head, tail


def test_a_batch_that_outgrows_its_buffer_slot_arrives_whole(pack: Path) -> None:
    run = loader(StreamingDataset(pack, decode="raw", seed=7), batch_size=BATCH, num_workers=2,
                 collate_fn=_buffer_and_more)
    seen = []
    for head, tail in run:
        ns = head.tolist()
        assert tail.tolist() == [n for n in ns for _ in range(20_000)]
        seen += ns
    assert sorted(seen) == list(range(NUM_SAMPLES))
    assert segments(run), "the batches did not come through the ring"
