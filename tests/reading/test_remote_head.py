"""The first batch of a remote stream: its records read on their own, ahead of their ranges.

A shuffled first batch wants a record or two of each of many blocks; a remote reader
reads those records as ranges of their own (``will_need_exact``) before the window's
whole ranges, which copy them from the cache and download the rest. Through
moto and the fault proxy: which byte spans the cache holds after an epoch, that every
sample still arrives once with its bytes, that a cached dataset downloads nothing for
its first batch, ``head_runs``' cover of the first samples, and ``ReadAhead.fetch_first``.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from storage_servers import FAST_RETRY, S3Endpoint

import shardio
from shardio.backends.remoterecords import partition, tail_guess
from shardio.format.runs import decode_run
from shardio.order.plan import PlanConfig, Split, plan_epoch
from shardio.reading.reader import DatasetReader
from shardio.reading.stream import _plan_window, head_runs
from shardio.storage import open_store
from shardio.storage.cache import RangeCache
from shardio.storage.fetch import RangeRequest
from shardio.storage.options import RemoteOptions
from shardio.storage.readahead import ReadAhead

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

NUM, SHARD, BLOCK, BATCH = 240, 120, 20, 4
"""Samples of 3 KB, shards of 120 (360 KB), blocks of 20 (60 KB: ranges join blocks up to
64 KiB, so each is a block): a first batch of 4 wants one record of a range, 1/20 of it."""


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("remote-head") / "ds"
    # format v2: a record read on its own is its frame (v3: its stored block)
    options = shardio.WriteOptions(codec="none", max_shard_samples=SHARD, version=2)
    rng = np.random.default_rng(4)
    with shardio.ShardWriter(out, options) as writer:
        for i in range(NUM):
            writer.write({"__key__": f"s{i:03d}", "bin": rng.bytes(3000)})
    return out


def _upload(folder: Path, url: str) -> None:
    store = open_store(url, retry=FAST_RETRY)
    for path in sorted(folder.iterdir()):
        store.put_file(path.name, path)


def _options(tmp_path: Path) -> RemoteOptions:
    return RemoteOptions(cache_dir=tmp_path / "cache", max_cache_bytes=64 << 20,
                         range_bytes=64 << 10, retry=FAST_RETRY)


def _spans(cache: Path) -> set[tuple[str, int, int]]:
    """``(object, start, stop)`` of every complete range in the cache folder."""
    spans = set()
    for entry in (cache / "ranges").iterdir():
        match = re.fullmatch(r".*~(shard-\d+\.rec)@(\d+)-(\d+)", entry.name)
        assert match is not None, entry.name
        spans.add((match[1], int(match[2]), int(match[3])))
    return spans


def _dataset(url: str, tmp_path: Path, block: int = BLOCK) -> shardio.StreamingDataset:
    return shardio.StreamingDataset(url, decode="raw", shuffle_buffer=NUM, block_size=block,
                                    seed=3, remote=_options(tmp_path))


@pytest.mark.parametrize("workers", [0, 2])
def test_the_first_batch_is_read_record_by_record_and_each_range_once_after(
        workers: int, packed: Path, s3: S3Endpoint, tmp_path: Path) -> None:
    _upload(packed, s3.url)
    # plan blocks of 2: the first window yields 2 samples of one block, then 4 of 2 blocks
    # (``head_first``), so a first batch of 4 wants records of several ranges
    loader = shardio.loader(_dataset(s3.url, tmp_path, block=2), batch_size=BATCH,
                            num_workers=workers)
    s3.plan.reset()
    batches = [(list(batch.keys), [bytes(b) for b in batch.bytes("bin")]) for batch in loader]
    keys = Counter(key for batch_keys, _ in batches for key in batch_keys)
    assert len(keys) == NUM and set(keys.values()) == {1}
    local = DatasetReader(packed)
    for batch_keys, payloads in batches:
        for key, payload in zip(batch_keys, payloads, strict=True):
            assert payload == local.get(int(key[1:]))["bin"]

    # what the cache holds: each shard's tail, its whole ranges, and the records of the
    # first batch of each reading process on their own (not the whole ranges they lie in)
    spans = _spans(tmp_path / "cache")
    whole, tails = _planned_spans(local, block=2)
    assert whole | tails <= spans
    exact = spans - whole - tails
    firsts = [batch_keys for batch_keys, _ in batches[: max(1, workers)]]
    wanted = {span for batch_keys in firsts
              for span in _joined([_record_span(local, int(key[1:])) for key in batch_keys])}
    # with workers, a range another worker has downloaded already is read whole instead
    assert exact == wanted if workers == 0 else exact and exact <= wanted
    # no byte twice: a range copies the first batch's records from the cache and downloads
    # the rest (with workers, a range may start before another worker's records are in)
    once = sum(stop - start for _name, start, stop in whole | tails)
    twice = sum(stop - start for _name, start, stop in exact)
    got = s3.plan.body_bytes
    assert got == once if workers == 0 else once <= got <= once + twice
    local.close()


def test_v3_blocks_of_a_first_batch_are_downloaded_once(
        s3: S3Endpoint, tmp_path: Path) -> None:
    # a v3 record read on its own is its whole block: here 4 blocks of 60 KB for a first
    # batch of 4, together a sixth of the dataset (one shard of 1.4 MB); its range copies
    # them from the cache, so every byte is downloaded once (besides the shard's tail)
    out = tmp_path / "v3"
    rng = np.random.default_rng(5)
    options = shardio.WriteOptions(codec="none", max_shard_samples=2 * NUM, block_records=20)
    with shardio.ShardWriter(out, options) as writer:
        for i in range(2 * NUM):
            writer.write({"__key__": f"s{i:03d}", "bin": rng.bytes(3000)})
    manifest = shardio.read_manifest(out)
    assert manifest.version == 3 and len(manifest.shards) == 1
    _upload(out, s3.url)
    s3.plan.reset()
    remote = RemoteOptions(cache_dir=tmp_path / "cache", max_cache_bytes=64 << 20,
                           range_bytes=16 << 20, retry=FAST_RETRY)
    ds = shardio.StreamingDataset(s3.url, decode="raw", shuffle_buffer=2 * NUM, block_size=20,
                                  seed=3, remote=remote)
    keys = Counter(key for batch in shardio.loader(ds, batch_size=BATCH, num_workers=0)
                   for key in batch.keys)
    assert len(keys) == 2 * NUM and set(keys.values()) == {1}
    stored = sum(shard.num_bytes for shard in manifest.shards)
    tails = sum(tail_guess(shard.num_bytes, shard.num_samples, manifest.block_records)
                for shard in manifest.shards)
    assert s3.plan.body_bytes <= stored + tails


def test_a_cached_dataset_downloads_nothing_for_its_first_batch(
        packed: Path, s3: S3Endpoint, tmp_path: Path) -> None:
    _upload(packed, s3.url)
    loader = shardio.loader(_dataset(s3.url, tmp_path), batch_size=BATCH, num_workers=0)
    assert sum(len(batch) for batch in loader) == NUM
    s3.plan.reset()
    # another epoch, another first batch: its ranges are in the cache whole, so they are read
    assert sum(len(batch) for batch in loader) == NUM
    assert s3.plan.ranged_gets == 0


def _planned_spans(local: DatasetReader, block: int = BLOCK
                   ) -> tuple[set[tuple[str, int, int]], set[tuple[str, int, int]]]:
    """Each shard's whole ranges (plan blocks of ``block``, 64 KiB ranges) and its tail: what
    any epoch downloads, the first batch read on its own or not."""
    whole, tails = set(), set()
    for number, info in enumerate(local.manifest.shards):
        shard = local.shard(number)
        last = info.num_samples - 1
        offsets = np.asarray([shard.offset(i) for i in range(info.num_samples)]
                             + [shard.offset(last) + len(shard.frame(last))], np.uint64)
        cuts = partition(offsets, 64 << 10, block)
        whole |= {(info.name, 0 if j == 0 else int(offsets[cuts[j]]), int(offsets[cuts[j + 1]]))
                  for j in range(len(cuts) - 1)}
        guess = tail_guess(info.num_bytes, info.num_samples, local.manifest.block_records)
        tails.add((info.name, info.num_bytes - guess, info.num_bytes))
    return whole, tails


def _joined(spans: list[tuple[str, int, int]]) -> list[tuple[str, int, int]]:
    """``spans`` with those that meet joined (consecutive records: one GET)."""
    out: list[tuple[str, int, int]] = []
    for name, start, stop in sorted(spans):
        if out and out[-1][0] == name and out[-1][2] == start:
            out[-1] = (name, out[-1][1], stop)
        else:
            out.append((name, start, stop))
    return out


def _record_span(reader: DatasetReader, index: int) -> tuple[str, int, int]:
    shard, record = reader.locate(index)
    start = reader.shard(shard).offset(record)
    return reader.manifest.shards[shard].name, start, start + len(reader.shard(shard).frame(record))


@pytest.mark.parametrize("block_records", [None, 5])
@pytest.mark.parametrize("head", [0, 1, 7, 64, 500])
def test_head_runs_cover_the_first_samples_within_the_window_runs_in_due_order(
        head: int, block_records: int | None) -> None:
    config = PlanConfig(shard_sizes=(90, 70, 80), seed=2, window=120, block_size=10)
    order = plan_epoch(config, 1, Split())
    firsts = np.asarray([0, 90, 160], np.int64)
    plan = _plan_window(order, 0, 3, 120, firsts, 10, 9)
    runs = head_runs(plan, firsts, head, block_records)
    covered = [int(firsts[s]) + r for s, a, b in runs for r in range(a, b)]
    first = set(order[3 : min(3 + head, 120)].tolist())  # one window
    assert len(covered) == len(set(covered))
    if block_records is None:
        assert sorted(covered) == sorted(first)
    else:  # and the window's records between two of them in one stored block
        assert set(covered) >= first
        assert set(covered) <= set(order[:120].tolist())
        blocks: dict[tuple[int, int], list[int]] = {}
        for s, a, b in runs:
            for r in range(a, b):
                blocks.setdefault((s, r // block_records), []).append(r)
        for (s, _block), records in blocks.items():
            wanted = [r for r in records if int(firsts[s]) + r in first]
            assert sorted(records) == list(range(min(wanted), max(wanted) + 1))
    for shard, start, stop in runs:  # inside one of the window's runs
        assert any(s == shard and a <= start and stop <= b for s, a, b in plan.runs)
    due = [next(n for n, i in enumerate(order[3:].tolist()) if i in range(
        int(firsts[s]) + a, int(firsts[s]) + b)) for s, a, b in runs]
    assert due == sorted(due)


@pytest.mark.parametrize("workers", [0, 2])
def test_under_half_a_budget_only_the_first_batches_records_are_downloaded_twice(
        workers: int, packed: Path, s3: S3Endpoint, tmp_path: Path) -> None:
    # the first window's head records and runs are queued in the order they are taken: a
    # range queued out of that order was dropped by the read-ahead and, evicted meanwhile
    # under this budget, downloaded again
    _upload(packed, s3.url)
    manifest = shardio.read_manifest(packed)
    dataset_bytes = sum(s.num_bytes for s in manifest.shards)
    tails = sum(tail_guess(s.num_bytes, s.num_samples, manifest.block_records)
                for s in manifest.shards)
    remote = RemoteOptions(cache_dir=tmp_path / "cache", max_cache_bytes=dataset_bytes // 2,
                           range_bytes=64 << 10, max_in_flight=2, retry=FAST_RETRY)
    ds = shardio.StreamingDataset(s3.url, decode="raw", shuffle_buffer=NUM // 4,
                                  block_size=BLOCK, seed=3, remote=remote)
    s3.plan.reset()
    keys = Counter(key for batch in shardio.loader(ds, batch_size=BATCH, num_workers=workers)
                   for key in batch.keys)
    assert len(keys) == NUM and set(keys.values()) == {1}
    record = dataset_bytes / NUM
    # with 2 workers, ranges a worker took were seen downloaded again (1 run in ~5 of the
    # full suite: 943,980 bytes against a bound of 887,668, once 1,064,110 against
    # 1,018,740 with one range a worker allowed): ranges evicted under this budget between
    # a worker's windows, as the two workers' windows interleave; what this test holds is
    # that no more than two ranges a worker go twice
    again = 0 if workers == 0 else 2 * workers * (64 << 10)
    assert 0 < s3.plan.body_bytes <= (
        dataset_bytes + tails + max(1, workers) * BATCH * record + again)


def test_ranges_fetched_first_are_taken_in_any_order_beside_the_queue(
        s3: S3Endpoint, tmp_path: Path) -> None:
    data = bytes(range(256)) * 100
    store = open_store(s3.url, retry=FAST_RETRY)
    store.put_bytes("obj", data)
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=1 << 20)
    firsts = [RangeRequest("obj", i * 100, i * 100 + 60) for i in range(6)]
    queued = [RangeRequest("obj", 10_000, 12_000), RangeRequest("obj", 12_000, 14_000)]
    s3.plan.reset()
    with ReadAhead(cache, store, version="v1", max_in_flight=4,
                   max_in_flight_bytes=4000) as ahead:
        assert not ahead.fetch_first([RangeRequest("obj", 0, 5000)])  # over the byte limit
        assert ahead.fetch_first(firsts)
        ahead.plan(queued)
        for request in [*reversed(firsts), *queued]:
            with ahead.take(request) as got:
                assert got.read() == data[request.start : request.stop]
    assert s3.plan.ranged_gets == len(firsts) + len(queued)  # each once, none dropped


def test_a_v3_first_batch_read_with_its_head_waits_for_no_whole_range(
        s3: S3Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Format v3 files a head run's samples in columns, not ``samples``: the first batch
    once read its head, then loaded every run of the window queued before it (a whole
    first window downloaded before the first batch)."""
    from shardio.reading import stream

    out = tmp_path / "v3"
    rng = np.random.default_rng(6)
    options = shardio.WriteOptions(codec="none", max_shard_samples=NUM, block_records=2)
    with shardio.ShardWriter(out, options) as writer:
        for i in range(2 * NUM):
            writer.write({"__key__": f"s{i:03d}", "bin": rng.bytes(3000)})
    _upload(out, s3.url)
    loads: list[str] = []
    load, load_head = stream._OpenWindow.load, stream._OpenWindow._load_head

    def spy_load(self: stream._OpenWindow, r: int) -> None:
        loads.append("run")
        load(self, r)

    def spy_head(self: stream._OpenWindow, run: tuple[int, int, int]) -> None:
        loads.append("head")
        load_head(self, run)

    monkeypatch.setattr(stream._OpenWindow, "load", spy_load)
    monkeypatch.setattr(stream._OpenWindow, "_load_head", spy_head)
    ds = shardio.StreamingDataset(s3.url, decode="raw", shuffle_buffer=2 * NUM, block_size=2,
                                  seed=3, remote=_options(tmp_path))
    batches = iter(shardio.loader(ds, batch_size=BATCH, num_workers=0))
    first = next(batches)
    assert len(first) == BATCH and loads and set(loads) == {"head"}
    keys = Counter([*first.keys, *(key for batch in batches for key in batch.keys)])
    assert len(keys) == 2 * NUM and set(keys.values()) == {1}


def test_a_first_batch_read_with_its_head_is_yielded_before_the_window_is_advised(
        s3: S3Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The window's other runs are advised once the head's samples are out: advised beside
    the head, their whole ranges shared the link with it, and the first batch waited for
    every shard's tail. Only the tails are fetched beside the head."""
    from shardio.reading import stream

    out = tmp_path / "v3"
    rng = np.random.default_rng(7)
    options = shardio.WriteOptions(codec="none", max_shard_samples=NUM // 4, block_records=2)
    with shardio.ShardWriter(out, options) as writer:
        for i in range(NUM):
            writer.write({"__key__": f"s{i:03d}", "bin": rng.bytes(3000)})
    _upload(out, s3.url)
    advised: list[int] = []
    advise = stream.advise

    def spy(reader: stream.RunReader, runs: list[tuple[int, int, int]]) -> None:
        advised.append(len(runs))
        advise(reader, runs)

    monkeypatch.setattr(stream, "advise", spy)
    ds = shardio.StreamingDataset(s3.url, decode="raw", shuffle_buffer=NUM, block_size=2,
                                  seed=3, remote=_options(tmp_path))
    batches = iter(shardio.loader(ds, batch_size=BATCH, num_workers=0))
    first = next(batches)
    assert len(first) == BATCH and advised == []
    keys = Counter([*first.keys, *(key for batch in batches for key in batch.keys)])
    assert len(keys) == NUM and set(keys.values()) == {1}
    assert advised and advised[0] > 0


def _one_range_shard(s3: S3Endpoint, tmp_path: Path) -> tuple[Path, list[bytes]]:
    """A v3 shard of 200 records of 3 KB on ``s3`` (one range of 600 KB, blocks of 24 KB)."""
    out = tmp_path / "v3"
    rng = np.random.default_rng(8)
    payloads = [rng.bytes(3000) for _ in range(200)]
    options = shardio.WriteOptions(codec="none", max_shard_samples=200, block_records=8)
    with shardio.ShardWriter(out, options) as writer:
        for i, payload in enumerate(payloads):
            writer.write({"__key__": f"s{i:03d}", "bin": payload})
    _upload(out, s3.url)
    return out, payloads


def _one_range_options(tmp_path: Path) -> RemoteOptions:
    return RemoteOptions(cache_dir=tmp_path / "cache", max_cache_bytes=64 << 20,
                         range_bytes=16 << 20, retry=FAST_RETRY)


def test_head_runs_sharing_a_block_download_it_once_and_their_range_only_the_rest(
        s3: S3Endpoint, tmp_path: Path) -> None:
    """Two runs of a first batch that want records of one v3 block share one request (the
    block downloaded once, each run reading its own records out of it); the range holding
    them, downloaded later, copies those blocks from the cache and fetches only the rest."""
    _out, payloads = _one_range_shard(s3, tmp_path)
    with DatasetReader(s3.url, remote=_one_range_options(tmp_path)) as reader:
        shard = reader.shard(0)
        s3.plan.reset()
        runs = [(1, 3), (4, 6), (17, 18)]  # the first two in block 0, the third in block 2
        assert shard.will_need_exact(runs) is False  # nothing cached yet
        for start, stop in runs:
            run = shard.read_run_exact(start, stop)
            got = [s["bin"] for s in decode_run(run, path=shard.path, first_record=start,
                                                keys=shard.keys())]
            assert got == payloads[start:stop]
        assert s3.plan.ranged_gets == 2  # block 0 once for two runs, block 2 once
        head_bytes = s3.plan.body_bytes
        whole = shard.read_run(0, 200)
        got = [s["bin"] for s in decode_run(whole, path=shard.path, first_record=0,
                                            keys=shard.keys())]
        assert got == payloads
        # the range: its bytes before block 0, between blocks 0 and 2, after block 2
        assert s3.plan.ranged_gets == 2 + 3
        assert 0 < head_bytes < s3.plan.body_bytes - head_bytes
        assert s3.plan.body_bytes == shard.max_range_bytes  # the head's blocks not twice
        assert shard.will_need_exact(runs) is True  # all in the cache now


def test_a_damaged_cached_part_is_not_copied_into_its_range(
        s3: S3Endpoint, tmp_path: Path) -> None:
    """A first batch's block damaged in the node cache after it was read: the range that
    copies it fails its check, is downloaded whole, and every record is right."""
    out, payloads = _one_range_shard(s3, tmp_path)
    with DatasetReader(s3.url, remote=_one_range_options(tmp_path)) as reader:
        shard = reader.shard(0)
        shard.will_need_exact([(4, 6)])
        shard.read_run_exact(4, 6)
        size = shardio.read_manifest(out).shards[0].num_bytes
        part = next(p for p in (tmp_path / "cache" / "ranges").iterdir()
                    if not p.name.endswith(f"-{size}"))  # the block, not the shard's tail
        data = bytearray(part.read_bytes())
        data[len(data) // 2] ^= 0x01
        part.write_bytes(bytes(data))
        s3.plan.reset()
        whole = shard.read_run(0, 200)
        got = [s["bin"] for s in decode_run(whole, path=shard.path, first_record=0,
                                            keys=shard.keys())]
        assert got == payloads
        # the copy failed the range's check: the second try downloaded all of it
        assert s3.plan.body_bytes == 2 * shard.max_range_bytes - part.stat().st_size


def test_a_first_batch_from_one_block_inflates_it_once(
        s3: S3Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first batch of a shuffled v3 pack of small records is drawn from the plan's first
    block (here 3 stored blocks); each is read, checked and inflated once, not once for each
    run of consecutive records of the batch."""
    tree = tmp_path / "tree"
    rng = np.random.default_rng(9)
    for i in range(400):
        (tree / f"c{i % 4}").mkdir(parents=True, exist_ok=True)
        (tree / f"c{i % 4}" / f"f{i:03d}.txt").write_bytes(rng.bytes(50) * 4)
    out = tmp_path / "packed"
    shardio.pack(tree, out, options=shardio.WriteOptions(block_records=50), num_workers=1)
    _upload(out, s3.url)
    import shardio.format.runs as runs_module
    inflated: list[int] = []
    real = runs_module.decode_columns  # type: ignore[attr-defined]

    def counted(buf: memoryview, head: Any, **kw: Any) -> Any:
        inflated.append(head.first_record)
        return real(buf, head, **kw)

    monkeypatch.setattr(runs_module, "decode_columns", counted)
    ds = shardio.StreamingDataset(s3.url, decode="raw", seed=5, remote=_options(tmp_path))
    manifest = shardio.read_manifest(out)
    firsts = np.cumsum([0, *manifest.shard_sizes])
    batch = next(iter(shardio.loader(ds, batch_size=16, num_workers=0)))
    shard = np.searchsorted(firsts, batch.indices, side="right") - 1
    blocks = set(zip(shard.tolist(), ((batch.indices - firsts[shard]) // 50).tolist(), strict=True))
    assert len(inflated) == len(blocks) <= 3  # the plan's first block: 3 stored blocks
