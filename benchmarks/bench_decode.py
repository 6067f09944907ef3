"""Question: which JPEG decoder is fastest here, and how close does a decoded epoch come to it?

Per decoder, the decode limit: JPEG bytes already in memory decoded to RGB uint8, no
loader, in one process and in 2 processes at once (``decode_child.py``): Pillow (the
wheel), pillow-simd (built from source in a venv of its own under ``benchmarks/work/``,
never in the project's), simplejpeg and PyTurboJPEG (libjpeg-turbo bindings from PyPI;
PyTurboJPEG needs the system's ``libturbojpeg``, 1.x for libjpeg-turbo 2.x). Then, in
the same rounds, a ``shardio.loader`` epoch with ``decode="tensor"`` and 2 workers
(``bench_handover.py``'s decoded run, a fresh process from building the loader) with
each decoder shardio can use (Pillow, and simplejpeg where installed), as a ratio to
the 2-process limit of the same decoder in the same round (issue 10: >= 0.9). Median of
``--repeats`` rounds, rotated; load averages kept. Writes ``results/decode.json``.

    .venv/bin/python -m benchmarks.bench_decode [--repeats 3] [--pillow-simd] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_handover import ensure_pack
from benchmarks.datagen import FULL_SIZES, QUICK_SIZES, ensure_tree
from benchmarks.machine import describe_machine, source_id

HERE = Path(__file__).resolve().parent
SIDE = HERE / "work" / "decoders"
SIDE_PACKAGES = {"decoders": ["numpy", "pillow", "simplejpeg", "PyTurboJPEG<2"],
                 "pillow-simd": ["numpy", "pillow-simd"]}


def side_python(name: str) -> Path | None:
    """The interpreter of side venv ``name``, made on first use; None if it cannot be made."""
    python = SIDE / name / "bin" / "python"
    if not python.exists():
        shutil.rmtree(SIDE / name, ignore_errors=True)
        made = subprocess.run([sys.executable, "-m", "venv", str(SIDE / name)], check=False)
        if made.returncode != 0:
            return None
        pillow = [] if name == "pillow-simd" else [f"pillow=={_pillow_version()}"]
        wanted = [p for p in SIDE_PACKAGES[name] if p != "pillow"] + pillow
        got = subprocess.run([str(python), "-m", "pip", "install", "-q", *wanted], check=False)
        if got.returncode != 0:
            shutil.rmtree(SIDE / name, ignore_errors=True)
            return None
    return python


def _pillow_version() -> str:
    import PIL

    return PIL.__version__


def limit(python: Path, name: str, root: Path) -> dict[str, Any]:
    proc = subprocess.run([str(python), "-m", "benchmarks.decode_child", name, str(root)],
                          capture_output=True, text=True, check=False, cwd=HERE.parent)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**out, "load_1min": os.getloadavg()[0]}


def loader_epoch(decoder: str, tree: Any, pack: Path) -> dict[str, Any]:
    """``bench_handover``'s decoded 2-worker epoch, shardio decoding with ``decoder``."""
    spec = {"variant": "decoded-w2-ring", "pack": str(pack),
            "tree": {"kind": tree.kind, "root": str(tree.root), "num_files": tree.num_files,
                     "num_bytes": tree.num_bytes, "num_classes": tree.num_classes}}
    env = {**os.environ, "SHARDIO_JPEG_DECODER": decoder}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_handover", "--child",
                           json.dumps(spec)], capture_output=True, text=True, check=False,
                          cwd=HERE.parent, env=env, timeout=900)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="the 1,000-image tree")
    parser.add_argument("--pillow-simd", action="store_true",
                        help="also build pillow-simd in benchmarks/work/decoders/ (~1 min)")
    args = parser.parse_args()
    tree = ensure_tree("images", (QUICK_SIZES if args.quick else FULL_SIZES)["images"])
    pack = ensure_pack(tree)
    pythons = {"pillow": side_python("decoders"), "simplejpeg": side_python("decoders"),
               "pyturbojpeg": side_python("decoders")}
    if args.pillow_simd:
        pythons["pillow-simd"] = side_python("pillow-simd")
    jobs = [("limit", name) for name, py in pythons.items() if py is not None]
    try:
        import simplejpeg  # noqa: F401  (shardio decodes with it when it is importable)

        fast = ["simplejpeg"]
    except ImportError:
        fast = []
    jobs += [("loader", name) for name in ["pillow", *fast]]
    runs: dict[str, list[dict[str, Any]]] = {f"{kind}:{name}": [] for kind, name in jobs}
    started = time.time()
    for rep in range(args.repeats):
        for kind, name in jobs[rep % len(jobs):] + jobs[: rep % len(jobs)]:
            python = pythons.get(name)
            result = (limit(python, name, tree.root) if kind == "limit" and python
                      else loader_epoch(name, tree, pack))
            runs[f"{kind}:{name}"].append({**result, "round": rep})
            print(f"round {rep + 1} {kind}:{name}: "
                  f"{ {k: round(v, 1) for k, v in result.items() if isinstance(v, float)} }",
                  flush=True)
    ratios: dict[str, list[float]] = {}
    for name in ["pillow", *fast]:
        for run in runs[f"loader:{name}"]:
            same = [r for r in runs.get(f"limit:{name}", []) if r["round"] == run["round"]]
            if same and "samples_per_s" in run and "two_processes_per_s" in same[0]:
                ratios.setdefault(name, []).append(
                    run["samples_per_s"] / same[0]["two_processes_per_s"])
    medians = {key: {k: statistics.median(r[k] for r in rs if k in r) for k in rs[0]
                     if isinstance(rs[0][k], (int, float)) and k != "round"}
               for key, rs in runs.items() if rs and "error" not in rs[0]}
    versions = {key.split(":", 1)[1]: rs[0].get("version") for key, rs in runs.items()
                if key.startswith("limit:") and rs}
    out = HERE / "results" / ("decode-quick.json" if args.quick else "decode.json")
    out.write_text(json.dumps({
        "question": __doc__.splitlines()[0], "date": time.strftime("%Y-%m-%d %H:%M"),
        "command": ".venv/bin/python -m benchmarks.bench_decode"
                   + (" --pillow-simd" if args.pillow_simd else "")
                   + (" --quick" if args.quick else ""),
        "repeats": args.repeats, "images": tree.num_files, "wall_s": round(time.time() - started),
        "machine": describe_machine(SIDE), "shardio_source": source_id(HERE.parent / "shardio"),
        "decoder_versions": versions, "medians": medians,
        "loader_over_same_decoder_limit": {k: statistics.median(v) for k, v in ratios.items()},
        "runs": runs,
    }, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
