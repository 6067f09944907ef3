"""Processes sharing one node cache budget: a tail a sibling will open, space already free.

Each reading process copies a shard's tail (footer, index, keys) out of the cache once,
when it opens the shard; a sibling opening that shard later needs the same cached range.
Through moto and the fault proxy, with forked DataLoader workers (real processes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from storage_servers import FAST_RETRY, S3Endpoint

import shardio
from shardio.storage import open_store, sharing
from shardio.storage.options import RemoteOptions
from shardio.storage.remote import RemoteStore

pytest_plugins = ("storage_plugin",)

NUM, SHARD, BLOCK, RECORD, WINDOW = 1200, 600, 20, 1000, 120
"""Two shards of ~600 KB in blocks of 20 records (~20 KB); tails of 64 KiB."""


def _pack(out: Path, url: str) -> shardio.Manifest:
    options = shardio.WriteOptions(codec="none", max_shard_samples=SHARD)
    rng = np.random.default_rng(8)
    with shardio.ShardWriter(out, options) as writer:
        for i in range(NUM):
            writer.write({"__key__": f"s{i:04d}", "bin": rng.bytes(RECORD)})
    store = open_store(url, retry=FAST_RETRY)
    for path in sorted(out.iterdir()):
        store.put_file(path.name, path)
    return shardio.read_manifest(out)


def _logged(log: Path) -> list[tuple[str, int, int]]:
    """The GETs every process logged: ``(object, start, stop)``."""
    if not log.exists():
        return []
    rows = [line.split() for line in log.read_text().splitlines()]
    return [(name, int(start), int(stop)) for name, start, stop in rows]


class _LateSecond:
    """A worker_init_fn: worker 1 starts once worker 0 alone downloaded ``num_bytes``
    (the budget and then some: least-recently-used eviction has run), at most ``limit_s``
    later (then the test finds nothing to catch, never a false failure)."""

    def __init__(self, log: Path, num_bytes: int, limit_s: float = 120.0) -> None:
        self.log, self.num_bytes, self.limit_s = log, num_bytes, limit_s

    def __call__(self, worker: int) -> None:
        if worker != 1:
            return
        deadline = time.monotonic() + self.limit_s
        while time.monotonic() < deadline:
            if sum(stop - start for _n, start, stop in _logged(self.log)) >= self.num_bytes:
                return
            time.sleep(0.05)


# forked workers inherit the logging store; 2 workers on a machine with fewer cores is fine
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_a_late_worker_finds_the_tails_its_sibling_opened(
        s3: S3Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manifest = _pack(tmp_path / "ds", s3.url)
    sizes = {shard.name: shard.num_bytes for shard in manifest.shards}
    budget = sum(sizes.values()) // 4
    log = tmp_path / "gets.log"
    read = RemoteStore.read_range_into

    def logging_read(self: RemoteStore, name: str, start: int, stop: int, write: Any) -> None:
        read(self, name, start, stop, write)
        with open(log, "a") as out:  # one short append per GET: lines never interleave
            out.write(f"{name} {start} {stop}\n")

    monkeypatch.setattr(RemoteStore, "read_range_into", logging_read)
    remote = RemoteOptions(cache_dir=tmp_path / "cache", max_cache_bytes=budget,
                           range_bytes=64 << 10, retry=FAST_RETRY)
    ds = shardio.StreamingDataset(s3.url, decode="raw", shuffle_buffer=WINDOW,
                                  block_size=BLOCK, seed=0, remote=remote)
    # worker 0 may run through its whole share (NUM samples ready) while worker 1 waits
    late = _LateSecond(log, budget + 2 * (64 << 10) + budget // 8)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                         prefetch_factor=NUM, worker_init_fn=late,
                                         multiprocessing_context="fork")
    keys = Counter(sample["__key__"] for sample in loader)
    assert len(keys) == NUM and set(keys.values()) == {1}
    gets = _logged(log)
    evicted = sum(stop - start for _n, start, stop in gets) - budget
    assert evicted > 2 * (64 << 10)  # worker 1 started after eviction had run
    tails = Counter(get for get in gets if get[2] == sizes[get[0]])
    assert set(tails) and set(tails.values()) == {1}, tails


class _Holder:
    """Holds ``held`` bytes ahead, its reader idle; records what it was asked to give back,
    and each time the watcher looked at it (once a round, before it counts the waiting)."""

    def __init__(self, held: int) -> None:
        self.held = held
        self.asked: list[int] = []
        self.looked = threading.Semaphore(0)

    @property
    def held_ahead(self) -> int:
        self.looked.release()
        return self.held

    @property
    def idle_s(self) -> float:
        return 1e9

    def give_back(self, num_bytes: int) -> int:
        self.asked.append(num_bytes)
        return 0

    def rounds(self, num_rounds: int) -> None:
        """Wait until the watcher completed ``num_rounds`` rounds from now."""
        for _ in range(num_rounds + 1):
            assert self.looked.acquire(timeout=60)


def test_a_waiting_download_that_free_space_covers_takes_nothing_back(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    (root / sharing.WAITING).mkdir(parents=True)
    need = 1 << 20
    holder = _Holder(4 * need)
    # another process's download waits for 1 MiB (a real process: the watcher skips its own)
    waiting = subprocess.Popen(
        [sys.executable, "-c", "import sys; from shardio.storage.sharing import waiter\n"
         f"with waiter({str(root)!r}, {need}):\n print('in', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert waiting.stdout is not None and waiting.stdout.readline() == "in\n"
        (entry,) = os.scandir(root / sharing.WAITING)
        old = time.time() - 10 * sharing.YIELD_AFTER_S  # it has waited long enough
        os.utime(entry.path, (old, old))
        free = [need]  # ...and the space it waits for is free now (it sleeps between tries)
        sharing.hold_ahead(root, holder)
        sharing.held_ahead(root, lambda: free[0])
        holder.rounds(2)
        assert holder.asked == []
        free[0] = need // 4  # a quarter is free: the rest is given back
        holder.rounds(2)
        assert holder.asked and holder.asked[-1] == need - need // 4
    finally:
        assert waiting.stdin is not None
        waiting.stdin.close()
        waiting.wait(timeout=60)
        holder.held = 0  # the watcher ends
