"""Medians, ratios and issue 8's targets from a ``bench_remote`` results file, as markdown.

``python -m benchmarks.remote_report [FILE]`` prints every table of a results file (by
default the committed ``results/remote.json``, else ``remote-quick.json``);
``summary_block`` is the shardio-against-the-best-peer summary the docs' Performance page
shows (``perf-remote``, through ``benchmarks/performance.py``). Ratios compare figures of
the same run; "stored" is the size of the system's own uploaded format, the bytes one
epoch must download at least.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.fetch_ceiling import PARALLEL, RANGE_BYTES

RESULTS = Path(__file__).resolve().parent / "results"
SHARDIO = "shardio-records"
PEERS = ("mosaicml", "litdata", "webdataset")
CONFIGS = ("fits-w0", "fits-w2", "half-w0", "half-w2")


def load_results(path: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The results file ``path``, else the committed full run, else the quick one."""
    if path is None:
        path = RESULTS / "remote.json"
        if not path.exists():
            path = RESULTS / "remote-quick.json"
    return path, json.loads(path.read_text(encoding="utf-8"))


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize_runs(runs: list[dict[str, Any]], stored: int) -> dict[str, Any]:
    """Medians over the runs of one system and configuration (completed epochs only)."""
    def per_epoch(i: int, key: str) -> list[float]:
        return [r["epochs"][i][key] for r in runs if len(r["epochs"]) > i]

    failures = [r["error"] for r in runs if r["error"]]
    return {
        "runs": len(runs), "completed": sum(len(r["epochs"]) == 2 and not r["error"]
                                            for r in runs),
        "failure": failures[0] if failures else None,
        "epoch1": _median(per_epoch(0, "samples_per_s")),
        "first_batch_s": _median(per_epoch(0, "first_batch_s")),
        "down1": _median([b / stored for b in per_epoch(0, "get_bytes")]),
        "epoch2": _median(per_epoch(1, "samples_per_s")),
        "down2": _median([b / stored for b in per_epoch(1, "get_bytes")]),
        "cache_peak": max((r["cache_peak_bytes"] for r in runs), default=0),
        "run_down": max((r.get("run_get_bytes", 0) / stored for r in runs if r["error"]),
                        default=None),
        "budget": runs[0]["budget_bytes"] if runs else None,
        "exactly_once": all(e["exactly_once"] for r in runs for e in r["epochs"]),
        "load": [r["load_1min"][0] for r in runs],
    }


def summarize(results: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """``tree -> system -> config -> summary`` (``summarize_runs``)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for kind, tree in results["trees"].items():
        out[kind] = {}
        for name, entry in tree["systems"].items():
            if entry["status"] != "ok":
                continue
            out[kind][name] = {config: summarize_runs(runs, entry["stored_bytes"])
                               for config, runs in entry["runs"].items()}
    return out


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def _mb(value: float | None) -> str:
    return "–" if value is None else f"{value / 1e6:,.0f}"


def error_line(f: dict[str, Any]) -> str:
    """The line of a recorded error that names it: ``Type: message``, without module paths.

    A DataLoader worker's error arrives wrapped (a ``RuntimeError`` around the worker's
    traceback), so the last ``SomethingError: ...`` line is preferred to the type's own.
    """
    lines = [line.strip() for line in f["message"].splitlines() if line.strip()]
    named = ([line for line in lines if re.match(rf"([\w.]+\.)?{f['type']}: ", line)]
             or [line for line in lines if re.match(r"([\w.]+\.)?\w+(Error|Exception)\w*: ", line)]
             or [line for line in lines if f["type"] in line] or lines or [f["type"]])
    return re.sub(r"^[\w.]+\.(\w+: )", r"\1", named[-1])


def _failure(s: dict[str, Any]) -> str:
    f = s["failure"]
    if f is None:
        return f"{s['completed']}/{s['runs']}"
    first = error_line(f)[:150].replace("|", "/")
    if f["message"].startswith("exit timeout"):
        seconds = re.search(r"after (\d+) s", f["message"])
        first = (f"timed out after {seconds[1] if seconds else '?'} s, "
                 f"{_num(s['run_down'], 1)}x stored downloaded by then")
    minimum = re.search(r"the minimum is (\d+) bytes", f["message"])
    if minimum:
        first = f"{first.split(':')[0]}: the minimum is {int(minimum[1]) / 1e6:,.0f} MB"
    return f"{s['completed']}/{s['runs']}; epoch {f['epoch']}: {first}"


def best_peer(systems: dict[str, dict[str, Any]], config: str) -> tuple[str, float] | None:
    """The peer with the highest median first-epoch samples/s in ``config``."""
    rates = [(systems[p][config]["epoch1"], p) for p in PEERS
             if config in systems.get(p, {}) and systems[p][config]["epoch1"] is not None]
    if not rates:
        return None
    rate, name = max(rates)
    return name, rate


def link_rate(tree: dict[str, Any], name: str, link: dict[str, Any]) -> float | None:
    """Samples/s at which ``name``'s stored bytes fill the link's bandwidth cap: no reader of
    that copy can pass it, whatever its CPU (``None`` without a cap)."""
    if not link.get("bandwidth_mbs"):
        return None
    stored = tree["systems"][name]["stored_bytes"]
    return float(link["bandwidth_mbs"]) * 1e6 * tree["num_files"] / stored


def ceiling_rate(tree: dict[str, Any], name: str) -> tuple[float, int] | None:
    """Samples/s at which the server and the proxy deliver ``name``'s stored copy to curl,
    with no reader (``fetch_ceiling``): the median over repeats of each repeat's faster
    parallelism, and that parallelism's most frequent value; ``None`` where not measured
    (runs before the probe existed)."""
    runs = tree["systems"].get(name, {}).get("ceiling") or []
    per_repeat = [runs[i:i + len(PARALLEL)] for i in range(0, len(runs), len(PARALLEL))]
    best = [min(group, key=lambda r: r["wall_s"]) for group in per_repeat if group]
    if not best:
        return None
    wall = statistics.median(r["wall_s"] for r in best)
    parallel = statistics.mode(r["parallel"] for r in best)
    return tree["num_files"] / wall, parallel


def ceiling_line(tree: dict[str, Any], systems: dict[str, Any]) -> str | None:
    """One sentence: each copy's fetch ceiling, the most any reader of it can reach here."""
    parts = []
    for name in systems:
        rate = ceiling_rate(tree, name)
        if rate is not None:
            parts.append(f"{name} {rate[0]:,.0f} samples/s ({rate[1]} ranges at once)")
    if not parts:
        return None
    counts = " and ".join(map(str, PARALLEL))
    return ("Fetch ceiling (each copy fetched by `curl` through the same link in ranges of "
            f"{RANGE_BYTES >> 20} MiB, nothing reading it; the faster of {counts} ranges at "
            "once, median over repeats): " + "; ".join(parts) + ".")


def link_share(tree: dict[str, Any], name: str, link: dict[str, Any],
               rate: float | None) -> str:
    """How much of the link's cap ``rate`` samples/s of ``name``'s stored bytes use."""
    bound = link_rate(tree, name, link)
    return "–" if bound is None or rate is None else f"{rate / bound:.0%}"


def target_rows(systems: dict[str, dict[str, Any]], tree: dict[str, Any] | None = None,
                link: dict[str, Any] | None = None) -> list[list[str]]:
    """Issue 8's targets for shardio-records: ``[target, config, value, needs, met, note]``.

    The note of a first-epoch ratio says the most the link's cap allows shardio's copy
    (``link_rate``) and the most the server and proxy deliver of it with no reader
    (``ceiling_rate``), each as a ratio to the same peer: a target above either is out of
    any reader's reach here, and the share reached says how close shardio came."""
    rows: list[list[str]] = []
    own = systems.get(SHARDIO, {})
    for config in ("fits-w0", "fits-w2"):
        s = own.get(config)
        if s is None:
            continue
        best = best_peer(systems, config)
        if best and s["epoch1"]:
            ratio = s["epoch1"] / best[1]
            bound = None if tree is None or link is None else link_rate(tree, SHARDIO, link)
            notes = [] if bound is None else [
                f"the link allows at most {bound / best[1]:.2f}x ({bound:,.0f} samples/s); "
                f"shardio used {s['epoch1'] / bound:.0%} of it"]
            ceiling = None if tree is None else ceiling_rate(tree, SHARDIO)
            if ceiling is not None:
                notes.append(f"its fetch ceiling allows at most {ceiling[0] / best[1]:.2f}x "
                             f"({ceiling[0]:,.0f} samples/s); shardio reached "
                             f"{s['epoch1'] / ceiling[0]:.0%} of it")
            note = "; ".join(notes)
            rows.append([f"first epoch x best peer ({best[0]})", config, f"{ratio:.2f}",
                         ">= 1.5", "yes" if ratio >= 1.5 else "**NO**", note])
        if s["first_batch_s"] is not None:
            rows.append(["time to first batch, s", config, f"{s['first_batch_s']:.2f}", "< 2",
                         "yes" if s["first_batch_s"] < 2 else "**NO**", ""])
        if s["down1"] is not None:
            rows.append(["downloaded / stored bytes, epoch 1 (budget fits)", config,
                         f"{s['down1']:.2f}", "<= 1.05", "yes" if s["down1"] <= 1.05 else "**NO**",
                         ""])
    for config in ("half-w0", "half-w2"):
        s = own.get(config)
        if s is None or s["budget"] is None:
            continue
        peak = s["cache_peak"]
        rows.append([f"cache peak / budget ({_mb(s['budget'])} MB)", config,
                     f"{peak / s['budget']:.2f}", "<= 1.0",
                     "yes" if peak <= s["budget"] else "**NO**", ""])
        done = s["completed"] == s["runs"]
        rows.append(["epochs complete at this budget", config, f"{s['completed']}/{s['runs']}",
                     "all, or refused at once with the minimum",
                     "yes" if done else ("refused (budget < in flight)" if _refused(s)
                                         else "**NO**"), ""])
    return rows


def render(path: Path, results: dict[str, Any]) -> str:
    """The markdown of one results file: the setting, one table per tree, the targets."""
    summary = summarize(results)
    machine, link = results["machine"], results["link"]
    loads = [v for tree in summary.values() for cfgs in tree.values() for s in cfgs.values()
             for v in s["load"]]
    cap = (f"{link['bandwidth_mbs']:.0f} MB/s shared by all responses" if link["bandwidth_mbs"]
           else "no bandwidth cap")
    lines = [
        f"{'Quick' if results['quick'] else 'Full'} run of {results['date']} "
        f"(`benchmarks/results/{path.name}`, `{results['command']}`, "
        f"{results['wall_s'] / 60:.0f} min): median of {results['repeats']} interleaved "
        f"repeat(s), batch size 64, raw bytes, two epochs per fresh process. Link: "
        f"{link['latency_ms']:.0f} ms per request, {cap}; "
        f"server s3rver {results['versions'].get('s3rver')} on 127.0.0.1; "
        f"shardio as committed at {results['shardio_source'].get('git_head')}. "
        f"Machine: {machine['cores']} cores ({machine['cpu'].split()[0]} "
        f"{' '.join(machine['cpu'].split()[1:3])}), {machine['ram_gib']} GiB RAM, shared "
        f"with other jobs: 1-minute load average at the start of each run median "
        f"{_num(_median(loads), 1)} ({_num(min(loads, default=None), 1)}–"
        f"{_num(max(loads, default=None), 1)}). Budgets: *fits* = none given (each "
        f"system's default: room for all), *half* = half the source bytes; WebDataset "
        f"streams without a cache and has no budget.",
        "",
    ]
    for kind, systems in summary.items():
        tree = results["trees"][kind]
        lines += [f"**{kind}**: {tree['num_files']:,} files, {tree['num_bytes'] / 1e6:,.0f} MB "
                  "(stored: " + ", ".join(
                      f"{n} {_mb(tree['systems'][n]['stored_bytes'])} MB"
                      for n in systems) + ")", ""]
        lines += ["| system | config | epoch 1 samples/s | share of the link, epoch 1 | "
                  "first batch s | downloaded / stored, "
                  "epoch 1 | epoch 2 samples/s | downloaded / stored, epoch 2 | cache peak MB "
                  "(budget) | exactly once | runs complete |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for config in CONFIGS:
            best = best_peer(systems, config)
            for name, configs in systems.items():
                s = configs.get(config)
                if s is None:
                    continue
                rate = _num(s["epoch1"])
                if name == SHARDIO and best and s["epoch1"]:
                    rate += f" ({s['epoch1'] / best[1]:.2f}x {best[0]})"
                budget = "" if s["budget"] is None else f" ({_mb(s['budget'])})"
                lines.append(
                    f"| {name} | {config} | {rate} | {link_share(tree, name, link, s['epoch1'])} | "
                    f"{_num(s['first_batch_s'], 2)} | "
                    f"{_num(s['down1'], 2)} | {_num(s['epoch2'])} | {_num(s['down2'], 2)} | "
                    f"{_mb(s['cache_peak'])}{budget} | {'yes' if s['exactly_once'] else 'NO'} | "
                    f"{_failure(s)} |")
        lines.append("")
        ceiling = ceiling_line(tree, systems)
        if ceiling:
            lines += [ceiling, ""]
        rows = target_rows(systems, tree, link)
        if rows:
            lines += [f"Issue 8's targets for {SHARDIO} ({kind}):", "",
                      "| target | config | value | needs | met | note |",
                      "|---|---|---|---|---|---|"]
            lines += ["| " + " | ".join(row) + " |" for row in rows]
            lines.append("")
        elif SHARDIO not in systems:
            reason = tree["systems"].get(SHARDIO, {}).get("reason") or "not in this run"
            lines += [f"{SHARDIO}: not measured ({reason}).", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _half_outcome(s: dict[str, Any] | None) -> str:
    if s is None:
        return "–"
    if s["completed"] == s["runs"]:
        return (f"{_num(s['epoch2'])} samples/s, {_num(s['down2'], 2)}x downloaded, cache peak "
                f"{_mb(s['cache_peak'])} MB of {_mb(s['budget'])}")
    f = s["failure"] or {}
    if _refused(s):
        minimum = re.search(r"the minimum is (\d+) bytes", f.get("message", ""))
        return "refused at once" + (f": needs {int(minimum[1]) / 1e6:,.0f} MB" if minimum else
                                    " (budget below its minimum)")
    if f.get("message", "").startswith("exit timeout"):
        return (f"did not finish ({f['message'].split(':')[0].removeprefix('exit ')}; "
                f"{_num(s['run_down'], 1)}x stored downloaded by then, cache peak "
                f"{_mb(s['cache_peak'])} MB of {_mb(s['budget'])})")
    kind = error_line(f).split(":")[0] if f else "?"
    return f"failed ({kind}) in {s['runs'] - s['completed']} of {s['runs']} runs"


def _refused(s: dict[str, Any]) -> bool:
    """Every run stopped before its first epoch with an error about the cache budget."""
    f = s["failure"]
    return (f is not None and not s["completed"] and f["epoch"] == 1
            and "cache" in f["message"].lower() and f["type"] in ("CacheBudgetError", "ValueError"))


def summary_rows(systems: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The main README's rows for one tree: ``[what, shardio, best peer]``."""
    own = systems.get(SHARDIO, {})
    rows = []
    for workers in (0, 2):
        config = f"fits-w{workers}"
        s, best = own.get(config), best_peer(systems, config)
        mine = _num(s["epoch1"]) if s else "–"
        if s and s["epoch1"] and best:
            mine += f" ({s['epoch1'] / best[1]:.2f}x {best[0]})"
        rows.append([f"first epoch, samples/s, {workers} workers", mine,
                     f"{_num(best[1])} ({best[0]})" if best else "–"])
    for workers in (0, 2):
        config = f"fits-w{workers}"
        s = own.get(config)
        peers = [(systems[p][config]["first_batch_s"], p) for p in PEERS
                 if config in systems.get(p, {}) and systems[p][config]["first_batch_s"]]
        fastest = min(peers, default=None)
        rows.append([f"first batch, s, {workers} workers", _num(s and s["first_batch_s"], 2),
                     f"{fastest[0]:.2f} ({fastest[1]})" if fastest else "–"])
    for workers in (0, 2):
        config = f"fits-w{workers}"
        s = own.get(config)
        peers = [(systems[p][config]["down1"], p) for p in PEERS
                 if config in systems.get(p, {}) and systems[p][config]["down1"]]
        least = min(peers, default=None)
        rows.append([f"downloaded / stored bytes, epoch 1, {workers} workers",
                     _num(s and s["down1"], 2), f"{least[0]:.2f} ({least[1]})" if least else "–"])
    for workers in (0, 2):
        config = f"half-w{workers}"
        peers = [f"{p}: {_half_outcome(systems[p][config])}" for p in PEERS
                 if config in systems.get(p, {})]
        rows.append([f"epoch 2 with a budget of half the data, {workers} workers",
                     _half_outcome(own.get(config)), "; ".join(peers) or "–"])
    return rows


def summary_block() -> str:
    """The ``bench-remote-summary`` block of the main README: shardio against the best peer."""
    path, results = load_results()
    link = results["link"]
    lines = [
        f"Streaming from S3 ({'quick' if results['quick'] else 'full'} run of "
        f"{results['date']}, `benchmarks/results/{path.name}`): s3rver on 127.0.0.1 behind "
        f"{link['latency_ms']:.0f} ms per request and {link['bandwidth_mbs']:.0f} MB/s, "
        f"{results['machine']['cores']} shared cores; medians of {results['repeats']} "
        "repeat(s); method and full tables in "
        "[benchmarks/README.md](benchmarks/README.md#remote-reading-bench_remotepy).",
        "",
    ]
    for kind, systems in summarize(results).items():
        tree = results["trees"][kind]
        lines += [f"| {kind}: {tree['num_files']:,} files, {tree['num_bytes'] / 1e6:,.0f} MB "
                  "| shardio (records) | best peer |", "|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in summary_rows(systems)]
        lines.append("")
    if UNCAPPED.exists():
        lines += [uncapped_line(json.loads(UNCAPPED.read_text(encoding="utf-8"))), ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def uncapped_line(results: dict[str, Any]) -> str:
    """One sentence for the main README: the first epoch without the bandwidth cap, where
    the capped link's bound hides what each reader costs."""
    parts = []
    for kind, systems in summarize(results).items():
        for config in ("fits-w0", "fits-w2"):
            own, best = systems.get(SHARDIO, {}).get(config), best_peer(systems, config)
            if own and own["epoch1"] and best:
                parts.append(f"{kind}, {config[-1]} workers: {_num(own['epoch1'])} samples/s, "
                             f"{own['epoch1'] / best[1]:.2f}x {best[0]}")
    return (f"Without the bandwidth cap ({results['link']['latency_ms']:.0f} ms per request "
            f"only, run of {results['date']}, `benchmarks/results/{UNCAPPED.name}`), shardio's "
            "first epoch: " + "; ".join(parts) + ". There each reader's CPU per request and "
            "per byte decides, on cores shared with the server and the proxy.")


UNCAPPED = RESULTS / "remote-uncapped.json"
"""The same comparison with no bandwidth cap (latency only), budgets that fit."""


if __name__ == "__main__":
    file = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    print(render(*load_results(file)), end="")


def first_batch_block() -> str:
    """The ``remote-first-batch`` block of docs/remote.md: from the quick run, shardio's
    first batch, first epoch and bytes downloaded beside WebDataset's, per configuration."""
    path = RESULTS / "remote-quick.json"
    results = json.loads(path.read_text(encoding="utf-8"))
    link = results["link"]
    lines = [f"`benchmarks/results/{path.name}` ({results['date']}, `python -m "
             "benchmarks.bench_remote --quick`): s3rver behind "
             f"{link['latency_ms']:.0f} ms a request and {link['bandwidth_mbs']:.0f} MB/s.", ""]
    for kind, systems in summarize(results).items():
        ours, wds = systems.get(SHARDIO, {}), systems.get("webdataset", {})
        lines += [f"| {kind} | first batch, s | WebDataset's | first epoch, samples/s | "
                  "WebDataset's | downloaded / stored |", "|---|---|---|---|---|---|"]
        for config in CONFIGS:
            s, w = ours.get(config), wds.get(config)
            if s is None:
                continue
            lines.append(f"| {config} | {_num(s['first_batch_s'], 2)} | "
                         f"{_num(w and w['first_batch_s'], 2)} | {_num(s['epoch1'])} | "
                         f"{_num(w and w['epoch1'])} | {_num(s['down1'], 2)} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"
