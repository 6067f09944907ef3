"""Servers the storage tests run on loopback: moto's S3 and a read-only Range server.

* ``MotoS3``: moto's threaded S3 server on 127.0.0.1, port chosen by the OS.
* ``RangeHTTPServer``: serves a folder read-only over HTTP/1.1 and honours ``Range``.
* ``S3Endpoint`` / ``HttpEndpoint``: what the fixtures (``storage_plugin``) hand a
  test; each sits behind a ``benchmarks.storage_proxy.FaultProxy``.

Nothing here reaches beyond 127.0.0.1. Every server thread is a daemon.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from benchmarks.storage_proxy import FaultPlan, FaultProxy, Server, serve
from shardio.storage import RetryPolicy

FAST_RETRY = RetryPolicy(max_attempts=6, base_delay_s=0.002, max_delay_s=0.02,
                         connect_timeout_s=5.0, read_timeout_s=10.0)
"""Retries as the default policy makes them, with waits short enough for tests."""


class _RangeHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _RangeServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _file(self) -> Path | None:
        rel = self.path.split("?", 1)[0].lstrip("/")
        path = (self.server.root / rel).resolve()
        if self.server.root not in path.parents or not path.is_file():
            return None
        return path

    def _reply(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        path = self._file()
        if path is None:
            self._reply(404, {"Content-Length": "0"}, b"")
            return
        size = path.stat().st_size
        spec = None if self.server.ignore_range else self.headers.get("Range")
        if spec is None:
            data = path.read_bytes()
            self._reply(200, {"Content-Length": str(size), "Accept-Ranges": "bytes"}, data)
            return
        first, _, last = spec.removeprefix("bytes=").partition("-")
        if first == "":
            start, stop = max(0, size - int(last)), size
        else:
            start, stop = int(first), (min(size, int(last) + 1) if last else size)
        if start >= stop:
            self._reply(416, {"Content-Range": f"bytes */{size}", "Content-Length": "0"}, b"")
            return
        with open(path, "rb") as fh:
            data = os.pread(fh.fileno(), stop - start, start)
        self._reply(206, {"Content-Length": str(len(data)), "Accept-Ranges": "bytes",
                          "Content-Range": f"bytes {start}-{stop - 1}/{size}"}, data)

    def do_HEAD(self) -> None:
        path = self._file()
        if path is None:
            self._reply(404, {"Content-Length": "0"}, b"")
            return
        self._reply(200, {"Content-Length": str(path.stat().st_size),
                          "Accept-Ranges": "bytes"}, b"")


class _RangeServer(Server):
    root: Path
    ignore_range = False


class RangeHTTPServer:
    """Serves ``root`` read-only on 127.0.0.1 (GET and HEAD, with Range unless told not to)."""

    def __init__(self, root: Path) -> None:
        self._server = _RangeServer(("127.0.0.1", 0), _RangeHandler)
        self._server.root = Path(root).resolve()
        self.address = ("127.0.0.1", self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.address[1]}"
        self._thread = serve(self._server, "range-http")

    @property
    def ignore_range(self) -> bool:
        """Whether GET answers 200 with the whole file whatever ``Range`` asks (some servers do)."""
        return self._server.ignore_range

    @ignore_range.setter
    def ignore_range(self, value: bool) -> None:
        self._server.ignore_range = value

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class MotoS3:
    """moto's threaded S3 server on 127.0.0.1 (in-memory buckets), started on construction."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        self.address = self._server.get_host_and_port()
        self.url = f"http://{self.address[0]}:{self.address[1]}"

    def create_bucket(self, name: str) -> None:
        """Make bucket ``name`` directly on the server (not through any proxy)."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket=name)

    def close(self) -> None:
        """Stop the server."""
        self._server.stop()


@dataclass(frozen=True)
class S3Endpoint:
    """A fresh bucket prefix reached through the fault proxy."""

    url: str
    """``s3://<fresh bucket>/data``."""
    bucket: str
    plan: FaultPlan
    moto: MotoS3
    proxy: FaultProxy


@dataclass(frozen=True)
class HttpEndpoint:
    """A folder served read-only with Range support, behind its own fault proxy."""

    root: Path
    url: str
    plan: FaultPlan
    server: RangeHTTPServer
