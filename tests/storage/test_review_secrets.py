"""No error text, traceback or log line ever holds a credential: every store error path, scanned.

Distinctive secrets are planted where a user puts them: request headers and
basic auth in ``storage_options``, S3 keys in ``storage_options`` and in the
``AWS_*`` environment, and a presigned URL's query string. Then every error path
a store has is driven on loopback servers: a hostile HTTP server answering
403, 404, 500, a redirect loop (to a URL with a token in its query) or a cut
body, for the manifest and for the shards; moto refusing bad credentials
(IAM authentication on); a presigned GET and every GET answered by a redirect
loop. Each goes through ``StreamingDataset`` (with and without DataLoader
workers), ``IndexedDataset``, ``verify`` and the CLI (``ls``, ``verify``), and
``str``, ``repr``, the formatted traceback with every ``__cause__`` and
``__context__``, warnings and every log record are scanned for the planted values.
"""

from __future__ import annotations

import base64
import logging
import shutil
import socket
import traceback
import warnings
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from click.testing import CliRunner
from moto.core.authorization import enable_iam_authentication
from storage_servers import FAST_RETRY, HttpEndpoint, S3Endpoint

import shardio
from benchmarks.storage_proxy import Server, _ProxyHandler, _ProxyServer, serve
from shardio import IndexedDataset, StreamingDataset
from shardio.cli import main
from shardio.storage import open_store
from shardio.storage.options import RemoteOptions
from shardio.storage.retry import describe, redact
from shardio.synth import make_imagefolder

pytest_plugins = ("storage_plugin",)

pytestmark = pytest.mark.servers

HEADER_TOKEN = "Bearer hdr-Pl4nted-7f3a9c"
API_KEY = "xapi-Pl4nted-0b1e2d"
BASIC_PASSWORD = "basic-Pl4nted-5a6b7c"
BASIC_HEADER = base64.b64encode(f"someone:{BASIC_PASSWORD}".encode()).decode()
REDIRECT_TOKEN = "qtok-Pl4nted-99ab"
OPTION_KEY = "AKIAOPTPL4NTED0001"
OPTION_SECRET = "opt-secret-Pl4nted-c0ffee"
ENV_KEY = "AKIAENVPL4NTED0002"
ENV_SECRET = "env-secret-Pl4nted-decade"
ENV_TOKEN = "env-token-Pl4nted-feed42"
SIGNATURE_MARKS = ("X-Amz-Signature", "X-Amz-Credential", "Signature=", "AWSAccessKeyId")
"""What a presigned URL's query holds: none of it may be shown."""
PLANTED = (HEADER_TOKEN, "hdr-Pl4nted", API_KEY, BASIC_PASSWORD, BASIC_HEADER, REDIRECT_TOKEN,
           OPTION_KEY, OPTION_SECRET, ENV_KEY, ENV_SECRET, ENV_TOKEN, *SIGNATURE_MARKS)
FAULTS = ("403", "404", "500", "loop", "cut")


# --- the scan --------------------------------------------------------------------------------

def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it was raised from or during."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [current.__cause__, current.__context__]


def assert_clean(*texts: str) -> None:
    for text in texts:
        leaked = [secret for secret in PLANTED if secret in text]
        assert not leaked, f"{leaked} in:\n{text}"


def assert_clean_error(exc: BaseException) -> None:
    """No planted value in ``exc``'s traceback (chains included) nor any linked error's text."""
    assert_clean("".join(traceback.format_exception(exc)))
    for linked in chain(exc):
        assert_clean(str(linked), repr(linked), *map(repr, linked.args))


class Watched:
    """Every log record (any logger, any level shardio's own, WARNING and up of the libraries
    below it, whose DEBUG output is theirs to redact) and every warning while it runs."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog

    def run(self, call: Callable[[], Any]) -> BaseException | None:
        self.caplog.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                call()
            except Exception as exc:  # what the user sees: scanned, then handed back
                error: BaseException | None = exc
            else:
                error = None
        for record in self.caplog.records:
            if record.name.startswith("shardio") or record.levelno >= logging.WARNING:
                assert_clean(record.getMessage(), str(record.exc_text or ""))
                if record.exc_info and record.exc_info[1] is not None:
                    assert_clean_error(record.exc_info[1])
        assert_clean(*(str(w.message) for w in caught))
        if error is not None:
            assert_clean_error(error)
        return error


@pytest.fixture
def watched(caplog: pytest.LogCaptureFixture) -> Watched:
    caplog.set_level(logging.DEBUG, logger="shardio")
    caplog.set_level(logging.WARNING)
    return Watched(caplog)


# --- a hostile HTTP server -------------------------------------------------------------------

class _HostileHandler(BaseHTTPRequestHandler):
    """Serves ``server.root``; a request whose path holds ``server.match`` gets ``server.fault``."""

    protocol_version = "HTTP/1.1"
    server: _HostileServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        self.server.authorized += self.headers.get("Authorization") in (
            HEADER_TOKEN, f"Basic {BASIC_HEADER}")
        path = self.path.split("?", 1)[0]
        file = self.server.root / path.lstrip("/")
        fault = self.server.fault if self.server.match in path else ""
        if fault in ("403", "404", "500"):
            self._send(int(fault), {"Content-Type": "text/plain"}, b"refused")
            return
        if fault == "loop":  # a redirect to itself, with a token in the query
            self._send(302, {"Location": f"{path}?token={REDIRECT_TOKEN}"})
            return
        if not file.is_file():
            self._send(404, {})
            return
        data = file.read_bytes()
        spec = self.headers.get("Range")
        status, start, stop = 200, 0, len(data)
        if spec is not None and self.command == "GET":
            first, _, last = spec.removeprefix("bytes=").partition("-")
            start, stop, status = int(first), min(len(data), int(last) + 1), 206
        body = data[start:stop]
        headers = {"Accept-Ranges": "bytes"}
        if status == 206:
            headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
        if fault == "cut" and self.command == "GET":  # half the body, then the connection ends
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._send(status, headers, body)

    def do_HEAD(self) -> None:
        path = self.path.split("?", 1)[0]
        fault = self.server.fault if self.server.match in path else ""
        file = self.server.root / path.lstrip("/")
        if fault in ("403", "404", "500") or not file.is_file():
            self._send(int(fault) if fault in ("403", "500") else 404, {})
            return
        self.send_response(200)
        self.send_header("Content-Length", str(file.stat().st_size))
        self.end_headers()


class _HostileServer(Server):
    root: Path
    fault = ""
    match = ""
    authorized = 0
    """GETs that carried the planted Authorization header."""


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[_HostileServer]:
    server = _HostileServer(("127.0.0.1", 0), _HostileHandler)
    server.root = tmp_path / "served"
    server.root.mkdir()
    thread = serve(server, "hostile-http")
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


# --- data ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 small JPEGs in three shards."""
    src = tmp_path_factory.mktemp("secrets-src")
    make_imagefolder(src, num_classes=2, per_class=12, seed=2, long_side=(32, 48))
    out = tmp_path_factory.mktemp("secrets") / "ds"
    shardio.pack(src, out, options=shardio.WriteOptions(max_shard_samples=8))
    return out


def remote(tmp_path: Path, storage_options: dict[str, Any] | None = None) -> RemoteOptions:
    return RemoteOptions(storage_options=storage_options, cache_dir=tmp_path / "cache",
                         max_cache_bytes=64 << 20, retry=FAST_RETRY)


HTTP_HEADERS = {
    "bearer": {"Authorization": HEADER_TOKEN, "X-Api-Key": API_KEY},
    "basic": {"Authorization": f"Basic {BASIC_HEADER}", "Cookie": f"session={API_KEY}"},
}


def http_options(kind: str = "bearer") -> dict[str, Any]:
    return {"headers": HTTP_HEADERS[kind]}


def readers(url: str, options: RemoteOptions) -> dict[str, Callable[[], Any]]:
    """Every way a user reads ``url``: each call reads all of it."""
    def stream(workers: int) -> Callable[[], Any]:
        def read() -> None:
            ds = StreamingDataset(url, decode="raw", remote=options)
            for _ in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers):
                pass
        return read

    def indexed() -> None:
        ds = IndexedDataset(url, decode="raw", remote=options)
        for i in range(len(ds)):
            ds[i]

    def verify() -> None:
        report = shardio.verify(url, remote=options)
        assert_clean(*(fault.message for fault in report.faults))
        assert not report.ok

    return {"stream": stream(0), "indexed": indexed, "verify": verify}


# --- the tests -------------------------------------------------------------------------------

def test_describe_keeps_status_and_reason_and_drops_headers_queries_and_user_info() -> None:
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    url = URL(f"https://someone:{BASIC_PASSWORD}@host/ds/x?X-Amz-Signature=abc&token="
              f"{REDIRECT_TOKEN}")
    info = aiohttp.RequestInfo(url, "GET", CIMultiDictProxy(CIMultiDict(
        {"Authorization": HEADER_TOKEN})), url)
    exc = aiohttp.ClientResponseError(info, (), status=403, message="Forbidden")
    assert HEADER_TOKEN in repr(exc) and REDIRECT_TOKEN in str(exc)  # aiohttp's own texts
    assert describe(exc) == "ClientResponseError: HTTP 403 Forbidden"
    assert redact(f"bad URL {url}") == "bad URL https://host/ds/x"


@pytest.mark.parametrize("headers", sorted(HTTP_HEADERS))
@pytest.mark.parametrize("where", ["manifest.json", ".rec"])
@pytest.mark.parametrize("fault", FAULTS)
def test_http_errors_never_show_headers_auth_or_redirect_tokens(
        packed: Path, hostile: _HostileServer, tmp_path: Path, watched: Watched,
        fault: str, where: str, headers: str) -> None:
    shutil.copytree(packed, hostile.root / "ds")
    hostile.fault, hostile.match = fault, where
    url = f"http://127.0.0.1:{hostile.server_address[1]}/ds"
    for name, read in readers(url, remote(tmp_path, http_options(headers))).items():
        shutil.rmtree(tmp_path / "cache", ignore_errors=True)
        hostile.authorized = 0
        error = watched.run(read)
        assert error is None or isinstance(error, shardio.ShardioError), repr(error)
        assert error is not None or name == "verify", (name, fault, where)
        assert hostile.authorized > 0, "the planted header never reached the server"


def test_a_worker_error_reraised_by_the_dataloader_is_clean(
        packed: Path, hostile: _HostileServer, tmp_path: Path, watched: Watched) -> None:
    shutil.copytree(packed, hostile.root / "ds")
    hostile.fault, hostile.match = "403", ".rec"
    url = f"http://127.0.0.1:{hostile.server_address[1]}/ds"
    ds = StreamingDataset(url, decode="raw", remote=remote(tmp_path, http_options()))
    error = watched.run(lambda: list(torch.utils.data.DataLoader(ds, batch_size=None,
                                                                 num_workers=2)))
    assert error is not None and "403" in str(error)


def s3_secrets(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Plant the environment's S3 credentials; returns storage_options planting others."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ENV_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", ENV_SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", ENV_TOKEN)
    return {"key": OPTION_KEY, "secret": OPTION_SECRET}


def upload(packed: Path, url: str) -> None:
    store = open_store(url, retry=FAST_RETRY)
    for path in sorted(packed.iterdir()):
        store.put_file(path.name, path)


@pytest.mark.parametrize("credentials", ["options", "environment"])
def test_s3_bad_credentials_never_show_keys_secrets_or_signed_urls(
        packed: Path, s3: S3Endpoint, tmp_path: Path, watched: Watched,
        monkeypatch: pytest.MonkeyPatch, credentials: str) -> None:
    upload(packed, s3.url)
    options = s3_secrets(monkeypatch)
    with enable_iam_authentication():  # moto knows none of the planted keys: 403 everywhere
        for name, read in readers(s3.url, remote(
                tmp_path, options if credentials == "options" else None)).items():
            error = watched.run(read)
            assert error is not None or name == "verify", name
        for args in (["ls", s3.url], ["verify", s3.url]):
            result = CliRunner().invoke(main, [*args, "--cache-dir", str(tmp_path / "cli")])
            assert result.exit_code != 0, args
            assert_clean(result.output)
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                assert_clean_error(result.exception)


class _RedirectingProxyHandler(_ProxyHandler):
    """moto behind a proxy that answers presigned GETs (``loop``: every GET) with a redirect
    to themselves."""

    server: _RedirectingProxy

    def _relay(self) -> None:
        presigned = "X-Amz-Signature=" in self.path
        if self.command == "GET" and (presigned or self.server.loop_every_get):
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super()._relay()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay


class _RedirectingProxy(_ProxyServer):
    loop_every_get = False


@pytest.fixture
def redirecting(s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch) -> Iterator[_RedirectingProxy]:
    proxy = _RedirectingProxy(("127.0.0.1", 0), _RedirectingProxyHandler)
    proxy.plan, proxy.upstream = s3.plan, s3.moto.address
    thread = serve(proxy, "redirecting-proxy")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.server_address[1]}")
    yield proxy
    proxy.shutdown()
    proxy.server_close()
    thread.join(timeout=5)


def test_a_presigned_get_redirected_in_a_loop_falls_back_to_get_object(
        packed: Path, s3: S3Endpoint, redirecting: _RedirectingProxy, tmp_path: Path,
        watched: Watched, monkeypatch: pytest.MonkeyPatch) -> None:
    upload(packed, s3.url)
    s3_secrets(monkeypatch)
    ds = StreamingDataset(s3.url, decode="raw", remote=remote(tmp_path))
    keys: list[str] = []
    assert watched.run(lambda: keys.extend(sample["__key__"] for sample in ds)) is None
    local = StreamingDataset(packed, decode="raw")
    assert sorted(keys) == sorted(sample["__key__"] for sample in local)  # S3's own GETs


def test_every_get_redirected_in_a_loop_fails_without_a_signed_url(
        packed: Path, s3: S3Endpoint, redirecting: _RedirectingProxy, tmp_path: Path,
        watched: Watched, monkeypatch: pytest.MonkeyPatch) -> None:
    upload(packed, s3.url)
    options = s3_secrets(monkeypatch)
    redirecting.loop_every_get = True
    for name, read in readers(s3.url, remote(tmp_path, options)).items():
        error = watched.run(read)
        assert error is not None or name == "verify", name


@pytest.mark.parametrize("args", [["info", "nosuch"], ["ls", "nosuch"], ["verify", "nosuch"],
                                  ["cat", "ds", "nokey"], ["doctor", "nosuch"]])
def test_a_password_in_the_dataset_url_is_never_shown(packed: Path, http: HttpEndpoint,
                                                      tmp_path: Path, args: list[str]) -> None:
    # messages quote the URL the user gave: every ShardioError and CLI line cuts its user info
    shutil.copytree(packed, http.root / "ds")
    url = http.url.replace("http://", f"http://someone:{BASIC_PASSWORD}@") + "/" + args[1]
    result = CliRunner().invoke(main, [args[0], url, *args[2:],
                                       *(["--cache-dir", str(tmp_path / "c")]
                                         if args[0] in ("verify", "cat") else [])])
    assert result.exit_code == 1 and result.output.startswith("Error: "), result.output
    assert BASIC_PASSWORD not in result.output and "Traceback" not in result.output
    assert "unexpected" not in result.output, result.output
    if args[1] == "nosuch":  # the Python API's error too
        with pytest.raises(shardio.ShardioError) as info:
            shardio.open_dataset(url)
        assert BASIC_PASSWORD not in f"{info.value} {info.value.path}"


@pytest.mark.parametrize("fault", ["403", "404", "500"])
def test_a_shard_the_server_refuses_or_fails_is_not_called_missing(
        packed: Path, hostile: _HostileServer, tmp_path: Path, fault: str) -> None:
    # fsspec says "not found" of any failed HEAD over HTTP: a 403 or 500 on a shard once came
    # out as ShardMissingError, "restore the object or re-pack"
    shutil.copytree(packed, hostile.root / "ds")
    hostile.fault, hostile.match = fault, ".rec"
    url = f"http://127.0.0.1:{hostile.server_address[1]}/ds"
    with pytest.raises(shardio.ShardioError) as info:
        next(iter(StreamingDataset(url, decode="raw", remote=remote(tmp_path))))
    missing = isinstance(info.value, shardio.ShardMissingError)
    assert missing == (fault == "404"), repr(info.value)
    assert missing or isinstance(info.value, shardio.StorageError)
