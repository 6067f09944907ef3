"""``python -m benchmarks.adapters``: import every system's library for real and list versions.

``setup_env.sh`` runs this last, so an environment whose peer cannot import (for example
one that pulled a torchvision that does not load) fails at set-up, not mid-benchmark.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys

from benchmarks.adapters import SYSTEMS, get_adapter
from benchmarks.adapters.mds import import_streaming

_MODULES = {"shardio": "shardio", "webdataset": "webdataset", "litdata": "litdata",
            "lmdb": "lmdb"}


def check() -> int:
    """Import each adapter's library; print ``system  version-or-reason``; return failures."""
    failures = 0
    for name in SYSTEMS:
        adapter = get_adapter(name)
        reason = adapter.missing()
        library = adapter.library
        if reason is None and library is not None:
            try:
                if library == "mosaicml-streaming":
                    import_streaming()
                else:
                    importlib.import_module(_MODULES[library])
                version = importlib.metadata.version(library)
            except Exception as exc:  # any import failure is what this check reports
                reason = f"import failed: {type(exc).__name__}: {exc}"
                failures += 1
        if reason is not None:
            print(f"{name:28s} SKIP  {reason}")
        else:
            print(f"{name:28s} ok    {library or 'stdlib + torch'} {version if library else ''}")
    return failures


if __name__ == "__main__":
    sys.exit(1 if check() else 0)
