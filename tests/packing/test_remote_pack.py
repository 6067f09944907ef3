"""``shardio pack SRC s3://…`` and ``ShardWriter("s3://…")`` against moto behind the fault proxy.

A remote pack must leave exactly the objects a local pack of the same input
leaves as files, byte for byte; never a manifest after a SIGKILL; resume by
reusing every uploaded shard; overwrite only a shardio dataset.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from storage_servers import FAST_RETRY, S3Endpoint

from shardio import RemoteOptions, verify
from shardio.errors import OutputExistsError, PackError, StorageError
from shardio.format.manifest import JOURNAL_NAME, MANIFEST_NAME
from shardio.packing.journal import load_journal
from shardio.packing.pack import pack
from shardio.packing.remote_target import RemoteTarget, staging_folder
from shardio.packing.writer import ShardWriter, WriteOptions
from shardio.storage import RemoteStore, open_store

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

OPTIONS = WriteOptions(max_shard_samples=40)  # tiny_tree: 300 samples -> 8 shards


@pytest.fixture(autouse=True)
def _staging(staging_tmp: Path) -> Path:
    return staging_tmp


def local_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def remote_objects(url: str) -> dict[str, bytes]:
    """Every object under ``url``, read through the proxy (ranged GETs, which it may cut)."""
    store = open_store(url)
    return {name: store.read_range(name, 0, store.size(name)) for name in store.list_names()}


def recording_puts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every ``put_file`` and ``delete`` of remote stores, in order, as ``op name``."""
    calls: list[str] = []
    put_file, delete = RemoteStore.put_file, RemoteStore.delete

    def put(self: RemoteStore, name: str, source: Path) -> None:
        calls.append(f"put {name}")
        put_file(self, name, source)

    def rm(self: RemoteStore, name: str) -> None:
        calls.append(f"delete {name}")
        delete(self, name)

    monkeypatch.setattr(RemoteStore, "put_file", put)
    monkeypatch.setattr(RemoteStore, "delete", rm)
    return calls


@pytest.mark.parametrize("backend", ["records", "lmdb"])
def test_pack_to_s3_through_faults_is_identical_to_a_local_pack(
    tiny_tree: Path, tmp_path: Path, s3: S3Endpoint, backend: str,
    monkeypatch: pytest.MonkeyPatch, staging_tmp: Path,
) -> None:
    options = WriteOptions(backend=backend, max_shard_samples=40)
    staged_at_upload: list[int] = []
    put_file = RemoteStore.put_file

    def put(self: RemoteStore, name: str, source: Path) -> None:
        staged_at_upload.append(sum(1 for p in staging_folder(s3.url).iterdir()
                                    if p.name.startswith(("shard-", ".shard-"))))
        put_file(self, name, source)

    monkeypatch.setattr(RemoteStore, "put_file", put)
    s3.plan.reset(slowdown_every=4, cut_every=3, seed=3)
    summary = pack(tiny_tree, s3.url, options=options, num_workers=2, seed=5)
    assert s3.plan.slowdowns > 0
    local = pack(tiny_tree, tmp_path / "local", options=options, num_workers=1, seed=5)
    assert summary.out == s3.url and summary.shards == local.shards == 8
    objects = remote_objects(s3.url)
    assert s3.plan.cuts > 0  # the comparison's ranged GETs were cut too, and resumed
    assert objects == local_files(tmp_path / "local")  # no journal, nothing extra
    assert list(objects)[-1] == MANIFEST_NAME or MANIFEST_NAME in objects
    assert max(staged_at_upload) <= 2  # one shard per worker, never the whole dataset
    assert list(staging_tmp.iterdir()) == []  # staging removed
    report = verify(s3.url, remote=RemoteOptions(cache_dir=tmp_path / "cache"))
    assert report.ok and report.num_records == 300  # read back through the remote reader


def test_large_shards_go_up_in_parts_and_stay_identical(
    tmp_path: Path, s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shardio.storage import remote

    src = tmp_path / "src"
    src.mkdir()
    (src / "blob.bin").write_bytes(os.urandom(20 << 20))
    (src / "small.bin").write_bytes(b"x" * 1000)
    parts: list[str] = []
    multipart = remote.upload_s3_multipart

    def counting(fs: Any, path: str, source: Path, **kwargs: Any) -> None:
        parts.append(path.rsplit("/", 1)[1])
        multipart(fs, path, source, **kwargs)

    monkeypatch.setattr(remote, "upload_s3_multipart", counting)
    s3.plan.reset(slowdown_every=5, seed=1)
    pack(src, s3.url, num_workers=1, options=WriteOptions(codec="none"))
    pack(src, tmp_path / "local", num_workers=1, options=WriteOptions(codec="none"))
    assert parts == ["shard-00000.rec"]  # 20 MiB: a multipart upload
    assert remote_objects(s3.url) == local_files(tmp_path / "local")


KILLER = textwrap.dedent("""
    import os, signal, sys
    from shardio.packing.journal import load_journal
    from shardio.packing.pack import pack
    from shardio.storage import RemoteStore
    from shardio.packing.writer import WriteOptions

    put_bytes = RemoteStore.put_bytes

    def put_then_maybe_die(self, name, data):
        put_bytes(self, name, data)
        if name == ".shardio-pack.json" and len(load_journal(data)["shards"]) == 3:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-pack, right after a journal update

    RemoteStore.put_bytes = put_then_maybe_die
    pack(sys.argv[1], sys.argv[2], options=WriteOptions(max_shard_samples=40), num_workers=2,
         seed=5)
""")


def test_a_killed_pack_leaves_no_manifest_and_resume_reuses_uploaded_shards(
    tiny_tree: Path, tmp_path: Path, s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch,
    staging_tmp: Path,
) -> None:
    killed = subprocess.run([sys.executable, "-c", KILLER, str(tiny_tree), s3.url],
                            capture_output=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    store = open_store(s3.url)
    names = store.list_names()
    assert MANIFEST_NAME not in names and JOURNAL_NAME in names
    journaled = {s["name"] for s in load_journal(store.read_bytes(JOURNAL_NAME))["shards"]}
    assert len(journaled) == 3 and journaled <= set(names)
    assert staging_folder(s3.url).is_dir()  # left behind by the kill, reclaimed below
    with pytest.raises(OutputExistsError, match="not empty"):
        pack(tiny_tree, s3.url, options=OPTIONS, num_workers=1, seed=5)
    with pytest.raises(PackError, match="other options or input"):
        pack(tiny_tree, s3.url, options=OPTIONS, num_workers=1, seed=6, resume=True)

    s3.plan.reset(slowdown_every=4, seed=2)
    calls = recording_puts(monkeypatch)
    resumed = pack(tiny_tree, s3.url, options=OPTIONS, num_workers=2, seed=5, resume=True)
    uploaded = {c.split(" ", 1)[1] for c in calls if c.startswith("put shard-")}
    assert resumed.resumed_samples == 120
    assert uploaded.isdisjoint(journaled) and len(uploaded) == 5  # only the missing shards
    assert calls[-2:] == [f"put {MANIFEST_NAME}", f"delete {JOURNAL_NAME}"]  # manifest last
    pack(tiny_tree, tmp_path / "local", options=OPTIONS, num_workers=1, seed=5)
    assert remote_objects(s3.url) == local_files(tmp_path / "local")
    assert list(staging_tmp.iterdir()) == []  # the killed pack's staging reclaimed
    with pytest.raises(OutputExistsError, match="already complete"):
        pack(tiny_tree, s3.url, options=OPTIONS, num_workers=1, seed=5, resume=True)


def test_overwrite_deletes_the_old_manifest_first_and_refuses_foreign_prefixes(
    tiny_tree: Path, tmp_path: Path, s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch,
) -> None:
    pack(tiny_tree, s3.url, options=OPTIONS, num_workers=1)
    with pytest.raises(OutputExistsError, match="not empty"):
        pack(tiny_tree, s3.url, options=OPTIONS, num_workers=1)
    fewer = WriteOptions(max_shard_samples=100)
    s3.plan.reset(slowdown_every=4, seed=4)
    calls = recording_puts(monkeypatch)
    pack(tiny_tree, s3.url, options=fewer, num_workers=1, seed=1, overwrite=True)
    assert calls[0] == f"delete {MANIFEST_NAME}"  # no reader opens the old dataset any more
    first_put = next(i for i, c in enumerate(calls) if c.startswith("put"))
    assert {c for c in calls[:first_put] if c.startswith("delete shard-")} == {
        f"delete shard-{n:05d}.rec" for n in range(8)}  # old shards gone before new ones
    pack(tiny_tree, tmp_path / "local", options=fewer, num_workers=1, seed=1)
    assert remote_objects(s3.url) == local_files(tmp_path / "local")  # 3 shards, not 8

    foreign = open_store(s3.url + "-other")
    foreign.put_bytes("notes.txt", b"mine")
    for overwrite in (False, True):
        with pytest.raises(OutputExistsError, match=r"notes\.txt"):
            pack(tiny_tree, s3.url + "-other", options=OPTIONS, num_workers=1,
                 overwrite=overwrite)
    assert foreign.list_names() == ["notes.txt"]


def test_a_second_pack_to_the_same_url_is_refused_while_the_first_runs(
    s3: S3Endpoint, tiny_tree: Path,
) -> None:
    first = RemoteTarget(open_store(s3.url))
    try:
        (first.staging / ".shard-00000.rec.tmp").write_bytes(b"partial")
        with pytest.raises(PackError, match="another shardio pack on this host"):
            pack(tiny_tree, s3.url, options=OPTIONS, num_workers=1)
        assert (first.staging / ".shard-00000.rec.tmp").exists()  # not touched
    finally:
        first.close()
    assert pack(tiny_tree, s3.url, options=OPTIONS, num_workers=1).shards == 8


def test_url_sources_are_refused_and_remote_options_ignored_for_a_local_out(
    tiny_tree: Path, tmp_path: Path
) -> None:
    with pytest.raises(StorageError, match="pack reads SRC from a local folder"):
        pack("s3://bucket/src", tmp_path / "out")
    # the same RemoteOptions a reader takes: a local OUT is written in place, nothing cached
    remote = RemoteOptions(storage_options={"anon": True}, cache_dir=tmp_path / "cache")
    assert pack(tiny_tree, tmp_path / "out", options=OPTIONS, num_workers=1,
                remote=remote).shards == 8
    with ShardWriter(tmp_path / "mine", remote=remote) as writer:
        _write_samples(writer, 0, 3)
    assert (tmp_path / "out" / "manifest.json").exists()
    assert (tmp_path / "mine" / "manifest.json").exists()
    assert not (tmp_path / "cache").exists()


def _write_samples(writer: ShardWriter, start: int, stop: int) -> None:
    for i in range(start, stop):
        writer.write({"__key__": f"k{i:04d}", "bin": bytes([i % 251]) * (100 + i)})


def test_shard_writer_to_s3_is_identical_and_resumes(
    tmp_path: Path, s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with ShardWriter(tmp_path / "local", max_shard_samples=10) as writer:
        _write_samples(writer, 0, 45)
    s3.plan.reset(slowdown_every=4, cut_every=2, seed=5)
    # an interrupted writer: 2 shards uploaded, the third in staging
    with pytest.raises(RuntimeError, match="stop"), ShardWriter(
            s3.url, max_shard_samples=10) as writer:
        _write_samples(writer, 0, 25)
        raise RuntimeError("stop")
    assert MANIFEST_NAME not in open_store(s3.url).list_names()
    with ShardWriter(s3.url, max_shard_samples=10, resume=True) as writer:
        assert writer.num_resumed == 20  # keys read from the uploaded shards, through cuts
        _write_samples(writer, writer.num_resumed, 45)
    assert s3.plan.cuts > 0
    assert remote_objects(s3.url) == local_files(tmp_path / "local")


def test_cli_packs_to_a_url_and_refuses_a_url_source(
    tiny_tree: Path, tmp_path: Path, s3: S3Endpoint,
) -> None:
    run = [sys.executable, "-m", "shardio", "pack"]
    done = subprocess.run([*run, str(tiny_tree), s3.url, "--max-shard-samples", "40",
                           "--num-workers", "2", "--json"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["out"] == s3.url and json.loads(done.stdout)["shards"] == 8
    again = subprocess.run([*run, str(tiny_tree), s3.url, "--resume"], capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 1 and "already complete" in again.stderr
    refused = subprocess.run([*run, "s3://bucket/src", str(tmp_path / "out")],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "s3://bucket/src" in refused.stderr
    assert "local folder" in refused.stderr and not (tmp_path / "out").exists()


def test_a_writer_whose_manifest_upload_fails_keeps_its_shards_for_resume(
    tmp_path: Path, s3: S3Endpoint, staging_tmp: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shardio.storage import remote

    monkeypatch.setattr(remote, "RetryPolicy", lambda: FAST_RETRY)  # give up in milliseconds
    s3.plan.reset(slowdown_match="manifest.json")  # every PUT of the manifest: 503, for good
    with pytest.raises(StorageError, match=r"manifest\.json"), ShardWriter(
            s3.url, max_shard_samples=10) as writer:
        _write_samples(writer, 0, 25)
    assert list(staging_tmp.iterdir()) == []  # released, not left locked
    s3.plan.reset()
    names = open_store(s3.url).list_names()
    assert MANIFEST_NAME not in names and JOURNAL_NAME in names
    with ShardWriter(s3.url, max_shard_samples=10, resume=True) as writer:
        assert writer.num_resumed == 25  # all three shards were uploaded and journaled
    assert open_store(s3.url).exists(MANIFEST_NAME)


def test_a_file_url_output_is_the_local_folder(tiny_tree: Path, tmp_path: Path) -> None:
    summary = pack(tiny_tree, f"file://{tmp_path / 'out'}", options=OPTIONS, num_workers=1)
    assert summary.shards == 8 and (tmp_path / "out" / MANIFEST_NAME).exists()
