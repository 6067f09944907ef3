"""Stores: local paths read in place, S3 and HTTP through a fault proxy, retries, errors."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from storage_servers import FAST_RETRY, HttpEndpoint, S3Endpoint

from shardio.errors import MissingDependencyError, StorageError
from shardio.storage import (
    LocalStore,
    RemoteStore,
    RetryPolicy,
    StoreStats,
    is_remote,
    is_transient,
    open_store,
    split_url,
)
from shardio.storage import remote as remote_module
from shardio.storage.retry import IncompleteBodyError, retry_call

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

DATA = os.urandom(3 << 20)
MB = 1 << 20


# --- URLs and local stores ----------------------------------------------------------------------

def test_urls_pick_the_store() -> None:
    assert split_url("s3://bucket/x") == ("s3", "s3://bucket/x")
    assert split_url("GS://b/x")[0] == "gs"
    assert split_url("file:///data/x") == (None, "/data/x")
    assert split_url("relative/dir") == (None, "relative/dir")
    assert split_url(Path("/abs")) == (None, "/abs")
    assert split_url("C:/data") == (None, "C:/data")  # a drive letter is not a scheme
    assert is_remote("https://host/ds") and not is_remote("out/train")
    assert isinstance(open_store("out/train"), LocalStore)
    assert isinstance(open_store("az://container/ds"), RemoteStore)
    with pytest.raises(ValueError, match="storage_options are for remote URLs"):
        open_store("out/train", storage_options={"anon": True})


def test_local_store_reads_in_place_and_writes_atomically(tmp_path: Path) -> None:
    store = open_store(tmp_path / "ds")
    assert store.list_names() == []  # the folder need not exist
    source = tmp_path / "src.bin"
    source.write_bytes(DATA)
    store.put_file("shard-00000.rec", source)
    store.put_bytes("sub/manifest.json", b"{}")
    assert store.list_names() == ["shard-00000.rec", "sub/manifest.json"]  # no temp files left
    assert store.local_path("shard-00000.rec") == tmp_path / "ds" / "shard-00000.rec"
    assert store.read_range("shard-00000.rec", 5, 5 + MB) == DATA[5 : 5 + MB]
    got = bytearray(len(DATA))
    store.read_range_into("shard-00000.rec", 0, len(DATA),
                          lambda off, chunk: got.__setitem__(slice(off, off + len(chunk)), chunk))
    assert got == DATA
    assert store.size("shard-00000.rec") == len(DATA) and store.exists("sub/manifest.json")
    with pytest.raises(StorageError, match="truncated or replaced"):
        store.read_range("shard-00000.rec", len(DATA) - 10, len(DATA) + 10)
    store.delete("sub/manifest.json")
    store.delete("sub/manifest.json")  # missing is fine
    assert not store.exists("sub/manifest.json")
    for bad in ("../escape", "/abs", "a//b", ""):
        with pytest.raises(ValueError, match="not a plain relative name"):
            store.read_bytes(bad)


def test_put_failure_leaves_no_partial_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalStore(tmp_path)
    store.put_bytes("x.bin", b"old")

    def fail_fsync(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail_fsync)
    with pytest.raises(OSError, match="disk full"):
        store.put_bytes("x.bin", b"new bytes")
    assert sorted(os.listdir(tmp_path)) == ["x.bin"]
    assert (tmp_path / "x.bin").read_bytes() == b"old"


def test_local_paths_and_remote_descriptions_import_no_fsspec(tmp_path: Path) -> None:
    code = (
        "import sys, shardio, shardio.storage as s\n"
        f"st = s.open_store({str(tmp_path)!r}); st.put_bytes('a', b'x'); st.read_range('a', 0, 1)\n"
        "s.open_store('s3://bucket/x'); s.open_store('https://host/x')\n"
        "heavy = ('fsspec', 's3fs', 'aiohttp', 'botocore', 'torch')\n"
        "bad = [m for m in heavy if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_packages_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("gcsfs") is None:  # never reach for Google from a test
        with pytest.raises(MissingDependencyError, match=r"shardio-torch\[remote\]"):
            open_store("gs://bucket/ds").size("manifest.json")
    monkeypatch.setitem(sys.modules, "fsspec", None)  # as if fsspec were not installed
    store = RemoteStore("s3://bucket/ds", protocol="s3", storage_options={"key": "fresh-client"})
    with pytest.raises(MissingDependencyError,
                       match=r"pip install fsspec s3fs \(the extra shardio-torch\[remote\]\)"):
        store.read_bytes("manifest.json")


# --- retries ------------------------------------------------------------------------------------

def test_transient_errors_are_told_from_permanent_ones() -> None:
    import aiohttp
    from botocore.exceptions import ClientError

    def s3_error(code: str, status: int) -> OSError:
        err = OSError(5, code)
        err.__cause__ = ClientError(
            {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")
        return err

    transient = [ConnectionResetError(), TimeoutError(), asyncio.TimeoutError(),
                 IncompleteBodyError("cut"), aiohttp.ClientPayloadError("cut"),
                 s3_error("SlowDown", 503), s3_error("InternalError", 500),
                 s3_error("TooManyRequests", 429)]
    permanent = [FileNotFoundError(), PermissionError(), ValueError("bad"),
                 s3_error("AccessDenied", 403), s3_error("InvalidRange", 416),
                 StorageError("already retried")]
    assert [is_transient(e) for e in transient] == [True] * len(transient)
    assert [is_transient(e) for e in permanent] == [False] * len(permanent)


def test_retry_call_backs_off_with_jitter_and_gives_up_naming_the_call() -> None:
    policy = RetryPolicy(max_attempts=4, base_delay_s=0.1, max_delay_s=0.25)
    waits: list[float] = []
    stats = StoreStats()
    outcomes: list[Exception | str] = [ConnectionResetError(), TimeoutError(), "ok"]

    def flaky() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert retry_call(flaky, policy=policy, what="s3://b/x: GET", stats=stats,
                      sleep=waits.append) == "ok"
    assert stats.retries == 2 and stats.requests == 3
    assert 0 <= waits[0] <= 0.1 and 0 <= waits[1] <= 0.2
    caps = [min(0.25, 0.1 * 2**a) for a in range(10)]
    assert all(0 <= policy.delay_s(a) <= caps[a] for a in range(10) for _ in range(50))

    def down() -> None:
        raise ConnectionRefusedError("refused")

    with pytest.raises(StorageError, match=r"s3://b/x: GET: failed 4 times in a row.*refused"):
        retry_call(down, policy=policy, what="s3://b/x: GET", sleep=waits.append)

    def missing() -> None:
        raise FileNotFoundError("gone")

    calls_before = len(waits)
    with pytest.raises(FileNotFoundError):
        retry_call(missing, policy=policy, what="x", sleep=waits.append)
    assert len(waits) == calls_before  # never retried

    received = [0]

    def cut_every_time() -> str:  # each attempt gets some bytes further before it is cut
        received[0] += 1
        if received[0] < 10:
            raise IncompleteBodyError("cut")
        return "done"

    assert retry_call(cut_every_time, policy=policy, what="x", sleep=waits.append,
                      progress=lambda: received[0]) == "done"  # 9 cuts > max_attempts


# --- S3 through the fault proxy -----------------------------------------------------------------

def test_s3_ranged_reads_survive_slowdowns_cuts_and_latency(s3: S3Endpoint) -> None:
    store = open_store(s3.url, retry=FAST_RETRY)
    store.put_bytes("shard-00000.rec", DATA)
    s3.plan.reset(slowdown_every=3, cut_every=2, latency_s=0.002)
    ranges = [(i * 300_000, i * 300_000 + MB) for i in range(7)]
    for start, stop in ranges:
        assert store.read_range("shard-00000.rec", start, stop) == DATA[start:stop]
    assert s3.plan.slowdowns >= 2 and s3.plan.cuts >= 2
    assert isinstance(store, RemoteStore)
    assert store.stats.retries == s3.plan.slowdowns + s3.plan.cuts  # every fault retried once
    assert store.stats.resumed >= s3.plan.cuts  # a cut body continues where it stopped...
    assert s3.plan.body_bytes < sum(b - a for a, b in ranges) + s3.plan.cuts * MB // 4
    # ...so the proxy sent hardly more than was asked (a restart would resend each half)


def test_a_stalled_body_times_out_and_resumes(s3: S3Endpoint) -> None:
    impatient = RetryPolicy(max_attempts=3, base_delay_s=0.001, read_timeout_s=0.3)
    store = open_store(s3.url, retry=impatient)
    store.put_bytes("shard-00000.rec", DATA)
    s3.plan.reset(stall_every=1, stall_s=1.0)  # the first attempt stalls halfway...
    got = bytearray()

    def take(offset: int, chunk: memoryview) -> None:
        assert offset == len(got)
        got.extend(chunk)
        s3.plan.stall_every = 0  # ...the resumed request does not

    store.read_range_into("shard-00000.rec", 0, MB, take)
    assert got == DATA[:MB] and s3.plan.stalls == 1
    assert isinstance(store, RemoteStore) and store.stats.resumed == 1


def test_s3_put_list_delete_and_errors(s3: S3Endpoint) -> None:
    store = open_store(s3.url, retry=FAST_RETRY)
    assert store.list_names() == []
    other = open_store(s3.url.rsplit("/", 1)[0] + "/elsewhere", retry=FAST_RETRY)
    assert isinstance(store, RemoteStore) and isinstance(other, RemoteStore)
    assert other._fs() is store._fs()  # one client, so credentials resolved once per process
    s3.plan.reset(slowdown_every=2, seed=1)
    store.put_bytes("manifest.json", b'{"format": "shardio"}')
    store.put_bytes(".shardio-pack.json", b"{}")
    store.put_bytes("sub/shard-00001.rec", DATA[:1000])
    assert s3.plan.slowdowns > 0
    s3.plan.reset()
    assert store.list_names() == [".shardio-pack.json", "manifest.json", "sub/shard-00001.rec"]
    assert store.read_bytes("manifest.json") == b'{"format": "shardio"}'
    assert store.size("sub/shard-00001.rec") == 1000 and store.exists("manifest.json")
    store.delete("manifest.json")
    store.delete("manifest.json")
    assert not store.exists("manifest.json")
    with pytest.raises(FileNotFoundError, match="no such object"):
        store.read_bytes("manifest.json")
    with pytest.raises(FileNotFoundError, match=r"s3://.*/data/nope"):
        store.read_range("nope", 0, 10)


def test_s3_multipart_upload_retries_parts_and_is_all_or_nothing(
        s3: S3Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote_module, "MIN_PART_BYTES", 5 << 20)  # S3's minimum part size
    big = tmp_path / "big.bin"
    payload = os.urandom(11 << 20)  # three parts
    big.write_bytes(payload)
    store = open_store(s3.url, retry=FAST_RETRY)
    s3.plan.reset(slowdown_every=3)
    store.put_file("shard-00000.rec", big)
    assert s3.plan.slowdowns >= 1
    s3.plan.reset()
    assert store.read_bytes("shard-00000.rec") == payload

    failing = open_store(s3.url, retry=RetryPolicy(max_attempts=1))
    s3.plan.reset(slowdown_match="partNumber=")  # start and abort pass, every part fails
    with pytest.raises(StorageError, match="PUT part 1"):
        failing.put_file("shard-00001.rec", big)
    s3.plan.reset()
    assert not store.exists("shard-00001.rec")
    import boto3

    client = boto3.client("s3", endpoint_url=s3.moto.url, region_name="us-east-1")
    assert "Uploads" not in client.list_multipart_uploads(Bucket=s3.bucket)  # aborted


def test_storage_options_override_the_environment(
        s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    open_store(s3.url, retry=FAST_RETRY).put_bytes("x", b"payload")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    options = {"endpoint_url": s3.proxy.url, "key": "testing", "secret": "testing"}
    store = open_store(s3.url, storage_options=options, retry=FAST_RETRY)
    assert store.read_bytes("x") == b"payload"



def test_a_changed_endpoint_in_the_environment_gets_a_new_client(
        s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients are shared per configuration, and the ``AWS_*`` environment is configuration.

    A client cached under the old endpoint once served a later test's store, whose requests
    then bypassed that test's proxy.
    """
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.moto.url)  # straight to the server, no proxy
    open_store(s3.url, retry=FAST_RETRY).put_bytes("x", b"payload")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.proxy.url)
    before = s3.plan.requests
    assert open_store(s3.url, retry=FAST_RETRY).read_bytes("x") == b"payload"
    assert s3.plan.requests > before

def test_a_whole_object_is_one_get_and_survives_faults(s3: S3Endpoint) -> None:
    """A manifest or journal is read in one request: s3fs's ``cat_file`` asked for the
    object's size first, a second round trip before every dataset could open."""
    store = open_store(s3.url, retry=FAST_RETRY)
    store.put_bytes("manifest.json", b'{"format": "shardio"}')
    s3.plan.reset()
    assert store.read_bytes("manifest.json") == b'{"format": "shardio"}'
    assert (s3.plan.requests, s3.plan.gets, s3.plan.ranged_gets) == (1, 1, 0)
    s3.plan.reset(slowdown_every=2, cut_every=3)
    for _ in range(4):
        assert store.read_bytes("manifest.json") == b'{"format": "shardio"}'
    with pytest.raises(FileNotFoundError):
        store.read_bytes("nope.json")

# --- HTTP ---------------------------------------------------------------------------------------

def test_http_server_with_range_reads_through_faults(http: HttpEndpoint) -> None:
    (http.root / "ds").mkdir()
    (http.root / "ds" / "shard-00000.rec").write_bytes(DATA)
    (http.root / "ds" / "manifest.json").write_text('{"format": "shardio"}')
    store = open_store(f"{http.url}/ds", retry=FAST_RETRY)
    http.plan.reset(slowdown_every=4, cut_every=2)
    for start in (0, 123_457, 2 * MB, 77, MB + 1, 2 * MB - 5):
        assert store.read_range("shard-00000.rec", start, start + MB) == DATA[start : start + MB]
    assert store.read_bytes("manifest.json") == b'{"format": "shardio"}'
    assert store.size("shard-00000.rec") == len(DATA)
    assert not store.exists("nope.rec")
    assert http.plan.cuts >= 1 and http.plan.slowdowns >= 1
    assert isinstance(store, RemoteStore) and store.stats.resumed >= http.plan.cuts
    with pytest.raises(FileNotFoundError):
        store.read_range("nope.rec", 0, 10)
    with pytest.raises(StorageError, match="cannot list"):
        store.list_names()
    with pytest.raises(StorageError, match="read-only"):
        store.put_bytes("x", b"y")
    http.plan.reset()
    http.server.ignore_range = True  # a server that answers every GET with the whole file
    assert store.read_range("shard-00000.rec", MB + 3, 2 * MB) == DATA[MB + 3 : 2 * MB]
