"""``RemoteStore``: objects behind an fsspec URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``…).

What it guarantees above fsspec:

* **Fork safety.** The store keeps the pid its client was made for and takes
  this process's client (``shardio.storage.client``) in a forked, spawned or
  forkserver child; pickling keeps the description only. Clients are shared
  per process and configuration, so credentials are resolved once per process.
* **Retries** with backoff and jitter on every call (``shardio.storage.retry``);
  a ranged GET cut mid-body resumes at the first byte not received
  (``shardio.storage.transfer``).
* **Errors** translated at this boundary: ``FileNotFoundError`` for a missing
  object, ``StorageError`` otherwise (saying what to set or check when the store
  found no credentials, denied access or has no such bucket: ``client.refusal``),
  ``MissingDependencyError`` naming the ``remote`` extra when fsspec or a
  protocol's package is not installed. Messages carry no URL query string.

Writes: an object PUT is atomic (multipart for large S3 files, part by part),
so there are no temporary names; a caller that needs "complete" semantics
writes the manifest last. Imports fsspec only when a client is made.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from shardio.errors import MissingDependencyError, StorageError
from shardio.storage.client import (
    HTTP_PROTOCOLS,
    S3_PROTOCOLS,
    client_for,
    missing_dependency,
    refusal,
)
from shardio.storage.retry import IncompleteBodyError, RetryPolicy, StoreStats, redact, retry_call
from shardio.storage.store import RangeWriter, check_name, check_range
from shardio.storage.transfer import (
    abort_s3_uploads,
    read_object,
    stream_range,
    upload_s3_multipart,
)

T = TypeVar("T")

MIN_PART_BYTES = 8 << 20
"""Multipart upload part size floor (S3 needs >= 5 MiB; AWS recommends 8-16 MB)."""
MAX_PARTS = 10_000


class RemoteStore:
    """Objects under one fsspec URL; safe to pickle, fork and share between threads."""

    def __init__(
        self,
        url: str,
        *,
        protocol: str,
        storage_options: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """Describe the store; no client is made and nothing is imported until first use.

        Args:
            url: the root, e.g. ``s3://bucket/datasets/train``.
            protocol: the URL's scheme, lower case.
            storage_options: passed to the fsspec filesystem (``endpoint_url``, ``key``,
                ``profile``, ``anon``, ``client_kwargs``…), overriding this layer's defaults.
            retry: retry policy; the default retries 8 times over about 10 s.
        """
        self.url = url.rstrip("/")
        self.protocol = protocol
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.stats = StoreStats()
        self._client: Any = None
        self._pid = -1

    def __repr__(self) -> str:
        return f"RemoteStore({self.url!r})"

    def __getstate__(self) -> dict[str, Any]:
        """What a spawned worker needs: the description, never the client."""
        return {"url": self.url, "protocol": self.protocol,
                "storage_options": self.storage_options, "retry": self.retry}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], protocol=state["protocol"],  # type: ignore[misc]
                      storage_options=state["storage_options"], retry=state["retry"])

    def _fs(self) -> Any:
        """The client of this process (a fork or spawn gets a new one)."""
        if self._pid != os.getpid() or self._client is None:
            self._client = client_for(self.protocol, self.storage_options, self.retry,
                                      url=self.url)
            self._pid = os.getpid()
            self.stats = StoreStats()
        return self._client

    def _path(self, name: str) -> str:
        return f"{self.url}/{check_name(name)}"

    def _call(self, path: str, op: str, call: Callable[[], T],
              progress: Callable[[], int] | None = None) -> T:
        """``call`` (operation ``op`` on ``path``) with retries, its errors translated: a
        refusal (no credentials, access denied, no such bucket) says what to set or check."""
        where = redact(path)  # a presigned URL's query string is a read grant
        what = f"{where}: {op}"
        try:
            return retry_call(call, policy=self.retry, what=what, stats=self.stats,
                              progress=progress)
        except (StorageError, MissingDependencyError):
            raise
        except ImportError as exc:
            raise missing_dependency(exc, self.protocol) from exc
        except Exception as exc:
            refused = refusal(self.protocol, self.storage_options, self.url, exc)
            if refused is not None:
                raise StorageError(f"{what}: {refused}", path=what) from exc
            if isinstance(exc, FileNotFoundError):
                raise FileNotFoundError(errno.ENOENT, "no such object", where) from exc
            raise StorageError(f"{what}: {exc!r}", path=what) from exc

    def local_path(self, name: str) -> Path | None:
        """None: remote objects are read through ranges (and the node cache)."""
        return None

    def read_bytes(self, name: str) -> bytes:
        """The whole object ``name`` in one GET."""
        path = self._path(name)

        def get() -> bytes:
            data = read_object(self._fs(), self.protocol, path)
            self.stats.bytes_read += len(data)
            return data

        return self._call(path, "GET", get)

    def read_range(self, name: str, start: int, stop: int) -> bytes:
        """Bytes ``start..stop`` of ``name`` in one ranged GET (resumed if cut)."""
        parts: list[bytes] = []
        self.read_range_into(name, start, stop, lambda _offset, chunk: parts.append(bytes(chunk)))
        return b"".join(parts)

    def read_range_into(self, name: str, start: int, stop: int, write: RangeWriter) -> None:
        """Stream bytes ``start..stop`` of ``name`` into ``write``, resuming a cut body."""
        check_range(name, start, stop)
        path = self._path(name)
        pos = start

        def deliver(chunk: bytes) -> None:
            nonlocal pos
            take = min(len(chunk), stop - pos)
            if take > 0:
                write(pos - start, memoryview(chunk)[:take])
                pos += take
                self.stats.bytes_read += take

        def attempt() -> None:
            if pos > start:
                self.stats.resumed += 1
            stream_range(self._fs(), self.protocol, path, pos, stop, deliver)
            if pos < stop:
                raise IncompleteBodyError(
                    f"{path}: the response ended at byte {pos} of range {start}..{stop}")

        self._call(path, f"GET bytes {start}..{stop}", attempt, progress=lambda: pos)

    def size(self, name: str) -> int:
        """Size of ``name`` (a HEAD request)."""
        path = self._path(name)

        def head() -> int:
            fs = self._fs()
            fs.invalidate_cache(path)
            try:
                size = fs.size(path)
            except FileNotFoundError as exc:
                # fsspec's HTTP file system says "not found" of any failed HEAD and GET: a
                # 403 or 500 is the server's answer, to retry or name, not a missing object
                status = getattr(exc.__cause__, "status", None)
                if isinstance(status, int) and status not in (404, 410):
                    raise exc.__cause__ from None  # type: ignore[misc]
                raise
            if size is None:
                raise StorageError(f"{path}: the server does not say the object's size", path=path)
            return int(size)

        return self._call(path, "HEAD", head)

    def exists(self, name: str) -> bool:
        """Whether ``name`` exists (a HEAD request)."""
        try:
            self.size(name)
        except FileNotFoundError:
            return False
        return True

    def list_names(self) -> list[str]:
        """Every object under the root, relative and sorted (HTTP servers cannot list)."""
        if self.protocol in HTTP_PROTOCOLS:
            raise StorageError(
                f"{self.url}: an HTTP server cannot list its files; reading needs no listing, "
                "but packing (--resume, --overwrite) needs an object store URL",
                path=self.url,
            )

        def find() -> list[str]:
            fs = self._fs()
            root = fs._strip_protocol(self.url).rstrip("/")
            fs.invalidate_cache(root)
            return sorted(p[len(root) + 1:] for p in fs.find(root) if p.startswith(root + "/"))

        return self._call(self.url, "LIST", find)

    def delete(self, name: str) -> None:
        """Remove ``name``; a missing object is not an error."""
        path = self._path(name)
        self._read_only(path)

        def rm() -> None:
            fs = self._fs()
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(path)
            fs.invalidate_cache(path)

        self._call(path, "DELETE", rm)

    def put_file(self, name: str, source: Path) -> None:
        """Upload ``source`` as ``name`` (one PUT, or a multipart upload when large)."""
        path = self._path(name)
        self._read_only(path)
        size = os.path.getsize(source)
        part_bytes = max(MIN_PART_BYTES, -(-size // MAX_PARTS))
        if self.protocol in S3_PROTOCOLS and size > 2 * part_bytes:
            upload_s3_multipart(self._fs(), path, source, part_bytes=part_bytes,
                                retried=lambda op, call: self._call(path, op, call))
            self._fs().invalidate_cache(path)
            return

        def put() -> None:
            fs = self._fs()
            fs.put_file(str(source), path)
            fs.invalidate_cache(path)

        self._call(path, f"PUT {size} bytes", put)

    def put_bytes(self, name: str, data: bytes) -> None:
        """Store ``data`` as ``name`` in one PUT."""
        path = self._path(name)
        self._read_only(path)

        def put() -> None:
            fs = self._fs()
            fs.pipe_file(path, data)
            fs.invalidate_cache(path)

        self._call(path, f"PUT {len(data)} bytes", put)

    def abort_uploads(self, is_ours: Callable[[str], bool]) -> list[str]:
        """Abort the unfinished uploads under the root whose names ``is_ours`` accepts.

        Only S3 keeps uploads apart from objects (multipart, billed until
        aborted); elsewhere there is nothing to abort. Returns the aborted names.
        """
        if self.protocol not in S3_PROTOCOLS:
            return []
        return abort_s3_uploads(self._fs(), self.url, is_ours,
                                retried=lambda op, call: self._call(self.url, op, call))

    def _read_only(self, path: str) -> None:
        if self.protocol in HTTP_PROTOCOLS:
            raise StorageError(
                f"{path}: HTTP(S) datasets are read-only; write to an object store "
                "(s3://, gs://, az://) or a local folder instead",
                path=path,
            )
