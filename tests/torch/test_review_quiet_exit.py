"""A script that takes a few samples and stops prints nothing more: closing a window of the
stream lets go of what is open and never opens a shard file again (``shardio.reading.stream``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import shardio

pytestmark = pytest.mark.slow

# Each script reads from a copy of the dataset in a temporary folder. ``opened()`` lists the
# files of that copy this process still holds (descriptors and maps): none once the
# iterator is gone. The folder is removed before the interpreter exits, and in the last
# script before the iterator is finalized (at exit).
PRELUDE = """
import gc, os, shutil, tempfile
from shardio import StreamingDataset

def opened(root):
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the descriptor of the listing itself, closed by now
            pass
    with open("/proc/self/maps") as maps:
        mapped = [line.split()[-1] for line in maps]
    return sorted({path for path in fds + mapped if path.startswith(root)})

tmp = tempfile.mkdtemp()
shutil.copytree(SRC, tmp + "/ds")
"""
SCRIPTS = {
    "next-of-iter": """
        first = next(iter(StreamingDataset(tmp + "/ds", shuffle=True, seed=1)))
        gc.collect()
        print(type(first).__name__, opened(tmp))
        shutil.rmtree(tmp)
    """,
    "break": """
        for i, sample in enumerate(StreamingDataset(tmp + "/ds")):
            if i == 3:
                break
        del sample
        gc.collect()
        print(i, opened(tmp))
        shutil.rmtree(tmp)
    """,
    "held-until-exit": """
        samples = iter(StreamingDataset(tmp + "/ds", shuffle=True, seed=1))
        first = next(samples)
        shutil.rmtree(tmp)
        print(type(first).__name__, [])
    """,
}


@pytest.mark.parametrize("backend", ["records", "lmdb"])
@pytest.mark.parametrize("script", sorted(SCRIPTS))
@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="lists open files in /proc")
def test_a_script_that_stops_early_prints_nothing_at_exit(
        tmp_path: Path, imagefolder: Path, backend: str, script: str) -> None:
    src = tmp_path / "pack"
    shardio.pack_imagefolder(imagefolder, src, options=shardio.WriteOptions(
        backend=backend, max_shard_samples=10), num_workers=1, progress=False)
    code = f"SRC = {str(src)!r}\n" + PRELUDE + textwrap.dedent(SCRIPTS[script])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.strip() in {"tuple []", "3 []"}
