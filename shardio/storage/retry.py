"""Retries for remote stores: which errors are transient, and exponential backoff with jitter.

Object stores fail transiently all the time: connections reset, timeouts,
5xx, ``429`` and S3's ``503 SlowDown``, and responses cut mid-body. Every
remote call goes through ``retry_call``, which retries those with "full
jitter" backoff (a random wait up to ``base * 2**attempt``, capped), so that
many workers hitting a throttled bucket spread out instead of retrying in
lockstep. Anything else (missing object, access denied, a bad request) fails
at once. Classification is by exception type *name*, status and error code
along the cause chain, so this module imports neither botocore nor aiohttp.

``retry_call`` is also where a store's errors leave the libraries that raised
them, so it is where their secrets are dropped: aiohttp's ``repr`` carries every
request header (``Authorization`` included), a presigned URL's query string is
a read grant, and other libraries' texts may quote a credential. What escapes
``retry_call`` (its ``StorageError``, or the error it did not retry) is a fresh
exception of the same kind, built by ``describe`` from the type, status and
reason of the original, with URL query strings, user info and every secret
``add_secrets`` was told of (``client_for`` tells it those of ``storage_options``
and the environment) cut out, and raised with no chain to the original, whose
text a traceback would print. Imports only ``errors``.
"""

from __future__ import annotations

import asyncio
import errno
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from shardio.errors import ShardioError, StorageError, without_url_secrets

T = TypeVar("T")

TRANSIENT_TYPES = frozenset({
    # aiohttp
    "ClientPayloadError", "ClientConnectionError", "ClientOSError", "ServerDisconnectedError",
    "ServerTimeoutError", "ClientConnectorError", "SocketTimeoutError", "ConnectionTimeoutError",
    # botocore / aiobotocore
    "IncompleteReadError", "ResponseStreamingError", "ReadTimeoutError", "ConnectTimeoutError",
    "EndpointConnectionError", "ConnectionClosedError", "HTTPClientError", "ResponseParserError",
    # fsspec, http.client, urllib3
    "FSTimeoutError", "IncompleteRead", "RemoteDisconnected", "ProtocolError",
})
"""Exception classes (by name, anywhere in the MRO) that mean "the connection failed, try again"."""

TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "TooManyRequests", "RequestLimitExceeded",
    "RequestTimeout", "RequestTimeoutException", "InternalError", "ServiceUnavailable",
    "503", "500", "502", "504",
})
"""Service error codes (S3 and friends) that ask the client to retry."""


class IncompleteBodyError(ConnectionError):
    """A response ended before the requested range did; the rest is requested again."""


class StoreCallError(OSError):
    """A store call's failure as a message may show it: the original's type, status and
    reason, never its headers, query strings or secrets (``describe``)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    def __repr__(self) -> str:
        return str(self)  # callers format it with !r, as they would the original


REDACTED = "[redacted]"
MIN_SECRET_CHARS = 6
"""Shorter values are not cut out of messages (they would cut common words), and are not
secrets anyway."""
_secrets: set[str] = set()
_secrets_lock = threading.Lock()


def add_secrets(values: Iterable[str]) -> None:
    """Have every message ``redact`` cleans from now on cut out ``values`` (credentials,
    header values) wherever they occur."""
    with _secrets_lock:
        _secrets.update(v for v in values if len(v) >= MIN_SECRET_CHARS)


def redact(text: str) -> str:
    """``text`` without URL user info, query strings and fragments, and without the values
    ``add_secrets`` was given."""
    text = without_url_secrets(text)
    with _secrets_lock:
        secrets = sorted(_secrets, key=len, reverse=True)  # a secret within another: the longer
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def describe(exc: BaseException) -> str:
    """``exc`` as a message may show it: its type and its HTTP status and reason, or its text
    cleaned by ``redact``.

    An HTTP response error is told by its status and reason alone: aiohttp's ``repr`` holds
    every request header and its text the URL, which may be presigned.
    """
    if getattr(exc, "request_info", None) is not None:
        status, reason = getattr(exc, "status", 0), getattr(exc, "message", "")
        said = f"HTTP {status} {reason}" if isinstance(status, int) and status > 0 else reason
        return redact(f"{type(exc).__name__}: {said}".rstrip(": "))
    text = str(exc)
    return redact(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def _clean(exc: Exception) -> Exception:
    """What ``retry_call`` raises for ``exc``, which it does not retry: shardio's own errors
    and ImportError as they are; anything else as a fresh exception of the same kind
    (not found, access denied, or ``StoreCallError``) whose text is ``describe(exc)``."""
    if isinstance(exc, (ShardioError, ImportError)):
        return exc
    if isinstance(exc, FileNotFoundError):
        return FileNotFoundError(errno.ENOENT, describe(exc))
    if isinstance(exc, PermissionError):
        return PermissionError(errno.EACCES, describe(exc))
    status, _code = _status_and_code(exc)
    return StoreCallError(describe(exc), status)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently remote calls are retried.

    Attributes:
        max_attempts: tries per call, the first included.
        base_delay_s: the backoff scale: attempt ``n`` waits up to ``base * 2**n``.
        max_delay_s: the cap of one wait.
        connect_timeout_s: time allowed to open a connection.
        read_timeout_s: time allowed between two reads of a response (a stalled body).
    """

    max_attempts: int = 8
    base_delay_s: float = 0.1
    max_delay_s: float = 10.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("retry delays must not be negative")

    def delay_s(self, attempt: int) -> float:
        """The wait before retry number ``attempt`` (0-based): full jitter, capped."""
        return random.uniform(0.0, min(self.max_delay_s, self.base_delay_s * 2.0**attempt))


@dataclass
class StoreStats:
    """What a store did in this process; for tests, benchmarks and logs."""

    requests: int = 0
    retries: int = 0
    resumed: int = 0
    """Retries that continued a range after the bytes already received."""
    bytes_read: int = 0


def _status_and_code(exc: BaseException) -> tuple[int | None, str | None]:
    """The HTTP status and service error code an exception carries, where it carries them."""
    status = getattr(exc, "status", None)  # aiohttp.ClientResponseError
    code = None
    response = getattr(exc, "response", None)  # botocore.exceptions.ClientError
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", status)
        code = response.get("Error", {}).get("Code")
    return (status if isinstance(status, int) else None), (None if code is None else str(code))


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is worth retrying."""
    permanent = (StorageError, FileNotFoundError, PermissionError, IsADirectoryError,
                 NotADirectoryError)
    if isinstance(exc, permanent):  # a StorageError already went through its own retries
        return False
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
            return True
        if any(cls.__name__ in TRANSIENT_TYPES for cls in type(current).__mro__):
            return True
        status, code = _status_and_code(current)
        if status is not None and (status >= 500 or status in (408, 429)):
            return True
        if code in TRANSIENT_CODES:
            return True
        current = current.__cause__ or current.__context__
    return False


def retry_call(
    call: Callable[[], T],
    *,
    policy: RetryPolicy,
    what: str,
    stats: StoreStats | None = None,
    progress: Callable[[], int] | None = None,
    sleep: Callable[[float], object] = time.sleep,
) -> T:
    """``call()``, retried on transient errors with backoff; other errors are raised as their
    secret-free copies (``FileNotFoundError``, ``PermissionError``, ``StoreCallError``; shardio's
    own errors and ``ImportError`` as they are).

    Args:
        call: the request; it may keep progress between attempts (a resumed range).
        policy: attempts and delays.
        what: the object and operation, for the error message (``"s3://b/x: GET 0..16M"``).
        stats: counters to update.
        progress: bytes received so far; an attempt that moved it forward before failing
            does not use up an attempt (a slow, often cut transfer still finishes).
        sleep: the wait function (tests pass a recorder).

    Raises:
        StorageError: ``max_attempts`` attempts in a row failed transiently without
            progress; the message names ``what`` and the last error (``describe``).
    """
    failures = 0
    while True:
        if stats is not None:
            stats.requests += 1
        before = progress() if progress is not None else 0
        failure: Exception | None = None
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc):
                failure = _clean(exc)
            else:
                moved = progress is not None and progress() > before
                failures = 0 if moved else failures + 1
                if failures >= policy.max_attempts:
                    failure = StorageError(
                        f"{redact(what)}: failed {policy.max_attempts} times in a row, last "
                        f"with {describe(exc)}; the store is unreachable, overloaded or "
                        "cutting connections: check the endpoint and the network, or retry "
                        "later (retry policy: max_attempts)",
                        path=redact(what),
                    )
        if failure is not None:
            # raised here, outside the handler, so that it has no __context__: the original's
            # text (request headers, a signed URL), which a traceback prints, stays behind
            raise failure
        if stats is not None:
            stats.retries += 1
        sleep(policy.delay_s(max(failures - 1, 0)))
