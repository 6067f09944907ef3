"""The harness: every system on every tree, interleaved, each measurement in a fresh process.

``python -m benchmarks.run [--quick] [--systems a,b] [--datasets images,tiny,fields,mixed]``
generates (or reuses) the data, packs it with every system, checks eviction and the disk's
own rate, audits exactly-once delivery and files opened, then times epochs (streamed, and
random access for map-style readers; shardio's warm one again without checksums) and the
time to the first batch on a 10^5-sample tree (``--first-sample``); every repeat
visits the systems in a rotated order so drift on a shared machine spreads over all of
them; every child imports a copy of ``shardio`` taken when the run starts, so edits
to the shared tree during a run cannot mix code versions. Medians, ratios and target
checks are computed by ``benchmarks.summary``; the JSON goes to ``benchmarks/results/``
and ``--update-readme`` rewrites the READMEs' generated blocks from the committed results
(a full run's file is the newest ``*-full.json``, so it shows at once).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import SNAPSHOT_ENV, probe
from benchmarks.adapters import (
    BASELINE,
    CHECKED,
    OPT_IN,
    RANDOM_ACCESS,
    SHUFFLE_ONLY,
    SYSTEMS,
    get_adapter,
    payload_crc,
    read_payload,
)
from benchmarks.datagen import DATA_ROOT, FULL_SIZES, QUICK_SIZES, Tree, ensure_tree
from benchmarks.machine import describe_machine, library_versions, snapshot_shardio, source_id
from benchmarks.summary import summarize

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


FIRST_SAMPLES = 100_000
"""Issue 29's time to the first sample is asked of a warm local dataset of 10^5 samples."""
DECODE_LIMIT = "decode-limit"
"""Stands for the decode limit's measurement in the rotation of the decoded rounds."""


def epoch_configs(
    kind: str, workers: list[int], caches: list[str], decode: bool
) -> list[dict[str, Any]]:
    """The timed epochs for one tree: raw for every workers × cache, decoded with 2 workers.

    A warm 0-worker epoch is followed by the same epoch without shardio's checksums and by
    random access through the map-style readers, so that their ratios to it (and to the
    LMDB file's random gets) are taken in the same rounds.
    """
    out: list[dict[str, Any]] = []
    for w in workers:
        for c in caches:
            out.append({"name": f"raw-w{w}-{c}", "num_workers": w, "cache": c, "decode": False})
            if w == 0 and c == "warm":
                out.append({**out[-1], "name": "raw-w0-warm-nocheck", "verify": False,
                            "only": CHECKED})
                out.append({**out[-2], "name": "random-w0-warm", "access": "random",
                            "only": RANDOM_ACCESS})
    if decode and kind == "images":
        out.append({"name": "decoded-w2-warm", "num_workers": 2, "cache": "warm", "decode": True})
    return out


def tree_spec(tree: Tree, args: argparse.Namespace) -> dict[str, Any]:
    """What every child of one tree is told about it."""
    return {"tree": {"kind": tree.kind, "root": str(tree.root), "num_files": tree.num_files,
                     "num_bytes": tree.num_bytes, "num_classes": tree.num_classes},
            "seed": args.seed, "pack_workers": args.pack_workers}


class Runner:
    """Runs child measurements and keeps their raw results."""

    def __init__(
        self, work_root: Path, *, timeout_s: float, verbose: bool, snapshot: str
    ) -> None:
        self.work_root = work_root
        self.env = {**os.environ, SNAPSHOT_ENV: snapshot}
        self.timeout_s = timeout_s
        self.verbose = verbose
        self.logs = work_root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self._count = 0
        self.loads: list[float] = []
        """The 1-minute load average before each measurement (the harness's own included)."""

    def child(self, spec: dict[str, Any], *, prefix: list[str] | None = None) -> dict[str, Any]:
        """Run ``benchmarks.child`` on ``spec``; its result, or ``{"error": ...}``."""
        self._count += 1
        self.loads.append(os.getloadavg()[0])
        tag = f"{self._count:04d}-{spec.get('system', 'decode')}-{spec['mode']}"
        spec_path = self.logs / f"{tag}.spec.json"
        result_path = self.logs / f"{tag}.result.json"
        spec = {**spec, "result": str(result_path)}
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        cmd = [*(prefix or []), sys.executable, "-m", "benchmarks.child", str(spec_path)]
        with open(self.logs / f"{tag}.log", "wb") as log:
            try:
                proc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                      timeout=self.timeout_s, check=False, env=self.env)
                code: int | str = proc.returncode
            except subprocess.TimeoutExpired:
                code = f"timeout after {self.timeout_s:.0f} s"
        if code != 0 or not result_path.exists():
            tail = (self.logs / f"{tag}.log").read_text(errors="replace").strip().splitlines()
            return {"error": f"exit {code}: " + " | ".join(tail[-3:])}
        result: dict[str, Any] = json.loads(result_path.read_text(encoding="utf-8"))
        if self.verbose:
            brief = {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()
                     if k in ("samples_per_s", "files_per_s", "seconds", "exactly_once")}
            print(f"  {tag}: {brief}", flush=True)
        return result


def expected_crcs(tree: Tree, path: Path) -> Path:
    """Sorted CRC-32 of every source file, saved once per tree (what exactly-once means)."""
    if not path.exists():
        crcs = np.sort(np.fromiter(
            (payload_crc(read_payload(paths)) for _, paths in tree.samples()), dtype=np.uint32))
        np.save(path, crcs)
    return path


def interpreter() -> str:
    """The Python running the harness, relative to the repository (no machine path in results)."""
    exe = Path(sys.executable).absolute()
    try:
        return exe.relative_to(REPO).as_posix()
    except ValueError:
        return exe.name


def rotate(items: list[str], k: int) -> list[str]:
    """``items`` started at position ``k`` (interleaving order for repeat ``k``)."""
    k %= max(1, len(items))
    return items[k:] + items[:k]


def measure_tree(
    tree: Tree, systems: list[str], runner: Runner, args: argparse.Namespace
) -> dict[str, Any]:
    """Every measurement of one tree; raw runs, not yet summarized."""
    base = runner.work_root / tree.kind
    base.mkdir(parents=True, exist_ok=True)
    common = tree_spec(tree, args)
    out: dict[str, Any] = {"num_files": tree.num_files, "num_bytes": tree.num_bytes,
                           "systems": {}, "tar": [], "decode": [], "eviction": []}
    ready: list[str] = []
    for name in systems:
        reason = get_adapter(name).missing()
        out["systems"][name] = {"status": "skipped" if reason else "ok", "reason": reason,
                                "pack": [], "cat_cold": [], "epochs": {}, "audit": None}
        if reason is None:
            ready.append(name)
        else:
            print(f"[{tree.kind}] skip {name}: {reason}", flush=True)

    def work(name: str) -> Path:
        return base / name

    for rep in range(args.repeats):
        print(f"[{tree.kind}] pack, repeat {rep + 1}/{args.repeats}", flush=True)
        for name in rotate(ready, rep):
            shutil.rmtree(work(name), ignore_errors=True)
            if name == BASELINE:
                work(name).mkdir(parents=True)
                out["systems"][name]["pack"].append({"output_bytes": 0})
                continue
            res = runner.child({**common, "mode": "pack", "system": name, "work": str(work(name))})
            out["systems"][name]["pack"].append(res)
        tar = base / "tar" / "out.tar"
        shutil.rmtree(tar.parent, ignore_errors=True)
        tar.parent.mkdir(parents=True)
        probe.read_all(tree.files())
        start = time.perf_counter()
        subprocess.run(["tar", "-cf", str(tar), "-C", str(tree.root), "."], check=True)
        seconds = time.perf_counter() - start
        out["tar"].append({"seconds": seconds, "files_per_s": tree.num_files / seconds,
                           "output_bytes": tar.stat().st_size})
        tar.unlink()
    for name in list(ready):
        if all("error" in r for r in out["systems"][name]["pack"]):
            out["systems"][name]["status"] = "failed"
            out["systems"][name]["reason"] = out["systems"][name]["pack"][-1]["error"]
            ready.remove(name)

    adapters = {name: get_adapter(name) for name in ready}
    print(f"[{tree.kind}] eviction check and cold cat", flush=True)
    for rep in range(args.repeats):
        files = tree.files()
        probe.evict(files)
        left = probe.resident_fraction(files)
        cold, size = probe.timed_read(files)
        warm, _ = probe.timed_read(files)
        out["eviction"].append({"cold_s": cold, "warm_s": warm, "bytes": size,
                                "resident_after_evict": left,
                                "resident_after_read": probe.resident_fraction(files)})
        for name in rotate(ready, rep):
            data = adapters[name].data_files(tree, work(name))
            probe.evict(data)
            seconds = probe.cat_seconds(data)
            size = sum(p.stat().st_size for p in data)
            out["systems"][name]["cat_cold"].append(
                {"seconds": seconds, "mb_per_s": size / 1e6 / seconds,
                 "samples_per_s": tree.num_files / seconds})

    crc = expected_crcs(tree, base / f"expected-crc-{tree.root.name}.npy")
    print(f"[{tree.kind}] audit: exactly-once over two epochs, files opened", flush=True)
    for name in ready:
        log = runner.logs / f"strace-{tree.kind}-{name}.log"
        prefix = probe.strace_prefix(log) if args.strace else None
        res = runner.child({**common, "mode": "audit", "system": name, "work": str(work(name)),
                            "num_workers": 2, "expected_crc": str(crc)}, prefix=prefix)
        if prefix is not None and "error" not in res:
            under = tree.root if name == BASELINE else work(name)
            res["opens"] = probe.count_opens(log, under=under, markers=res["markers"])
            log.unlink()
        out["systems"][name]["audit"] = res

    configs = epoch_configs(tree.kind, args.workers, args.caches, args.decode)
    for rep in range(args.repeats):
        for cfg in configs:
            print(f"[{tree.kind}] {cfg['name']}, repeat {rep + 1}/{args.repeats}", flush=True)
            # the decode limit is measured in the decoded rounds, in their rotation: a
            # ratio to it then compares figures taken under the same load (measured apart,
            # minutes before, a busy neighbour on the 2 cores moved one and not the other)
            limit = [DECODE_LIMIT] if cfg["decode"] else []
            for name in rotate(ready + limit, rep):
                if name == DECODE_LIMIT:
                    out["decode"].append(runner.child({**common, "mode": "decode",
                                                       "work": str(base)}))
                    continue
                if name in SHUFFLE_ONLY and (cfg["cache"] == "cold" or cfg["decode"]):
                    continue
                if name not in cfg.get("only", (name,)):
                    continue
                spec = {**common, "mode": "epoch", "system": name, "work": str(work(name)),
                        "num_workers": cfg["num_workers"], "cache": cfg["cache"],
                        "decode": cfg["decode"], "access": cfg.get("access", "stream"),
                        "verify": cfg.get("verify", True)}
                runs = out["systems"][name]["epochs"].setdefault(cfg["name"], [])
                runs.append(runner.child(spec))
    for name in ready:
        if name.startswith("shardio"):
            manifest = json.loads((work(name) / "manifest.json").read_text(encoding="utf-8"))
            out["systems"][name]["num_shards"] = len(manifest["shards"])
    return out


def measure_first(tree: Tree, systems: list[str], runner: Runner,
                  args: argparse.Namespace) -> dict[str, Any]:
    """Warm time to the first batch on every system's pack of ``tree``; raw runs."""
    base = runner.work_root / "first-sample"
    common = tree_spec(tree, args)
    out: dict[str, Any] = {"num_samples": tree.num_files, "systems": {}}
    ready = []
    for name in systems:
        if name in SHUFFLE_ONLY or get_adapter(name).missing():
            continue
        work = base / name
        shutil.rmtree(work, ignore_errors=True)
        print(f"[first sample] pack {name}", flush=True)
        if name == BASELINE:
            work.mkdir(parents=True)
            packed: dict[str, Any] = {}
        else:
            packed = runner.child({**common, "mode": "pack", "system": name, "work": str(work)})
        out["systems"][name] = {"pack_error": packed.get("error"), "runs": []}
        if "error" not in packed:
            ready.append(name)
    for rep in range(args.repeats):
        print(f"[first sample] repeat {rep + 1}/{args.repeats}", flush=True)
        for name in rotate(ready, rep):
            out["systems"][name]["runs"].append(runner.child(
                {**common, "mode": "first", "system": name, "work": str(base / name)}))
    shutil.rmtree(base, ignore_errors=True)  # a 10^5-sample pack per system: not kept
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line flags."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small trees, 1 repeat: minutes")
    p.add_argument("--systems", default=",".join(s for s in SYSTEMS if s not in OPT_IN),
                   help="comma-separated subset")
    p.add_argument("--datasets", default=",".join(FULL_SIZES),
                   help="comma-separated subset of " + ", ".join(FULL_SIZES))
    p.add_argument("--images", type=int, help="JPEG count (default 8000; quick 1000)")
    p.add_argument("--tiny", type=int, help="tiny-file count (default 100000; quick 10000)")
    p.add_argument("--fields", type=int, help="multi-field samples (default 100000; quick 10000)")
    p.add_argument("--mixed", type=int, help="mixed-size files (default 20000; quick 4000)")
    p.add_argument("--first-sample", type=int, default=FIRST_SAMPLES,
                   help=f"samples of the tiny tree timed to the first batch (default "
                   f"{FIRST_SAMPLES}, quick too; 0 skips)")
    p.add_argument("--repeats", type=int, help="runs per figure, median reported (default 3)")
    p.add_argument("--workers", default="0,2", help="num_workers values of the raw epochs")
    p.add_argument("--caches", default="warm,cold", help="page-cache states of the raw epochs")
    p.add_argument("--no-decode", dest="decode", action="store_false", help="skip decoded runs")
    p.add_argument("--no-strace", dest="strace", action="store_false", help="skip open counts")
    p.add_argument("--pack-workers", type=int, default=2, help="for writers that take workers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", type=Path, default=DATA_ROOT, help="generated trees cache")
    p.add_argument("--work-dir", type=Path, default=HERE / "work", help="packed copies")
    p.add_argument("--out", type=Path, help="results JSON (default benchmarks/results/…)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per child run")
    p.add_argument("--update-readme", action="store_true", help="rewrite the README table")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {', '.join(SYSTEMS)}")
    args.datasets = [d for d in args.datasets.split(",") if d]
    if unknown := sorted(set(args.datasets) - set(FULL_SIZES)):
        p.error(f"unknown datasets {unknown}; choose from {', '.join(FULL_SIZES)}")
    args.workers = [int(w) for w in args.workers.split(",")]
    args.caches = [c for c in args.caches.split(",") if c]
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    return args


def main(argv: list[str] | None = None) -> Path:
    """Run the comparison; returns the results file."""
    args = parse_args(argv)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    stamp = time.strftime("%Y-%m-%d")
    out = args.out or HERE / "results" / f"{stamp}-{'quick' if args.quick else 'full'}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    snapshot = args.work_dir / "snapshot"
    source = snapshot_shardio(REPO, snapshot)
    runner = Runner(args.work_dir, timeout_s=args.timeout, verbose=args.verbose,
                    snapshot=str(snapshot))
    started = time.time()
    load_before = os.getloadavg()[0]
    raw: dict[str, Any] = {}
    for kind in args.datasets:
        tree = ensure_tree(kind, getattr(args, kind) or sizes[kind], seed=args.seed,
                           data_root=args.data_dir)
        raw[kind] = measure_tree(tree, args.systems, runner, args)
    first = None
    if args.first_sample:
        tree = ensure_tree("tiny", args.first_sample, seed=args.seed, data_root=args.data_dir)
        first = measure_first(tree, args.systems, runner, args)
    command = f"{interpreter()} -m benchmarks.run" + (" --quick" if args.quick else "")
    results = summarize(raw, first=first, meta={
        "schema": 1, "date": time.strftime("%Y-%m-%d %H:%M"), "command": command,
        "argv": sys.argv[1:] if argv is None else argv, "quick": args.quick,
        "repeats": args.repeats, "wall_s": round(time.time() - started, 1),
        # other jobs on a shared machine move every figure: what the load was says how much
        "load_avg_1min": {"start": round(load_before, 2), "end": round(os.getloadavg()[0], 2),
                          "median": round(float(np.median(runner.loads or [0.0])), 2),
                          "max": round(max(runner.loads or [0.0]), 2)},
        "machine": describe_machine(args.work_dir), "versions": library_versions(),
        "shardio_source": {**source, "changed_during_run":
                           source_id(REPO / "shardio")["sha256"] != source["sha256"]},
        "config": {"batch_size": 64, "workers": args.workers, "caches": args.caches,
                   "pack_workers": args.pack_workers, "seed": args.seed},
    })
    out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"results: {out}")
    if args.update_readme:
        from benchmarks.readme import write_blocks

        for document in write_blocks():
            print(f"rewrote {document}")
    if not args.verbose:
        shutil.rmtree(runner.logs, ignore_errors=True)
    return out


if __name__ == "__main__":
    main()
