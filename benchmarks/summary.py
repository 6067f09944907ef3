"""Raw runs → medians, ratios to the baseline and the best peer, and the issue's targets.

Every figure is the median over its repeats (runs that failed are left out and counted).
Ratios compare figures of the same run. Targets are checked for each shardio backend
exactly as issue 4 words them, with issue 29's on every tree (random access against the
single LMDB file, the checksums' share of a warm epoch, the warm epoch against the LMDB
file) and on the first-sample tree (10^5 samples, warm); a target that cannot be measured
here says why.
"""

from __future__ import annotations

from typing import Any

from benchmarks.adapters import BASELINE, CHECKED, PEERS
from benchmarks.datagen import SMALL
from benchmarks.probe import median

SHARDIO = ("shardio-records", "shardio-lmdb")
UNSHUFFLED = "shardio-records-unshuffled"
DATALOADER = "shardio-records-dataloader"
"""``shardio-records``' pack read through a plain DataLoader: its reading targets only."""
LMDB = "lmdb-file"
FIRST_SAMPLE_S = 0.1
"""Issue 29: the first sample of a warm local dataset of 10^5 samples within 0.1 s."""


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of every numeric field over the runs without an error; keeps the raw runs."""
    good = [r for r in runs if "error" not in r]
    out: dict[str, Any] = {"runs": runs, "num_ok": len(good)}
    if not good:
        out["error"] = runs[-1]["error"] if runs else "not run"
        return out
    for key, value in good[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = median(r.get(key) for r in good)
        elif value is None:
            out[key] = None
    return out


def _value(system: dict[str, Any], metric: str) -> float | None:
    if metric == "pack":
        v = system.get("pack", {}).get("files_per_s")
    else:
        v = system.get("epochs", {}).get(metric, {}).get("samples_per_s")
    return v if isinstance(v, float | int) else None


def ratios(systems: dict[str, Any], metrics: list[str]) -> dict[str, Any]:
    """For each metric and system: value, × baseline, × best peer (and which peer)."""
    out: dict[str, Any] = {}
    for metric in metrics:
        values = {n: _value(s, metric) for n, s in systems.items()
                  if not (metric == "pack" and n == BASELINE)}
        peers = {n: v for n, v in values.items() if n in PEERS and v}
        best = max(peers, key=lambda n: peers[n]) if peers else None
        base = values.get(BASELINE)
        row = {}
        for name, value in values.items():
            if value is None:
                continue
            row[name] = {
                "value": value,
                "vs_baseline": value / base if base else None,
                "vs_best_peer": value / peers[best] if best else None,
                "best_peer": best,
            }
        out[metric] = row
    return out


def _ratio(ds: dict[str, Any], metric: str, name: str, key: str) -> float | None:
    value: float | None = ds["ratios"].get(metric, {}).get(name, {}).get(key)
    return value


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _shardio_targets(kind: str, ds: dict[str, Any], name: str) -> list[tuple[str, Any, float, str]]:
    """``(target, value, threshold, note)`` for one shardio backend on one tree."""
    own = ds["systems"][name]
    checks = _read_targets(kind, ds, name)
    checks.append(("pack files/s x best peer", _ratio(ds, "pack", name, "vs_best_peer"), 1.5, ""))
    checks.append(("pack files/s x tar", _div(_value(own, "pack"), ds["tar"].get("files_per_s")),
                   0.8, ""))
    sizes = [s["pack"].get("output_bytes") for n, s in ds["systems"].items()
             if n in PEERS and s["status"] == "ok" and s["pack"].get("output_bytes")]
    checks.append(("smallest peer output / own output",
                   _div(min(sizes) if sizes else None, own["pack"].get("output_bytes")), 1.0, ""))
    checks.append(("shuffle quality, shuffled pack",
                   own["epochs"].get("raw-w0-warm", {}).get("shuffle_quality"), 0.99, ""))
    audit = own.get("audit") or {}
    if audit.get("opens") and own.get("num_shards"):
        limit = (own["num_shards"] + 1) * 2 + 1
        worst = max(o["opens"] for o in audit["opens"])
        checks.append(("files opened: limit / worst epoch (2 workers)", limit / max(worst, 1),
                       1.0, f"{worst} opens; limit = (shards + manifest) x 2 workers "
                       f"+ 1 main-process manifest read = {limit}"))
    rss = audit.get("main_rss_mb") or []
    if len(rss) == 2:
        checks.append(("main RSS growth, epoch 1 -> 2: 5 MB minus growth", 5.0 - (rss[1] - rss[0]),
                       0.0, f"{rss[0]:.0f} MB -> {rss[1]:.0f} MB"))
    checks.append(("time to first sample on 1,000,000 samples", None, 1.0,
                   "measured by benchmarks/first_sample.py, see its section"))
    checks.append(("random access x single LMDB file",
                   _div(_value(own, "random-w0-warm"), _value(ds["systems"].get(LMDB, {}),
                                                              "random-w0-warm")), 1.0,
                   "IndexedDataset, random sampler, 0 workers, warm"))
    if name in CHECKED:
        checks.append(("warm epoch with checksums / without (checks' share < 5%)",
                       _div(_value(own, "raw-w0-warm"), _value(own, "raw-w0-warm-nocheck")),
                       0.95, "verify=True vs verify=False, 0 workers"))
    return checks


def _read_targets(kind: str, ds: dict[str, Any], name: str) -> list[tuple[str, Any, float, str]]:
    """The targets of reading a pack (epochs), for one way of reading it on one tree."""
    own = ds["systems"][name]
    checks: list[tuple[str, Any, float, str]] = []
    if kind in SMALL:
        checks.append(("cold epoch x baseline", _ratio(ds, "raw-w0-cold", name, "vs_baseline"),
                       15, ""))
    else:
        cat = own.get("cat_cold", {}).get("samples_per_s")
        checks.append(("cold epoch x cold cat of its shards",
                       _div(_value(own, "raw-w0-cold"), cat), 0.9, ""))
    checks.append(("cold epoch x best peer", _ratio(ds, "raw-w0-cold", name, "vs_best_peer"),
                   1.5, ""))
    checks.append(("warm epoch x best peer", _ratio(ds, "raw-w0-warm", name, "vs_best_peer"),
                   1.5, ""))
    checks.append(("warm epoch x single LMDB file", _div(
        _value(own, "raw-w0-warm"), _value(ds["systems"].get(LMDB, {}), "raw-w0-warm")), 1.5, ""))
    for cache in ("warm", "cold"):
        checks.append((f"{cache} epoch, 2 workers x 0 workers",
                       _div(_value(own, f"raw-w2-{cache}"), _value(own, f"raw-w0-{cache}")),
                       1.0, ""))
    if kind == "images":
        limit = (ds.get("decode_limit") or {}).get("two_core_samples_per_s")
        checks.append(("decoded, 2 workers x decode limit (2 cores)",
                       _div(_value(own, "decoded-w2-warm"), limit), 0.9, ""))
    return checks


def first_sample_targets(first: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 29's time to the first sample, as ``0.1 s / measured`` (met at 1.0 or more)."""
    out = []
    for name in [*SHARDIO, DATALOADER]:
        seconds = first["systems"].get(name, {}).get("first_batch_s")
        value = _div(FIRST_SAMPLE_S, seconds)
        out.append({"dataset": f"tiny, {first['num_samples']:,} samples", "system": name,
                    "target": "time to first batch, warm: 0.1 s / measured", "value": value,
                    "threshold": 1.0, "met": None if value is None else value >= 1.0,
                    "note": "" if seconds is None else f"{seconds:.3f} s, 0 workers"})
    return out


def targets(datasets: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 4's targets, each a ratio measured in the same run, for every shardio backend."""
    out: list[dict[str, Any]] = []
    for kind, ds in datasets.items():
        for name in [*SHARDIO, DATALOADER, UNSHUFFLED]:
            own = ds["systems"].get(name)
            if not own or own["status"] != "ok":
                continue
            if name == UNSHUFFLED:
                checks: list[tuple[str, Any, float, str]] = [(
                    "shuffle quality, class-ordered --no-shuffle pack",
                    own["epochs"].get("raw-w0-warm", {}).get("shuffle_quality"), 0.95, "")]
            elif name == DATALOADER:  # issue 10: the read targets hold through it too
                checks = _read_targets(kind, ds, name)
            else:
                checks = _shardio_targets(kind, ds, name)
            for target, value, threshold, note in checks:
                out.append({"dataset": kind, "system": name, "target": target, "value": value,
                            "threshold": threshold,
                            "met": None if value is None else value >= threshold, "note": note})
    return out


def summarize_first(first: dict[str, Any]) -> dict[str, Any]:
    """Medians of the first-sample runs, and each system's time over the fastest peer's."""
    systems = {n: {**median_of(s["runs"]), "pack_error": s["pack_error"]}
               for n, s in first["systems"].items()}
    peers = {n: s["first_batch_s"] for n, s in systems.items()
             if n in PEERS and s.get("first_batch_s")}
    best = min(peers, key=lambda n: peers[n]) if peers else None
    for s in systems.values():
        s["best_peer"] = best
        s["best_peer_s_over_own"] = _div(peers.get(best or ""), s.get("first_batch_s"))
    return {"num_samples": first["num_samples"], "systems": systems}


def summarize(raw: dict[str, Any], *, meta: dict[str, Any],
              first: dict[str, Any] | None = None) -> dict[str, Any]:
    """The results document: ``meta`` plus per-dataset medians, ratios and target checks."""
    datasets: dict[str, Any] = {}
    for kind, res in raw.items():
        systems: dict[str, Any] = {}
        for name, s in res["systems"].items():
            entry = {k: v for k, v in s.items() if k not in ("pack", "cat_cold", "epochs")}
            entry["pack"] = median_of(s["pack"])
            entry["cat_cold"] = median_of(s["cat_cold"])
            entry["epochs"] = {cfg: median_of(runs) for cfg, runs in s["epochs"].items()}
            systems[name] = entry
        decode = median_of(res["decode"]) if res["decode"] else None
        if decode and "processes_samples_per_s" in decode:
            # measured: 2 processes decoding at once (issue 10's definition of the limit)
            decode["two_core_samples_per_s"] = decode["processes_samples_per_s"]
        elif decode and "per_core_samples_per_s" in decode:  # results files before issue 10
            decode["two_core_samples_per_s"] = 2 * decode["per_core_samples_per_s"]
        ev = median_of(res["eviction"])
        if "cold_s" in ev:
            ev["cold_over_warm_s"] = ev["cold_s"] / ev["warm_s"]
        metrics = [*sorted({cfg for s in systems.values() for cfg in s["epochs"]}), "pack"]
        datasets[kind] = {
            "num_files": res["num_files"], "num_bytes": res["num_bytes"],
            "tar": median_of(res["tar"]), "decode_limit": decode, "eviction": ev,
            "systems": systems, "ratios": ratios(systems, metrics),
        }
    out = {**meta, "datasets": datasets, "targets": targets(datasets)}
    if first is not None:
        out["first_sample"] = summarize_first(first)
        out["targets"] += first_sample_targets(out["first_sample"])
    return out
