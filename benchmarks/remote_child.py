"""One remote measurement in a fresh process: ``python -m benchmarks.remote_child SPEC.json``.

Builds the system's remote reader once and iterates ``num_epochs`` epochs through it,
as a training loop would. Per epoch: samples, seconds, time to the first batch (for the
first epoch from building the dataset, so manifest or index reads, listing and worker
start count), whether every sample came exactly once (the sorted CRC-32 of the payloads
against those of the source files), the wall-clock start and end (the parent cuts its
cache-size samples there) and the link's counters before and after (bytes downloaded).
A failure is recorded with the epochs done before it, so an epoch that does not complete
is a result, not a crash. The library, its object-store client (``client_modules``) and
torch are imported before any clock starts.
The result is written as JSON to ``spec["result"]``.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.adapters import EpochSpec
from benchmarks.adapters.remote import RemoteSpec, get_reader
from benchmarks.child import preload
from benchmarks.datagen import Tree
from benchmarks.remote_servers import proxy_stats


def run_epochs(spec: dict[str, Any]) -> dict[str, Any]:
    """The measurement ``spec`` describes; see the module docstring."""
    t = spec["tree"]
    tree = Tree(t["kind"], Path(t["root"]), t["num_files"], t["num_bytes"], t["num_classes"])
    r = spec["remote"]
    remote = RemoteSpec(url=r["url"], http_url=r["http_url"], files=tuple(r["files"]),
                        cache_dir=Path(r["cache_dir"]), max_cache_bytes=r["max_cache_bytes"],
                        fork_fix=r.get("fork_fix", True))
    reader = get_reader(spec["system"])
    preload(reader, torch=True)  # type: ignore[arg-type]  (it has .library, all preload reads)
    for module in reader.client_modules:
        importlib.import_module(module)
    expected = np.load(spec["expected_crc"])
    epoch_spec = EpochSpec(num_workers=spec["num_workers"], shuffle=True, seed=spec["seed"],
                           num_epochs=spec["num_epochs"])
    epochs: list[dict[str, Any]] = []
    out: dict[str, Any] = {"epochs": epochs, "error": None}
    stats = proxy_stats(spec["proxy_url"])
    wall = time.time()
    start = time.perf_counter()
    try:
        for loader in reader.epochs(tree, remote, epoch_spec):
            crcs: list[int] = []
            first: float | None = None
            for payloads, _ in loader:
                if first is None:
                    first = time.perf_counter() - start
                crcs += [zlib.crc32(p) for p in payloads]
            seconds = time.perf_counter() - start
            after = proxy_stats(spec["proxy_url"])
            got = np.sort(np.asarray(crcs, dtype=np.uint32))
            epochs.append({
                "samples": len(crcs), "seconds": seconds, "samples_per_s": len(crcs) / seconds,
                "first_batch_s": first, "exactly_once": bool(np.array_equal(got, expected)),
                "wall_start": wall, "wall_end": time.time(),
                "get_bytes": after["get_bytes"] - stats["get_bytes"],
                "gets": after["gets"] - stats["gets"],
                "requests": after["requests"] - stats["requests"],
            })
            stats = proxy_stats(spec["proxy_url"])
            wall = time.time()
            start = time.perf_counter()
    except Exception as exc:  # the failure is the result (a budget refused, a stall, ...)
        lines = traceback.format_exception_only(type(exc), exc)
        out["error"] = {"epoch": len(epochs) + 1, "type": type(exc).__name__,
                        "message": "".join(lines).strip()[-600:]}
    return out


def main(argv: list[str]) -> None:
    """Run the measurement described by the JSON file ``argv[0]``."""
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    result = run_epochs(spec)
    Path(spec["result"]).write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
