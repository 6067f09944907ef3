"""The fault-injecting HTTP reverse proxy the storage tests and benchmarks put before servers.

Its ``FaultPlan`` answers some requests ``503 SlowDown`` without forwarding
them, cuts some ranged GETs after half of the body (the connection closes),
stalls others mid-body, adds latency, and can cap the bandwidth of all response
bodies together (one shared link, as a node's network); it counts what it did,
so tests can check that faults really happened and benchmarks how many bytes
crossed. ``GET /__proxy__/stats`` answers the counters as JSON without
forwarding, delaying or counting. Bodies of requests that are not broken are
relayed as they arrive. Listens on 127.0.0.1 only; every thread is a daemon.
Used by ``tests/storage_servers.py`` and ``benchmarks/remote_servers.py``; it
imports nothing from either.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade", "expect", "content-length",
})
STATS_PATH = "/__proxy__/stats"
"""``GET`` this path for the counters (JSON); it is answered by the proxy itself."""
RELAY_CHUNK = 64 << 10
"""Bytes relayed (and paced) at a time."""
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
    refuse_match: str = ""
    """Every request whose ``"METHOD /path?query"`` contains this is answered ``refuse_status``
    (a store that refuses a kind of request: query-string authentication, say)."""
    refuse_status: int = 400
    refusals: int = 0
    latency_s: float = 0.0
    """Added before every request is forwarded."""
    max_bytes_per_s: float = 0.0
    """Response bodies of all connections together are sent at most this fast (0: no cap)."""
    requests: int = 0
    ranged_gets: int = 0
    slowdowns: int = 0
    cuts: int = 0
    stalls: int = 0
    body_bytes: int = 0
    """Bytes of ranged GET bodies the proxy sent (cut bodies count what was sent)."""
    gets: int = 0
    """GET requests forwarded, ranged or not."""
    get_bytes: int = 0
    """Bytes of every GET body the proxy sent, ranged or whole."""
    seed: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _rng: random.Random = field(default_factory=random.Random, repr=False)
    _link_free_at: float = field(default=0.0, repr=False)
    link_s: float = 0.0
    """Seconds of link time booked by ``pace``: bytes sent under a cap / the cap."""

    def reset(self, **settings: Any) -> FaultPlan:
        """Clear counters and faults, then apply ``settings``; returns the plan."""
        with self._lock:
            for name in ("slowdown_every", "cut_every", "stall_every", "requests", "ranged_gets",
                         "slowdowns", "cuts", "stalls", "body_bytes", "gets", "get_bytes",
                         "refusals"):
                setattr(self, name, 0)
            self.stall_s = self.latency_s = self.max_bytes_per_s = self.link_s = 0.0
            self.seed = 0
            self.slowdown_match = self.refuse_match = ""
            self.refuse_status = 400
            for name, value in settings.items():
                setattr(self, name, value)
            self._rng = random.Random(self.seed)
        return self

    def _draw(self, every: int) -> bool:
        return every == 1 or (every > 1 and self._rng.randrange(every) == 0)

    def decide(self, method: str, path: str, ranged: bool) -> str:
        """What to do with the next request: refuse, slowdown, cut, stall or pass."""
        with self._lock:
            self.requests += 1
            if self.refuse_match and self.refuse_match in f"{method} {path}":
                self.refusals += 1
                return "refuse"
            matched = bool(self.slowdown_match) and self.slowdown_match in f"{method} {path}"
            if matched or self._draw(self.slowdown_every):
                self.slowdowns += 1
                return "slowdown"
            if method == "GET":
                self.gets += 1
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

    def sent(self, num_bytes: int, *, ranged: bool = True) -> None:
        """Count ``num_bytes`` of a GET body as sent (``ranged``: of a ranged GET)."""
        with self._lock:
            self.get_bytes += num_bytes
            if ranged:
                self.body_bytes += num_bytes

    def pace(self, num_bytes: int) -> float:
        """Wait until ``num_bytes`` more fit through the shared link (``max_bytes_per_s``).

        The link sends one chunk after another in the order they asked, so concurrent
        bodies share the rate; idle time is not saved up for a later burst. Returns the
        seconds it waited (0 without a cap).
        """
        if self.max_bytes_per_s <= 0:
            return 0.0
        with self._lock:
            now = time.monotonic()
            booked = num_bytes / self.max_bytes_per_s
            self.link_s += booked
            self._link_free_at = max(now, self._link_free_at) + booked
            wait = self._link_free_at - now
        time.sleep(wait)
        return wait

    def counters(self) -> dict[str, float]:
        """Every setting and counter, as ``GET /__proxy__/stats`` answers them."""
        with self._lock:
            return {name: getattr(self, name) for name in (
                "requests", "gets", "get_bytes", "ranged_gets", "body_bytes", "slowdowns",
                "cuts", "stalls", "latency_s", "max_bytes_per_s")}


class Server(ThreadingHTTPServer):
    """A threaded HTTP server whose request threads are daemons and that ignores clients gone."""

    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 refuses a burst of connections (two workers
    # opening their first ranges at once), and a refused client retries after 1 s: a
    # stall that object stores do not have, which the benchmark then measured as ours
    request_queue_size = 128

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet about clients that went away (cut, killed or timed out on purpose)."""
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


def serve(server: Server, name: str) -> threading.Thread:
    """Run ``server`` on a daemon thread named ``name``."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name=name, daemon=True)
    thread.start()
    return thread


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as object stores and s3rver have it: with Nagle's algorithm a reply's
    # headers and its first body bytes, written one after the other, waited for the
    # client's delayed ACK (about 40 ms on Linux), so a small GET took about 95 ms where
    # the plan adds 20
    disable_nagle_algorithm = True
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

    def _write_body(self, data: bytes, *, ranged: bool) -> None:
        for start in range(0, len(data), RELAY_CHUNK):
            chunk = data[start:start + RELAY_CHUNK]
            self.server.plan.pace(len(chunk))
            if self.command == "GET":  # counted first: a client that has the bytes sees them
                self.server.plan.sent(len(chunk), ranged=ranged)
            self.wfile.write(chunk)

    def _stats(self) -> None:
        data = json.dumps(self.server.plan.counters()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, reason: str | None, body: bytes) -> None:
        """Answer with an S3-style XML error, the request never forwarded."""
        self.send_response(status, reason)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _relay(self) -> None:
        if self.command == "GET" and self.path == STATS_PATH:
            self._stats()
            return
        plan = self.server.plan
        body = self._request_body()
        decision = plan.decide(self.command, self.path, "Range" in self.headers)
        if plan.latency_s:
            time.sleep(plan.latency_s)
        if decision == "refuse":
            self._error(plan.refuse_status, None, (
                f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{plan.refuse_status}"
                "</Code><Message>refused by the fault plan</Message></Error>").encode())
            return
        if decision == "slowdown":
            self._error(503, "Slow Down", SLOWDOWN_XML)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        ranged = self.command == "GET" and "Range" in self.headers
        conn = http.client.HTTPConnection(*self.server.upstream, timeout=60)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            reply_headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP]
            length = resp.getheader("Content-Length")
            if decision == "pass" and self.command != "HEAD" and length is not None:
                self.send_response(resp.status, resp.reason)
                for key, value in reply_headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", length)
                self.end_headers()
                while chunk := resp.read(RELAY_CHUNK):  # relayed as it arrives
                    self._write_body(chunk, ranged=ranged)
                return
            data = resp.read()
        finally:
            conn.close()
        self.send_response(resp.status, resp.reason)
        for key, value in reply_headers:
            self.send_header(key, value)
        length = length if self.command == "HEAD" else None
        self.send_header("Content-Length", length or str(len(data)))
        self.end_headers()
        if self.command == "HEAD":
            return
        half = len(data) // 2
        if decision == "cut" and half:
            self._write_body(data[:half], ranged=ranged)
            self.wfile.flush()
            time.sleep(0.05)  # let the client take the half before it sees the close
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if decision == "stall" and half:
            self._write_body(data[:half], ranged=ranged)
            self.wfile.flush()
            time.sleep(plan.stall_s)
            data = data[half:]
        self._write_body(data, ranged=ranged)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay


class _ProxyServer(Server):
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
        self._thread = serve(self._server, "fault-proxy")

    def close(self) -> None:
        """Stop serving (requests in flight finish on their daemon threads)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
