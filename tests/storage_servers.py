"""Servers the storage tests run on loopback: moto's S3, a fault-injecting proxy, a Range server.

* ``start_moto()``: moto's threaded S3 server on 127.0.0.1, port chosen by the OS.
* ``FaultProxy``: a small HTTP reverse proxy of our own in front of any of them. Its
  ``FaultPlan`` answers some requests ``503 SlowDown`` without forwarding them, cuts
  some ranged GETs after half of the body (the connection closes), stalls others
  mid-body, and adds latency; it counts what it did, so tests can check that
  faults really happened.
* ``RangeHTTPServer``: serves a folder read-only over HTTP/1.1 and honours ``Range``.

Nothing here reaches beyond 127.0.0.1. Every server thread is a daemon.
"""

from __future__ import annotations

import http.client
import logging
import os
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from shardio.storage import RetryPolicy

FAST_RETRY = RetryPolicy(max_attempts=6, base_delay_s=0.002, max_delay_s=0.02,
                         connect_timeout_s=5.0, read_timeout_s=10.0)
"""Retries as the default policy makes them, with waits short enough for tests."""

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "expect", "content-length",
})
SLOWDOWN_XML = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>fault</RequestId></Error>"
)


@dataclass
class FaultPlan:
    """Which requests the proxy breaks, drawn from a seeded generator. 0 turns a fault off.

    Faults are drawn at random rather than every n-th request: a client whose
    one call makes two requests (HEAD, then LIST) would otherwise fail in lockstep.
    """

    slowdown_every: int = 0
    """One request in n, of any kind, is answered 503 SlowDown and never forwarded."""
    cut_every: int = 0
    """One ranged GET in n sends half of its body, then the connection is closed."""
    stall_every: int = 0
    """One ranged GET in n sends half of its body, waits ``stall_s``, then the rest."""
    stall_s: float = 0.0
    slowdown_match: str = ""
    """Every request whose ``"METHOD /path?query"`` contains this is answered 503 SlowDown."""
    latency_s: float = 0.0
    """Added before every request is forwarded."""
    requests: int = 0
    ranged_gets: int = 0
    slowdowns: int = 0
    cuts: int = 0
    stalls: int = 0
    body_bytes: int = 0
    """Bytes of ranged GET bodies the proxy sent (cut bodies count what was sent)."""
    seed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def reset(self, **settings: Any) -> FaultPlan:
        """Clear counters and faults, then apply ``settings``; returns the plan."""
        with self._lock:
            for name in ("slowdown_every", "cut_every", "stall_every", "requests", "ranged_gets",
                         "slowdowns", "cuts", "stalls", "body_bytes"):
                setattr(self, name, 0)
            self.stall_s = self.latency_s = 0.0
            self.seed = 0
            self.slowdown_match = ""
            for name, value in settings.items():
                setattr(self, name, value)
            self._rng = random.Random(self.seed)
        return self

    def _draw(self, every: int) -> bool:
        return every == 1 or (every > 1 and self._rng.randrange(every) == 0)

    def decide(self, method: str, path: str, ranged: bool) -> str:
        """``"slowdown"``, ``"cut"``, ``"stall"`` or ``"pass"`` for the next request."""
        with self._lock:
            self.requests += 1
            matched = bool(self.slowdown_match) and self.slowdown_match in f"{method} {path}"
            if matched or self._draw(self.slowdown_every):
                self.slowdowns += 1
                return "slowdown"
            if method != "GET" or not ranged:
                return "pass"
            self.ranged_gets += 1
            if self._draw(self.cut_every):
                self.cuts += 1
                return "cut"
            if self._draw(self.stall_every):
                self.stalls += 1
                return "stall"
            return "pass"

    def sent(self, num_bytes: int) -> None:
        """Count ``num_bytes`` of a ranged GET body as sent."""
        with self._lock:
            self.body_bytes += num_bytes


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet about clients that went away (cut, killed or timed out on purpose)."""
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


def _serve(server: _Server, name: str) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name=name, daemon=True)
    thread.start()
    return thread


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _request_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _relay(self) -> None:
        plan = self.server.plan
        body = self._request_body()
        decision = plan.decide(self.command, self.path, "Range" in self.headers)
        if plan.latency_s:
            time.sleep(plan.latency_s)
        if decision == "slowdown":
            self.send_response(503, "Slow Down")
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(SLOWDOWN_XML)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(SLOWDOWN_XML)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        conn = http.client.HTTPConnection(*self.server.upstream, timeout=60)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            reply_headers = resp.getheaders()
        finally:
            conn.close()
        self.send_response(resp.status, resp.reason)
        for key, value in reply_headers:
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        length = resp.getheader("Content-Length") if self.command == "HEAD" else None
        self.send_header("Content-Length", length or str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        ranged = self.command == "GET" and "Range" in self.headers
        half = len(data) // 2
        if decision == "cut" and half:
            self.wfile.write(data[:half])
            self.wfile.flush()
            plan.sent(half)
            time.sleep(0.05)  # let the client take the half before it sees the close
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if decision == "stall" and half:
            self.wfile.write(data[:half])
            self.wfile.flush()
            plan.sent(half)
            time.sleep(plan.stall_s)
            data = data[half:]
        self.wfile.write(data)
        if ranged:
            plan.sent(len(data))

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay


class _ProxyServer(_Server):
    plan: FaultPlan
    upstream: tuple[str, int]


class FaultProxy:
    """A reverse proxy on 127.0.0.1 that breaks requests to ``upstream`` as ``plan`` says."""

    def __init__(self, upstream: tuple[str, int], plan: FaultPlan | None = None) -> None:
        self.plan = plan or FaultPlan()
        self._server = _ProxyServer(("127.0.0.1", 0), _ProxyHandler)
        self._server.plan = self.plan
        self._server.upstream = upstream
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = _serve(self._server, "fault-proxy")

    def close(self) -> None:
        """Stop serving (requests in flight finish on their daemon threads)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


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


class _RangeServer(_Server):
    root: Path
    ignore_range = False


class RangeHTTPServer:
    """Serves ``root`` read-only on 127.0.0.1 (GET and HEAD, with Range unless told not to)."""

    def __init__(self, root: Path) -> None:
        self._server = _RangeServer(("127.0.0.1", 0), _RangeHandler)
        self._server.root = Path(root).resolve()
        self.address = ("127.0.0.1", self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.address[1]}"
        self._thread = _serve(self._server, "range-http")

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
