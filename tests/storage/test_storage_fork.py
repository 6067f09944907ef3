"""A store (and a cache) used in the parent keeps working in fork, spawn and forkserver children.

The parent reads first, so its client, sessions and fsspec's IO thread exist
when the children start: the situation in which s3fs-based loaders hang.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from pathlib import Path

import pytest
import storage_workers
from storage_servers import FAST_RETRY, HttpEndpoint, S3Endpoint

from shardio.storage import RangeCache, RemoteStore, Store, open_store

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

DATA = os.urandom(1 << 20)
RANGES = [(0, 1000), (5000, 300_000), (700_000, 1 << 20)]


def run_in_children(method: str, store: Store, expected: Path, tmp_path: Path) -> list[dict]:
    """Two children of ``method`` read ``RANGES`` through ``store``; their reports."""
    ctx = mp.get_context(method)
    reports = [tmp_path / f"{method}-{i}.json" for i in range(2)]
    procs = [ctx.Process(target=storage_workers.read_ranges,
                         args=(store, "obj.bin", str(expected), RANGES, str(report)))
             for report in reports]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
            proc.join()
            pytest.fail(f"a {method} child hung using a store its parent had used")
    assert [proc.exitcode for proc in procs] == [0, 0]
    return [json.loads(report.read_text()) for report in reports]


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_s3_store_used_in_parent_works_in_children(
        method: str, s3: S3Endpoint, tmp_path: Path) -> None:
    # A forkserver child has the environment of the forkserver process, which Python starts
    # once, maybe before this test's AWS_* settings: explicit options travel with the store.
    explicit = {"endpoint_url": s3.proxy.url, "key": "testing", "secret": "testing"}
    store = open_store(s3.url, storage_options=explicit if method == "forkserver" else None,
                       retry=FAST_RETRY)
    store.put_bytes("obj.bin", DATA)
    assert store.read_range("obj.bin", 10, 20) == DATA[10:20]  # the parent's client is live
    expected = tmp_path / "expected.bin"
    expected.write_bytes(DATA)
    s3.plan.reset(cut_every=3)  # and the children retry too
    reports = run_in_children(method, store, expected, tmp_path)
    for report in reports:
        assert report["client_pid"] == report["pid"]  # each child made its own client
        if method == "fork":
            assert report["inherited_pid"] == os.getpid()  # ...although it inherited ours
    assert store.read_range("obj.bin", 0, 1 << 20) == DATA  # the parent is unharmed
    assert isinstance(store, RemoteStore) and store._pid == os.getpid()


def test_http_store_used_in_parent_works_in_forked_children(
        http: HttpEndpoint, tmp_path: Path) -> None:
    (http.root / "obj.bin").write_bytes(DATA)
    store = open_store(http.url, retry=FAST_RETRY)
    assert store.read_range("obj.bin", 10, 20) == DATA[10:20]
    run_in_children("fork", store, http.root / "obj.bin", tmp_path)
    assert store.read_bytes("obj.bin") == DATA


def test_cache_used_in_parent_works_in_spawned_children(s3: S3Endpoint, tmp_path: Path) -> None:
    store = open_store(s3.url, retry=FAST_RETRY)
    store.put_bytes("shard.rec", DATA)
    cache = RangeCache(tmp_path / "cache", max_cache_bytes=len(DATA))
    with cache.open_range(store, "shard.rec", 0, 1 << 16, version="v1") as got:
        assert got.read() == DATA[: 1 << 16]
    expected = tmp_path / "expected.bin"
    expected.write_bytes(DATA)
    proc = mp.get_context("spawn").Process(target=storage_workers.read_cached, args=(
        store, cache, 0, "shard.rec", str(expected), 1 << 16, 0, 1))  # the cache, pickled
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert s3.plan.ranged_gets == 16  # the child reused the parent's range: 1 + 15
