"""S3 ranged GETs by presigned URL: signed once per object, then plain HTTP requests.

Every ``get_object`` through aiobotocore builds, signs and parses a request in
Python: several times the CPU of the same ranged GET as a plain aiohttp request
(docs/decisions.md, "S3 ranged GETs by presigned URL"). A
reader makes hundreds of GETs an epoch (shard tails, a first batch's records,
ranges) on the one thread that also receives every byte. So an object's GET URL
is presigned once (SigV4 query authentication: the range header is not signed,
so one URL serves every range of the object) and renewed after half its
lifetime, or at once when the store answers 403 (credentials rotated since).
Requests go through an aiohttp session of the filesystem's own, on its loop,
with the client's connect and read timeouts. A response that fails carries its
status (``PresignedGetError``, whose message names the object, never the URL, which
grants a read to whoever holds it), which ``retry`` classifies as for any HTTP
store. Where a URL cannot be presigned or is refused as signed (no credentials
resolved, server-side encryption with a customer key, whose headers
a URL cannot carry, a bucket in another region than the client's: botocore's own
calls follow S3's redirect there; a presigned GET follows no redirect),
``CannotPresign`` sends the caller to
``get_object``, for this filesystem from then on. Imports aiohttp only when called.
"""

from __future__ import annotations

import errno
import time
import weakref
from collections.abc import Callable
from typing import Any

from shardio.storage.retry import describe

PRESIGN_SECONDS = 3600
"""Lifetime asked for a presigned URL; it is renewed after half of it."""
NO_PRESIGN_KEYS = ("SSECustomerKey", "SSECustomerAlgorithm", "SSECustomerKeyMD5")
"""Request parameters a presigned URL cannot carry (they travel as headers)."""


class CannotPresign(Exception):
    """This filesystem's GETs must go through ``get_object`` (raised before any byte)."""


class PresignedGetError(OSError):
    """An error status of a presigned GET, named by the object's path: the URL, which
    grants a read for an hour to whoever holds it, never goes into a message."""

    def __init__(self, status: int, path: str, reason: str) -> None:
        super().__init__(f"{path}: HTTP {status} {reason}".rstrip())
        self.status = status
        """Read by ``retry.is_transient``: 5xx, 408 and 429 are retried."""


class _Presigned:
    """One filesystem's presigned URLs and the session that fetches them (one per process,
    as the filesystem itself)."""

    def __init__(self) -> None:
        self.urls: dict[tuple[str, str, str | None], tuple[str, float]] = {}
        self.session: Any = None
        self.refused = False
        """A presigned GET was refused as signed: ``get_object`` from now on."""


def _state(fs: Any) -> _Presigned:
    state: _Presigned | None = getattr(fs, "_shardio_presigned", None)
    if state is None:
        state = _Presigned()
        fs._shardio_presigned = state
        weakref.finalize(fs, _close, fs.loop, state)
    return state


def _close(loop: Any, state: _Presigned) -> None:
    """Close the session on its loop where it still runs (at exit it may not: then the
    process's end closes the sockets)."""
    session = state.session
    if session is None or session.closed or loop is None or not loop.is_running():
        return
    loop.call_soon_threadsafe(lambda: loop.create_task(session.close()))


def usable(fs: Any) -> bool:
    """Whether this filesystem's GETs can go by presigned URL."""
    if any(k in (getattr(fs, "req_kw", None) or {}) for k in NO_PRESIGN_KEYS):
        return False
    return not _state(fs).refused


async def _url(fs: Any, state: _Presigned, bucket: str, key: str, version: str | None, *,
               renew: bool) -> str:
    now = time.monotonic()
    known = state.urls.get((bucket, key, version))
    if known is not None and not renew and known[1] > now:
        return known[0]
    s3 = await fs.set_session()
    params = {"Bucket": bucket, "Key": key, **(fs.req_kw or {})}
    if version:
        params["VersionId"] = version
    try:
        url: str = await s3.generate_presigned_url("get_object", Params=params,
                                                   ExpiresIn=PRESIGN_SECONDS)
    except Exception as exc:  # no credentials, say: get_object raises what it means
        raise CannotPresign(f"{bucket}/{key}: {describe(exc)}") from exc
    state.urls[(bucket, key, version)] = (url, now + PRESIGN_SECONDS / 2)
    return url


def _session(fs: Any, state: _Presigned) -> Any:
    import aiohttp

    if state.session is None or state.session.closed:
        config = getattr(fs, "config_kwargs", None) or {}
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.get("connect_timeout"),
                                        sock_read=config.get("read_timeout"))
        limit = int(config.get("max_pool_connections", 10))
        state.session = aiohttp.ClientSession(
            timeout=timeout, connector=aiohttp.TCPConnector(limit=limit),
            auto_decompress=False)
    return state.session


async def stream(fs: Any, path: str, start: int, stop: int, deliver: Callable[[bytes], None],
                 chunk_bytes: int) -> None:
    """Bytes ``start..stop`` of S3 object ``path`` to ``deliver``, chunk by chunk.

    Raises:
        CannotPresign: use ``get_object`` instead (nothing was delivered).
        FileNotFoundError: no such object.
        PermissionError: 403 again after signing anew.
        PresignedGetError: another error status (transient ones are retried by the
            caller's ``retry_call``).
        aiohttp.ClientError: a connection failed or a body was cut.
    """
    bucket, key, version = fs.split_path(path)
    state = _state(fs)
    session = _session(fs, state)
    headers = {"Range": f"bytes={start}-{stop - 1}", "Accept-Encoding": "identity"}
    for attempt in range(2):
        url = await _url(fs, state, bucket, key, version, renew=attempt > 0)
        # redirects are not followed: S3 redirects to another region's endpoint, where the
        # signature does not hold, and aiohttp's error for a redirect loop quotes the URL
        async with session.get(url, headers=headers, allow_redirects=False) as resp:
            if resp.status == 403 and attempt == 0:
                continue  # expired, or credentials rotated since it was signed: sign again
            if 300 <= resp.status < 400 or resp.status == 400:  # not S3's auth, or its region
                state.refused = True
                raise CannotPresign(f"{path}: a presigned GET was answered {resp.status}")
            if resp.status == 404:
                raise FileNotFoundError(errno.ENOENT, "no such object", path)
            if resp.status == 403:
                raise PermissionError(errno.EACCES, "access denied (403)", path)
            if resp.status >= 400:
                raise PresignedGetError(resp.status, path, resp.reason or "")
            await relay(resp, start, deliver, chunk_bytes)
            return


async def relay(resp: Any, start: int, deliver: Callable[[bytes], None],
                chunk_bytes: int) -> None:
    """A ranged GET's body to ``deliver`` in chunks; from a server that ignored the range
    (200, the whole object), only the bytes from ``start`` on."""
    skip = start if resp.status == 200 else 0
    async for chunk in resp.content.iter_chunked(chunk_bytes):
        if skip >= len(chunk):
            skip -= len(chunk)
            continue
        deliver(chunk[skip:] if skip else chunk)
        skip = 0
