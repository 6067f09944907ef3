"""The remote side of ``bench_remote``: a disk-backed S3 server, the link in front of it, uploads.

* ``S3rver``: the `s3rver <https://github.com/jamhall/s3rver>`_ S3 server (Node), a
  subprocess on 127.0.0.1 keeping its objects as files on disk, so a ranged GET costs
  what the range costs (moto's threaded server reads the whole object for every range,
  so nothing is timed on it). ``ensure_s3rver`` installs the pinned version from the
  npm registry into ``benchmarks/.node/`` (git-ignored) the first time.
* The link: ``storage_proxy.FaultProxy`` (the storage tests' proxy) with latency per
  request and a bandwidth cap shared by every response body, counting the GET bytes it
  sends; ``proxy_stats`` reads its counters from another process.
* ``upload_folder``: puts a packed folder under a prefix, directly to the server (not
  through the link); a folder already there with the same names and sizes is kept.
* ``FolderSampler``: the size of a cache folder over time, sampled from a thread.

Nothing here listens beyond 127.0.0.1 or imports shardio.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.storage_proxy import STATS_PATH

HERE = Path(__file__).resolve().parent
NODE_PREFIX = HERE / ".node"
S3RVER_VERSION = "3.7.1"
BUCKET = "bench"
ACCESS_KEY = "S3RVER"
"""s3rver's fixed credentials (it accepts any signature with ``--allow-mismatched-signatures``)."""


def ensure_s3rver(prefix: Path = NODE_PREFIX) -> Path:
    """The s3rver executable, installed with ``npm install --prefix`` first if absent.

    Raises:
        RuntimeError: npm is missing or the install failed (the message says which).
    """
    exe = prefix / "node_modules" / ".bin" / "s3rver"
    if exe.exists():
        return exe
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed; bench_remote needs Node.js and npm for s3rver "
                           "(apt-get install nodejs npm)")
    prefix.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                           f"s3rver@{S3RVER_VERSION}"], capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0 or not exe.exists():
        raise RuntimeError(f"npm install s3rver@{S3RVER_VERSION} failed: {proc.stderr[-500:]}")
    return exe


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class S3rver:
    """An s3rver process serving the folder ``root`` with the bucket ``BUCKET``."""

    def __init__(self, root: Path, *, log: Path) -> None:
        exe = ensure_s3rver()
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "ab")  # noqa: SIM115  (open while the server runs; closed in close)
        self._proc = subprocess.Popen(
            [str(exe), "-d", str(root), "-a", "127.0.0.1", "-p", str(self.port), "--silent",
             "--allow-mismatched-signatures", "--no-vhost-buckets", "--configure-bucket", BUCKET],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/{BUCKET}?max-keys=1", timeout=2).read()
                return
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"s3rver did not start (see {log.name})") from None
                time.sleep(0.1)

    @property
    def pid(self) -> int:
        """The server's process id (its CPU time is part of what a benchmark costs)."""
        return self._proc.pid

    def close(self) -> None:
        """Stop the server (this process started it)."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()


def s3_environment(endpoint_url: str) -> dict[str, str]:
    """What every reader's process needs to reach ``endpoint_url`` the standard way.

    ``AWS_ENDPOINT_URL`` is read by botocore (boto3, s3fs); MosaicML Streaming reads
    ``S3_ENDPOINT_URL``; obstore (LitData's chunk downloads) needs ``AWS_ALLOW_HTTP``
    for a plain-HTTP endpoint. No credentials or config files of the user are read.
    """
    return {"AWS_ENDPOINT_URL": endpoint_url, "S3_ENDPOINT_URL": endpoint_url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": ACCESS_KEY,
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true", "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true"}


def s3_client(endpoint_url: str) -> Any:
    """A boto3 S3 client for ``endpoint_url`` (path-style addressing)."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=endpoint_url, aws_access_key_id=ACCESS_KEY,
                        aws_secret_access_key=ACCESS_KEY, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}))


def upload_folder(client: Any, folder: Path, prefix: str) -> int:
    """Put every file under ``folder`` at ``prefix/<relative path>``; bytes now under the prefix.

    Objects already there with the same relative names and sizes are kept as they are
    (the packs are deterministic); any other content under the prefix is deleted first.
    """
    local = {p.relative_to(folder).as_posix(): p.stat().st_size
             for p in sorted(folder.rglob("*")) if p.is_file()}
    remote: dict[str, int] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET,
                                                                 Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            remote[obj["Key"][len(prefix) + 1:]] = int(obj["Size"])
    if remote != local:
        for key in remote:
            client.delete_object(Bucket=BUCKET, Key=f"{prefix}/{key}")
        for key in local:
            client.upload_file(str(folder / key), BUCKET, f"{prefix}/{key}")
    return sum(local.values())


def proxy_stats(proxy_url: str) -> dict[str, float]:
    """The link's counters (``FaultPlan.counters``), asked over HTTP from any process."""
    with urllib.request.urlopen(proxy_url + STATS_PATH, timeout=10) as resp:
        stats: dict[str, float] = json.loads(resp.read())
    return stats


def remove_mosaicml_shm(local: Path, shm: Path = Path("/dev/shm")) -> list[str]:
    """Remove the shared memory a killed MosaicML run with ``local=`` left; the names removed.

    MosaicML names its segments ``<prefix>_<what>`` and lists the ``local`` folders of a
    prefix in ``<prefix>_locals``; a run killed on timeout leaves them, and a later run
    would attach to the stale state. Only prefixes whose list names ``local`` are touched.
    """
    removed: list[str] = []
    for entry in shm.glob("*_locals"):
        try:
            if str(local).encode() not in entry.read_bytes():
                continue
        except OSError:
            continue
        prefix = entry.name.removesuffix("_locals")
        for path in shm.glob(f"{prefix}_*"):
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path.name)
    return removed


def folder_bytes(folder: Path) -> int:
    """Bytes of the regular files under ``folder``, each inode once (files vanishing count 0).

    A file renamed from one subfolder to another while the walk runs (a download
    published into place) would otherwise be counted twice.
    """
    seen: dict[tuple[int, int], int] = {}
    stack = [folder]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    st = entry.stat(follow_symlinks=False)
                    seen[(st.st_dev, st.st_ino)] = st.st_size
            except OSError:
                pass
    return sum(seen.values())


class FolderSampler:
    """Samples ``folder_bytes(folder)`` every ``interval_s`` on a thread: ``(time.time(), bytes)``.

    Wall-clock times, so the samples can be cut at epoch boundaries another process
    recorded. Use as a context manager.
    """

    def __init__(self, folder: Path, *, interval_s: float = 0.05) -> None:
        self.folder = folder
        self.interval_s = interval_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="folder-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append((time.time(), folder_bytes(self.folder)))
            if self._stop.wait(self.interval_s):
                self.samples.append((time.time(), folder_bytes(self.folder)))
                return

    def __enter__(self) -> FolderSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, start: float = 0.0, stop: float = float("inf")) -> int:
        """The largest size sampled between ``start`` and ``stop`` (wall clock); 0 if none."""
        return max((size for t, size in self.samples if start <= t <= stop), default=0)
