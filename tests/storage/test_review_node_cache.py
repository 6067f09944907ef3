"""The node cache under bad replies, a damaged cache disk and a stopped process (issue 28, 4-5).

A reply damaged on the way, or a cache file damaged on the node's disk, must
never outlive the read that met it: a range is committed to the cache only
once everything it holds is checked, and a cached range that fails its check
is discarded and fetched once more. A process stopped (SIGSTOP) while it
downloads a range must not hold up the others: they download it themselves.
Everything runs against a read-only HTTP server on 127.0.0.1 (the ``http``
fixture); damage is made by changing the served file for one read, or the
cache's file on disk.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from storage_servers import FAST_RETRY, HttpEndpoint

import shardio
from shardio import ChecksumError, IndexedDataset, ShardWriter
from shardio.backends.remoterecords import tail_guess
from shardio.format.frames import unpack_footer
from shardio.storage.options import MIN_RANGE_BYTES, RemoteOptions

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

NUM = 60


def payload(i: int) -> bytes:
    return bytes((i * 7 + k) % 251 for k in range(3000 + 37 * i))


def write(folder: Path, *, key_bytes: int = 8) -> None:
    """A ``.rec`` dataset of ``NUM`` samples in shards of 20; keys padded to ``key_bytes``."""
    # format v2: the tails crafted here are v2's (v3's: tests/format/test_format_v3.py)
    with ShardWriter(folder, max_shard_samples=20, version=2) as writer:
        for i in range(NUM):
            writer.write({"__key__": f"{i:05d}".rjust(key_bytes, "k"), "data": payload(i)})


def options(tmp_path: Path, **overrides: Any) -> RemoteOptions:
    settings: dict[str, Any] = {"cache_dir": tmp_path / "cache", "max_cache_bytes": 32 << 20,
                                "range_bytes": MIN_RANGE_BYTES, "retry": FAST_RETRY}
    settings.update(overrides)
    return RemoteOptions(**settings)


def read_all(url: str, opts: RemoteOptions) -> None:
    """Read every sample by index through a fresh dataset object; compare each."""
    ds = IndexedDataset(url, decode="raw", remote=opts)
    try:
        for i in range(NUM):
            assert bytes(ds[i]["data"]) == payload(i)
    finally:
        ds.close()


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.fixture
def served(http: HttpEndpoint) -> Iterator[tuple[str, Path]]:
    """``(url, folder)`` of a small dataset served over HTTP."""
    write(http.root / "ds")
    yield f"{http.url}/ds", http.root / "ds"


def shard(folder: Path) -> Path:
    return sorted(folder.glob("*.rec"))[0]


def ranges(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "ranges").iterdir())


def test_a_bad_tail_reply_is_never_cached(served: tuple[str, Path], tmp_path: Path) -> None:
    url, folder = served
    path = shard(folder)
    good = path.read_bytes()
    footer = unpack_footer(good, path=str(path))
    flip(path, footer.keys_offset + 2)  # in the key block: the footer itself is intact
    with pytest.raises(ChecksumError):
        read_all(url, options(tmp_path))
    path.write_bytes(good)  # the server is healthy again
    read_all(url, options(tmp_path))  # a later reader on the node is not poisoned


def test_a_long_tail_is_cached_only_once_checked_whole(http: HttpEndpoint,
                                                        tmp_path: Path) -> None:
    write(http.root / "ds", key_bytes=4000)  # keys longer than the first GET guesses
    url, path = f"{http.url}/ds", shard(http.root / "ds")
    good = path.read_bytes()
    footer = unpack_footer(good, path=str(path))
    assert footer.index_offset < len(good) - tail_guess(len(good), 20)  # a second GET is needed
    flip(path, footer.keys_offset + 2)  # before the bytes the first GET asked for
    with pytest.raises(ChecksumError):
        read_all(url, options(tmp_path))
    path.write_bytes(good)
    read_all(url, options(tmp_path))


def test_a_range_damaged_on_the_cache_disk_is_fetched_again(
        served: tuple[str, Path], tmp_path: Path) -> None:
    url, _folder = served
    read_all(url, options(tmp_path))
    for cached in ranges(tmp_path):  # every cached range, tails and records alike
        flip(cached, cached.stat().st_size // 2)
    read_all(url, options(tmp_path))
    ds = shardio.StreamingDataset(url, decode="raw", remote=options(tmp_path))
    for cached in ranges(tmp_path):
        flip(cached, cached.stat().st_size // 3)
    assert sorted(bytes(s["data"]) for s in ds) == sorted(payload(i) for i in range(NUM))


def test_a_damaged_cached_copy_the_store_cannot_replace_names_the_cache_file(
        served: tuple[str, Path], http: HttpEndpoint, tmp_path: Path) -> None:
    url, _folder = served
    read_all(url, options(tmp_path))
    damaged = next(p for p in ranges(tmp_path) if "@0-" in p.name)  # a shard's first range
    flip(damaged, damaged.stat().st_size // 2)
    http.plan.reset(refuse_match="GET /ds/shard-", refuse_status=403)
    with pytest.raises(ChecksumError) as caught:
        read_all(url, options(tmp_path))
    message = str(caught.value)
    assert str(damaged) in message and "re-pack" not in message, message


def test_verify_is_not_fooled_by_a_damaged_cached_copy(served: tuple[str, Path],
                                                       tmp_path: Path) -> None:
    url, _folder = served
    assert shardio.verify(url, remote=options(tmp_path)).ok
    for cached in ranges(tmp_path):
        flip(cached, cached.stat().st_size // 2)
    report = shardio.verify(url, remote=options(tmp_path))
    assert report.ok and report.num_records == NUM, report.faults


HOLDER = textwrap.dedent("""
    import sys
    from shardio.storage import RangeCache, open_store
    store = open_store(sys.argv[1])
    cache = RangeCache(sys.argv[2], max_cache_bytes=64 << 20)
    with cache.open_range(store, "obj.bin", 0, int(sys.argv[3]), version="v") as cached:
        data = bytes(cached.view())
    sys.exit(0 if data == open(sys.argv[4], "rb").read() else 3)
""")

WAITER = textwrap.dedent("""
    import json, sys
    from shardio.storage import RangeCache, open_store
    store = open_store(sys.argv[1])
    cache = RangeCache(sys.argv[2], max_cache_bytes=64 << 20, stall_s=0.5)
    with cache.open_range(store, "obj.bin", 0, int(sys.argv[3]), version="v") as cached:
        data = bytes(cached.view())
    ok = data == open(sys.argv[4], "rb").read()
    print(json.dumps({"ok": ok, "downloads": cache.stats.downloads,
                      "takeovers": cache.stats.takeovers}))
""")


def test_a_stopped_downloader_does_not_block_the_node(http: HttpEndpoint,
                                                      tmp_path: Path) -> None:
    data = os.urandom(4 << 20)
    (http.root / "obj.bin").write_bytes(data)
    cache = tmp_path / "cache"
    args = [http.url, str(cache), str(len(data)), str(http.root / "obj.bin")]
    # the holder's GET sends half its body, then the proxy pauses: it holds the lock
    http.plan.reset(stall_every=1, stall_s=3.0)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, *args])
    try:
        partial = cache / "partial"
        while not (partial.is_dir() and any(p.stat().st_size for p in partial.iterdir())):
            assert holder.poll() is None, "the holder finished before it could be stopped"
            time.sleep(0.01)
        holder.send_signal(signal.SIGSTOP)
        http.plan.reset()
        waiter = subprocess.run([sys.executable, "-c", WAITER, *args], capture_output=True,
                                text=True, timeout=120)
        assert waiter.returncode == 0, waiter.stderr
        report = json.loads(waiter.stdout)
        assert report == {"ok": True, "downloads": 1, "takeovers": 1}
    finally:
        holder.send_signal(signal.SIGCONT)
    assert holder.wait(timeout=120) == 0  # resumed, it finishes and reads the right bytes
    assert sorted(p.name for p in (cache / "ranges").iterdir()) == [
        next((cache / "ranges").iterdir()).name]
    assert not list((cache / "partial").iterdir())
