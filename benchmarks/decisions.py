"""The figures of ``docs/decisions.md``: one-off experiments whose question is answered.

Each function renders a generated block from a committed results file. The code that
measured it was deleted once the question was answered; ``docs/decisions.md`` names the
commit that measured it, and ``git show <commit>:benchmarks/<module>.py`` has the code.
The questions that stay worth re-asking keep their measuring code (``benchmarks/README.md``).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from benchmarks.bench_handover import load_range, num
from shardio.format.blockfile import DEFAULT_MAX_BLOCK_BYTES

RESULTS = Path(__file__).resolve().parent / "results"
RUN_RECORDS = 64
"""Records per CRC-32C call in ``checksum.json``'s chained column."""
BLOCK_KINDS = {"images": "JPEGs", "tiny": "files of 1-4 KB"}
"""The LMDB check's results files (``lmdbcheck-KIND.json``), with what their files are."""
METRIC, WORKERS_METRIC = "raw-w0-warm", "raw-w2-warm"
"""The harness's warm raw epochs, one process and 2 workers, that the before/after blocks show."""
SHARDIO = {"shardio-records": "shardio.loader", "shardio-records-dataloader": "plain DataLoader"}
TARGET = 1.5


def _load(name: str) -> dict[str, Any]:
    return dict(json.loads((RESULTS / name).read_text(encoding="utf-8")))


def checksum_block() -> str:
    """Checksums per record size, and the checks' share of a warm epoch (format v2)."""
    results = _load("checksum.json")
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


def _ms(value: float) -> str:
    return f"{value:.2f} ms" if value < 1 else f"{value:.1f} ms"


def _count(value: float) -> str:
    """A median count rounded half up (a median of an even number of shards may end in .5)."""
    return f"{math.floor(value + 0.5):,}"


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.2g}%"


def lmdbcheck_block() -> str:
    """The LMDB check's cost per shard open and per epoch, from ``lmdbcheck-*.json``."""
    results = {kind: _load(f"lmdbcheck-{kind}.json") for kind in BLOCK_KINDS}
    loads = sorted(f"{r['machine']['load_1min']:.1f}" for r in results.values())
    dates = sorted({r["date"] for r in results.values()})
    rounds = sorted({r["rounds"] for r in results.values()})
    lines = [
        f"{' and '.join(dates)}, {results['images']['machine']['cpus']}-core machine shared "
        f"with other jobs (1-minute load average {'–'.join(dict.fromkeys([loads[0], loads[-1]]))} "
        f"at the end), Python {results['images']['machine']['python']}, "
        f"{' and '.join(map(str, rounds))} rounds; medians:",
        "",
        "| data (LMDB pack) | pages read / pages per shard | check, warm | cold "
        "| cold, with headers | all shards cold / raw cold epoch | / `StreamingDataset` epoch |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, label in BLOCK_KINDS.items():
        r = results[kind]
        lines.append(
            f"| {int(r['data'].split()[0]):,} {label}, {r['dataset_bytes'] / 1e6:,.0f} MB, "
            f"{r['num_shards']} shards | {_count(r['pages_read_per_shard'])} / "
            f"{_count(r['pages_per_shard'])} | {_ms(r['check_warm_ms_median'])} "
            f"| {_ms(r['check_cold_ms_median'])} "
            f"| {_ms(r['check_cold_ms_median_with_overflow_headers'])} "
            f"| {_percent(r['checks_cold_fraction_of_epoch'])} "
            f"({r['cold_epoch_s_median_with_check']:.2f} s epoch) "
            f"| {_percent(r['checks_cold_fraction_of_streaming_epoch'])} "
            f"({r['streaming_epoch_s']:.1f} s) |")
    lines += ["", *_lmdbcheck_notes(results)]
    return "\n".join(lines) + "\n"


def _lmdbcheck_notes(results: dict[str, dict[str, Any]]) -> list[str]:
    """The figures the table's text needs: epochs with and without the check, opens, pages."""
    def spread(r: dict[str, Any]) -> tuple[float, float]:
        epochs = r["cold_epoch_s_with_check"] + r["cold_epoch_s_without_check"]
        return min(epochs), max(epochs)

    gaps = [abs(r["cold_epoch_s_median_with_check"] - r["cold_epoch_s_median_without_check"])
            < spread(r)[1] - spread(r)[0] for r in results.values()]
    epochs = ", ".join(
        f"{kind} {100 * r['cold_epoch_overhead_fraction']:+.1f}% (epochs "
        f"{spread(r)[0]:.2f}–{spread(r)[1]:.2f} s)" for kind, r in results.items())
    opens = ", ".join(
        f"{kind} {_ms(r['open_warm_ms_median'])} (the check {_ms(r['check_warm_ms_median'])})"
        for kind, r in results.items())
    shards = "; ".join(
        f"{kind} {r['dataset_bytes'] / r['num_shards'] / 1e6:,.0f} MB, "
        f"{_count(r['pages_read_per_shard'])} of {_count(r['pages_per_shard'])}"
        for kind, r in results.items())
    most = [(kind, r) for kind, r in results.items()
            if r["pages_read_per_shard"] >= r["pages_per_shard"] / 2]
    per_record = "".join(
        f" The check reads most of a {kind} shard: {_count(r['entries_per_shard'])} records, "
        f"{r['check_warm_ms_median'] * 1e3 / r['entries_per_shard']:.1f} µs per record per warm "
        "check." for kind, r in most)
    headers = ", ".join(
        f"{kind} {r['check_cold_ms_median_with_overflow_headers'] / r['check_cold_ms_median']:.2g}×"
        for kind, r in results.items())
    lines = [
        f"* Cold epoch with the check against without: {epochs}: "
        + ("less than the run-to-run spread." if all(gaps) else "**more than the spread**."),
        f"* A whole warm open of a shard: {opens}.",
        f"* A shard's size, and the pages the check reads of it: {shards}.{per_record}",
        f"* Reading the overflow headers too, cold: {headers} the check's cost.",
    ]
    decoded = [(kind, r) for kind, r in results.items() if r["decoded_epoch_s"] is not None]
    lines += [f"* With Pillow decoding every JPEG ({kind}): all shards' cold checks are "
              f"{_percent(r['checks_cold_fraction_of_decoded_epoch'])} of the warm epoch "
              f"({r['decoded_epoch_s']:.1f} s)." for kind, r in decoded]
    return lines


def decode_block() -> str:
    """Per decoder: its limit, and shardio's decoded epoch against the limit of the same decoder."""
    res, name = _load("decode.json"), "decode.json"
    med, ratios = res["medians"], res["loader_over_same_decoder_limit"]
    versions = res["decoder_versions"]
    rows = []
    for decoder in ("pillow", "pillow-simd", "simplejpeg", "pyturbojpeg"):
        lim = med.get(f"limit:{decoder}")
        if lim is None:
            continue
        loader = med.get(f"loader:{decoder}", {})
        rows.append(
            f"| {decoder} {versions.get(decoder) or ''} | {num(lim.get('us_per_image'))} | "
            f"{num(lim.get('one_process_per_s'))} | {num(lim.get('two_processes_per_s'))} | "
            f"{num(loader.get('samples_per_s'))} | "
            f"{'**' + format(ratios[decoder], '.2f') + '**' if decoder in ratios else '-'} |")
    return "\n".join([
        f"Run of {res['date']} (`benchmarks/results/{name}`, `{res['command']}`): median of "
        f"{res['repeats']} rotated round(s), {res['images']:,} images (limits: 2,000 of them, "
        f"bytes in memory, no loader). 1-minute load average during the runs: "
        f"{load_range(res['runs'])}.",
        "",
        "| decoder | us/image, 1 process | images/s, 1 process | images/s, 2 processes at once "
        "(the limit) | shardio.loader decoded, 2 workers | / limit of the same decoder |",
        "|---|---|---|---|---|---|",
        *rows,
    ])


def crop_block() -> str:
    """``crop=`` against a full decode then the crop, per image and per epoch."""
    result = _load("crop.json")
    label = {"images": "harness images, 400-500 px", "large": "photos of 1600x1200"}
    lines = [
        f"Measured {result['date']} on {result['machine']['cores']} cores, 1-minute load "
        f"{result['load_avg_1min']:.1f}, shardio at git {result['shardio_source']['git_head']} "
        f"(`{result['command'].strip()}`); medians of {result['repeats']} rounds; images/s "
        f"to 224x224 RandomResizedCrop; `crop=` decoded baseline JPEGs with "
        f"{result.get('crop_decoder', 'Pillow (draft scale)')}:", "",
        "| tree | per image, 1 process: `crop=` | full decode, then crop | ratio | "
        f"epoch, {result['workers']} workers: `shardio.loader(crop=)` | "
        "DataLoader over the files, full decode then crop | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, tree in result["trees"].items():
        per, epoch = tree["per_image"], tree["epoch"]
        lines.append(
            f"| {label.get(name, name)} ({tree['files']:,} files) | {per['crop']:,.0f} | "
            f"{per['full']:,.0f} | {per['crop'] / per['full']:.2f}x | "
            f"{epoch['shardio']:,.0f} | {epoch['folder']:,.0f} | "
            f"{epoch['shardio'] / epoch['folder']:.2f}x |")
    return "\n".join(lines) + "\n"


def s3_request_block() -> str:
    """One paragraph: a ranged GET's CPU and wall time, by get_object and presigned URL."""
    result = _load("s3-request.json")
    ways = result["ways"]
    old, new = ways["get_object"], ways["presigned"]
    return (
        f"Measured {result['date']} on {result['machine']['cores']} cores, 1-minute load "
        f"{result['load_avg_1min']:.1f}, shardio at git {result['shardio_source']['git_head']} "
        f"(`{result['command'].strip()}`), {result['requests']} ranged GETs of 4 KB in a row "
        f"to s3rver on 127.0.0.1, medians of {result['rounds']} rounds: aiobotocore's "
        f"`get_object` {old['cpu_ms']:.2f} ms of CPU a request "
        f"({old['cpu_ms_range'][0]:.2f}-{old['cpu_ms_range'][1]:.2f}), "
        f"{old['wall_ms']:.2f} ms of wall time; by presigned URL {new['cpu_ms']:.2f} ms "
        f"({new['cpu_ms_range'][0]:.2f}-{new['cpu_ms_range'][1]:.2f}), "
        f"{new['wall_ms']:.2f} ms: {old['cpu_ms'] / new['cpu_ms']:.1f}x less CPU a request.\n")


def block_size_block() -> str:
    """The v3 block bounds' random-access bytes and per-sample cost (docs/format.md §8.2)."""
    results = _load("block_size.json")
    tiny, images = (results["trees"][kind] for kind in ("tiny", "images"))
    lines = [f"`python -m benchmarks.bench_block_size`: {tiny['num_samples']:,} tiny files of "
             f"1–4 KB with a label, {images['num_samples']:,} JPEGs of 60–110 KB with a label; "
             "one shard per bound, zstd level 3; min of 5 rounds on the project's 2-core machine:",
             "", "| bound | tiny: records/block | tiny: bytes read per random record | tiny: "
             "random record µs | tiny: sequential µs/sample | images: bytes read per random "
             "record | images: sequential µs/sample |", "|---|---|---|---|---|---|---|"]
    for row, image in zip(tiny["rows"], images["rows"], strict=True):
        bound = row["bound"]
        label = f"{bound >> 20} MiB" if bound >= 1 << 20 else f"{bound >> 10} KiB"
        cells = [label, f"{row['records_per_block']:.0f}",
                 f"{row['random_bytes_per_access']:,.0f}", f"{row['random_us']:.0f}",
                 f"{row['sequential_us_per_sample']:.1f}",
                 f"{image['random_bytes_per_access']:,.0f}",
                 f"{image['sequential_us_per_sample']:.1f}"]
        if bound == DEFAULT_MAX_BLOCK_BYTES:
            cells = [f"**{c}**" for c in cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def block_bound_warm_block() -> str:
    """bench_warm before (128 KiB blocks) and after (512 KiB): µs a sample each way."""
    before, after = _load("warm-block-128k.json"), _load("warm-block-512k.json")
    lines = [f"Before: {before['date']}, `{before['command']}`, shardio at git "
             f"{before['shardio_source']['git_head']}; after: {after['date']}, "
             f"`{after['command']}`, shardio at git {after['shardio_source']['git_head']}; "
             "medians, checks on:", "",
             "| tree | read through | 128 KiB: µs a sample | 512 KiB: µs a sample | after / "
             "before |", "|---|---|---|---|---|"]
    for old, new in zip(before["trees"], after["trees"], strict=True):
        for name, times in old["seconds"].items():
            if not name.endswith("verify=True") or name not in new["seconds"]:
                continue
            a = statistics.median(times) / old["num_files"]
            b = statistics.median(new["seconds"][name]) / new["num_files"]
            lines.append(f"| {old['kind']} ({old['num_files']:,}) | "
                         f"`{name.removesuffix(' verify=True')}` | {1e6 * a:.2f} | "
                         f"{1e6 * b:.2f} | {b / a:.2f} |")
    return "\n".join(lines) + "\n"


def _describe(label: str, results: dict[str, Any]) -> str:
    src = results.get("shardio_source") or {}
    load = results.get("load_avg_1min")
    if isinstance(load, dict):  # newer runs: start, end, median and max of the samples
        load = [load["start"], load["end"]]
    loads = f", 1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end" if (
        load) else ""
    return (f"*{label}*: {results['date']}, shardio at git {src.get('git_head') or '2a934e5'}, "
            f"`python -m benchmarks.run {' '.join(results.get('argv') or [])}`, median of "
            f"{results['repeats']} repeat(s){loads}.")


def warm_block() -> str:
    """Warm raw epochs in one process before (2a934e5) and after format v2's reads."""
    runs = {"before": _load("warm-before.json"), "after": _load("warm-after.json")}
    lines = [_describe(label, res) for label, res in runs.items()]
    lines += ["", "| tree | read through | before: samples/s | x best peer | after: samples/s | "
              "x best peer | x best peer, after / before | target >= 1.5x best peer |",
              "|---|---|---|---|---|---|---|---|"]
    for kind in ("images", "tiny"):
        for system, how in SHARDIO.items():
            cells = []
            ratio_after = None
            values: dict[str, float] = {}
            for label, res in runs.items():
                row = res["datasets"].get(kind, {}).get("ratios", {}).get(METRIC, {}).get(system)
                if row is None:
                    cells += ["-", "-"]
                    continue
                values[label] = row["vs_best_peer"]
                peer = row["best_peer"]
                peer_value = res["datasets"][kind]["ratios"][METRIC][peer]["value"]
                cells += [f"{row['value']:,.0f}",
                          f"{row['vs_best_peer']:.2f} ({peer} {peer_value:,.0f})"]
                if label == "after":
                    ratio_after = row["vs_best_peer"]
            gain = (f"{values['after'] / values['before']:.2f}x" if len(values) == 2 else "-")
            met = "-" if ratio_after is None else ("met" if ratio_after >= TARGET else
                                                   f"**missed** by {TARGET / ratio_after:.2f}x")
            lines.append(f"| {kind} | {how} | {' | '.join(cells)} | {gain} | {met} |")
    return "\n".join(lines) + "\n"


def dataloader_block() -> str:
    """A plain ``DataLoader`` with 2 workers against one process, before and after raw
    samples crossed as places in their shard files (``FileBytes``)."""
    runs = {"before": _load("dataloader-workers-before.json"),
            "after": _load("dataloader-workers-after.json")}
    system = "shardio-records-dataloader"
    lines = [_describe(label, res) for label, res in runs.items()]
    lines += ["", "| tree | before: 2 workers, samples/s | x 1 process | x best peer | "
              "after: 2 workers, samples/s | x 1 process | x best peer | "
              "target: 2 workers >= 1.0x 1 process |", "|---|---|---|---|---|---|---|---|"]
    for kind in ("images", "tiny"):
        cells: list[str] = []
        own = None
        for res in runs.values():
            ratios = res["datasets"].get(kind, {}).get("ratios", {})
            two, one = (ratios.get(m, {}).get(system) for m in (WORKERS_METRIC, METRIC))
            if two is None or one is None:
                cells += ["-", "-", "-"]
                own = None
                continue
            own = two["value"] / one["value"]
            peer = two["best_peer"]
            rate = ratios[WORKERS_METRIC][peer]["value"]
            cells += [f"{two['value']:,.0f}", f"{own:.2f}",
                      f"{two['vs_best_peer']:.2f} ({peer} {rate:,.0f})"]
        met = "-" if own is None else ("met" if own >= 1.0 else f"**missed** by {1.0 / own:.2f}x")
        lines.append(f"| {kind} | {' | '.join(cells)} | {met} |")
    return "\n".join(lines) + "\n"


def telemetry_block() -> str:
    """Warm epochs with ``shardio.loader``'s telemetry on and off, in the same rounds."""
    res = _load("telemetry.json")
    lines = [f"Measured {res['date']} on {res['machine']['cores']} cores, 1-minute load "
             f"{res['load_avg_1m']:.1f}, shardio at git {res['shardio']['git_head']}; "
             f"{res['samples']:,} tiny records, warm epochs through loaders built once, "
             f"{res['rounds']} rounds of {res['epochs_per_round']} epochs, on and off "
             "alternated:", "",
             "| workers | batch size | epoch on, s | epoch off, s | on / off, median over "
             "rounds | telemetry alone, µs a batch | its share of the epoch |",
             "|---|---|---|---|---|---|---|"]
    for row in res["results"].values():
        lines.append(f"| {row['num_workers']} | {row['batch_size']} | {row['epoch_on_s']:.4f} | "
                     f"{row['epoch_off_s']:.4f} | {row['ratio_on_off']:.3f} | "
                     f"{row['telemetry_per_batch_us']:.2f} | {row['overhead_pct']:.2f}% |")
    return "\n".join(lines) + "\n"


def integrity_block() -> str:
    """CPU of reads with and without the key checks, the same revision otherwise."""
    res = _load("integrity-checks.json")
    cpu = res["median_cpu_seconds"]
    lines = [f"Measured {res['date'][:16].replace('T', ' ')} (`{res['command']}`, shardio at "
             f"{res['revision']} against {res['baseline']}); {res['samples']:,} small records, "
             f"{res['per_shard']:,} a shard, {res['gets']:,} random gets; CPU seconds of the "
             "reading process, medians of the rounds:", "",
             "| backend | read | cache | without the checks | with them | change |",
             "|---|---|---|---|---|---|"]
    for key in sorted({k.rsplit("/", 1)[0] for k in cpu}):
        old, new = cpu[f"{key}/old"], cpu[f"{key}/new"]
        lines.append(f"| {' | '.join(key.split('/'))} | {old:.4f} | {new:.4f} | "
                     f"{100 * (new / old - 1):+.1f}% |")
    return "\n".join(lines) + "\n"


def batch_split_block() -> str:
    """A worker's reads of whole batches in turn against a contiguous part, before lanes."""
    res = _load("batch_split.json")
    lines = [f"{res['samples']:,} records of 1-4 KB, batches of {res['batch_size']}, shuffle "
             f"window {res['window']:,}, blocks of {res['block_size']}; worker 0's reads in one "
             "process, warm, CPU µs a sample, median of 3:", "",
             "| workers | contiguous parts | whole batches in turn | in turn / contiguous |",
             "|---|---|---|---|"]
    for row in res["rows"]:
        lines.append(f"| {row['num_workers']} | {row['contiguous_us']:.2f} | "
                     f"{row['batches_in_turn_us']:.2f} | "
                     f"{row['batches_in_turn_us'] / row['contiguous_us']:.2f} |")
    return "\n".join(lines) + "\n"
