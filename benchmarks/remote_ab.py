"""Remote reading, shardio at two commits: the same cold epochs through the same link, interleaved.

**Question:** did a change to the remote read path make shardio's first remote epoch
faster, and its first batch sooner, measured in one session (one load, one link)
rather than across two full ``bench_remote`` runs hours apart?

``python -m benchmarks.remote_ab --revs df57165,HEAD [--datasets images,tiny]
[--workers 0,2] [--budgets fits] [--repeats 2]`` extracts ``shardio/`` of each commit
(``git archive``, committed files only), packs each tree once with the newest of them
into ``bench_remote``'s work folder, uploads it to s3rver, and measures exactly as
``bench_remote`` does (``measure``: a fresh ``remote_child`` process, a fresh cache
folder, the storage proxy with 20 ms a request and 100 MB/s shared), visiting the commits
in turn for every (repeat, budget, workers), so drift on a shared machine falls on both.
Prints one line per run and, with ``--out``, writes them as JSON. Only
``shardio-records`` is read; ratios to the peers come from ``bench_remote``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from benchmarks import SNAPSHOT_ENV
from benchmarks.bench_remote import FULL_SIZES, REPO, measure, pack_and_upload, tree_spec
from benchmarks.datagen import DATA_ROOT, ensure_tree
from benchmarks.remote_servers import BUCKET, S3rver, s3_client, s3_environment
from benchmarks.resultsfile import write_results
from benchmarks.run import Runner, expected_crcs
from benchmarks.storage_proxy import FaultPlan, FaultProxy

HERE = Path(__file__).resolve().parent
SYSTEM = "shardio-records"


def extract(rev: str, dest: Path) -> str:
    """``shardio/`` of commit ``rev`` into ``dest``; returns the commit's short hash."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "shardio"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", rev],
                          capture_output=True, text=True, check=True).stdout.strip()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--revs", required=True, help="two or more commits, comma-separated")
    p.add_argument("--datasets", default="images,tiny")
    p.add_argument("--workers", default="0,2")
    p.add_argument("--budgets", default="fits", help="fits, half or both")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--bandwidth-mbs", type=float, default=100.0)
    p.add_argument("--work-dir", type=Path, default=HERE / "work" / "remote")
    p.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = p.parse_args(argv)

    revs = [r for r in args.revs.split(",") if r]
    snapshots = {rev: args.work_dir / "ab" / f"snapshot-{n}" for n, rev in enumerate(revs)}
    commits = {rev: extract(rev, folder) for rev, folder in snapshots.items()}
    newest = snapshots[revs[-1]]
    runner = Runner(args.work_dir, timeout_s=900, verbose=True, snapshot=str(newest))
    server = S3rver(args.work_dir / "s3rver", log=runner.logs / "s3rver.log")
    plan = FaultPlan(latency_s=args.latency_ms / 1000, max_bytes_per_s=args.bandwidth_mbs * 1e6)
    proxy = FaultProxy(("127.0.0.1", server.port), plan)
    env = {**os.environ, **s3_environment(proxy.url)}
    rows: list[dict[str, Any]] = []
    pack_args = argparse.Namespace(seed=0)
    try:
        for kind in args.datasets.split(","):
            tree = ensure_tree(kind, FULL_SIZES[kind], seed=0, data_root=DATA_ROOT)
            work = args.work_dir / tree.root.name
            work.mkdir(parents=True, exist_ok=True)
            crc = expected_crcs(tree, work / "expected-crc.npy")
            upload = pack_and_upload(tree, SYSTEM, work / "packs", runner,
                                     s3_client(server.url), pack_args)
            if "error" in upload:
                raise RuntimeError(upload["error"])
            budgets = {"fits": None, "half": tree.num_bytes // 2}
            for rep in range(args.repeats):
                for budget in args.budgets.split(","):
                    for workers in (int(w) for w in args.workers.split(",")):
                        for rev in revs:
                            tag = f"ab-{kind}-{budget}-w{workers}-{rev}"
                            cache = args.work_dir / "cache" / tag
                            remote = {"url": f"s3://{BUCKET}/{upload['prefix']}",
                                      "http_url": f"{proxy.url}/{BUCKET}/{upload['prefix']}",
                                      "files": upload["files"], "cache_dir": str(cache),
                                      "max_cache_bytes": budgets[budget], "fork_fix": True}
                            spec = {"system": SYSTEM, "tree": tree_spec(tree), "remote": remote,
                                    "num_workers": workers, "num_epochs": 1, "seed": rep,
                                    "expected_crc": str(crc), "proxy_url": proxy.url}
                            res = measure(spec, cache=cache,
                                          env={**env, SNAPSHOT_ENV: str(snapshots[rev])},
                                          logs=runner.logs, tag=tag, timeout_s=300,
                                          server=server, proxy=proxy)
                            row = {"rev": rev, "commit": commits[rev], "tree": kind,
                                   "budget": budget, "workers": workers, "repeat": rep,
                                   "load_1min": res["load_1min"], "error": res["error"]}
                            if res["epochs"]:
                                epoch = res["epochs"][0]
                                row.update(samples_per_s=round(epoch["samples_per_s"]),
                                           first_batch_s=round(epoch["first_batch_s"], 2),
                                           downloaded=round(epoch["get_bytes"]
                                                            / upload["stored_bytes"], 3),
                                           exactly_once=epoch["exactly_once"])
                            rows.append(row)
                            print(f"{commits[rev]:>8} {kind:<6} {budget}-w{workers}: "
                                  f"{row.get('samples_per_s', '-')} samples/s, first batch "
                                  f"{row.get('first_batch_s', '-')} s, downloaded "
                                  f"{row.get('downloaded', '-')}x, load {row['load_1min']}"
                                  f"{'  ' + str(row['error']) if row['error'] else ''}",
                                  flush=True)
    finally:
        proxy.close()
        server.close()
    if args.out is not None:
        write_results(args.out, {
            "revs": commits,
            "link": {"latency_ms": args.latency_ms, "bandwidth_mbs": args.bandwidth_mbs},
            "rows": rows})


def ab_block(path: Path | None = None) -> str:
    """The docs table of a committed A/B (``results/remote-ab.json``): medians and ranges."""
    result = json.loads((path or HERE / "results" / "remote-ab.json").read_text(
        encoding="utf-8"))
    groups: dict[tuple[str, str, int, str], list[dict[str, Any]]] = {}
    for row in result["rows"]:
        if row.get("error") is None:
            key = (row["tree"], row["budget"], row["workers"], row["commit"])
            groups.setdefault(key, []).append(row)
    repeats = max((len(rows) for rows in groups.values()), default=0)
    cap = result["link"]["bandwidth_mbs"]
    link = f"{cap:.0f} MB/s" if cap else "no bandwidth cap"
    lines = [f"Measured {result['date']}, {result['link']['latency_ms']:.0f} ms a request and "
             f"{link}, medians of {repeats} (range):", "",
             "| tree | budget | workers | commit | samples/s | first batch | downloaded | load |",
             "|---|---|---|---|---|---|---|---|"]
    for (tree, budget, workers, commit), rows in groups.items():
        rate = sorted(r["samples_per_s"] for r in rows)
        first = sorted(r["first_batch_s"] for r in rows)
        load = [x for r in rows for x in r["load_1min"]]
        lines.append(
            f"| {tree} | {budget} | {workers} | {commit} | {_median(rate):,.0f} "
            f"({rate[0]:,.0f}–{rate[-1]:,.0f}) | {_median(first):.2f} s "
            f"({first[0]:.2f}–{first[-1]:.2f}) | {_median([r['downloaded'] for r in rows]):.2f}× "
            f"| {min(load):.1f}–{max(load):.1f} |")
    return "\n".join(lines) + "\n"


def ab_uncapped_block() -> str:
    """The docs table of the committed A/B without a bandwidth cap (``remote-ab-uncapped.json``)."""
    return ab_block(HERE / "results" / "remote-ab-uncapped.json")


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


if __name__ == "__main__":
    main()
