"""Where the time to shardio's first remote batch goes: one cold run, traced.

**Question:** streaming from S3 behind ``bench_remote``'s link (s3rver, 20 ms a request,
100 MB/s shared), what does each process do until the first batch arrives: when do
the DataLoader workers start, when are the manifest and the shards' tails read, which
ranges does each worker ask for and in what order, when does each land, when does each
worker yield its first batch and when does the main process get it?

``python -m benchmarks.remote_trace [--dataset images] [--workers 2] [--batches 4]``
packs the generated tree (``datagen``, ``bench_remote``'s sizes) with the working
tree's shardio, uploads it to a fresh s3rver, and reads it in a fresh process with an
empty cache exactly as ``bench_remote``'s child does (``StreamingDataset`` +
``shardio.loader``, raw bytes, batches of 64, seed 0), with timestamps taken at the
read path's seams (wrapped in that process only: nothing in shardio is changed). It
prints a summary per process and, with ``--events``, every event. ``--repeats`` runs
it again (fresh process, fresh cache) and prints the time to the first batch of each.
A shared machine: compare runs of one invocation only.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TRACE_ENV = "SHARDIO_TRACE_FILE"
T0_ENV = "SHARDIO_TRACE_T0"


def _emit(event: str, **detail: Any) -> None:
    """Append one event line (wall clock since the run's start, pid, name, details)."""
    t = time.time() - float(os.environ[T0_ENV])
    cpu = round(time.process_time(), 3)  # this process's CPU: busy, or waiting on the link?
    line = json.dumps({"t": round(t, 4), "pid": os.getpid(), "cpu": cpu, "ev": event,
                       **detail}) + "\n"
    fd = os.open(os.environ[TRACE_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())  # one write of a short line: lines never interleave
    finally:
        os.close(fd)


def _around(owner: Any, name: str, label: Callable[..., dict[str, Any]]) -> None:
    """Wrap ``owner.name`` to emit ``<name>+`` before and ``<name>-`` after each call."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        detail = label(*args, **kwargs)
        _emit(name + "+", **detail)
        try:
            return original(*args, **kwargs)
        finally:
            _emit(name + "-", **detail)

    setattr(owner, name, wrapped)


def install() -> None:
    """Put timestamps at the read path's seams (this process and the workers it forks)."""
    from shardio.reading import shards as shardsource
    from shardio.reading import stream
    from shardio.storage import cache, readahead
    from shardio.torch import dataset

    def request(_self: Any, req: Any, *_more: Any) -> dict[str, Any]:
        return {"obj": req.name, "lo": req.start, "hi": req.stop}

    _around(shardsource.ShardSource, "_tail", lambda _s, n: {"shard": n})
    _around(shardsource.ShardSource, "open_shard", lambda _s, n: {"shard": n})
    _around(readahead.ReadAhead, "_open_ahead", request)
    _around(readahead.ReadAhead, "take", request)
    _around(cache.RangeCache, "_download",
            lambda _s, _store, _key, name, start, stop, *_more: {"obj": name, "lo": start,
                                                                  "hi": stop})
    plan = readahead.ReadAhead.plan

    def traced_plan(self: Any, requests: Any) -> None:
        requests = list(requests)
        _emit("plan", n=len(requests), bytes=sum(r.stop - r.start for r in requests))
        plan(self, requests)

    readahead.ReadAhead.plan = traced_plan  # type: ignore[method-assign]
    advise = stream.advise

    def traced_advise(reader: Any, runs: Any) -> None:
        _emit("advise", runs=len(runs))
        advise(reader, runs)

    stream.advise = traced_advise
    it = dataset.StreamingDataset.__iter__

    def traced_iter(self: Any) -> Iterator[Any]:
        _emit("iter")
        for n, item in enumerate(it(self)):
            if n < 4:
                _emit("yield", n=n)
            yield item

    dataset.StreamingDataset.__iter__ = traced_iter  # type: ignore[method-assign]


def child(spec_path: Path) -> None:
    """One traced run: build the dataset and loader, take ``batches`` batches."""
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    import importlib

    import shardio
    from benchmarks.adapters.remote import get_reader
    from benchmarks.child import preload

    # imported before the clock starts, as remote_child does: torch, shardio's reading
    # modules and its S3 client (s3fs took 0.24 s of a traced first batch before)
    reader = get_reader("shardio-records")
    preload(reader, torch=True)  # type: ignore[arg-type]
    for module in reader.client_modules:
        importlib.import_module(module)
    install()
    os.environ[T0_ENV] = repr(time.time())
    _emit("start")
    options = shardio.RemoteOptions(cache_dir=spec["cache_dir"])
    data = shardio.StreamingDataset(spec["url"], decode="raw", shuffle=True, seed=spec["seed"],
                                    remote=options)
    _emit("dataset")
    batches = shardio.loader(data, batch_size=64, num_workers=spec["workers"])
    _emit("loader")
    for n, _batch in enumerate(batches):
        _emit("batch", n=n)
        if n + 1 >= spec["batches"]:
            break
    _emit("done")


def summarize(events: list[dict[str, Any]]) -> list[str]:
    """Per process: start, tails, first GET, GETs and bytes before its first yield, yields."""
    lines = []
    pids = list(dict.fromkeys(e["pid"] for e in events))
    for pid in pids:
        mine = [e for e in events if e["pid"] == pid]

        def first(ev: str, mine: list[dict[str, Any]] = mine) -> float | None:
            return next((e["t"] for e in mine if e["ev"] == ev), None)

        yields = [e["t"] for e in mine if e["ev"] in ("yield", "batch")]
        until = yields[0] if yields else float("inf")
        gets = [e for e in mine if e["ev"] == "_download-" and e["t"] <= until]
        get_bytes = sum(e["hi"] - e["lo"] for e in gets)
        tails = [e["t"] for e in mine if e["ev"] == "_tail-"]
        takes = [e for e in mine if e["ev"] == "take-" and e["t"] <= until]
        lines.append(
            f"pid {pid}: iter {first('iter')}, tails {len(tails)} done by "
            f"{max(tails) if tails else None}, first GET start {first('_download+')} lands "
            f"{first('_download-')}; before its first yield: {len(gets)} GETs landed "
            f"({get_bytes / 1e6:.1f} MB), {len(takes)} ranges taken; yields/batches at "
            f"{[round(t, 2) for t in yields[:4]]}")
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="images", choices=("images", "tiny"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="shuffle seed (bench_remote: the repeat)")
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--bandwidth-mbs", type=float, default=100.0)
    p.add_argument("--events", action="store_true", help="print every event of the last run")
    p.add_argument("--work-dir", type=Path, default=HERE / "work" / "remote-trace")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        child(args.child)
        return

    import shardio
    from benchmarks.bench_remote import FULL_SIZES
    from benchmarks.datagen import DATA_ROOT, ensure_tree
    from benchmarks.remote_servers import BUCKET, S3rver, s3_client, s3_environment, upload_folder
    from benchmarks.storage_proxy import FaultPlan, FaultProxy

    tree = ensure_tree(args.dataset, FULL_SIZES[args.dataset], seed=0, data_root=DATA_ROOT)
    work = args.work_dir
    pack = work / "packs" / tree.root.name
    if not (pack / "manifest.json").exists():
        shardio.pack(tree.root, pack, options=shardio.WriteOptions(backend="records"), seed=0,
                     shuffle=True, num_workers=2, overwrite=True)
    (work / "logs").mkdir(parents=True, exist_ok=True)
    server = S3rver(work / "s3rver", log=work / "logs" / "s3rver.log")
    plan = FaultPlan(latency_s=args.latency_ms / 1000, max_bytes_per_s=args.bandwidth_mbs * 1e6)
    proxy = FaultProxy(("127.0.0.1", server.port), plan)
    try:
        prefix = f"{tree.root.name}/shardio-records"
        upload_folder(s3_client(server.url), pack, prefix)
        env = {**os.environ, **s3_environment(proxy.url)}
        for rep in range(args.repeats):
            cache = work / "cache"
            shutil.rmtree(cache, ignore_errors=True)
            trace = work / "logs" / "trace.jsonl"
            trace.unlink(missing_ok=True)
            spec = work / "logs" / "spec.json"
            spec.write_text(json.dumps({"url": f"s3://{BUCKET}/{prefix}", "cache_dir": str(cache),
                                        "workers": args.workers, "batches": args.batches,
                                        "seed": args.seed}),
                            encoding="utf-8")
            load = os.getloadavg()[0]
            subprocess.run([sys.executable, "-m", "benchmarks.remote_trace", "--child",
                            str(spec)], cwd=REPO, env={**env, TRACE_ENV: str(trace)},
                           check=True)
            events = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines()]
            events.sort(key=lambda e: e["t"])
            batch = next(e["t"] for e in events if e["ev"] == "batch")
            done = next(e["t"] for e in events if e["ev"] == "done")
            taken = sum(e["ev"] == "batch" for e in events)
            print(f"run {rep}: first batch {batch:.2f} s, {taken} batches in {done:.2f} s "
                  f"(load {load:.1f})")
            for line in summarize(events):
                print("  " + line)
        if args.events:
            for e in events:
                print(json.dumps(e))
    finally:
        proxy.close()
        server.close()


if __name__ == "__main__":
    main()
