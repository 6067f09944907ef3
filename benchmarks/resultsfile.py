"""The one results writer of the benchmark questions: one JSON file per question.

``write_results`` stamps every file with what a figure needs to be read months later:
when, the command that reproduces it, the machine, the libraries, the shardio measured
(the snapshot ``BENCH_SHARDIO_SNAPSHOT`` names, if any) and the load average at the end;
then come the question's own fields, which win where a name is the same. ``load_results``
reads one back. Report functions read only committed files, so a figure in the docs is
always one that ``git log -p benchmarks/results/<name>.json`` has.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import SNAPSHOT_ENV
from benchmarks.machine import describe_machine, library_versions, source_id

RESULTS = Path(__file__).resolve().parent / "results"


PATH_OPTIONS = ("--out", "--json", "--work", "--work-dir", "--data-dir")
"""Options that say where (files and folders of one machine), not what is measured."""


def command_line(module: str, argv: Sequence[str]) -> str:
    """``python -m module argv`` less the ``PATH_OPTIONS`` and their values: what
    reproduces a run anywhere, and no path of the machine it ran on."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in PATH_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in PATH_OPTIONS)):
            kept.append(arg)
    return " ".join(["python -m", module, *kept])


def _command() -> str:
    """How this process was started (``command_line`` of its module and arguments)."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    module = spec.name if spec is not None else Path(sys.argv[0]).stem
    return command_line(module, sys.argv[1:])


def write_results(out: str | Path, results: dict[str, Any], *, command: str | None = None,
                  sort_keys: bool = False) -> Path:
    """Write ``results`` as ``benchmarks/results/<out>`` (a name) or to ``out`` (a path).

    Args:
        out: a file name under ``benchmarks/results/``, or a path (``--out`` of a run).
        results: the question's fields; they override the stamp's where names collide.
        command: the command that reproduces the run; by default this process's own.
        sort_keys: sort the keys at every level (the files whose history is kept sorted).
    """
    path = RESULTS / out if isinstance(out, str) else out
    stamp = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "command": command or _command(),
        "machine": describe_machine(path.parent), "versions": library_versions(),
        "shardio_source": source_id(Path(os.environ.get(SNAPSHOT_ENV) or RESULTS.parent.parent)
                                    / "shardio"),
        "load_avg_1min_end": os.getloadavg()[0],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**stamp, **results}, indent=1, sort_keys=sort_keys) + "\n",
                    encoding="utf-8")
    return path


def load_results(name: str) -> dict[str, Any]:
    """The committed results file ``benchmarks/results/<name>``."""
    return dict(json.loads((RESULTS / name).read_text(encoding="utf-8")))
