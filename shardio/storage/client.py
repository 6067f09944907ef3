"""Per-process fsspec clients: made lazily, shared by configuration, never carried across a fork.

A client (an fsspec filesystem with its event loop, HTTP sessions, sockets
and resolved credentials) belongs to the process that made it. ``client_for``
keeps one per protocol and options in this process, so every store of one
configuration resolves its credentials once (the ``AWS_*`` environment
including ``AWS_ENDPOINT_URL``, profiles, ``GOOGLE_APPLICATION_CREDENTIALS``,
or ``storage_options``), never per request. After a fork the child starts with
no clients: the inherited ones are kept referenced and unused, so no finalizer
closes the parent's connections from the child, and fsspec's IO loop, thread
and lock are reset. fsspec's instance cache is never used
(``skip_instance_cache``). Spawned and forkserver children start empty anyway.
Options a filesystem takes from the URL itself (``ftp://host:port``'s host and
port) are read from the store's URL, as ``fsspec.open`` would.
``refusal`` turns a store's refusal (no credentials, access denied, no such
bucket) into what to set or check: this module knows each protocol's settings.
The credentials a client is made from (``storage_options`` values under
credential-like names, every header value, the ``AWS_*``-style environment's
keys, secrets and tokens) are handed to ``retry.add_secrets``, so no message
that a store's error becomes ever quotes them. Imports fsspec only inside
``client_for``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from shardio.errors import MissingDependencyError
from shardio.storage.retry import RetryPolicy, add_secrets, redact

HTTP_PROTOCOLS = ("http", "https")
CONFIG_ENV_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "FSSPEC_")
"""Environment variables that configure a client: part of its key, so a changed endpoint or
profile gets a new client instead of one resolved for the old settings."""
SECRET_NAME = re.compile(
    r"key|secret|token|password|passwd|credential|auth|signature|sas|session|cookie|headers|"
    r"connection_string",
    re.IGNORECASE)
"""Names of options and environment variables whose values (everything below them, for a
mapping such as ``headers``) are secrets; an ``endpoint_url`` or a region is not."""
S3_PROTOCOLS = ("s3", "s3a")
POOL_CONNECTIONS = 32
"""Connections an S3 client keeps open at most (a reading process: ranges ahead + tails)."""
REMOTE_EXTRA = "pip install fsspec s3fs (the extra shardio-torch[remote])"
CREDENTIAL_ERRORS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                     "DefaultCredentialsError", "CredentialUnavailableError")
"""Error types (botocore, google-auth, azure-identity) meaning "no credentials were found"."""
CREDENTIAL_SETTINGS = {
    "s3": ("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE",
           "{'key': ..., 'secret': ...}"),
    "gs": ("GOOGLE_APPLICATION_CREDENTIALS (a service account key file)", "{'token': ...}"),
    "az": ("AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY, or "
           "AZURE_STORAGE_CONNECTION_STRING", "{'account_name': ..., 'account_key': ...}"),
    "http": ("", "{'headers': {'Authorization': ...}}"),
}
"""Per protocol family: the environment variables that give a store credentials, and the
``storage_options`` that do in Python."""
PROTOCOL_FAMILIES = {"s3a": "s3", "gcs": "gs", "abfs": "az", "abfss": "az", "adl": "az",
                     "https": "http"}

_clients: dict[str, tuple[Mapping[str, Any], Any]] = {}
"""Key -> (the options it was made from, kept alive so that an id() key is never reused; client)."""
_clients_lock = threading.Lock()
_inherited: list[Any] = []
"""Clients a forked child inherited: kept referenced so that no finalizer closes the parent's
sessions from the child; never used."""


def _forget_clients_after_fork() -> None:
    global _clients_lock
    _clients_lock = threading.Lock()  # another thread may have held it at fork time
    _inherited.extend(client for _options, client in _clients.values())
    _clients.clear()
    asyn = sys.modules.get("fsspec.asyn")
    if asyn is not None:
        # fsspec's own after-fork hook (2025.7+) clears its loop and IO thread but not the lock
        # that guards them, which a parent thread may have held at fork time; older releases
        # have no hook at all. reset_lock() clears all three.
        asyn.reset_lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_clients_after_fork)


def secret_values(value: Any, *, secret: bool = False) -> Iterator[str]:
    """The strings of ``value`` (options, nested mappings and sequences) that are secrets: those
    under a name ``SECRET_NAME`` matches, at any depth."""
    if isinstance(value, str):
        if secret:
            yield value
    elif isinstance(value, Mapping):
        for name, item in value.items():
            yield from secret_values(item, secret=secret or bool(SECRET_NAME.search(str(name))))
    elif isinstance(value, (list, tuple)):  # aiohttp.BasicAuth is a tuple
        for item in value:
            yield from secret_values(item, secret=secret)


def missing_dependency(exc: ImportError, protocol: str) -> MissingDependencyError:
    """The error for a remote URL whose fsspec implementation is not installed."""
    return MissingDependencyError(
        f"reading or writing {protocol}:// URLs needs fsspec and its {protocol} package "
        f"({exc}); install them with {REMOTE_EXTRA} (gcsfs or adlfs for gs:// and az://)"
    )


def credentials_hint(protocol: str) -> str:
    """What to set so that a store of ``protocol`` finds (other) credentials."""
    variables, options = CREDENTIAL_SETTINGS.get(PROTOCOL_FAMILIES.get(protocol, protocol),
                                                 ("", "{...}"))
    where = f"set {variables}, or " if variables else ""
    return f"{where}in Python pass RemoteOptions(storage_options={options})"


def endpoint(protocol: str, options: Mapping[str, Any]) -> str:
    """Where an S3 store sends its requests, and which setting said so; "" for the others."""
    if protocol not in S3_PROTOCOLS:
        return ""
    client_kwargs = options.get("client_kwargs") or {}
    given = options.get("endpoint_url") or client_kwargs.get("endpoint_url")
    if given:
        return f"the endpoint {redact(str(given))} (storage_options endpoint_url)"
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(name):
            return f"the endpoint {redact(os.environ[name])} ({name})"
    return "AWS (no AWS_ENDPOINT_URL is set)"


def refusal(protocol: str, options: Mapping[str, Any], url: str, exc: BaseException) -> str | None:
    """What failed and what to set or check, when ``exc`` (as ``retry_call`` raises it) is a
    store's refusal: no credentials found, access denied, or a missing S3 bucket; else None."""
    text = str(exc.strerror if isinstance(exc, OSError) and exc.strerror else exc)
    at = endpoint(protocol, options)
    if text.partition(":")[0] in CREDENTIAL_ERRORS:  # retry.describe: "<type>: <text>"
        public = ("; a public bucket needs none: storage_options={'anon': True}"
                  if protocol in S3_PROTOCOLS else "")
        return f"no credentials were found ({text}); {credentials_hint(protocol)}{public}"
    if isinstance(exc, PermissionError) or getattr(exc, "status", None) in (401, 403):
        if protocol in HTTP_PROTOCOLS:
            return (f"access denied ({text}); the server wants credentials "
                    f"({credentials_hint(protocol)}), or the URL is wrong or has expired")
        by = f" by {at}" if at else ""
        return (f"access denied ({text}){by}; check that the credentials in use may access "
                f"this {'bucket' if at else 'location'} ({credentials_hint(protocol)})"
                + (" and that this is the right endpoint" if at else ""))
    if (isinstance(exc, FileNotFoundError) and protocol in S3_PROTOCOLS
            and ("NoSuchBucket" in text or "bucket does not exist" in text)):
        bucket = url.partition("://")[2].partition("/")[0]
        return (f"the bucket {bucket!r} does not exist at {at}; check the bucket name and the "
                "endpoint (AWS_ENDPOINT_URL, or storage_options endpoint_url), or create the "
                "bucket first")
    return None


def url_options(protocol: str, url: str) -> dict[str, Any]:
    """The options fsspec's filesystem for ``protocol`` takes from ``url`` itself (ftp's host
    and port, sftp's user); empty for most protocols.

    Raises:
        MissingDependencyError: fsspec or the protocol's package is not installed.
    """
    try:
        import fsspec

        found: dict[str, Any] = fsspec.get_filesystem_class(protocol)._get_kwargs_from_urls(url)
    except ImportError as exc:
        raise missing_dependency(exc, protocol) from exc
    return found


def _new_client(protocol: str, options: Mapping[str, Any], policy: RetryPolicy) -> Any:
    """A fresh fsspec filesystem for ``protocol``, with this layer's retry and timeout defaults."""
    try:
        import fsspec
    except ImportError as exc:
        raise missing_dependency(exc, protocol) from exc
    opts = dict(options)
    inner_retries = None
    if protocol in S3_PROTOCOLS:
        # retry_call owns retries (jittered, counted, resuming); s3fs's and botocore's own
        # loops would multiply the attempts and sleep in lockstep across workers.
        inner_retries = opts.pop("retries", 1)  # a class attribute of S3FileSystem, not a kwarg
        config = dict(opts.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1})
        config.setdefault("connect_timeout", policy.connect_timeout_s)
        config.setdefault("read_timeout", policy.read_timeout_s)
        # botocore's pool of 10 connections queued the ranges a reader keeps in flight
        # (up to fetch.DEFAULT_IN_FLIGHT) behind the tails it fetches at once
        config.setdefault("max_pool_connections", POOL_CONNECTIONS)
        # botocore presigns with SigV2 unless told (storage.presigned), which regions opened
        # since 2014 refuse; its own requests sign with SigV4 already. anon=True overrides it.
        config.setdefault("signature_version", "s3v4")
        opts["config_kwargs"] = config
    elif protocol in HTTP_PROTOCOLS:
        import aiohttp

        client = dict(opts.get("client_kwargs") or {})
        client.setdefault("timeout", aiohttp.ClientTimeout(
            total=None, sock_connect=policy.connect_timeout_s, sock_read=policy.read_timeout_s))
        opts["client_kwargs"] = client
    try:
        fs = fsspec.filesystem(protocol, skip_instance_cache=True, **opts)
    except ImportError as exc:
        raise missing_dependency(exc, protocol) from exc
    if inner_retries is not None:
        fs.retries = inner_retries
    return fs


def client_for(protocol: str, options: Mapping[str, Any], policy: RetryPolicy, *,
               url: str = "") -> Any:
    """This process's client for ``protocol`` and ``options`` (under those ``url`` gives, such
    as an ftp host), made on first use.

    Raises:
        MissingDependencyError: fsspec or the protocol's package is not installed.
    """
    from_url = url_options(protocol, url) if url else {}
    if from_url:  # FTPFileSystem() has no default host: without it, a TypeError and a __del__ error
        options = {**from_url, **options}
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(CONFIG_ENV_PREFIXES))
    try:
        key = json.dumps([protocol, options, policy.connect_timeout_s, policy.read_timeout_s, env],
                         sort_keys=True)
    except TypeError:  # options holding objects: a client of its own per options mapping
        key = f"{protocol}:{id(options)}:{json.dumps(env)}"
    with _clients_lock:
        entry = _clients.get(key)
        if entry is None:
            add_secrets(secret_values(options))
            add_secrets(secret_values(dict(env)))
            entry = _clients[key] = (options, _new_client(protocol, options, policy))
        return entry[1]
