"""shardio's benchmark harness: shardio against its peers on identical data, in one run.

Not part of the installed package. ``datagen`` makes the data, ``adapters`` gives every
system the same small interface, ``probe`` holds the measuring instruments, ``child``
runs one measurement in a fresh process, ``run`` drives a whole comparison, ``summary``
turns raw runs into medians, ratios and target checks, and ``report`` writes the tables
of ``benchmarks/README.md``.

When ``BENCH_SHARDIO_SNAPSHOT`` names a folder holding a copy of the ``shardio`` package
(``run.py`` sets it for its children), that copy is imported instead of the working
tree's: the editable install's import hook is removed and the folder goes first on
``sys.path``, before anything here imports shardio.
"""

from __future__ import annotations

import os
import sys

SNAPSHOT_ENV = "BENCH_SHARDIO_SNAPSHOT"


def _use_snapshot(folder: str) -> None:
    if "shardio" in sys.modules:
        return
    sys.meta_path[:] = [
        f for f in sys.meta_path
        if not (f if isinstance(f, type) else type(f)).__module__.startswith("__editable___shardio")
    ]
    sys.path.insert(0, folder)


if os.environ.get(SNAPSHOT_ENV):
    _use_snapshot(os.environ[SNAPSHOT_ENV])
