"""The measuring instruments: page-cache control, a memory sampler, shuffle entropy, strace.

Nothing here knows about a particular system. Cold reads evict each file with
``posix_fadvise(POSIX_FADV_DONTNEED)`` after one ``sync`` (dirty pages cannot be
dropped); ``resident_fraction`` asks ``fincore`` how much of the files is still cached,
so the eviction is checked, not assumed. Memory is sampled from ``/proc`` (the process
and every descendant, so DataLoader workers count). Files opened are counted from an
``strace -f`` log of ``open``/``openat``, cut into epochs by marker opens of paths that
do not exist.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

READ_CHUNK = 8 << 20


def evict(paths: Iterable[Path]) -> int:
    """Drop every file's pages from the page cache; returns the number of files."""
    os.sync()
    count = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        count += 1
    return count


def read_all(paths: Iterable[Path]) -> int:
    """Read every file to the end (fills the page cache); returns bytes read."""
    total = 0
    for path in paths:
        with open(path, "rb", buffering=0) as fh:
            while chunk := fh.read(READ_CHUNK):
                total += len(chunk)
    return total


def timed_read(paths: Sequence[Path]) -> tuple[float, int]:
    """``(seconds, bytes)`` to read every file once from this process."""
    start = time.perf_counter()
    size = read_all(paths)
    return time.perf_counter() - start, size


def cat_seconds(paths: Sequence[Path]) -> float:
    """Seconds for ``cat`` to stream the files to /dev/null (the disk's sequential rate)."""
    names = b"\0".join(os.fsencode(p) for p in paths)
    start = time.perf_counter()
    subprocess.run(["xargs", "-0", "cat"], input=names, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def resident_fraction(paths: Sequence[Path], *, max_files: int = 200) -> float | None:
    """Fraction of the files' bytes in the page cache (``fincore``; a sample of many files)."""
    if shutil.which("fincore") is None or not paths:
        return None
    step = max(1, len(paths) // max_files)
    chosen = [str(p) for p in paths[::step]]
    out = subprocess.run(
        ["fincore", "--bytes", "--json", "--output", "RES,SIZE", *chosen],
        capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:
        return None
    rows = json.loads(out.stdout)["fincore"]
    size = sum(int(r["size"]) for r in rows)
    return sum(int(r["res"]) for r in rows) / size if size else 0.0


def _descendants(pid: int) -> list[int]:
    found = [pid]
    for parent in found:
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as fh:
                    found.extend(int(c) for c in fh.read().split())
            except OSError:
                pass
    return found


def memory_kb(pid: int) -> tuple[int, int]:
    """``(VmRSS, RssAnon)`` in KiB of one process, (0, 0) if it is gone."""
    rss = anon = 0
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1])
    except OSError:
        pass
    return rss, anon


class MemorySampler:
    """Peak RSS of this process plus all its descendants, sampled every ``interval_s``.

    RSS counts file-backed pages a reader has mapped (mmap'd shards, LMDB) and shared
    pages once per process, so the sum is an upper bound; ``peak_anon_kb`` counts only
    anonymous memory (heap, buffers), closer to what the process itself costs.
    """

    def __init__(self, *, interval_s: float = 0.05) -> None:
        self.interval_s = interval_s
        self.peak_rss_kb = 0
        self.peak_anon_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def _sample(self) -> None:
        rss = anon = 0
        for pid in _descendants(os.getpid()):
            r, a = memory_kb(pid)
            rss += r
            anon += a
        self.peak_rss_kb = max(self.peak_rss_kb, rss)
        self.peak_anon_kb = max(self.peak_anon_kb, anon)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> MemorySampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def batch_entropy(labels: np.ndarray, num_classes: int, batch_size: int) -> float:
    """Mean class entropy (bits) over the full batches of ``labels`` in the given order."""
    full = len(labels) // batch_size
    if full == 0:
        return 0.0
    rows = labels[: full * batch_size].reshape(full, batch_size)
    counts = np.stack([np.bincount(r, minlength=num_classes) for r in rows]).astype(np.float64)
    p = counts / batch_size
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -np.nansum(np.where(p > 0, p * np.log2(p), 0.0), axis=1)
    return float(h.mean())


def shuffle_quality(
    batches: Sequence[Sequence[int]], num_classes: int, *, batch_size: int, seed: int = 0,
    trials: int = 5,
) -> float | None:
    """Per-batch class entropy of the delivered order / that of uniform random permutations.

    1.0 means batches are as mixed as a perfect shuffle of the same labels would make them;
    a class-ordered stream scores near 0. Labels are taken in delivery order, so batches
    formed per worker are judged as the training step sees them.
    """
    labels = np.fromiter((int(x) for b in batches for x in b), dtype=np.int64)
    if len(labels) < batch_size or num_classes < 2:
        return None
    rng = np.random.default_rng(seed)
    ideal = float(np.mean([
        batch_entropy(rng.permutation(labels), num_classes, batch_size) for _ in range(trials)
    ]))
    return batch_entropy(labels, num_classes, batch_size) / ideal if ideal > 0 else None


_CALL = re.compile(r'^(\d+)\s+(?:open|openat)\((?:[^,"]*, )?"([^"]*)"(.*)$')
_RESUMED = re.compile(r'^(\d+)\s+<\.\.\. (?:open|openat) resumed>.*=\s*(-?\d+)')
_RESULT = re.compile(r'=\s*(-?\d+)')


def strace_prefix(log: Path) -> list[str] | None:
    """The command prefix that logs every open of a process tree, or None without strace."""
    if shutil.which("strace") is None:
        return None
    return ["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=open,openat", "-o", str(log)]


def _opens(log: Path) -> list[tuple[str, int]]:
    """``(path, result)`` of every open in the log, joining calls strace split in two."""
    pending: dict[str, str] = {}
    out: list[tuple[str, int]] = []
    for line in log.read_text(errors="replace").splitlines():
        call = _CALL.match(line)
        if call is not None:
            pid, path, rest = call.groups()
            if "<unfinished ...>" in rest:
                pending[pid] = path
            elif (result := _RESULT.search(rest)) is not None:
                out.append((path, int(result.group(1))))
            continue
        resumed = _RESUMED.match(line)
        if resumed is not None and resumed.group(1) in pending:
            out.append((pending.pop(resumed.group(1)), int(resumed.group(2))))
    return out


def count_opens(log: Path, *, under: Path, markers: Sequence[str]) -> list[dict[str, int]]:
    """Successful opens of files below ``under``, per span between consecutive markers.

    Returns one ``{"opens": n, "files": distinct}`` per span (``len(markers) - 1`` spans).
    """
    prefix = str(under.resolve()) + os.sep
    spans: list[list[str]] = []
    current: list[str] | None = None
    for path, result in _opens(log):
        if any(path.endswith(m) for m in markers):
            current = []
            spans.append(current)
        elif current is not None and result >= 0 and path.startswith(prefix):
            current.append(path)
    return [{"opens": len(s), "files": len(set(s))} for s in spans[: max(0, len(markers) - 1)]]


def median(values: Iterable[float]) -> float:
    """Median of the finite values (NaN when none)."""
    finite = sorted(v for v in values if v is not None and math.isfinite(v))
    if not finite:
        return math.nan
    mid = len(finite) // 2
    return finite[mid] if len(finite) % 2 else (finite[mid - 1] + finite[mid]) / 2
