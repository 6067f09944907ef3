"""Protocol-specific transfers fsspec has no common API for: streamed ranged GETs, S3 multipart.

A ranged GET of 8-16 MB is read from the response in 1 MB chunks and each
chunk handed on as it arrives, so that a body cut mid-way loses at most the
chunk in flight: the retry asks for the remaining bytes only. S3 (by presigned
URL, ``presigned``, else through s3fs's client) and HTTP (through fsspec's
aiohttp session) stream; other
protocols fall back to one ``cat_file`` of the remaining range per attempt.
Large S3 uploads go part by part, each part retried on its own, and the
upload is aborted on failure so no invisible parts are left to pay for; the
uploads of a process killed between parts are found and aborted by the next
pack that overwrites or resumes (``abort_s3_uploads``). The
``fs`` arguments are fsspec filesystems; these functions touch a few of their
semi-public methods (``_call_s3``, ``split_path``, ``set_session``,
``encode_url``), which is why ``pyproject.toml`` pins the tested versions.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from shardio.storage import presigned
from shardio.storage.client import HTTP_PROTOCOLS, S3_PROTOCOLS

T = TypeVar("T")

CHUNK_BYTES = 1 << 20
"""Bytes taken from a response body at a time: what a cut loses at most."""

Retried = Callable[[str, Callable[[], Any]], Any]
"""``retried(operation, call)``: ``call()`` under the store's retry policy and translation."""


async def _stream_s3(fs: Any, path: str, start: int, stop: int,
                     deliver: Callable[[bytes], None]) -> None:
    if presigned.usable(fs):
        try:
            await presigned.stream(fs, path, start, stop, deliver, CHUNK_BYTES)
            return
        except presigned.CannotPresign:
            pass
    bucket, key, version = fs.split_path(path)
    extra = {"VersionId": version} if version else {}
    resp = await fs._call_s3(
        "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{stop - 1}", **extra)
    body = resp["Body"]
    try:
        while chunk := await body.read(CHUNK_BYTES):
            deliver(chunk)
    finally:
        body.close()


async def _stream_http(fs: Any, url: str, start: int, stop: int,
                       deliver: Callable[[bytes], None]) -> None:
    session = await fs.set_session()
    kw = dict(fs.kwargs)
    # identity: a compressed body would not be the byte range asked for
    headers = {**(kw.pop("headers", None) or {}), "Range": f"bytes={start}-{stop - 1}",
               "Accept-Encoding": "identity"}
    async with session.get(fs.encode_url(url), headers=headers, **kw) as resp:
        if resp.status == 404:
            raise FileNotFoundError(errno.ENOENT, "no such object", url)
        resp.raise_for_status()
        await presigned.relay(resp, start, deliver, CHUNK_BYTES)


def stream_range(fs: Any, protocol: str, path: str, start: int, stop: int,
                 deliver: Callable[[bytes], None]) -> None:
    """Hand bytes ``start..stop`` of ``path`` to ``deliver`` in order, chunk by chunk.

    ``deliver`` may get bytes beyond ``stop`` (a server ignoring the range); the
    caller trims. A cut body raises after the chunks already delivered.
    """
    if protocol in S3_PROTOCOLS or protocol in HTTP_PROTOCOLS:
        from fsspec.asyn import sync

        streamer = _stream_s3 if protocol in S3_PROTOCOLS else _stream_http
        sync(fs.loop, streamer, fs, path, start, stop, deliver)
    else:
        deliver(fs.cat_file(path, start=start, end=stop))


async def _get_s3(fs: Any, path: str) -> bytes:
    bucket, key, version = fs.split_path(path)
    extra = {"VersionId": version} if version else {}
    resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **extra)
    body = resp["Body"]
    try:
        data: bytes = await body.read()
        return data
    finally:
        body.close()


def read_object(fs: Any, protocol: str, path: str) -> bytes:
    """The whole object ``path`` in one GET.

    s3fs's ``cat_file`` asks for the object's size first (to read a large one in
    parallel parts): a second round trip before a manifest or a journal, which are small.
    """
    if protocol in S3_PROTOCOLS:
        from fsspec.asyn import sync

        data: bytes = sync(fs.loop, _get_s3, fs, path)
        return data
    whole: bytes = fs.cat_file(path)
    return whole


def upload_s3_multipart(fs: Any, path: str, source: Path, *, part_bytes: int,
                        retried: Retried) -> None:
    """Upload ``source`` to S3 ``path`` in parts of ``part_bytes``, each retried on its own.

    The object appears, whole, only when the upload completes; on any failure
    the upload is aborted and nothing is visible.
    """
    from fsspec.asyn import sync

    bucket, key, _version = fs.split_path(path)

    def s3(method: str, **kwargs: Any) -> Any:
        return sync(fs.loop, fs._call_s3, method, Bucket=bucket, Key=key, **kwargs)

    upload = retried("start multipart upload", functools.partial(s3, "create_multipart_upload"))
    upload_id = upload["UploadId"]
    try:
        parts = []
        with open(source, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            for number, offset in enumerate(range(0, size, part_bytes), start=1):
                body = os.pread(fh.fileno(), part_bytes, offset)
                reply = retried(f"PUT part {number}", functools.partial(
                    s3, "upload_part", UploadId=upload_id, PartNumber=number, Body=body))
                parts.append({"PartNumber": number, "ETag": reply["ETag"]})
        retried("complete multipart upload", functools.partial(
            s3, "complete_multipart_upload", UploadId=upload_id,
            MultipartUpload={"Parts": parts}))
    except BaseException:
        with contextlib.suppress(Exception):  # best effort: the original error matters more
            s3("abort_multipart_upload", UploadId=upload_id)
        raise


def abort_s3_uploads(fs: Any, root: str, is_ours: Callable[[str], bool], *,
                     retried: Retried) -> list[str]:
    """Abort the unfinished multipart uploads under the S3 prefix ``root`` whose names are ours.

    A process killed between parts leaves an upload S3 keeps (and bills) until
    aborted; it never becomes an object, so no listing of objects shows it.
    ``is_ours`` judges the name relative to ``root``; other uploads are left alone.
    Returns the names of the aborted uploads.
    """
    from fsspec.asyn import sync

    bucket, key, _version = fs.split_path(root)
    prefix = f"{key.rstrip('/')}/" if key else ""
    aborted: list[str] = []
    markers: dict[str, str] = {}
    while True:
        page = retried("LIST multipart uploads", functools.partial(
            sync, fs.loop, fs._call_s3, "list_multipart_uploads", Bucket=bucket,
            Prefix=prefix, **markers))
        for upload in page.get("Uploads", []):
            name = upload["Key"][len(prefix):]
            if upload["Key"].startswith(prefix) and is_ours(name):
                with contextlib.suppress(FileNotFoundError):  # completed or aborted meanwhile
                    retried(f"abort multipart upload of {name}", functools.partial(
                        sync, fs.loop, fs._call_s3, "abort_multipart_upload", Bucket=bucket,
                        Key=upload["Key"], UploadId=upload["UploadId"]))
                aborted.append(name)
        if not page.get("IsTruncated"):
            return aborted
        markers = {"KeyMarker": page.get("NextKeyMarker", ""),
                   "UploadIdMarker": page.get("NextUploadIdMarker", "")}
