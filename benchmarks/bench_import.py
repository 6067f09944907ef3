"""Question: is ``shardio pack`` from WebDataset tars and from Parquet at least as fast as
``shardio pack`` of the same samples as a folder of files, and what memory does it hold?

Both harness trees (``benchmarks.datagen``: the ImageFolder of photo-like JPEGs and the
tiny-file tree, labelled by their top-level folder) are converted once, beside the tree
under ``benchmarks/work/import/``, into WebDataset tar shards (``<key>.<ext>`` and
``<key>.cls`` members, about 64 MB a tar, as ``webdataset.ShardWriter`` writes them) and
into Parquet files (a ``data`` binary column and a ``label`` ``ClassLabel`` column in the
Hugging Face schema metadata, 1024-row groups). Each round packs the folder (an
ImageFolder, or ``--class-folders`` for the tiny tree), the tars (``--label-field cls``)
and the Parquet files, in a rotated order, each in a fresh process with the same
options (2 workers, zstd, seed 0): the same samples, labels and shuffle. Reports per
source the median seconds, samples/s, the ratio to the folder, and the peak RSS of the
packing process and of its largest worker (``ru_maxrss``). In the same rounds, LitData's
``optimize`` converts the same three inputs (files, tars, Parquet files read by the
function it is given, the raw bytes and the label of each sample; 2 workers, 64 MB
chunks; in the first ``LITDATA_ROUNDS`` rounds) in a child process of its own venv,
``benchmarks/.env-litdata`` (its torch would replace this env's CPU torch):

    python3 -m venv benchmarks/.env-litdata
    benchmarks/.env-litdata/bin/pip install torch==2.14.1 litdata pyarrow

Without that venv LitData is left out and the results say why. Writes
``benchmarks/results/import.json`` (``--quick``: the quick trees, 3 rounds).

    .venv/bin/python -m benchmarks.bench_import [--quick] [--no-litdata]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the LitData child runs in a venv without shardio: imports come later
    from benchmarks.datagen import Tree

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "import"
LITDATA_PYTHON = HERE / ".env-litdata" / "bin" / "python"
TAR_BYTES = 64 << 20
WORKERS = 2
LITDATA_ROUNDS = 2
"""Rounds that also run LitData (the first ones): one ``optimize`` takes 20-60 s here."""


def _samples(tree: Tree) -> list[tuple[str, str, bytes, int]]:
    """``(key, extension, bytes, label)`` of every file, in the tree's order."""
    out = []
    for path in tree.files():
        rel = path.relative_to(tree.root).as_posix()
        stem, _, ext = rel.rpartition(".")
        out.append((stem, ext, path.read_bytes(), tree.label_of(rel)))
    return out


def write_tars(tree: Tree, folder: Path) -> None:
    """The tree as WebDataset tar shards (members grouped by key, in the tree's order)."""
    folder.mkdir(parents=True)
    parts: list[list[tuple[str, str, bytes, int]]] = [[]]
    written = 0
    for sample in _samples(tree):
        if written >= TAR_BYTES:
            parts.append([])
            written = 0
        parts[-1].append(sample)
        written += len(sample[2]) + 2048  # two members, a header and padding each
    for number, part in enumerate(parts):
        with tarfile.open(folder / f"train-{number:06d}.tar", "w") as tar:
            for key, ext, data, label in part:
                for name, payload in ((f"{key}.{ext}", data),
                                      (f"{key}.cls", str(label).encode())):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime = len(payload), 0
                    tar.addfile(info, io.BytesIO(payload))


def write_parquet(tree: Tree, folder: Path) -> None:
    """The tree as Parquet files with Hugging Face ``ClassLabel`` metadata, about 64 MB each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    samples = _samples(tree)
    classes = sorted({rel.split("/", 1)[0] for rel, *_ in samples})
    features = {"data": {"dtype": "binary", "_type": "Value"},
                "label": {"names": classes, "_type": "ClassLabel"}}
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    folder.mkdir(parents=True)
    part: list[tuple[str, str, bytes, int]] = []
    number = 0

    def flush() -> None:
        nonlocal number, part
        table = pa.table({"data": pa.array([s[2] for s in part], pa.binary()),
                          "label": pa.array([s[3] for s in part], pa.int64())})
        pq.write_table(table.replace_schema_metadata(meta),
                       folder / f"train-{number:05d}.parquet", row_group_size=1024)
        number, part = number + 1, []

    size = 0
    for sample in samples:
        part.append(sample)
        size += len(sample[2])
        if size >= TAR_BYTES:
            flush()
            size = 0
    if part:
        flush()


def child(src: str, out: str, kwargs: dict[str, Any]) -> None:
    """Pack once in this process; print seconds, samples and peak RSS as JSON."""
    import shardio

    began = time.perf_counter()
    summary = shardio.pack(src, out, num_workers=WORKERS, progress=False, **kwargs)
    seconds = time.perf_counter() - began
    print(json.dumps({
        "seconds": seconds, "samples": summary.samples,
        "rss_main_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_worker_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


def _litdata_file(item: tuple[str, int]) -> dict[str, Any]:
    """``optimize``'s function over files: one file's bytes and its label."""
    return {"data": Path(item[0]).read_bytes(), "label": item[1]}


def _litdata_tar(path: str) -> Iterator[dict[str, Any]]:
    """``optimize``'s function over a tar: its samples (a data member and a ``cls`` member)."""
    with tarfile.open(path) as tar:
        data = b""
        for member in tar:
            payload = tar.extractfile(member)
            if payload is None:
                continue
            if member.name.endswith(".cls"):
                yield {"data": data, "label": int(payload.read())}
            else:
                data = payload.read()


def _litdata_parquet(path: str) -> Iterator[dict[str, Any]]:
    """``optimize``'s function over a Parquet file: its rows, batch by batch."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as table:
        for batch in table.iter_batches(batch_size=256):
            for data, label in zip(batch.column("data").to_pylist(),
                                   batch.column("label").to_pylist(), strict=True):
                yield {"data": data, "label": label}


def litdata_child(kind: str, inputs_file: str, out: str) -> None:
    """Run LitData's ``optimize`` once in this process (the LitData venv); print seconds,
    samples and peak RSS as JSON."""
    import litdata

    inputs = json.loads(Path(inputs_file).read_text(encoding="utf-8"))
    fn = {"folder": _litdata_file, "webdataset": _litdata_tar,
          "parquet": _litdata_parquet}[kind]
    os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = out + "-cache"  # beside the output
    began = time.perf_counter()
    litdata.optimize(fn=fn, inputs=inputs, output_dir=out, chunk_bytes="64MB",
                     num_workers=WORKERS, verbose=False)
    seconds = time.perf_counter() - began
    index = json.loads((Path(out) / "index.json").read_text(encoding="utf-8"))
    print(json.dumps({
        "seconds": seconds, "samples": sum(c["chunk_size"] for c in index["chunks"]),
        "rss_main_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_worker_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))


def litdata_missing() -> str | None:
    """Why LitData cannot be run, or ``None``."""
    if not LITDATA_PYTHON.exists():
        return (f"no LitData venv at {LITDATA_PYTHON.relative_to(HERE.parent)} (see "
                "benchmarks/bench_import.py)")
    done = subprocess.run([str(LITDATA_PYTHON), "-c", "import litdata; print(litdata.__version__)"],
                          capture_output=True, text=True, check=False)
    return None if done.returncode == 0 else f"litdata does not import: {done.stderr[-300:]}"


def run_litdata(kind: str, inputs: list[Any], out: Path) -> dict[str, Any]:
    for path in (out, Path(f"{out}-cache")):
        shutil.rmtree(path, ignore_errors=True)
    inputs_file = WORK / "litdata-inputs.json"
    inputs_file.write_text(json.dumps(inputs), encoding="utf-8")
    done = subprocess.run([str(LITDATA_PYTHON), "-m", "benchmarks.bench_import", "--litdata",
                           kind, str(inputs_file), str(out)], capture_output=True, text=True,
                          check=True, cwd=HERE.parent)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    for path in (out, Path(f"{out}-cache")):
        shutil.rmtree(path, ignore_errors=True)
    return result


def run_once(src: Path, out: Path, kwargs: dict[str, Any]) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_import", "--child", str(src),
                           str(out), json.dumps(kwargs)], capture_output=True, text=True,
                          check=True, cwd=HERE.parent)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    shutil.rmtree(out, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick trees, 3 rounds")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--litdata", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--no-litdata", action="store_true", help="leave LitData out")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "import.json")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], json.loads(args.child[2]))
        return
    if args.litdata:
        litdata_child(*args.litdata)
        return
    from benchmarks.datagen import QUICK_SIZES, ensure_tree
    from benchmarks.machine import describe_machine, library_versions, source_id

    sizes = QUICK_SIZES if args.quick else {"images": 4000, "tiny": 50_000}
    rounds = 3 if args.quick else 5
    litdata_why = "left out (--no-litdata)" if args.no_litdata else litdata_missing()
    results: dict[str, Any] = {}
    for kind in ("images", "tiny"):
        tree = ensure_tree(kind, sizes[kind])
        base = WORK / tree.root.name
        if not (base / "done").exists():
            shutil.rmtree(base, ignore_errors=True)
            write_tars(tree, base / "tars")
            write_parquet(tree, base / "parquet")
            (base / "done").write_text("")
        folder_kwargs = {"imagefolder": True} if kind == "images" else {"class_folders": True}
        sources: dict[str, tuple[Path, dict[str, Any]]] = {"folder": (tree.root, folder_kwargs),
                   "webdataset": (base / "tars", {"label_field": "cls"}),
                   "parquet": (base / "parquet", {})}
        litdata_inputs = {
            "folder": [(str(p), tree.label_of(p.relative_to(tree.root).as_posix()))
                       for p in tree.files()],
            "webdataset": sorted(map(str, (base / "tars").iterdir())),
            "parquet": sorted(map(str, (base / "parquet").iterdir()))}
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sources}
        lit_runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sources}
        names = list(sources)
        for r in range(rounds):
            for name in names[r % 3:] + names[:r % 3]:
                src, kwargs = sources[name]
                runs[name].append(run_once(src, WORK / "out", kwargs))
                if litdata_why is None and r < LITDATA_ROUNDS:
                    lit_runs[name].append(run_litdata(name, litdata_inputs[name],
                                                      WORK / "litdata-out"))
        folder_s = statistics.median(x["seconds"] for x in runs["folder"])
        for system, system_runs in (("shardio", runs), ("litdata", lit_runs)):
            for name, got in system_runs.items():
                if not got:
                    continue
                seconds = statistics.median(x["seconds"] for x in got)
                row = results[f"{kind}-{name}" + ("" if system == "shardio" else "-litdata")] = {
                    "tree": kind, "source": name, "system": system, "samples": got[0]["samples"],
                    "input_bytes": tree.num_bytes, "seconds": seconds,
                    "samples_per_s": got[0]["samples"] / seconds,
                    "ratio_to_folder": folder_s / seconds,
                    "rss_main_mib": max(x["rss_main_mib"] for x in got),
                    "rss_worker_mib": max(x["rss_worker_mib"] for x in got),
                    "all_seconds": [x["seconds"] for x in got]}
                if system == "litdata":
                    results[f"{kind}-{name}"]["ratio_to_litdata"] = seconds / statistics.median(
                        x["seconds"] for x in runs[name])
                print(f"{kind:6} {system:8} {name:10} {seconds:7.2f} s "
                      f"{row['samples_per_s']:9.0f} samples/s x{row['ratio_to_folder']:.2f} of "
                      f"folder, RSS main {row['rss_main_mib']:.0f} MiB, worker "
                      f"{row['rss_worker_mib']:.0f} MiB", flush=True)
    out = {
        "question": "pack from WebDataset tars and from Parquet vs pack of the same samples as "
                    "a folder, and vs LitData's optimize of the same input: seconds, "
                    "samples/s and peak RSS",
        "date": time.strftime("%Y-%m-%d %H:%M"), "rounds": rounds, "num_workers": WORKERS,
        "load_avg_1m": os.getloadavg()[0], "machine": describe_machine(WORK),
        "libraries": library_versions(), "shardio": source_id(HERE.parent / "shardio"),
        "litdata": {"missing": litdata_why} if litdata_why else {"version": _litdata_version()},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


def _litdata_version() -> str:
    done = subprocess.run([str(LITDATA_PYTHON), "-m", "pip", "list", "--format=json"],
                          capture_output=True, text=True, check=True)
    versions = {p["name"].lower(): p["version"] for p in json.loads(done.stdout)}
    return f"litdata {versions.get('litdata')}, torch {versions.get('torch')}"


def import_block() -> str:
    """The generated block of docs/import.md: the measured ratios and peak RSS."""
    data = json.loads((HERE / "results" / "import.json").read_text(encoding="utf-8"))
    rows = list(data["results"].values())
    lines = ["| tree | source | system | samples | seconds | samples/s | vs folder | "
             "vs LitData | peak RSS main / worker |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        versus = row.get("ratio_to_litdata")
        lines.append(f"| {row['tree']} | {row['source']} | {row.get('system', 'shardio')} | "
                     f"{row['samples']:,} | {row['seconds']:.2f} | "
                     f"{row['samples_per_s']:,.0f} | {row['ratio_to_folder']:.2f}x | "
                     f"{'' if versus is None else f'{versus:.2f}x'} | "
                     f"{row['rss_main_mib']:.0f} / {row['rss_worker_mib']:.0f} MiB |")
    machine = data["machine"]
    lit = data.get("litdata") or {}
    lines.append("")
    lines.append(f"Median of {data['rounds']} rounds, {data['num_workers']} workers, "
                 f"{machine.get('cores', '?')} cores, load average {data['load_avg_1m']:.1f} "
                 f"at the end, {data['date']} (`python -m benchmarks.bench_import`, "
                 "`benchmarks/results/import.json`). "
                 + (f"LitData: {lit['version']}, in its own venv, median of the first "
                    f"{max(len(r['all_seconds']) for r in rows if r.get('system') == 'litdata')}"
                    " rounds." if "version" in lit else
                    f"LitData not measured: {lit.get('missing', 'not run')}."))
    shardio_rows = [row for row in rows if row.get("system", "shardio") == "shardio"]
    missed = [row for row in shardio_rows
              if row["source"] != "folder" and row["ratio_to_folder"] < 1]
    if missed:
        lines.append("")
        lines.append("Target missed (at least as fast as the folder): " + "; ".join(
            f"{row['source']} on {row['tree']} {row['ratio_to_folder']:.2f}x, "
            f"{1 / row['ratio_to_folder'] - 1:.0%} slower" for row in missed) + ".")
    behind = [row for row in shardio_rows if row.get("ratio_to_litdata", 1.5) < 1.5]
    if behind:
        lines.append("")
        lines.append("Target missed (at least 1.5x LitData): " + "; ".join(
            f"{row['source']} on {row['tree']} {row['ratio_to_litdata']:.2f}x"
            for row in behind) + ".")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
