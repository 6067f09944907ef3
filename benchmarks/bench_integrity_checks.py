"""What do issue 7's read-time integrity checks cost, on a cold and a warm epoch?

The checks: on each shard open, the key block is loaded and its CRC-32 compared with
the manifest's ``keys_crc32`` (a shard file exchanged for another is refused) and the
header flags are checked; on each record, its own ``__key__`` is compared with the key
block and the frame length with the index. This times the same reads with the
``shardio`` package of ``--current REV`` (default HEAD, extracted from git) and with a
copy of it whose key checks are cut out (``strip_checks``: the two lines that pass the
key block to the decoders; the baseline's manifest has no ``keys_crc32``), so nothing
but the checks differs. Rounds interleave the two, each read in a fresh process, on a
dataset of many small records (the worst case: most keys per byte). Reads: a full
shuffled epoch through the streaming path (``shardio.reading.stream.iter_samples``),
``--gets`` random ``DatasetReader.get`` calls (``IndexedDataset``'s path, where every
shard open is paid for a few records), and the open of every shard with one record read
(best of 5, warm: the per-open cost). Cold reads evict the shard files from the page
cache first (``benchmarks.probe.evict``, checked with ``fincore``). Wall and CPU time
are both kept: on a shared machine CPU time is the steadier of the two.

    python -m benchmarks.bench_integrity_checks
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final

HERE: Final = Path(__file__).resolve().parent
RESULT: Final = HERE / "results" / "integrity-checks.json"

CHILD = r"""
import json, sys, time
import numpy as np
import shardio
from shardio.reading.reader import DatasetReader
from shardio.reading.stream import iter_samples
root, gets, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if kind == "opens":  # every shard opened and one record read, best of 5 fresh readers
    best, cpu = float("inf"), float("inf")
    for _ in range(5):
        start, start_cpu = time.perf_counter(), time.process_time()
        with DatasetReader(root) as reader:
            for s in reader.manifest.shards:
                reader.get(s.first_index)
        best = min(best, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    print(json.dumps({"seconds": best, "cpu_seconds": cpu,
                      "count": len(reader.manifest.shards), "module": shardio.__file__}))
    sys.exit()
start, start_cpu = time.perf_counter(), time.process_time()
with DatasetReader(root) as reader:
    n = len(reader)
    if kind == "epoch":
        order = np.random.default_rng(0).permutation(n)
        count = sum(1 for _ in iter_samples(reader, order, window=8192, max_run=64))
    else:
        count = sum(len(reader.get(int(i))) > 0
                    for i in np.random.default_rng(1).integers(0, n, gets))
seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "count": count,
                  "module": shardio.__file__}))
"""


CHECK_LINES: Final = {
    "stream.py": "        keys=shard_reader.keys(),\n",
    "reader.py": "            key=reader.keys()[record],\n",
}
"""The lines that hand the key block to the decoders, cut out for the baseline."""


def strip_checks(package: Path) -> None:
    """Cut the per-record key checks out of the ``shardio`` under ``package``."""
    for name, line in CHECK_LINES.items():
        path = package / "shardio" / name
        text = path.read_text()
        if text.count(line) != 1:
            raise RuntimeError(f"{path}: expected the line {line.strip()!r} once")
        path.write_text(text.replace(line, ""))


def extract_revision(rev: str, target: Path) -> Path:
    """``target``, holding the ``shardio`` package of git revision ``rev`` (imports nothing)."""
    target.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(HERE.parent), "archive", rev, "shardio"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def make_dataset(root: Path, *, backend: str, num_samples: int, per_shard: int) -> None:
    """Small text-like records (about 600 bytes, zstd), ``per_shard`` to a shard."""
    import numpy as np

    from shardio import ShardWriter, WriteOptions

    rng = np.random.default_rng(0)
    words = [f"w{i}".encode() for i in range(500)]
    options = WriteOptions(backend=backend, codec="zstd", max_shard_samples=per_shard)
    with ShardWriter(root, options) as writer:
        for i in range(num_samples):
            text = b" ".join(words[j] for j in rng.integers(0, 500, 150))
            writer.write({"__key__": f"part{i % 97:02d}/sample-{i:08d}.txt", "txt": text,
                          "cls": int(i % 10)})


def baseline_copy(root: Path, dest: Path) -> None:
    """``root``'s shards (hard links: one page cache) with a manifest old readers accept."""
    dest.mkdir()
    manifest = json.loads((root / "manifest.json").read_text())
    for shard in manifest["shards"]:
        os.link(root / shard["name"], dest / shard["name"])
        shard.pop("keys_crc32", None)
    (dest / "manifest.json").write_text(json.dumps(manifest))


def time_read(root: Path, source: Path, *, kind: str, gets: int, cold: bool) -> dict[str, Any]:
    """One read of ``kind`` in a fresh process importing the ``shardio`` under ``source``."""
    from benchmarks.probe import evict, resident_fraction

    shards = [p for p in root.iterdir() if p.name.startswith("shard-")]
    resident = None
    if cold:
        evict(shards)
        resident = resident_fraction(shards)
    env = {**os.environ, "PYTHONPATH": str(source)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(root), str(gets), kind], env=env,
                         cwd=source, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out)
    if Path(result.pop("module")).parent != source / "shardio":
        raise RuntimeError(f"the child did not import the shardio under {source}")
    return {**result, "resident_before": resident}


def key_check_ns(root: Path) -> dict[str, float]:
    """Per record, CPU time decoding a block with and without the key check (best of 30)."""
    import time

    from shardio.format.record import decode_frames
    from shardio.reading.reader import DatasetReader

    with DatasetReader(root) as reader:
        shard = reader.shard(0)
        frames, keys = shard.read_frames(0, shard.num_records), shard.keys()

        def decode(with_keys: bool) -> None:
            decode_frames(frames, path=shard.path, first_record=0, offset_of=shard.offset,
                          keys=keys if with_keys else None)

        best = {False: float("inf"), True: float("inf")}
        for _ in range(30):  # interleaved, so a busy moment of the machine hits both
            for with_keys in best:
                start = time.process_time()
                decode(with_keys)
                best[with_keys] = min(best[with_keys], time.process_time() - start)
    return {"without": 1e9 * best[False] / len(frames), "with": 1e9 * best[True] / len(frames)}


def main(argv: list[str] | None = None) -> None:
    """Time both versions in interleaved rounds; write the results file and print a table."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--current", default="HEAD", metavar="REV", help="git revision to time")
    p.add_argument("--samples", type=int, default=200_000)
    p.add_argument("--per-shard", type=int, default=20_000)
    p.add_argument("--gets", type=int, default=2_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=RESULT)
    args = p.parse_args(argv)
    from benchmarks.machine import describe_machine

    rev = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", args.current],
                         check=True, capture_output=True, text=True).stdout.strip()
    rows: dict[str, list[float]] = {}
    cpu_rows: dict[str, list[float]] = {}
    micro: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="shardio-integrity-") as tmp:
        work = Path(tmp)
        current = extract_revision(rev, work / "current")
        baseline = extract_revision(rev, work / "baseline")
        strip_checks(baseline)
        sys.path.insert(0, str(current))  # the dataset is written by the current revision
        import shardio

        assert Path(shardio.__file__).parent == current / "shardio", shardio.__file__
        for backend in ("records", "lmdb"):
            new_root, old_root = work / f"{backend}-new", work / f"{backend}-old"
            make_dataset(new_root, backend=backend, num_samples=args.samples,
                         per_shard=args.per_shard)
            baseline_copy(new_root, old_root)
            for repeat in range(args.repeats):
                versions = [("new", new_root, current), ("old", old_root, baseline)]
                for name, root, src in versions[:: 1 if repeat % 2 == 0 else -1]:
                    for kind in ("epoch", "gets", "opens"):
                        for cold in (True, False) if kind != "opens" else (False,):
                            r = time_read(root, src, kind=kind, gets=args.gets, cold=cold)
                            key = f"{backend}/{kind}/{'cold' if cold else 'warm'}/{name}"
                            rows.setdefault(key, []).append(r["seconds"])
                            cpu_rows.setdefault(key, []).append(r["cpu_seconds"])
            micro[backend] = key_check_ns(new_root)
        machine = describe_machine(work)
    medians = {k: statistics.median(v) for k, v in rows.items()}
    cpu = {k: statistics.median(v) for k, v in cpu_rows.items()}
    table = ["| backend | read | cache | wall before (ms) | wall with checks (ms) | change "
             "| CPU before (ms) | CPU with checks (ms) | change |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for key in sorted({k.rsplit("/", 1)[0] for k in medians}):
        backend, kind, cache = key.split("/")
        cells = []
        for figures in (medians, cpu):
            old, new = figures[f"{key}/old"], figures[f"{key}/new"]
            cells.append(f"{1e3 * old:.1f} | {1e3 * new:.1f} | {100 * (new / old - 1):+.1f}%")
        table.append(f"| {backend} | {kind} | {cache} | {' | '.join(cells)} |")
    table += [f"\n{b}: decode CPU per record {m['without']:.0f} ns, with the key check "
              f"{m['with']:.0f} ns" for b, m in micro.items()]
    results = {
        "question": "what do the read-time integrity checks of issue 7 cost?",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m benchmarks.bench_integrity_checks " + " ".join(
            sys.argv[1:] if argv is None else argv),
        "revision": rev, "baseline": "the same, key checks cut out (strip_checks)",
        "machine": machine,
        "samples": args.samples, "per_shard": args.per_shard, "gets": args.gets,
        "seconds": rows, "cpu_seconds": cpu_rows, "median_seconds": medians,
        "median_cpu_seconds": cpu, "decode_ns_per_record": micro,
        "table": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
