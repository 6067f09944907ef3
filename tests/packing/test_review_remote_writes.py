"""Remote writes under hostile layouts and faults (issue 28, items 2, 11 and 14).

* ``--overwrite`` deletes only the names a pack writes at the top of the
  output (exact shard names, journal, manifest), on a local disk and in S3;
  anything else makes it refuse, naming every foreign object.
* A pack killed between the parts of a multipart upload leaves an upload S3
  keeps until aborted; ``--resume`` and ``--overwrite`` abort shardio's.
* An output URL with a query string or a fragment is refused before anything
  is written, without echoing the query's value.

Everything runs against moto's ``ThreadedMotoServer`` on 127.0.0.1 (``storage_plugin``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from storage_servers import S3Endpoint

from shardio.errors import OutputExistsError, PackError
from shardio.format.manifest import MANIFEST_NAME
from shardio.packing.pack import pack
from shardio.packing.writer import ShardWriter, WriteOptions
from shardio.storage import open_store

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

OPTIONS = WriteOptions(max_shard_samples=40)  # tiny_tree: 300 samples -> 8 shards
FOREIGN = ("shard-archive/2023.rec", "shard-backups/full.mdb", "shard-old.rec")
SECRET = "Vq9xS3CR3Tversion"


@pytest.fixture(autouse=True)
def _staging(staging_tmp: Path) -> Path:
    return staging_tmp


def s3_client(s3: S3Endpoint) -> Any:
    """A boto3 client straight to moto (not through the proxy)."""
    import boto3

    return boto3.client("s3", endpoint_url=s3.moto.url, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def unfinished_uploads(s3: S3Endpoint) -> list[str]:
    """The keys of the bucket's multipart uploads that were neither completed nor aborted."""
    reply = s3_client(s3).list_multipart_uploads(Bucket=s3.bucket)
    return sorted(u["Key"] for u in reply.get("Uploads", []))


def test_overwrite_to_s3_refuses_nested_and_inexact_shard_names(
    tiny_tree: Path, s3: S3Endpoint,
) -> None:
    pack(tiny_tree, s3.url, options=OPTIONS, num_workers=1)
    store = open_store(s3.url)
    for name in FOREIGN:
        store.put_bytes(name, b"someone else's")
    before = store.list_names()
    with pytest.raises(OutputExistsError) as caught:
        pack(tiny_tree, s3.url, options=OPTIONS, num_workers=1, overwrite=True)
    for name in FOREIGN:
        assert repr(name) in str(caught.value)  # every foreign name listed
    assert "shard-00000.rec" not in str(caught.value)
    assert store.list_names() == before  # nothing deleted, the old dataset still complete
    for name in FOREIGN:
        store.delete(name)
    assert pack(tiny_tree, s3.url, options=OPTIONS, num_workers=1, overwrite=True).shards == 8


def test_overwrite_of_a_local_folder_refuses_the_same_names(
    tiny_tree: Path, tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    pack(tiny_tree, out, options=OPTIONS, num_workers=1)
    (out / "shard-old.rec").write_bytes(b"a backup named like a shard")
    with pytest.raises(OutputExistsError, match=r"shard-old\.rec"):
        pack(tiny_tree, out, options=OPTIONS, num_workers=1, overwrite=True)
    assert (out / "shard-old.rec").read_bytes() == b"a backup named like a shard"
    for name in FOREIGN:
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_bytes(b"someone else's")
    (out / "shard-00042.rec").mkdir()  # a folder is never a shard, whatever its name
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    with pytest.raises(OutputExistsError) as caught:
        pack(tiny_tree, out, options=OPTIONS, num_workers=1, overwrite=True)
    for name in ("shard-archive/", "shard-backups/", "shard-old.rec", "shard-00042.rec/"):
        assert repr(name) in str(caught.value)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == before
    assert (out / MANIFEST_NAME).exists()


KILLED_BETWEEN_PARTS = textwrap.dedent("""
    import os, signal, sys
    from shardio.packing.pack import pack
    from shardio.storage import RemoteStore
    from shardio.packing.writer import WriteOptions

    call = RemoteStore._call

    def die_after_the_first_part(self, path, op, fn, progress=None):
        result = call(self, path, op, fn, progress)
        if op == "PUT part 1":
            os.kill(os.getpid(), signal.SIGKILL)  # between parts: the upload stays open
        return result

    RemoteStore._call = die_after_the_first_part
    pack(sys.argv[1], sys.argv[2], options=WriteOptions(codec="none"), num_workers=1,
         overwrite=sys.argv[3] == "overwrite")
""")


def kill_between_parts(src: Path, url: str, mode: str) -> None:
    """Run a pack of ``src`` to ``url`` in a child killed right after its first uploaded part."""
    killed = subprocess.run([sys.executable, "-c", KILLED_BETWEEN_PARTS, str(src), url, mode],
                            capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()


def test_resume_and_overwrite_abort_the_uploads_a_killed_pack_left(
    tmp_path: Path, s3: S3Endpoint,
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "blob.bin").write_bytes(os.urandom(17 << 20))  # > 2 parts of 8 MiB: multipart
    client = s3_client(s3)
    mine = client.create_multipart_upload(Bucket=s3.bucket, Key="data/notes/upload.bin")

    kill_between_parts(src, s3.url, "fresh")
    assert unfinished_uploads(s3) == ["data/notes/upload.bin", "data/shard-00000.rec"]
    resumed = pack(src, s3.url, options=WriteOptions(codec="none"), num_workers=1, resume=True)
    assert resumed.shards == 1
    assert unfinished_uploads(s3) == ["data/notes/upload.bin"]  # not shardio's: left alone

    kill_between_parts(src, s3.url, "overwrite")
    assert unfinished_uploads(s3) == ["data/notes/upload.bin", "data/shard-00000.rec"]
    client.abort_multipart_upload(Bucket=s3.bucket, Key="data/notes/upload.bin",
                                  UploadId=mine["UploadId"])
    # an upload left open by hand, as a killed process leaves it, under an empty-looking prefix
    client.create_multipart_upload(Bucket=s3.bucket, Key="data/manifest.json")
    pack(src, s3.url, options=WriteOptions(codec="none"), num_workers=1, overwrite=True)
    assert unfinished_uploads(s3) == []
    assert open_store(s3.url).list_names() == [MANIFEST_NAME, "shard-00000.rec"]


@pytest.mark.parametrize("suffix", [f"?versionId={SECRET}", f"#{SECRET}", f"?x=1#{SECRET}"])
def test_output_urls_with_a_query_or_fragment_are_refused(
    tiny_tree: Path, s3: S3Endpoint, suffix: str,
) -> None:
    url = s3.url + suffix
    with pytest.raises(PackError, match="query string") as caught:
        pack(tiny_tree, url, options=OPTIONS, num_workers=1)
    assert SECRET not in str(caught.value) and SECRET not in str(caught.value.path)
    with pytest.raises(PackError, match="query string"):
        ShardWriter(url)
    assert s3_client(s3).list_objects_v2(Bucket=s3.bucket).get("KeyCount") == 0
    cli = subprocess.run([sys.executable, "-m", "shardio", "pack", str(tiny_tree), url],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode != 0 and cli.stderr.startswith("Error:"), cli.stderr
    assert "Traceback" not in cli.stderr and SECRET not in cli.stdout + cli.stderr
    assert s3_client(s3).list_objects_v2(Bucket=s3.bucket).get("KeyCount") == 0
