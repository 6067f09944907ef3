"""One decode-limit measurement for ``bench_decode.py``, in whatever venv holds the decoder.

``python -m benchmarks.decode_child DECODER TREE_ROOT [SAMPLES]`` decodes up to
``SAMPLES`` JPEGs of the tree (read into memory first, every n-th file) to RGB
uint8 arrays, once in this process and then in 2 forked processes at once (each
every image), no loader, and prints one JSON line. Imports only numpy, Pillow and
the decoder: the pillow-simd venv has neither torch nor shardio.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def decoder(name: str) -> tuple[Callable[[bytes], Any], str]:
    """The decode function called ``name`` and the version of its library."""
    if name in ("pillow", "pillow-simd"):
        import PIL
        from PIL import Image

        def pil(data: bytes) -> Any:  # what benchmarks.adapters.decode_image does, minus torch
            with Image.open(io.BytesIO(data)) as img:
                return np.array(img.convert("RGB"))

        return pil, PIL.__version__
    if name == "simplejpeg":
        import simplejpeg

        return (lambda data: simplejpeg.decode_jpeg(data, colorspace="RGB")), simplejpeg.__version__
    if name == "pyturbojpeg":
        import importlib.metadata

        from turbojpeg import TJPF_RGB, TurboJPEG

        turbo = TurboJPEG()
        return ((lambda data: turbo.decode(data, pixel_format=TJPF_RGB)),
                importlib.metadata.version("PyTurboJPEG"))
    raise ValueError(f"unknown decoder {name!r}")


def _together(decode: Callable[[bytes], Any], blobs: list[bytes], go: Any, done: Any) -> None:
    for data in blobs[:16]:
        decode(data)
    go.wait()
    for data in blobs:
        decode(data)
    done.put(time.perf_counter())


def measure(name: str, root: Path, samples: int) -> dict[str, Any]:
    decode, version = decoder(name)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    blobs = [p.read_bytes() for p in files[:: max(1, len(files) // samples)]]
    for data in blobs[:16]:
        decode(data)
    start = time.perf_counter()
    for data in blobs:
        decode(data)
    one = time.perf_counter() - start
    ctx = multiprocessing.get_context("fork")
    go, done = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_together, args=(decode, blobs, go, done)) for _ in range(2)]
    for p in procs:
        p.start()
    go.wait()
    began = time.perf_counter()
    ends = [done.get() for _ in procs]
    for p in procs:
        p.join()
    return {"decoder": name, "version": version, "samples": len(blobs),
            "us_per_image": one / len(blobs) * 1e6, "one_process_per_s": len(blobs) / one,
            "two_processes_per_s": 2 * len(blobs) / (max(ends) - began)}


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], Path(sys.argv[2]),
                             int(sys.argv[3]) if len(sys.argv) > 3 else 2000)))
