"""The fetch ceiling: how fast the link, the proxy and the S3 server deliver one stored
copy when nothing reads it, the most any reader of that copy can reach on this machine.

Without a bandwidth cap the remote comparison is bound by CPU, and on this machine the
S3 server (Node, one thread for its JavaScript) and the proxy (Python) share the two
cores with the readers. A target such as "1.5x the best peer" is out of any reader's
reach when fetching the copy's bytes alone, with no reader work, takes longer than the
target allows; this measures that. ``curl`` fetches every object in ranges of
``RANGE_BYTES`` (what shardio asks for when the budget holds the dataset), ``parallel``
at a time, writing to ``/dev/null``: its CPU per byte is a small share of the server's
and the proxy's, so what is measured is theirs.
"""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

RANGE_BYTES = 16 * 1024 * 1024
PARALLEL = (4, 8)
"""Ranges in flight; the report keeps the faster (a shardio reading process keeps up to
64 MiB of ranges in flight: 4 of these)."""


def ranges(sizes: dict[str, int], range_bytes: int = RANGE_BYTES) -> list[tuple[str, int, int]]:
    """``(name, first, last)`` byte ranges (inclusive, as HTTP's ``Range``) covering every
    object, largest objects first so that the tail of the fetch is short ranges."""
    out = []
    for name, size in sorted(sizes.items(), key=lambda item: -item[1]):
        out += [(name, start, min(start + range_bytes, size) - 1)
                for start in range(0, size, range_bytes)]
    return out


def _get(url: str, first: int, last: int) -> int:
    """Fetch one range with curl; the body bytes it received."""
    done = subprocess.run(
        ["curl", "--silent", "--show-error", "--fail", "--range", f"{first}-{last}",
         "--output", "/dev/null", "--write-out", "%{size_download}", url],
        capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"curl {url} {first}-{last}: exit {done.returncode}: "
                           f"{done.stderr.strip()}")
    return int(float(done.stdout.strip()))


def fetch_ceiling(base_url: str, sizes: dict[str, int], parallel: int, *,
                  range_bytes: int = RANGE_BYTES) -> dict[str, Any]:
    """Fetch every object under ``base_url`` (``{base_url}/{name}``) once, ``parallel``
    ranges at a time; wall seconds, bytes received and requests made.

    Raises:
        RuntimeError: a GET failed or the bytes received are not the objects' sizes.
    """
    todo = ranges(sizes, range_bytes)
    started = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        received = sum(pool.map(lambda r: _get(f"{base_url}/{r[0]}", r[1], r[2]), todo))
    wall = time.perf_counter() - started
    expected = sum(sizes.values())
    if received != expected:
        raise RuntimeError(f"{base_url}: received {received} bytes of {expected}")
    return {"parallel": parallel, "wall_s": round(wall, 3), "bytes": received,
            "requests": len(todo)}
