"""Question: what does one ranged S3 GET cost the reader, by get_object and by presigned URL?

A remote epoch makes hundreds of GETs (shard tails, a first batch's records, ranges) on
the one thread that also receives every byte, so the client's CPU per request counts.
Against s3rver on 127.0.0.1 (no proxy, no latency: what is measured is the client),
``--requests`` ranged GETs of 4 KB of one object in a row, by aiobotocore's
``get_object`` through s3fs (as ``shardio.storage.transfer`` did before ``b3dda1a``) and by
``shardio.storage.presigned`` (the URL signed once, then plain aiohttp), alternated for
``--rounds`` rounds after a warm-up of each. Per way: milliseconds of process CPU and of
wall time a request, median over rounds. Writes ``results/s3-request.json``.

    benchmarks/.env/bin/python -m benchmarks.bench_s3_request [--requests 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.machine import source_id
from benchmarks.remote_servers import BUCKET, S3rver, s3_client, s3_environment

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
WORK = HERE / "work" / "s3-request"


def _measure(fs: Any, path: str, way: str, requests: int) -> tuple[float, float]:
    """Milliseconds of CPU and of wall time a request, ``requests`` GETs in a row."""
    from fsspec.asyn import sync

    from shardio.storage import presigned

    bucket, key, _ = fs.split_path(path)
    sink: list[int] = []

    async def by_get_object() -> None:
        for i in range(requests):
            resp = await fs._call_s3("get_object", Bucket=bucket, Key=key,
                                     Range=f"bytes={i * 4096}-{i * 4096 + 4095}")
            body = resp["Body"]
            sink.append(len(await body.read()))
            body.close()

    async def by_presigned() -> None:
        for i in range(requests):
            await presigned.stream(fs, path, i * 4096, i * 4096 + 4096,
                                   lambda chunk: sink.append(len(chunk)), 1 << 20)

    run = by_get_object if way == "get_object" else by_presigned
    cpu, wall = time.process_time(), time.perf_counter()
    sync(fs.loop, run)
    return ((time.process_time() - cpu) / requests * 1e3,
            (time.perf_counter() - wall) / requests * 1e3)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    WORK.mkdir(parents=True, exist_ok=True)
    server = S3rver(WORK / "s3rver", log=WORK / "s3rver.log")
    try:
        os.environ.update(s3_environment(server.url))
        s3_client(server.url).put_object(Bucket=BUCKET, Key="bench/object.bin",
                                         Body=os.urandom(args.requests * 4096))
        from shardio.storage import open_store

        store = open_store(f"s3://{BUCKET}/bench")
        fs = store._fs()  # type: ignore[attr-defined]  (a RemoteStore's client)
        path = f"{BUCKET}/bench/object.bin"
        ways = ("get_object", "presigned")
        for way in ways:  # warm-up: clients, sessions, the URL
            _measure(fs, path, way, 20)
        rows: dict[str, list[tuple[float, float]]] = {way: [] for way in ways}
        for r in range(args.rounds):
            for way in ways if r % 2 == 0 else ways[::-1]:
                rows[way].append(_measure(fs, path, way, args.requests))
    finally:
        server.close()
    result = {
        "question": "CPU and wall time of one ranged S3 GET: get_object against presigned URL",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": " ".join(["python -m benchmarks.bench_s3_request", *(argv or sys.argv[1:])]),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "load_avg_1min": os.getloadavg()[0],
        "shardio_source": source_id(HERE.parent / "shardio"),
        "requests": args.requests,
        "rounds": args.rounds,
        "ways": {way: {"cpu_ms": statistics.median(c for c, _ in got),
                       "wall_ms": statistics.median(w for _, w in got),
                       "cpu_ms_range": [min(c for c, _ in got), max(c for c, _ in got)]}
                 for way, got in rows.items()},
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "s3-request.json").write_text(json.dumps(result, indent=1) + "\n")
    print(s3_request_block())


def s3_request_block(path: Path | None = None) -> str:
    """One paragraph: a ranged GET's CPU and wall time, both ways."""
    result = json.loads((path or RESULTS / "s3-request.json").read_text(encoding="utf-8"))
    ways = result["ways"]
    old, new = ways["get_object"], ways["presigned"]
    return (
        f"Measured {result['date']} on {result['machine']['cores']} cores, 1-minute load "
        f"{result['load_avg_1min']:.1f}, shardio at git {result['shardio_source']['git_head']} "
        f"(`{result['command'].strip()}`), {result['requests']} ranged GETs of 4 KB in a row "
        f"to s3rver on 127.0.0.1, medians of {result['rounds']} rounds: aiobotocore's "
        f"`get_object` {old['cpu_ms']:.2f} ms of CPU a request "
        f"({old['cpu_ms_range'][0]:.2f}-{old['cpu_ms_range'][1]:.2f}), "
        f"{old['wall_ms']:.2f} ms of wall time; by presigned URL {new['cpu_ms']:.2f} ms "
        f"({new['cpu_ms_range'][0]:.2f}-{new['cpu_ms_range'][1]:.2f}), "
        f"{new['wall_ms']:.2f} ms: {old['cpu_ms'] / new['cpu_ms']:.1f}x less CPU a request.\n")


if __name__ == "__main__":
    main()
