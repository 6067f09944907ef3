"""Smoke run of the benchmark harness (``benchmarks/run.py``) on tiny generated trees.

No timing is asserted: the test proves the harness runs end to end in a fresh process per
measurement, that every system it can run delivers each sample exactly once per epoch,
that systems whose library is missing are skipped with a reason instead of crashing,
and that the results file and the README tables keep their structure.

It takes about three minutes, so it is marked ``harness``: the default ``pytest`` run
deselects it (``addopts`` in pyproject.toml) and ``.ci/run`` runs it as its own step
(``pytest -m harness``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
NUM_IMAGES = 30
NUM_TINY = 200
NUM_FIELDS = 200
NUM_MIXED = 100
NUM_FIRST = 300
KINDS = ("images", "tiny", "fields", "mixed")
pytestmark = pytest.mark.harness
SYSTEMS = ("imagefolder", "lmdb-file", "shardio-records", "webdataset")
"""shardio's LMDB backend is the same adapter as its ``.rec`` files (``backend="lmdb"``): the
harness's mechanics are proved without it, and the run takes a fifth less."""


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One harness run: every tree, raw warm epochs with 0 workers, audits with 2."""
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "results.json"
    cmd = [
        sys.executable, "-m", "benchmarks.run", "--images", str(NUM_IMAGES), "--tiny",
        str(NUM_TINY), "--fields", str(NUM_FIELDS), "--mixed", str(NUM_MIXED),
        "--first-sample", str(NUM_FIRST), "--repeats", "1", "--workers", "0", "--caches", "warm",
        "--systems", ",".join(SYSTEMS), "--data-dir", str(tmp / "data"),
        "--work-dir", str(tmp / "work"), "--out", str(out),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return data


def test_results_have_provenance(results: dict[str, Any]) -> None:
    assert results["schema"] == 1
    assert results["machine"]["cores"] >= 1
    assert results["versions"]["shardio"]
    python = os.path.relpath(Path(sys.executable).absolute(), REPO)
    if python.startswith(".."):
        python = Path(sys.executable).name
    assert results["command"] == f"{python} -m benchmarks.run"  # the interpreter that ran it
    assert set(results["datasets"]) == set(KINDS)
    assert results["datasets"]["images"]["num_files"] == NUM_IMAGES
    assert results["datasets"]["tiny"]["num_files"] == NUM_TINY
    assert results["datasets"]["fields"]["num_files"] == NUM_FIELDS
    assert results["datasets"]["mixed"]["num_files"] == NUM_MIXED


@pytest.mark.parametrize("kind", KINDS)
def test_every_runnable_system_delivers_each_sample_once(
    results: dict[str, Any], kind: str
) -> None:
    ds = results["datasets"][kind]
    n = ds["num_files"]
    assert set(ds["systems"]) == set(SYSTEMS)
    for name in ("imagefolder", "lmdb-file", "shardio-records"):
        system = ds["systems"][name]
        assert system["status"] == "ok", (name, system.get("reason"))
        audit = system["audit"]
        assert audit["samples_per_epoch"] == [n, n], name
        assert audit["exactly_once"] == [True, True], name
        epoch = system["epochs"]["raw-w0-warm"]
        assert epoch["samples"] == n, name
        assert epoch["bytes"] > 0, name
        if kind == "images":
            assert system["epochs"]["decoded-w2-warm"]["samples"] == n, name
        if name != "imagefolder":
            assert system["pack"]["output_bytes"] > 0, name
        random = system["epochs"]["random-w0-warm"]
        assert (random["samples"], random["bytes"]) == (n, epoch["bytes"]), name
    unchecked = ds["systems"]["shardio-records"]["epochs"]["raw-w0-warm-nocheck"]
    assert unchecked["samples"] == n
    assert "raw-w0-warm-nocheck" not in ds["systems"]["lmdb-file"]["epochs"]


def test_several_fields_are_read_whole_by_every_system(results: dict[str, Any]) -> None:
    ds = results["datasets"]["fields"]
    single = {name: s["epochs"]["raw-w0-warm"]["bytes"] for name, s in ds["systems"].items()
              if s["status"] == "ok"}
    assert single["imagefolder"] == ds["num_bytes"]  # both files of every sample
    assert set(single.values()) == {ds["num_bytes"]}, single


def test_first_sample_is_timed_for_every_system(results: dict[str, Any]) -> None:
    first = results["first_sample"]
    assert first["num_samples"] == NUM_FIRST
    for name in ("imagefolder", "lmdb-file", "shardio-records"):
        assert first["systems"][name]["batch_samples"] == 64, name
    rows = [t for t in results["targets"] if t["dataset"].startswith("tiny, ")]
    assert {t["system"] for t in rows} >= {"shardio-records"}


def test_missing_peer_is_skipped_with_a_reason(results: dict[str, Any]) -> None:
    peer = results["datasets"]["tiny"]["systems"]["webdataset"]
    if importlib.util.find_spec("webdataset") is None:
        assert peer["status"] == "skipped"
        assert "webdataset" in peer["reason"]
        assert not peer["epochs"]
    else:
        assert peer["status"] == "ok"
        assert peer["audit"]["exactly_once"] == [True, True]


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_files_opened_are_counted_per_epoch(results: dict[str, Any]) -> None:
    systems = results["datasets"]["tiny"]["systems"]
    baseline = systems["imagefolder"]["audit"]["opens"]
    assert len(baseline) == 2
    assert all(epoch["opens"] >= NUM_TINY for epoch in baseline)
    shards = systems["shardio-records"]["audit"]["opens"]
    assert all(1 <= epoch["opens"] < NUM_TINY for epoch in shards)


def test_targets_and_readme_tables_render(results: dict[str, Any]) -> None:
    from benchmarks.report import render

    checked = {(t["dataset"], t["system"]) for t in results["targets"]}
    assert {(kind, "shardio-records") for kind in KINDS} <= checked
    names = {t["target"] for t in results["targets"]}
    assert {"random access x single LMDB file",
            "warm epoch with checksums / without (checks' share < 5%)"} <= names
    assert all(t["met"] in (True, False, None) for t in results["targets"])
    text = render(results)
    for name in SYSTEMS:
        assert f"| {name} |" in text
    assert "Time to the first sample" in text
