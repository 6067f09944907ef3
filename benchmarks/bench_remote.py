"""Remote reading: shardio against MosaicML Streaming, LitData and WebDataset from one S3 server.

**Question:** streaming a dataset from object storage behind a realistic link (latency
per request, a bandwidth cap), how fast is each system's first epoch, how soon does the
first batch come, how many bytes does it download per epoch against the dataset's, how
large does its cache grow, and what happens in a second epoch when the cache budget is
half the dataset?

``python -m benchmarks.bench_remote [--quick] [--datasets images,tiny] [--repeats N]``:
every system packs the generated tree into its own format (the local adapters), the
packs are uploaded to s3rver (``remote_servers``; a disk-backed S3 server on
127.0.0.1), and each measurement is a fresh process (``remote_child``) reading through
the storage tests' proxy (``storage_proxy``) with ``--latency-ms`` per request and
``--bandwidth-mbs`` shared by all response bodies, which counts the GET bytes. Two
epochs per process, through one loader; a fresh, empty cache folder each time, its size
sampled every 50 ms by this process. Budgets: ``fits`` (no budget given: each system's
default, room for everything) and ``half`` (half the source bytes, given to the systems
that have a setting). Each repeat visits the systems in a rotated order, with the
1-minute load average recorded per measurement. Results go to
``benchmarks/results/remote.json`` (``remote-quick.json`` with ``--quick``);
``remote_report`` summarizes them and renders the README block.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import SNAPSHOT_ENV
from benchmarks.adapters import get_adapter
from benchmarks.adapters.remote import READERS, get_reader
from benchmarks.datagen import DATA_ROOT, Tree, ensure_tree
from benchmarks.fetch_ceiling import PARALLEL, fetch_ceiling
from benchmarks.machine import describe_machine, library_versions, source_id
from benchmarks.remote_servers import (
    BUCKET,
    S3RVER_VERSION,
    FolderSampler,
    S3rver,
    remove_mosaicml_shm,
    s3_client,
    s3_environment,
    upload_folder,
)
from benchmarks.resultsfile import write_results
from benchmarks.run import Runner, expected_crcs, interpreter, rotate
from benchmarks.storage_proxy import FaultPlan, FaultProxy

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FULL_SIZES = {"images": 8000, "tiny": 100_000}
QUICK_SIZES = {"images": 2000, "tiny": 20_000}
SYSTEMS = ("shardio-records", "mosaicml", "litdata", "webdataset")
"""Measured by default; ``shardio-lmdb`` may be added with ``--systems``."""
BUDGETS = ("fits", "half")


def snapshot_head(repo: Path, dest: Path) -> dict[str, Any]:
    """Extract ``shardio/`` of the committed HEAD into ``dest`` (what the children import).

    Not the working tree: other engineers edit it while a run goes on, and a half-made
    edit there once broke every pack of a run. Returns the commit and the copy's hash.
    """
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", "HEAD", "shardio"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
    return {"git_head": head, "from": "HEAD (committed files only)",
            "snapshot_sha256": source_id(dest / "shardio")["sha256"]}


def pack_and_upload(tree: Tree, name: str, work: Path, runner: Runner, client: Any,
                    args: argparse.Namespace) -> dict[str, Any]:
    """Pack ``tree`` with system ``name`` and upload it (peers' packs are kept in ``work``)."""
    folder = work / name
    marker = work / f"{name}.packed.json"
    if not marker.exists() or name.startswith("shardio"):  # shardio: as the snapshot packs
        shutil.rmtree(folder, ignore_errors=True)
        common = {"tree": tree_spec(tree), "seed": args.seed, "pack_workers": 2}
        res = runner.child({**common, "mode": "pack", "system": name, "work": str(folder)})
        if "error" in res:
            return {"error": f"pack: {res['error']}"}
        marker.write_text(json.dumps(res), encoding="utf-8")
    prefix = f"{tree.root.name}/{name}"
    stored = upload_folder(client, folder, prefix)
    sizes = {p.relative_to(folder).as_posix(): p.stat().st_size
             for p in sorted(folder.rglob("*")) if p.is_file()}
    return {"prefix": prefix, "files": sorted(sizes), "sizes": sizes, "stored_bytes": stored}


def tree_spec(tree: Tree) -> dict[str, Any]:
    """The tree as a child's spec names it."""
    return {"kind": tree.kind, "root": str(tree.root), "num_files": tree.num_files,
            "num_bytes": tree.num_bytes, "num_classes": tree.num_classes}


def measure(spec: dict[str, Any], *, cache: Path, env: dict[str, str], logs: Path, tag: str,
            timeout_s: float, server: S3rver, proxy: FaultProxy) -> dict[str, Any]:
    """Run one ``remote_child`` with a sampled cache folder; its result plus what was seen.

    ``run_get_bytes`` (GET bytes over the whole run, read here) says what a run that
    timed out had downloaded by then.
    """
    import psutil

    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    spec_path, result_path = logs / f"{tag}.spec.json", logs / f"{tag}.result.json"
    result_path.unlink(missing_ok=True)  # never read an earlier run's result
    spec = {**spec, "result": str(result_path)}
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    server_cpu = sum(psutil.Process(server.pid).cpu_times()[:2])
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    sent = proxy.plan.counters()["get_bytes"]
    with FolderSampler(cache) as sampler, open(logs / f"{tag}.log", "wb") as log:
        # its own session, so that a run killed on timeout takes its DataLoader workers along
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.remote_child", str(spec_path)],
                                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code: int | str = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = f"timeout after {timeout_s:.0f} s"
        with contextlib.suppress(ProcessLookupError):  # the run's workers, if any are left
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    remove_mosaicml_shm(cache)
    out_bytes = proxy.plan.counters()["get_bytes"] - sent
    own2 = resource.getrusage(resource.RUSAGE_SELF)
    kids2 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out: dict[str, Any] = {"epochs": [], "error": None}
    if result_path.exists():
        out = json.loads(result_path.read_text(encoding="utf-8"))
    out["exit"] = code
    out["run_get_bytes"] = out_bytes
    if code != 0 or not result_path.exists():
        tail = (logs / f"{tag}.log").read_text(errors="replace").strip().splitlines()[-3:]
        out["error"] = out["error"] or {"epoch": len(out["epochs"]) + 1, "type": "exit",
                                        "message": f"exit {code}: " + " | ".join(tail)}
    if out["error"]:  # no path of this machine in the results
        out["error"]["message"] = out["error"]["message"].replace(f"{REPO}/", "")
    for epoch in out["epochs"]:
        epoch["cache_peak_bytes"] = sampler.peak(epoch["wall_start"], epoch["wall_end"])
        del epoch["wall_start"], epoch["wall_end"]
    out["cache_peak_bytes"] = sampler.peak()
    out["cache_samples"] = len(sampler.samples)
    out["load_1min"] = [round(load, 2), round(os.getloadavg()[0], 2)]
    out["cpu_s"] = {  # readers (child + its workers), the link (this process), the S3 server
        "readers": round(kids2.ru_utime + kids2.ru_stime - kids.ru_utime - kids.ru_stime, 2),
        "proxy": round(own2.ru_utime + own2.ru_stime - own.ru_utime - own.ru_stime, 2),
        "server": round(sum(psutil.Process(server.pid).cpu_times()[:2]) - server_cpu, 2)}
    shutil.rmtree(cache, ignore_errors=True)
    return out


def measure_ceiling(base_url: str, sizes: dict[str, int], server: S3rver) -> list[dict[str, Any]]:
    """``fetch_ceiling`` at each of its parallelisms, with the CPU the server, the proxy
    (this process) and curl spent and the 1-minute load average before."""
    import psutil

    out = []
    for parallel in PARALLEL:
        server_cpu = sum(psutil.Process(server.pid).cpu_times()[:2])
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        load = os.getloadavg()[0]
        res = fetch_ceiling(base_url, sizes, parallel)
        own2 = resource.getrusage(resource.RUSAGE_SELF)
        kids2 = resource.getrusage(resource.RUSAGE_CHILDREN)
        res["load_1min"] = round(load, 2)
        res["cpu_s"] = {
            "curl": round(kids2.ru_utime + kids2.ru_stime - kids.ru_utime - kids.ru_stime, 2),
            "proxy": round(own2.ru_utime + own2.ru_stime - own.ru_utime - own.ru_stime, 2),
            "server": round(sum(psutil.Process(server.pid).cpu_times()[:2]) - server_cpu, 2)}
        out.append(res)
    return out


def measure_tree(tree: Tree, args: argparse.Namespace, runner: Runner, server: S3rver,
                 proxy: FaultProxy, env: dict[str, str]) -> dict[str, Any]:
    """Pack, upload, then every (budget, workers) x system, ``args.repeats`` times."""
    work = args.work_dir / tree.root.name
    work.mkdir(parents=True, exist_ok=True)
    client = s3_client(server.url)
    crc = expected_crcs(tree, work / "expected-crc.npy")
    out: dict[str, Any] = {"num_files": tree.num_files, "num_bytes": tree.num_bytes,
                           "systems": {}}
    ready = []
    for name in args.systems:
        reason = get_reader(name).missing() or get_adapter(name).missing()
        entry: dict[str, Any] = {"status": "skipped" if reason else "ok", "reason": reason,
                                 "runs": {}}
        out["systems"][name] = entry
        if reason is None:
            print(f"[{tree.kind}] pack and upload {name}", flush=True)
            upload = pack_and_upload(tree, name, work / "packs", runner, client, args)
            if "error" in upload:
                entry.update(status="failed", reason=upload["error"])
                continue
            entry["stored_bytes"] = upload["stored_bytes"]
            entry["num_files"] = len(upload["files"])
            entry["upload"] = upload
            ready.append(name)
        else:
            print(f"[{tree.kind}] skip {name}: {reason}", flush=True)
    budgets = {"fits": None, "half": tree.num_bytes // 2}
    timeout_s = args.timeout or run_timeout(out, args.bandwidth_mbs)
    timed_out: set[tuple[str, str]] = set()
    for rep in range(args.repeats):
        for name in rotate(ready, rep):  # what the link and server allow each copy, no reader
            upload = out["systems"][name]["upload"]
            print(f"[{tree.kind}] fetch ceiling of {name}, repeat {rep + 1}", flush=True)
            out["systems"][name].setdefault("ceiling", []).extend(measure_ceiling(
                f"{proxy.url}/{BUCKET}/{upload['prefix']}", upload["sizes"], server))
        for budget in args.budgets:
            for workers in args.workers:
                config = f"{budget}-w{workers}"
                print(f"[{tree.kind}] {config}, repeat {rep + 1}/{args.repeats}", flush=True)
                for name in rotate(ready, rep):
                    if budget != "fits" and not get_reader(name).has_budget:
                        continue
                    if (name, config) in timed_out:  # once is enough to know; saves the time
                        continue
                    upload = out["systems"][name]["upload"]
                    tag = f"{tree.kind}-{name}-{config}-r{rep}"  # its own cache folder too
                    remote = {"url": f"s3://{BUCKET}/{upload['prefix']}",
                              "http_url": f"{proxy.url}/{BUCKET}/{upload['prefix']}",
                              "files": upload["files"],
                              "cache_dir": str(args.work_dir / "cache" / tag),
                              "max_cache_bytes": budgets[budget], "fork_fix": args.fork_fix}
                    spec = {"system": name, "tree": tree_spec(tree), "remote": remote,
                            "num_workers": workers, "num_epochs": 2, "seed": args.seed + rep,
                            "expected_crc": str(crc), "proxy_url": proxy.url}
                    res = measure(spec, cache=args.work_dir / "cache" / tag, env=env,
                                  logs=runner.logs,
                                  tag=tag, timeout_s=timeout_s, server=server, proxy=proxy)
                    res["budget_bytes"] = budgets[budget]
                    if isinstance(res["exit"], str):
                        timed_out.add((name, config))
                    if args.verbose:
                        brief = [(round(e["samples_per_s"]), round(e["get_bytes"] / 1e6))
                                 for e in res["epochs"]]
                        print(f"  {tag}: {brief} {res['error'] or ''}", flush=True)
                    out["systems"][name]["runs"].setdefault(config, []).append(res)
    for entry in out["systems"].values():
        entry.pop("upload", None)
    return out


def remote_versions() -> dict[str, str | None]:
    """The S3 server's version and those of the clients the readers use."""
    out: dict[str, str | None] = {"s3rver": S3RVER_VERSION}
    for name in ("fsspec", "s3fs", "boto3", "botocore", "obstore"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def run_timeout(tree: dict[str, Any], bandwidth_mbs: float) -> float:
    """Seconds a run may take: 60 s plus 15x its two epochs at the link's rate (largest pack)."""
    largest = max((e.get("stored_bytes", 0) for e in tree["systems"].values()), default=0)
    return 60 + 15 * 2 * largest / (bandwidth_mbs * 1e6) if bandwidth_mbs else 600


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line flags."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2,000 images / 20,000 tiny, 1 repeat")
    p.add_argument("--datasets", default="images", help="images, tiny or both (comma-separated)")
    p.add_argument("--images", type=int, help="JPEG count (default 8000; quick 2000)")
    p.add_argument("--tiny", type=int, help="tiny-file count (default 100000; quick 20000)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {', '.join(READERS)}")
    p.add_argument("--workers", default="0,2", help="num_workers values")
    p.add_argument("--budgets", default=",".join(BUDGETS), help="fits, half or both")
    p.add_argument("--repeats", type=int, help="runs per figure, median reported (default 3)")
    p.add_argument("--latency-ms", type=float, default=20.0, help="added to every request")
    p.add_argument("--bandwidth-mbs", type=float, default=100.0,
                   help="MB/s shared by all response bodies (0: no cap)")
    p.add_argument("--no-fork-fix", dest="fork_fix", action="store_false",
                   help="leave MosaicML's workers on the parent's S3 connection (as shipped)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", type=Path, default=DATA_ROOT, help="generated trees cache")
    p.add_argument("--work-dir", type=Path, default=HERE / "work" / "remote",
                   help="packs, the S3 server's folder, caches, logs")
    p.add_argument("--out", type=Path, help="results JSON (default results/remote.json)")
    p.add_argument("--timeout", type=float,
                   help="seconds per run (default: 60 + 15x two epochs at the link's rate); a "
                        "system that times out is not run again in that configuration")
    p.add_argument("--update-readme", action="store_true", help="rewrite the generated blocks")
    p.add_argument("-v", "--verbose", action="store_true", help="print each run; keep logs")
    args = p.parse_args(argv)
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(args.systems) - set(READERS))
    if unknown:
        p.error(f"unknown systems {unknown}; choose from {', '.join(READERS)}")
    args.datasets = [d for d in args.datasets.split(",") if d]
    args.workers = [int(w) for w in args.workers.split(",")]
    args.budgets = [b for b in args.budgets.split(",") if b]
    if set(args.budgets) - set(BUDGETS):
        p.error(f"budgets are {', '.join(BUDGETS)}")
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    return args


def replayed(argv: list[str]) -> list[str]:
    """The arguments that made a run's figures, for its ``command``: all but this machine's
    scratch folders and the output switches (``--data-dir``, ``--work-dir``, ``-v``,
    ``--update-readme``)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        name = arg.split("=", 1)[0]
        if skip:
            skip = False
        elif name in ("--data-dir", "--work-dir"):
            skip = "=" not in arg
        elif name not in ("-v", "--verbose", "--update-readme"):
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> Path:
    """Run the comparison; returns the results file."""
    args = parse_args(argv)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    out = args.out or HERE / "results" / ("remote-quick.json" if args.quick else "remote.json")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    snapshot = args.work_dir / "snapshot"
    source = snapshot_head(REPO, snapshot)
    runner = Runner(args.work_dir, timeout_s=args.timeout or 900, verbose=args.verbose,
                    snapshot=str(snapshot))
    started = time.time()
    server = S3rver(args.work_dir / "s3rver", log=runner.logs / "s3rver.log")
    plan = FaultPlan(latency_s=args.latency_ms / 1000, max_bytes_per_s=args.bandwidth_mbs * 1e6)
    proxy = FaultProxy(("127.0.0.1", server.port), plan)
    env = {**os.environ, SNAPSHOT_ENV: str(snapshot), **s3_environment(proxy.url)}
    raw: dict[str, Any] = {}
    try:
        for kind in args.datasets:
            tree = ensure_tree(kind, getattr(args, kind) or sizes[kind], seed=args.seed,
                               data_root=args.data_dir)
            raw[kind] = measure_tree(tree, args, runner, server, proxy, env)
    finally:
        proxy.close()
        server.close()
    command = " ".join([f"{interpreter()} -m benchmarks.bench_remote",
                        *replayed(sys.argv[1:] if argv is None else argv)])
    results = {
        "schema": 1,
        "quick": args.quick, "repeats": args.repeats, "wall_s": round(time.time() - started, 1),
        "link": {"latency_ms": args.latency_ms, "bandwidth_mbs": args.bandwidth_mbs},
        "machine": describe_machine(args.work_dir),
        "versions": {**library_versions(), **remote_versions()},
        "shardio_source": source,
        "config": {"batch_size": 64, "workers": args.workers, "budgets": args.budgets,
                   "epochs_per_run": 2, "seed": args.seed, "server": "s3rver",
                   "mosaicml_fork_fix": args.fork_fix},
        "trees": raw,
    }
    write_results(out, results, command=command, sort_keys=True)
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
