"""Question: on pipelines whose bottleneck is known, does ``shardio doctor`` name it, and
does its first recommendation, applied in the same run, raise steps/s?

The four local validation cases of ``tests/torch/test_doctor.py``, at a fuller size:

* ``decode``: 1,600 px JPEGs decoded to tensors without workers for a 128 px model, a
  1 ms step (answer: decode-bound; decode at the model's size);
* ``step``: cheap tiny records, a 50 ms step (answer: data is not the bottleneck);
* ``workers``: three workers whose transform waits 5 ms a sample (40 ms a batch of 8)
  for a 2 ms step (answer: a stall every 3 batches; more workers);
* ``io``: a dataset served over HTTP on 127.0.0.1 behind ``storage_proxy.FaultProxy``
  holding every request 50 ms, no workers, a 1 ms step (answer: I/O-bound; more
  workers, measured over an empty node cache).

Per case it writes the doctor's report without its per-step series (and the text
report as printed) to ``benchmarks/results/doctor.json`` and the doctor's plot to
``docs/img/doctor-<case>.png`` (palette PNG, to stay small). Then ``scale``: how long
``shardio doctor DATASET`` with its defaults takes to answer on 100,000 tiny records
(the command run as a user runs it, from its start to its report). ``doctor_block``
renders the table and the reports of ``docs/doctor.md``. About two minutes on 2 cores,
most of them writing and packing the 100,000 files (``--scale-samples`` for fewer).

    python -m benchmarks.bench_doctor [--quick] [--scale-samples N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.machine import describe_machine, source_id
from benchmarks.resultsfile import write_results

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORK = HERE / "work" / "doctor"
RESULTS = HERE / "results" / "doctor.json"
IMAGES = REPO / "docs" / "img"
LATENCY_S = 0.05
"""What the loopback link holds every request before forwarding it."""
TRANSFORM_WAIT_S = 0.005
"""What the ``workers`` case's transform waits a sample (a lookup, not CPU)."""


def slow_transform(sample: dict[str, Any]) -> int:
    """Wait ``TRANSFORM_WAIT_S`` a sample, as a remote lookup would: workers, not cores."""
    time.sleep(TRANSFORM_WAIT_S)
    return int(sample["__index__"])


def case_decode(work: Path, quick: bool) -> dict[str, Any]:
    import shardio
    from shardio.synth import make_imagefolder

    make_imagefolder(work / "imgs", num_classes=2, per_class=8 if quick else 32,
                     long_side=(1600, 1700))
    shardio.pack_imagefolder(work / "imgs", work / "pack", num_workers=1, progress=False)
    return shardio.doctor(work / "pack", step_ms=1, num_steps=10 if quick else 60,
                          batch_size=4, num_workers=0, decode="tensor", image_size=128)


def _tiny_pack(work: Path, num_files: int, **options: Any) -> Path:
    import shardio
    from shardio.synth import make_tiny_tree

    make_tiny_tree(work / "tree", num_files=num_files)
    shardio.pack(work / "tree", work / "pack", num_workers=1, progress=False,
                 options=shardio.WriteOptions(**options))
    return work / "pack"


def case_step(work: Path, quick: bool) -> dict[str, Any]:
    import shardio

    pack = _tiny_pack(work, 2000 if quick else 10_000)
    return shardio.doctor(pack, step_ms=50, num_steps=10 if quick else 60, batch_size=32,
                          num_workers=0)


def case_workers(work: Path, quick: bool) -> dict[str, Any]:
    import shardio

    pack = _tiny_pack(work, 2000 if quick else 10_000)
    dataset = shardio.StreamingDataset(pack, decode="raw", transform=slow_transform)
    return shardio.doctor(shardio.loader(dataset, 8, num_workers=3), step_ms=2,
                          num_steps=31 if quick else 181)


def case_io(work: Path, quick: bool) -> dict[str, Any]:
    import shardio

    sys.path.insert(0, str(REPO / "tests"))  # the storage tests' loopback Range server
    from storage_servers import RangeHTTPServer  # type: ignore[import-not-found]  # on sys.path above

    from benchmarks.storage_proxy import FaultProxy

    served = work / "served"
    served.mkdir()
    # small shards (20 samples): the two runs (before, after) read different shards, so
    # the second gains from its workers' parallel requests, not from the first's cache
    _tiny_pack(work, 5000, max_shard_samples=20).rename(served / "ds")
    server = RangeHTTPServer(served)
    proxy = FaultProxy(server.address)
    try:
        # relative to the repository (main's working directory): the report names it
        cache = (work / "cache").relative_to(REPO)
        remote = shardio.RemoteOptions(cache_dir=cache, max_in_flight=1)
        dataset = shardio.StreamingDataset(f"{proxy.url}/ds", decode="raw", remote=remote)
        proxy.plan.reset(latency_s=LATENCY_S)
        return shardio.doctor(shardio.loader(dataset, 8, num_workers=0), step_ms=1,
                              num_steps=12 if quick else 100)
    finally:
        proxy.close()
        server.close()


def run_scale(work: Path, num_samples: int) -> dict[str, Any]:
    """``shardio doctor DATASET --json`` with its defaults over ``num_samples`` tiny
    records, as a user runs it (a new process): its seconds from start to report."""
    pack = _tiny_pack(work, num_samples)
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "shardio", "doctor", str(pack), "--json"],
                          check=True, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    report = json.loads(done.stdout)
    first = next(iter(report["recommendations"]), {})
    return {"samples": num_samples, "command": "shardio doctor DATASET --json",
            "seconds": round(seconds, 1), "steps": report["steps"],
            "num_workers": report["num_workers"], "bound": report["bound"],
            "first": first.get("text"), "measured_ratio": first.get("measured_ratio")}


CASES: dict[str, tuple[str, Callable[[Path, bool], dict[str, Any]]]] = {
    "decode": ("1,600 px JPEGs, tensor decode, no workers, 128 px model, 1 ms step",
               case_decode),
    "step": ("tiny records, no workers, 50 ms step", case_step),
    "workers": ("3 workers, transform waits 5 ms a sample (batch 8), 2 ms step",
                case_workers),
    "io": ("HTTP on loopback, 50 ms a request, 20 samples a shard, no workers, 1 ms step",
           case_io),
}
"""Case -> (the setup in words, the function returning the doctor's report)."""


def save_plot(report: dict[str, Any], path: Path) -> None:
    """The doctor's plot, re-saved with a 16-colour palette (a few KB, not a few tens)."""
    from PIL import Image

    from shardio.torch.doctor import draw_plot

    draw_plot(report, path)
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=16)
    small.save(path, format="PNG", optimize=True)


def main(argv: list[str] | None = None) -> None:
    """Run the cases; write the results file and the plots."""
    from shardio.torch.doctor import format_report

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the test suite's sizes")
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated subset")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--scale-samples", type=int, default=100_000,
                   help="records of the scale run (0: none)")
    args = p.parse_args(argv)
    # the workers case runs more workers than cores on purpose (they wait, not compute)
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    os.chdir(REPO)  # paths in the reports are relative to the repository
    started = time.time()
    cases: dict[str, Any] = {}
    for name in args.cases.split(","):
        setup, run = CASES[name]
        work = WORK / name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        began = time.perf_counter()
        report = run(work, args.quick)
        IMAGES.mkdir(parents=True, exist_ok=True)
        save_plot(report, IMAGES / f"doctor-{name}.png")
        report.pop("series")
        cases[name] = {"setup": setup, "seconds": round(time.perf_counter() - began, 1),
                       "text": format_report(report), "report": report}
        first = report["recommendations"][0]
        print(f"{name:8} bound {report['bound']:7} wait {report['data_wait_pct']:5.1f}% "
              f"stall {report['stall_every']} ratio {first.get('measured_ratio')} "
              f"({cases[name]['seconds']} s)", flush=True)
    scale = None
    if args.scale_samples:
        work = WORK / "scale"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        scale = run_scale(work, args.scale_samples)
        print(f"scale    {scale['samples']:,} samples: {scale['seconds']} s", flush=True)
    out = {
        "question": "does shardio doctor name the known bottleneck, and does its first "
                    "recommendation, applied in the same run, raise steps/s?",
        "date": time.strftime("%Y-%m-%d %H:%M"), "quick": args.quick,
        "wall_s": round(time.time() - started, 1), "load_avg_1m": os.getloadavg()[0],
        "link_latency_s": LATENCY_S, "machine": describe_machine(WORK),
        "shardio": source_id(REPO / "shardio"), "cases": cases, "scale": scale,
    }
    write_results(args.out, out)
    print(f"wrote {args.out}")


def doctor_block() -> str:
    """The generated block of docs/doctor.md: per case the verdict, the first
    recommendation's measured effect, the plot and the text report as printed."""
    data = json.loads(RESULTS.read_text(encoding="utf-8"))
    lines = ["| case | setup | bound | data wait | steps/s | headspace | stall every | "
             "first recommendation | applied |", "|---|---|---|---:|---:|---:|---:|---|---:|"]
    for name, case in data["cases"].items():
        r = case["report"]
        first = r["recommendations"][0]
        change = ", ".join(f"`{k}={tuple(v) if isinstance(v, list) else v}`"  # JSON lists
                           for k, v in first["change"].items()) or "none"
        ratio = f"{first['measured_ratio']:.2f}x" if "measured_ratio" in first else "—"
        lines.append(f"| {name} | {case['setup']} | {r['bound']} | "
                     f"{r['data_wait_pct']:.1f}% | {r['steps_per_s']:.1f} | "
                     f"{r['headspace_steps_per_s']:.1f} | {r['stall_every'] or '—'} | "
                     f"{change} | {ratio} |")
    machine = data["machine"]
    lines += ["", f"{machine.get('cores', '?')} cores, {data['date']}; applied: steps/s "
              "with the first recommendation over steps/s before, in the same run "
              "(`python -m benchmarks.bench_doctor`, `benchmarks/results/doctor.json`)."]
    scale = data.get("scale")
    if scale:
        lines += ["", f"`{scale['command'].replace(' --json', '')}` with its defaults "
                  f"({scale['steps']} steps, `num_workers={scale['num_workers']}`, the first "
                  "recommendation applied and measured) answered in "
                  f"**{scale['seconds']:.0f} s** on {scale['samples']:,} tiny records, from "
                  "the command's start to its report."]
    for name, case in data["cases"].items():
        lines += ["", f"**{name}** ({case['setup']}):", "",
                  f"![doctor plot, case {name}](img/doctor-{name}.png)", "",
                  "```text", case["text"], "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
