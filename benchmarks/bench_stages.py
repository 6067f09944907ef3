"""Question: where does a warm raw epoch in one process spend its time, per sample?

For each shared tree (``benchmarks/datagen.py``), packed with ``shardio.pack`` (format
v2), every stage of the read path is timed alone in one process, warm, as CPU seconds
(``time.process_time``, less disturbed by other jobs on a shared machine than the
wall clock) per sample, the minimum of ``--rounds``:

* ``check``: ``format.check_frames`` over every run of every shard (frame headers and
  the CRC-32C chain), and the same without the checksum (``verify=False``);
* ``checker``: what the checker thread does per run (``shardio.checkahead``: the CRC-32C
  chain, and zstd payloads inflated), here on the measuring thread;
* ``decode``: ``record.decode_run`` (check, decompress, msgpack or the zero-copy view),
  record by record, and ``columnar.decode_columns``, a shard's runs by field at once;
  then the epoch's shuffle windows as the stream decodes them: each window's runs of
  each shard by ``decode_columns``, and every shard's at once by
  ``windowdecode.decode_window`` (what the stream does first);
* ``stream``: ``stream.iter_chunks`` over the epoch's planned order (plan, runs
  decoded when due, gathering), then with each chunk's ``RecordBatch`` built;
* ``shardio.loader`` and a plain ``DataLoader`` with the user's collate, whole epochs
  (each payload's length taken, as the harness does), the CPU of both threads, and
  the loader's epoch again counting only the reading thread (``time.thread_time``);
* the single-LMDB-file peer's whole epoch (``benchmarks/adapters/lmdb_file.py``).

Writes ``benchmarks/results/stages.json``; the README table comes from it
(``stages_block``).

    python -m benchmarks.bench_stages [--quick] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
WORK = Path(__file__).resolve().parent / "work" / "stages"


def _cpu(function: Callable[[], object], rounds: int,
         clock: Callable[[], float] = time.process_time) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = clock()
        function()
        best = min(best, clock() - start)
    return best


def measure(kind: str, num_files: int, rounds: int) -> dict[str, Any]:
    """CPU microseconds per sample of each stage for one tree."""
    import numpy as np
    import torch.utils.data

    import shardio
    from benchmarks.adapters import EpochSpec, get_adapter
    from benchmarks.datagen import ensure_tree
    from shardio.batch import RecordBatch
    from shardio.checkahead import Check
    from shardio.columnar import RunPart, decode_columns
    from shardio.format import check_frames
    from shardio.reader import DatasetReader
    from shardio.record import decode_run
    from shardio.stream import iter_chunks, window_runs
    from shardio.windowdecode import ShardRuns, decode_window

    tree = ensure_tree(kind, num_files, seed=0)
    out = WORK / f"{kind}-{num_files}"
    if not (out / "manifest.json").exists():
        shardio.pack(tree.root, out, seed=0, num_workers=2, overwrite=True)
    peer = get_adapter("lmdb-file")
    peer_work = WORK / f"{kind}-{num_files}-lmdb-file"
    if not peer_work.exists():
        peer.pack(tree, peer_work, seed=0, num_workers=1)
    for path in [*out.iterdir(), *peer_work.iterdir()]:
        path.read_bytes()
    field = "image" if kind == "images" else "bin"
    dataset = shardio.StreamingDataset(out, decode="raw", seed=0)
    order, window, block = dataset.plan_stage().order, dataset.config.window, \
        dataset.config.block_size
    reader = DatasetReader(out)
    runs = [(s, lo, min(lo + block, reader.shard(s).num_records))
            for s in range(len(reader.manifest.shards))
            for lo in range(0, reader.shard(s).num_records, block)]

    def check(verify: bool) -> None:
        for s, lo, hi in runs:
            shard = reader.shard(s)
            check_frames(shard.read_run(lo, hi), path=shard.path, first_record=lo, verify=verify)

    def mapping() -> None:
        # each run's pages dropped first, so that its check maps them again: what a fresh
        # process (or a window after the last dropped its pages) pays
        for s, lo, hi in runs:
            shard = reader.shard(s)
            shard.drop_pages(lo, hi)
            check_frames(shard.read_run(lo, hi), path=shard.path, first_record=lo)

    def checker_work() -> None:
        lock = threading.Lock()
        for s, lo, hi in runs:
            assert Check(reader.shard(s).read_run(lo, hi), lock).passed()

    def columns() -> None:
        for s in range(len(reader.manifest.shards)):
            shard = reader.shard(s)
            parts = [RunPart(shard.read_run(lo, hi), lo, None, True) for t, lo, hi in runs
                     if t == s]
            assert decode_columns(parts, path=shard.path, keys=shard.keys(), verify=False,
                                  offset_of=shard.offset) is not None

    firsts = np.asarray([s.first_index for s in reader.manifest.shards], np.int64)
    windows: list[dict[int, list[tuple[int, int]]]] = []  # per window: each shard's runs
    for lo in range(0, len(order), window):
        spans: dict[int, list[tuple[int, int]]] = {}
        for s, start, stop in window_runs(np.sort(order[lo : lo + window]), firsts, block):
            spans.setdefault(s, []).append((start, stop))
        windows.append(spans)

    def window_parts(spans: dict[int, list[tuple[int, int]]]) -> list[tuple[Any, list[Any]]]:
        return [(reader.shard(s), [RunPart(reader.shard(s).read_run(a, b), a, None, True)
                                   for a, b in runs]) for s, runs in spans.items()]

    def columns_by_window() -> None:
        for spans in windows:
            for shard, parts in window_parts(spans):
                assert decode_columns(parts, path=shard.path, keys=shard.keys(), verify=False,
                                      offset_of=shard.offset) is not None

    def window_at_once() -> None:
        for spans in windows:
            assert decode_window([ShardRuns(parts, shard.keys())
                                  for shard, parts in window_parts(spans)]) is not None

    def decode(zero_copy: bool) -> None:
        for s, lo, hi in runs:
            shard = reader.shard(s)
            decode_run(shard.read_run(lo, hi), path=shard.path, first_record=lo,
                       first_index=lo, zero_copy=zero_copy, keys=shard.keys())

    def stream(batch: bool) -> None:
        with DatasetReader(out) as fresh:
            for chunk in iter_chunks(fresh, order, window=window, max_run=block, size=64,
                                     zero_copy=True):
                if batch:
                    RecordBatch.from_samples(chunk)

    def loader() -> None:
        data = shardio.StreamingDataset(out, decode="raw", seed=0)
        for batch in shardio.loader(data, batch_size=64, num_workers=0):
            sum(v.nbytes for v in batch.bytes(field) if v is not None)

    def plain() -> None:
        data = shardio.StreamingDataset(out, decode="raw", seed=0, batch_size=64)

        def collate(samples: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
            return [s[field] for s in samples], [s.get("label") for s in samples]

        for payloads, _labels in torch.utils.data.DataLoader(data, batch_size=64,
                                                             collate_fn=collate):
            sum(len(p) for p in payloads)

    def lmdb_file() -> None:
        for loader_epoch in peer.epochs(tree, peer_work, EpochSpec()):
            for payloads, _labels in loader_epoch:
                sum(len(p) for p in payloads)

    stages: dict[str, Callable[[], None]] = {
        "check_frames (CRC-32C chain)": lambda: check(True),
        "check_frames, verify=False": lambda: check(False),
        "checker thread's work (CRC-32C chain, inflate)": checker_work,
        "drop_pages, then check_frames (pages mapped again)": mapping,
        "decode_run, zero copy (record by record)": lambda: decode(True),
        "decode_run, copies (per-sample dicts)": lambda: decode(False),
        "decode_columns (a shard's runs by field)": columns,
        "decode_columns, window by window, shard by shard": columns_by_window,
        "decode_window (a window's shards at once)": window_at_once,
        "iter_chunks (plan, runs, gather; both threads)": lambda: stream(False),
        "iter_chunks + RecordBatch (both threads)": lambda: stream(True),
        "shardio.loader epoch (both threads)": loader,
        "plain DataLoader epoch, own collate (both threads)": plain,
        "lmdb-file epoch (the peer)": lmdb_file,
    }
    for function in stages.values():
        function()  # warm: imports, allocator, page tables
    results = {name: _cpu(function, rounds) / num_files * 1e6
               for name, function in stages.items()}
    # what the reader's own thread spends: the checker thread takes the rest on another core
    results["shardio.loader epoch, reading thread only"] = _cpu(
        loader, rounds, time.thread_time) / num_files * 1e6
    reader.close()
    return {"kind": kind, "num_files": num_files, "us_per_sample": results}


def main(argv: list[str] | None = None) -> Path:
    """Measure both trees; returns the results file."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small trees, 2 rounds")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=RESULTS / "stages.json")
    args = p.parse_args(argv)
    rounds = 2 if args.quick else args.rounds
    load = [os.getloadavg()[0]]
    images, tiny = (1000, 10_000) if args.quick else (8000, 100_000)
    trees = [measure("images", images, rounds), measure("tiny", tiny, rounds)]
    load.append(os.getloadavg()[0])
    command = "python -m benchmarks.bench_stages" + (" --quick" if args.quick
                                                      else f" --rounds {rounds}")
    results = {"date": time.strftime("%Y-%m-%d %H:%M"), "command": command,
               "load_avg_1min": load, "trees": trees}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(stages_block(args.out))
    return args.out


def stages_block(path: Path | None = None) -> str:
    """The README table of CPU microseconds per sample, stage by stage, from ``stages.json``."""
    results = json.loads((path or RESULTS / "stages.json").read_text(encoding="utf-8"))
    trees = results["trees"]
    lines = [f"Measured {results['date']} (`{results['command']}`), 1-minute load average "
             f"{results['load_avg_1min'][0]:.1f} before, {results['load_avg_1min'][1]:.1f} after; "
             "CPU microseconds per sample, the fastest of the rounds, one process, warm:", "",
             "| stage | " + " | ".join(f"{t['kind']} ({t['num_files']:,})" for t in trees) + " |",
             "|---|" + "---|" * len(trees)]
    for name in trees[0]["us_per_sample"]:
        lines.append(f"| {name} | " + " | ".join(f"{t['us_per_sample'][name]:.2f}"
                                                  for t in trees) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
