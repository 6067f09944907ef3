"""The proxy of the storage tests and bench_remote (``benchmarks/storage_proxy.py``): counting,
the shared bandwidth cap, streamed bodies, and its stats endpoint."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from storage_servers import RangeHTTPServer

from benchmarks.storage_proxy import STATS_PATH, FaultPlan, FaultProxy

pytestmark = pytest.mark.servers

SIZE = 1 << 20


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[FaultProxy, bytes]]:
    data = bytes(range(256)) * (SIZE // 256)
    (tmp_path / "blob.bin").write_bytes(data)
    server = RangeHTTPServer(tmp_path)
    proxy = FaultProxy(server.address)
    yield proxy, data
    proxy.close()
    server.close()


def get(url: str, headers: dict[str, str] | None = None) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                timeout=30) as resp:
        return bytes(resp.read())


def test_counts_whole_and_ranged_get_bodies(served: tuple[FaultProxy, bytes]) -> None:
    proxy, data = served
    assert get(f"{proxy.url}/blob.bin") == data
    assert get(f"{proxy.url}/blob.bin", {"Range": "bytes=10-109"}) == data[10:110]
    plan = proxy.plan
    assert (plan.gets, plan.ranged_gets) == (2, 1)
    assert plan.get_bytes == SIZE + 100  # every GET body
    assert plan.body_bytes == 100  # ranged bodies only, as before


def test_stats_endpoint_is_answered_not_forwarded_nor_counted(
        served: tuple[FaultProxy, bytes]) -> None:
    proxy, _ = served
    get(f"{proxy.url}/blob.bin", {"Range": "bytes=0-9"})
    stats = json.loads(get(proxy.url + STATS_PATH))
    assert stats["gets"] == 1 and stats["get_bytes"] == 10 and stats["requests"] == 1
    assert proxy.plan.requests == 1


def test_bandwidth_is_shared_by_all_bodies(served: tuple[FaultProxy, bytes]) -> None:
    proxy, data = served
    proxy.plan.reset(max_bytes_per_s=8 * SIZE)  # two 1 MiB bodies at once: >= 0.25 s together
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(get(f"{proxy.url}/blob.bin")))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [data, data]
    assert proxy.plan.get_bytes == 2 * SIZE
    assert abs(proxy.plan.link_s - 2 * SIZE / (8 * SIZE)) < 1e-6  # every body byte was paced


def test_reset_clears_the_cap_and_counters() -> None:
    plan = FaultPlan(max_bytes_per_s=1.0, gets=3, get_bytes=5)
    plan.reset()
    assert (plan.max_bytes_per_s, plan.gets, plan.get_bytes) == (0.0, 0, 0)
    assert plan.pace(1 << 30) == 0.0  # no cap: no wait
    assert plan.link_s == 0.0


def test_a_burst_of_connections_waits_in_the_backlog_instead_of_being_refused() -> None:
    # Nothing accepts here: every connect completes only if the listen backlog holds it.
    # With socketserver's default of 5, the 7th waited for the client's SYN retry (1 s,
    # then 3 s, ...), which bench_remote measured as a late first batch.
    import socket
    from http.server import BaseHTTPRequestHandler

    from benchmarks.storage_proxy import Server

    server = Server(("127.0.0.1", 0), BaseHTTPRequestHandler)
    clients: list[socket.socket] = []
    try:
        for _ in range(64):
            client = socket.create_connection(server.server_address, timeout=5)
            clients.append(client)
        assert len(clients) == 64  # each connect above raised a timeout if it was refused
    finally:
        for client in clients:
            client.close()
        server.server_close()
