"""What the results were measured on: cores, memory, disk, CPU, and every library's version."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

LIBRARIES = ("shardio", "torch", "webdataset", "mosaicml-streaming", "litdata", "lmdb",
             "numpy", "pillow", "psutil")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return None


def _disk(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"free_gib": round(shutil.disk_usage(path).free / 1024**3, 1)}
    try:
        src = subprocess.run(["findmnt", "-n", "-o", "SOURCE,FSTYPE", "--target", str(path)],
                             capture_output=True, text=True, check=False).stdout.split()
    except OSError:
        src = []
    if len(src) == 2:
        out["device"], out["fs"] = src
        dev = Path(src[0]).name
        rot = Path(f"/sys/block/{dev}/queue/rotational")
        if rot.exists():
            out["rotational"] = rot.read_text().strip() == "1"
    return out


def describe_machine(path: Path) -> dict[str, Any]:
    """Cores, RAM, CPU model, OS, Python, and the disk holding ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    return {"cores": os.cpu_count(), "ram_gib": _mem_total_gib(), "cpu": _cpu_model(),
            "os": platform.platform(), "python": platform.python_version(), "disk": _disk(path)}


def library_versions() -> dict[str, str | None]:
    """Installed version of every library the harness may use (None when absent)."""
    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out
