"""Damage is always found and never read as data: seeded bit flips, truncations, zeroed pages.

For each backend × codec, a small labelled dataset gets ``FLIPS`` single-bit flips at
random bits of its shards (seeded), a few truncations at random lengths and every 4 KB
page zeroed in turn. Each damaged copy is checked in a child process (the machinery of
``benchmarks/stress_corruption.py``, which runs thousands of such cases): ``verify`` must
report a fault, and ``DatasetReader.get`` (every sample, one by one) and the streaming
path (a shuffled order) must raise a ``ShardioError`` or return exactly the original
bytes. A child that dies by a signal or hangs is a failure of the case it ran, never
the end of pytest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.stress_corruption import (
    ALLOCATED_MB,
    bomb_cases,
    flip_cases,
    hostile_manifest_cases,
    make_dataset,
    run_bombs,
    run_cases,
    shard_files,
    summarize,
    summarize_bombs,
    truncate_cases,
    zero_cases,
)

FLIPS = 150
"""Per backend × codec: 300 per backend, 600 in all."""


@pytest.mark.parametrize("codec", ["zstd", "none"])
@pytest.mark.parametrize("backend", ["records", "lmdb"])
def test_every_flip_truncation_and_zeroed_page_is_found_and_never_read_as_data(
    tmp_path: Path, backend: str, codec: str
) -> None:
    root = tmp_path / "ds"
    make_dataset(root, backend=backend, codec=codec, seed=3)
    rng = np.random.default_rng([11, len(backend), len(codec)])
    cases = flip_cases(root, FLIPS, rng) + truncate_cases(root, 8, rng) + zero_cases(root)
    outcomes = run_cases(root, cases, unpack=False)

    bad = [(case, out) for case, out in zip(cases, outcomes, strict=True) if not _holds(out)]
    assert not bad, f"{len(bad)} of {len(cases)} cases broke a guarantee, e.g. {bad[:3]}"
    total = summarize(cases, outcomes)["total"]
    assert total["tried"] == len(cases) == total["found"]
    assert total["readers_raised"] > len(cases) // 5, "the readers must have met the damage"
    if backend == "records":  # no byte of a .rec shard goes unchecked by a reader
        assert total["readers_exact"] == 0
    assert sorted(Path(p).name for p in root.iterdir()) == sorted(
        ["manifest.json", *shard_files(root)]), "the pristine copy must stay untouched"


def _holds(outcome: dict[str, Any]) -> bool:
    """verify found it; no crash; each reader raised a ShardioError or read exact bytes."""
    return (outcome.get("found") is True and not outcome.get("crash")
            and not outcome.get("untyped")
            and all(outcome[r] in ("raised", "exact") for r in ("get", "stream")))


def test_the_check_fails_on_a_miss_a_signal_and_a_hang(tmp_path: Path) -> None:
    """The harness itself: damage verify cannot see, a child killed by SIGBUS, a child stuck."""
    root = tmp_path / "ds"
    make_dataset(root, backend="records", codec="none", num_samples=6, per_shard=3)
    cases = [{"kind": "manifest", "path": ["seed"], "value": 99},
             {"kind": "selftest", "do": "sigbus"},
             {"kind": "manifest", "path": ["shards", 0, "checksum"], "value": "crc32:00000000"},
             {"kind": "selftest", "do": "hang"},
             {"kind": "flip", "file": shard_files(root)[1], "bit": 200}]
    outcomes = run_cases(root, cases, unpack=False, case_timeout_s=3)
    assert not _holds(outcomes[0]), "an edit verify cannot see must not pass as found"
    assert outcomes[0]["get"] == outcomes[0]["stream"] == "exact"
    assert outcomes[1]["crash"] and not _holds(outcomes[1])
    assert "exit -7" in outcomes[1]["fault"]
    assert _holds(outcomes[2]), "the next child goes on after a crash"
    assert outcomes[3]["crash"] and "no progress" in outcomes[3]["fault"]
    assert _holds(outcomes[4]) and outcomes[4]["get"] == "raised", "and after a hang"


def test_a_manifest_claiming_counts_no_shard_holds_is_refused_without_allocating(
    tmp_path: Path,
) -> None:
    """10^7, 10^10, 2^62 and negative counts and sizes: refused, never planned or allocated."""
    root = tmp_path / "ds"
    make_dataset(root, backend="records", codec="zstd", seed=5)
    cases = hostile_manifest_cases(root)
    outcomes = run_cases(root, cases, torch=True, unpack=False)

    bad = [(case, out) for case, out in zip(cases, outcomes, strict=True)
           if not _holds(out) or out["streaming"] not in ("raised", "exact")
           or out["indexed"] not in ("raised", "exact")]
    assert not bad, f"{len(bad)} of {len(cases)} hostile manifests broke a guarantee: {bad[:3]}"
    assert summarize(cases, outcomes)["total"]["allocated"] == 0
    assert all(out["streaming"] == "raised" for out in outcomes), "every claim must be refused"


def test_header_bombs_raise_decode_error_on_every_path_without_the_allocation() -> None:
    """A JPEG, a PNG, a .npy and a JSON claiming sizes they do not hold, through every path."""
    picked = {("jpeg", 20000), ("png", 30000), ("npy", 10**10), ("json", 10**6)}
    cases = [c for c in bomb_cases() if (c["make"], c["claim"][0]) in picked]
    outcomes = run_bombs(cases)

    summary = summarize_bombs(cases, outcomes)
    assert not summary["misses"], summary["misses"]
    for kind, counts in summary["by_kind"].items():
        assert counts["found"] == counts["tried"] == 1, kind
        assert counts["max_growth_mb"] < ALLOCATED_MB, kind
