"""What the results were measured on: machine, library versions, and which shardio source.

Other engineers edit the shared working tree while a run goes on, so ``snapshot_shardio``
copies the ``shardio`` package once, at the start, and every measurement imports that
copy; ``source_id`` fingerprints it (git HEAD, whether the tree differed from HEAD, and a
hash of the package's files) so a result names exactly the code it measured.
"""

from __future__ import annotations

import hashlib
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
    from shardio.version import __version__  # its distribution is named shardio-torch

    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        if name == "shardio":
            out[name] = __version__
            continue
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def source_id(package: Path) -> dict[str, Any]:
    """Git HEAD of the checkout, whether ``package`` differs from it, and a content hash."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    repo = package.parent

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                             check=False)
        return out.stdout.strip()

    return {"git_head": git("rev-parse", "--short", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--", package.name)),
            "sha256": digest.hexdigest()[:16]}


def snapshot_shardio(repo: Path, dest: Path) -> dict[str, Any]:
    """Copy ``repo/shardio`` to ``dest/shardio`` (what the children import); its identity."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copytree(repo / "shardio", dest / "shardio",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return {**source_id(repo / "shardio"), "snapshot_sha256": source_id(dest / "shardio")["sha256"]}
