"""The harness's target checks (``benchmarks/summary.py``) on a committed run of every shape.

The plain-DataLoader system reads ``shardio-records``' pack, so it gets the reading targets
(issue 10: they hold "through ``shardio.loader`` and through a plain ``DataLoader``") and
none of the pack's; issue 29's rows (random access against the LMDB file, the checksums'
share, the first sample on 10^5 samples) are ratios of the run's own figures; checked
again, every system's checks are those the run stored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.summary import DATALOADER, LMDB, first_sample_targets, targets

RUN = max((Path(__file__).resolve().parents[2] / "benchmarks" / "results").glob(
    "*-quick-shapes.json"))
"""The latest run of every shape, as ``benchmarks.report`` picks it."""


def test_the_plain_dataloader_gets_the_reading_targets_only() -> None:
    results: dict[str, Any] = json.loads(RUN.read_text(encoding="utf-8"))
    checks = targets(results["datasets"])
    for kind, ds in results["datasets"].items():
        mine = {t["target"]: t for t in checks
                if t["dataset"] == kind and t["system"] == DATALOADER}
        assert not any("pack" in name or "output" in name for name in mine)
        warm = mine["warm epoch x best peer"]
        assert warm["value"] == ds["ratios"]["raw-w0-warm"][DATALOADER]["vs_best_peer"]
        assert warm["met"] is (warm["value"] >= 1.5)
        epochs = ds["systems"][DATALOADER]["epochs"]
        assert mine["warm epoch, 2 workers x 0 workers"]["value"] == (
            epochs["raw-w2-warm"]["samples_per_s"] / epochs["raw-w0-warm"]["samples_per_s"])
        assert ("decoded, 2 workers x decode limit (2 cores)" in mine) is (kind == "images")
    # the committed run was summarized by this code: checking it again changes nothing
    checks += first_sample_targets(results["first_sample"])
    stored = {(t["dataset"], t["system"], t["target"]): t["value"] for t in results["targets"]}
    assert {(t["dataset"], t["system"], t["target"]): t["value"] for t in checks} == stored


def test_issue_29_rows_are_ratios_of_the_runs_own_figures() -> None:
    results: dict[str, Any] = json.loads(RUN.read_text(encoding="utf-8"))
    assert set(results["datasets"]) == {"images", "tiny", "fields", "mixed"}
    for kind, ds in results["datasets"].items():
        rows = {t["target"]: t for t in results["targets"]
                if t["dataset"] == kind and t["system"] == "shardio-records"}
        epochs = ds["systems"]["shardio-records"]["epochs"]
        lmdb = ds["systems"][LMDB]["epochs"]
        random = rows["random access x single LMDB file"]
        assert random["value"] == (epochs["random-w0-warm"]["samples_per_s"]
                                   / lmdb["random-w0-warm"]["samples_per_s"])
        checks = rows["warm epoch with checksums / without (checks' share < 5%)"]
        assert checks["value"] == (epochs["raw-w0-warm"]["samples_per_s"]
                                   / epochs["raw-w0-warm-nocheck"]["samples_per_s"])
        assert checks["met"] is (checks["value"] >= 0.95)
    first = results["first_sample"]
    assert first["num_samples"] == 100_000
    row = next(t for t in results["targets"]
               if t["dataset"] == "tiny, 100,000 samples" and t["system"] == "shardio-records")
    assert row["value"] == 0.1 / first["systems"]["shardio-records"]["first_batch_s"]
