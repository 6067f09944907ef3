"""Question: which record checksum should format v2 use, and what does it cost a warm epoch?

Part 1 (per record size, 1 KB to 1 MB): microseconds per record and GB/s of zlib's
CRC-32 (format v1), CRC-32C from the ``crc32c`` package (hardware, takes any buffer),
CRC-32C from ``google-crc32c`` (hardware, takes ``bytes`` only, so a mapped record is
copied first, as a reader would have to) and xxh3-64 (``xxhash``), each called once per
record on records cut from a 512 MB buffer (larger than the caches, as records come
from the page cache), the algorithms interleaved round by round; and CRC-32C over a
run of 64 records in one call, which the v2 chain allows (``docs/format.md`` §4).

Part 2: the share of a warm raw epoch the checks take. The shared trees
(``benchmarks/datagen.py``) are packed with ``shardio.pack`` (format v2); in one process,
epochs through ``StreamingDataset`` + ``shardio.loader`` (0 workers, batch 64, each
payload's length taken) alternate ``verify=True`` and ``verify=False``; the share is
``1 - median(off) / median(on)``. Writes ``benchmarks/results/checksum.json``; the
README table comes from it (``checksum_block``).

    python -m benchmarks.bench_checksum [--quick] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
WORK = Path(__file__).resolve().parent / "work" / "checksum"
SIZES = (1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20)
RUN_RECORDS = 64


def checksums() -> dict[str, Callable[[memoryview], int] | str]:
    """Name -> one call on a record; a reason string where the library is missing."""
    out: dict[str, Callable[[memoryview], int] | str] = {"zlib crc32": zlib.crc32}
    try:
        import crc32c

        out["crc32c (crc32c)"] = crc32c.crc32c
    except ImportError:
        out["crc32c (crc32c)"] = "pip install crc32c"
    try:
        import google_crc32c

        out["crc32c (google-crc32c, bytes copy)"] = lambda v: google_crc32c.value(bytes(v))
    except ImportError:
        out["crc32c (google-crc32c, bytes copy)"] = "pip install google-crc32c"
    try:
        import xxhash

        out["xxh3-64 (xxhash)"] = xxhash.xxh3_64_intdigest
    except ImportError:
        out["xxh3-64 (xxhash)"] = "pip install xxhash"
    return out


def measure_micro(rounds: int, buffer_bytes: int) -> dict[str, Any]:
    """Per size and algorithm: median microseconds per record over ``rounds``."""
    data = memoryview(np.random.default_rng(0).integers(0, 256, buffer_bytes, np.uint8).data)
    functions = checksums()
    rows: list[dict[str, Any]] = []
    for size in SIZES:
        count = min(4096, buffer_bytes // size)
        stride = buffer_bytes // count
        views = [data[i * stride : i * stride + size] for i in range(count)]
        times: dict[str, list[float]] = {name: [] for name, f in functions.items()
                                         if callable(f)}
        runs: list[float] = []
        for r in range(rounds):
            names = list(times)
            for name in names[r % len(names):] + names[: r % len(names)]:
                function = functions[name]
                assert callable(function)
                start = time.perf_counter()
                for view in views:
                    function(view)
                times[name].append((time.perf_counter() - start) / count)
            import crc32c

            chunks = [data[i : i + RUN_RECORDS * size]
                      for i in range(0, buffer_bytes - RUN_RECORDS * size + 1, RUN_RECORDS * size)]
            start = time.perf_counter()
            for chunk in chunks:
                crc32c.crc32c(chunk, 0)
            runs.append((time.perf_counter() - start) / (len(chunks) * RUN_RECORDS))
        row: dict[str, Any] = {"size": size, "us_per_record": {
            name: statistics.median(t) * 1e6 for name, t in times.items()}}
        row["us_per_record"][f"crc32c over a run of {RUN_RECORDS}"] = statistics.median(runs) * 1e6
        rows.append(row)
    missing = {name: f for name, f in functions.items() if isinstance(f, str)}
    return {"rows": rows, "missing": missing, "buffer_bytes": buffer_bytes}


def epoch_share(kind: str, num_files: int, rounds: int) -> dict[str, Any]:
    """Warm raw epochs with and without record checks, alternating, in this process."""
    import shardio
    from benchmarks.datagen import ensure_tree

    tree = ensure_tree(kind, num_files, seed=0)
    out = WORK / f"{kind}-{num_files}"
    if not (out / "manifest.json").exists():
        shardio.pack(tree.root, out, seed=0, num_workers=2, overwrite=True)
    for path in out.iterdir():
        path.read_bytes()
    field = "image" if kind == "images" else "bin"
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds + 1):
        for verify in ((True, False) if r % 2 else (False, True)):
            dataset = shardio.StreamingDataset(out, decode="raw", seed=r, verify=verify)
            start = time.perf_counter()
            nbytes = 0
            for batch in shardio.loader(dataset, batch_size=64, num_workers=0):
                nbytes += sum(v.nbytes for v in batch.bytes(field) if v is not None)
            if r:  # the first round warms the process (imports, allocator)
                seconds[verify].append(time.perf_counter() - start)
    on, off = statistics.median(seconds[True]), statistics.median(seconds[False])
    return {"kind": kind, "num_files": num_files, "rounds": rounds,
            "seconds_verify": seconds[True], "seconds_no_verify": seconds[False],
            "median_verify_s": on, "median_no_verify_s": off,
            "samples_per_s_verify": num_files / on, "share": 1 - off / on}


def main(argv: list[str] | None = None) -> Path:
    """Run both parts; returns the results file."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small buffer and trees, 3 rounds")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", type=Path, default=RESULTS / "checksum.json")
    args = p.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    load_before = os.getloadavg()[0]
    micro = measure_micro(rounds, (64 if args.quick else 512) << 20)
    images, tiny = (1000, 10_000) if args.quick else (8000, 100_000)
    epochs = [epoch_share("images", images, rounds), epoch_share("tiny", tiny, rounds)]
    from benchmarks.machine import describe_machine, library_versions

    results = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": "python -m benchmarks.bench_checksum" + (" --quick" if args.quick else
                                                             f" --rounds {rounds}"),
        "machine": describe_machine(WORK.parent), "versions": library_versions(),
        "load_avg_1min": [load_before, os.getloadavg()[0]],
        "micro": micro, "epochs": epochs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(checksum_block(args.out))
    return args.out


def checksum_block(path: Path | None = None) -> str:
    """The README's record-checksum tables, from ``results/checksum.json``."""
    results = json.loads((path or RESULTS / "checksum.json").read_text(encoding="utf-8"))
    micro = results["micro"]
    names = list(micro["rows"][0]["us_per_record"])
    head = "| record size | " + " | ".join(names) + " |"
    lines = [f"Measured {results['date']} (`{results['command']}`); 1-minute load average "
             f"{results['load_avg_1min'][0]:.1f} before, {results['load_avg_1min'][1]:.1f} "
             "after. Microseconds per record (GB/s), median of the rounds, records cut "
             f"from a {micro['buffer_bytes'] >> 20} MB buffer:", "", head,
             "|" + "---|" * (len(names) + 1)]
    for row in micro["rows"]:
        size = row["size"]
        label = f"{size >> 10} KB" if size < 1 << 20 else f"{size >> 20} MB"
        cells = [f"{us:.2f} ({size / us / 1e3:.1f})" for us in row["us_per_record"].values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for name, reason in micro["missing"].items():
        lines.append(f"\n{name}: not measured ({reason}).")
    by_size = {row["size"]: row["us_per_record"] for row in micro["rows"]}
    run_name = f"crc32c over a run of {RUN_RECORDS}"
    if 64 << 10 in by_size and 4 << 10 in by_size and "crc32c (crc32c)" in by_size[4 << 10]:
        big, small = by_size[64 << 10], by_size[4 << 10]
        c32c, xxh = "crc32c (crc32c)", "xxh3-64 (xxhash)"
        lines += ["", f"At 64 KB (an image) CRC-32C costs {big[c32c] / big['zlib crc32']:.2f}x "
                  f"zlib's CRC-32 and xxh3-64 {big.get(xxh, float('nan')) / big[c32c]:.2f}x "
                  f"CRC-32C; at 4 KB one CRC-32C call per record costs "
                  f"{small[c32c] / small[run_name]:.2f}x its share of one call over a run, and "
                  f"xxh3-64 (which cannot continue a run) "
                  f"{small.get(xxh, float('nan')) / small[run_name]:.2f}x."]
    lines += ["", "Share of a warm raw epoch (`shardio.loader`, 0 workers) taken by the record "
              "checks (format v2, CRC-32C chain), `verify=True` against `verify=False` in the "
              "same process, alternating:", "",
              "| tree | samples | epoch with checks | samples/s | share of the epoch |",
              "|---|---|---|---|---|"]
    for e in results["epochs"]:
        lines.append(f"| {e['kind']} | {e['num_files']:,} | {e['median_verify_s']:.3f} s | "
                     f"{e['samples_per_s_verify']:,.0f} | {100 * e['share']:.1f}% |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
