"""One measurement in a fresh process: ``python -m benchmarks.child SPEC.json``.

Modes: ``pack`` (time ``adapter.pack`` on a warm source), ``epoch`` (warm or cold page
cache, then time one epoch: samples/s, MB/s, time to first batch, peak memory, shuffle
quality; through the system's own reader or, ``access="random"``, its map-style one under
a random sampler; ``verify=False`` without shardio's checksums), ``first`` (warm: the time
from building the dataset and loader to the first batch, ``first_sample.time_to_first``),
``audit`` (two epochs with the same loader, checking that each delivers every
sample exactly once by CRC-32 multiset, with marker opens so an strace log can be cut
into epochs) and ``decode`` (the decode limit: Pillow decoding JPEG bytes already in
memory, no loader, in one process and in 2 processes at once). The library is imported
before any clock starts. The result is written as JSON to ``spec["result"]``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.adapters import (
    Adapter,
    EpochSpec,
    decode_image,
    get_adapter,
    payload_crc,
    payload_nbytes,
)
from benchmarks.datagen import Tree
from benchmarks.first_sample import time_to_first
from benchmarks.probe import MemorySampler, evict, memory_kb, read_all, resident_fraction

_LIBRARY_MODULES = {"shardio": "shardio", "webdataset": "webdataset",
                    "litdata": "litdata", "lmdb": "lmdb"}


def preload(adapter: Adapter, *, torch: bool) -> None:
    """Import the system's library (and torch, for reading) now, so no timing includes it."""
    if torch:
        importlib.import_module("torch.utils.data")
    library = adapter.library
    if library == "mosaicml-streaming":
        from benchmarks.adapters.mds import import_streaming

        import_streaming()
    elif library is not None:
        module = importlib.import_module(_LIBRARY_MODULES[library])
        if library == "shardio":
            _ = (module.StreamingDataset, module.IndexedDataset, module.loader, module.pack)


def run_pack(adapter: Adapter, tree: Tree, work: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Pack on a warm source; seconds, files/s, output bytes, peak memory."""
    read_all(tree.files())
    with MemorySampler() as mem:
        start = time.perf_counter()
        adapter.pack(tree, work, seed=spec["seed"], num_workers=spec["pack_workers"])
        seconds = time.perf_counter() - start
    output = 0 if adapter.library is None else sum(
        p.stat().st_size for p in adapter.data_files(tree, work))
    return {"seconds": seconds, "files_per_s": tree.num_files / seconds,
            "mb_per_s": tree.num_bytes / 1e6 / seconds, "output_bytes": output,
            "peak_rss_mb": mem.peak_rss_kb / 1024}


def run_epoch(adapter: Adapter, tree: Tree, work: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """One timed epoch after warming or evicting every data file of the system."""
    from benchmarks.probe import shuffle_quality

    files = adapter.data_files(tree, work)
    if spec["cache"] == "cold":
        evict(files)
    else:
        read_all(files)
    resident = resident_fraction(files)
    epoch = EpochSpec(num_workers=spec["num_workers"], shuffle=True, seed=spec["seed"],
                      decode=spec["decode"], access=spec.get("access", "stream"),
                      verify=spec.get("verify", True))
    samples = nbytes = 0
    first: float | None = None
    labels: list[list[int]] = []
    with MemorySampler() as mem:
        start = time.perf_counter()
        for loader in adapter.epochs(tree, work, epoch):
            for payloads, batch_labels in loader:
                if first is None:
                    first = time.perf_counter() - start
                samples += len(payloads)
                nbytes += sum(payload_nbytes(p) for p in payloads)
                labels.append(list(batch_labels))
        seconds = time.perf_counter() - start
    quality = shuffle_quality(labels, tree.num_classes, batch_size=epoch.batch_size)
    return {"seconds": seconds, "samples": samples, "bytes": nbytes,
            "samples_per_s": samples / seconds, "mb_per_s": nbytes / 1e6 / seconds,
            "first_batch_s": first, "peak_rss_mb": mem.peak_rss_kb / 1024,
            "peak_anon_mb": mem.peak_anon_kb / 1024,
            "main_rss_mb": memory_kb(os.getpid())[0] / 1024,
            "resident_before": resident, "shuffle_quality": quality}


def run_first(adapter: Adapter, tree: Tree, work: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Warm: seconds from building the dataset and loader to the first batch (0 workers)."""
    read_all(adapter.data_files(tree, work))
    return time_to_first(adapter, tree, work, EpochSpec(seed=spec["seed"]))


def _marker(work: Path, index: int) -> str:
    name = f".bench-epoch-marker-{index}"
    with contextlib.suppress(FileNotFoundError):
        os.close(os.open(work / name, os.O_RDONLY))
    return name


def run_audit(adapter: Adapter, tree: Tree, work: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """Two epochs through one loader: exactly-once per epoch, reshuffle, main-process RSS."""
    expected = np.load(spec["expected_crc"])
    epoch = EpochSpec(num_workers=spec["num_workers"], shuffle=True, seed=spec["seed"],
                      num_epochs=2)
    markers = [_marker(work, 0)]
    counts, exact, rss, heads = [], [], [], []
    for index, loader in enumerate(adapter.epochs(tree, work, epoch), start=1):
        crcs = [payload_crc(p) for payloads, _ in loader for p in payloads]
        markers.append(_marker(work, index))
        counts.append(len(crcs))
        exact.append(bool(np.array_equal(np.sort(np.asarray(crcs, dtype=np.uint32)), expected)))
        rss.append(memory_kb(os.getpid())[0] / 1024)
        heads.append(crcs[:256])
    return {"markers": markers, "samples_per_epoch": counts, "exactly_once": exact,
            "main_rss_mb": rss, "reshuffled": len(heads) == 2 and heads[0] != heads[1]}


def _decode_all(blobs: list[bytes], start: Any, done: Any) -> None:
    """One decoding process of the limit: warm up, wait for the others, decode, report."""
    for data in blobs[:16]:
        decode_image(data)
    start.wait()
    for data in blobs:
        decode_image(data)
    done.put(time.perf_counter())


def run_decode(tree: Tree, spec: dict[str, Any]) -> dict[str, Any]:
    """The decode limit: Pillow decoding JPEG bytes already in memory, no loader.

    Once in this process (one core's rate), then in ``decode_processes`` forked processes
    at once, each decoding every image (the limit for that many workers: what the machine
    gives that many decoders now, shared cores and all, not one core's rate times N).
    """
    import multiprocessing

    files = tree.files()
    step = max(1, len(files) // spec.get("decode_samples", 2000))
    blobs = [p.read_bytes() for p in files[::step]]
    for data in blobs[:16]:
        decode_image(data)
    start = time.perf_counter()
    for data in blobs:
        decode_image(data)
    seconds = time.perf_counter() - start
    processes = int(spec.get("decode_processes", 2))
    ctx = multiprocessing.get_context("fork")
    go, done = ctx.Barrier(processes + 1), ctx.Queue()
    workers = [ctx.Process(target=_decode_all, args=(blobs, go, done)) for _ in range(processes)]
    for w in workers:
        w.start()
    go.wait()
    began = time.perf_counter()
    ends = [done.get() for _ in workers]
    for w in workers:
        w.join()
    together = max(ends) - began
    return {"samples": len(blobs), "seconds": seconds,
            "per_core_samples_per_s": len(blobs) / seconds, "processes": processes,
            "processes_seconds": together,
            "processes_samples_per_s": processes * len(blobs) / together}


def main(argv: list[str]) -> None:
    """Run the measurement described by the JSON file ``argv[0]``."""
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    t = spec["tree"]
    tree = Tree(t["kind"], Path(t["root"]), t["num_files"], t["num_bytes"], t["num_classes"])
    work = Path(spec["work"])
    if spec["mode"] == "decode":
        import torch  # noqa: F401  (imported before the clock, like every other mode)

        result = run_decode(tree, spec)
    else:
        adapter = get_adapter(spec["system"])
        preload(adapter, torch=spec["mode"] != "pack")
        mode = {"pack": run_pack, "epoch": run_epoch, "audit": run_audit,
                "first": run_first}[spec["mode"]]
        result = mode(adapter, tree, work, spec)
    Path(spec["result"]).write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
