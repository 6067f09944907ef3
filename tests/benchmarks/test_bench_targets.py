"""The harness's target checks (``benchmarks/summary.py``) on a committed full run.

The plain-DataLoader system reads ``shardio-records``' pack, so it gets the reading targets
(issue 10: they hold "through ``shardio.loader`` and through a plain ``DataLoader``") and
none of the pack's; checked again, every system's checks are those the run stored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.summary import DATALOADER, targets

RUN = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "2026-11-27-full.json"


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
    stored = {(t["dataset"], t["system"], t["target"]): t["value"] for t in results["targets"]}
    assert {(t["dataset"], t["system"], t["target"]): t["value"] for t in checks} == stored
