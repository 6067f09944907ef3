"""The scripts of ``examples/`` run as a user runs them: real processes, generated data, CPU.

Each runs a few steps on small images: the ImageFolder script packs, trains, checkpoints
and resumes (alone and as two ``torchrun`` ranks over gloo), the remote one packs to
moto's S3 and reads through the node cache, the mixing one draws two packs by weight.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from storage_servers import S3Endpoint

import shardio
from shardio.synth import make_imagefolder

pytest_plugins = ("storage_plugin",)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = ("--batch-size", "8", "--num-workers", "2", "--image-size", "32")


def run_example(script: str, *args: str, cwd: Path, launcher: tuple[str, ...] = ()) -> str:
    """Run ``examples/<script>`` with ``args`` in ``cwd``; its stdout (it must exit 0)."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}  # gloo on loopback, whatever the hostname
    proc = subprocess.run([sys.executable, *launcher, str(EXAMPLES / script), *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, f"{script} {' '.join(args)} failed:\n{proc.stderr[-4000:]}"
    return proc.stdout


def read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_imagefolder_script_resumes_exactly_where_its_checkpoint_left_off(
    imagefolder: Path, tmp_path: Path
) -> None:
    """8 steps of 8 (48 images: an epoch is 6 steps) against 5, checkpoint, then 3 more."""
    packed = tmp_path / "packed"
    out = run_example("train_imagefolder.py", "--data", str(imagefolder), "--packed",
                      str(packed), "--steps", "8", *SMALL, "--checkpoint", "full.pt",
                      "--log-file", "full.jsonl", cwd=tmp_path)
    assert f"packed 48 samples of {imagefolder}" in out
    assert shardio.read_manifest(packed).num_samples == 48
    run_example("train_imagefolder.py", "--data", str(packed), "--steps", "5", *SMALL,
                "--checkpoint", "part.pt", "--log-file", "part.jsonl", cwd=tmp_path)
    assert torch.load(tmp_path / "part.pt", weights_only=True)["step"] == 5
    out = run_example("train_imagefolder.py", "--data", str(packed), "--steps", "8", *SMALL,
                      "--checkpoint", "part.pt", "--log-file", "part.jsonl", "--resume",
                      cwd=tmp_path)
    assert "resumed at step 5, epoch 0" in out

    full, resumed = read_log(tmp_path / "full.jsonl"), read_log(tmp_path / "part.jsonl")
    assert [row["step"] for row in resumed] == list(range(1, 9))
    assert [row["epoch"] for row in full] == [0] * 6 + [1] * 2
    for uninterrupted, interrupted in zip(full, resumed, strict=True):
        # the same batches, and the same model and optimizer state training on them
        assert interrupted["labels"] == uninterrupted["labels"]
        assert interrupted["loss"] == pytest.approx(uninterrupted["loss"], rel=1e-5)
    assert torch.load(tmp_path / "part.pt", weights_only=True)["step"] == 8


@pytest.mark.servers
def test_the_imagefolder_script_runs_as_two_torchrun_ranks_and_resumes_in_one_process(
    imagefolder_pack: Path, tmp_path: Path
) -> None:
    run_example("train_imagefolder.py", "--data", str(imagefolder_pack), "--steps", "2",
                "--batch-size", "4", "--num-workers", "1", "--image-size", "32",
                "--checkpoint", "ddp.pt", "--log-file", "ddp.jsonl", cwd=tmp_path,
                launcher=("-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"))
    checkpoint = torch.load(tmp_path / "ddp.pt", weights_only=True)
    assert checkpoint["step"] == 2
    # each rank's position: 2 batches of 4 read by each of the two ranks
    assert [state["consumed"] for state in checkpoint["loaders"]] == [{"0": [8]}, {"1": [8]}]
    out = run_example("train_imagefolder.py", "--data", str(imagefolder_pack), "--steps", "4",
                      "--batch-size", "4", "--num-workers", "1", "--image-size", "32",
                      "--checkpoint", "ddp.pt", "--log-file", "ddp.jsonl", "--resume",
                      cwd=tmp_path)
    assert "resumed at step 2, epoch 0" in out  # the two ranks' positions merged
    assert [row["step"] for row in read_log(tmp_path / "ddp.jsonl")] == [1, 2, 3, 4]


@pytest.mark.servers
def test_the_remote_script_packs_to_s3_and_reads_through_the_node_cache(
    imagefolder: Path, s3: S3Endpoint, tmp_path: Path
) -> None:
    args = ("--url", s3.url, "--pack", str(imagefolder), "--cache-dir", str(tmp_path / "cache"),
            "--steps", "4", *SMALL)
    out = run_example("train_remote.py", *args, cwd=tmp_path)
    assert f"packed 48 samples of {imagefolder} to {s3.url}" in out
    first = json.loads(out.splitlines()[-1])
    assert first["steps"] == 4 and first["samples"] == 32 and first["cache_bytes"] > 0
    downloaded = s3.plan.get_bytes

    out = run_example("train_remote.py", *args, cwd=tmp_path)
    assert f"{s3.url} holds a dataset already" in out
    again = json.loads(out.splitlines()[-1])
    assert again["steps"] == 4 and again["samples"] == 32
    # the second run is served by the node cache: only each shard's small tail is fetched
    assert s3.plan.get_bytes - downloaded < downloaded / 10


def test_the_mixing_script_draws_each_source_by_weight_every_epoch(
    imagefolder_pack: Path, tmp_path: Path
) -> None:
    make_imagefolder(tmp_path / "more", num_classes=4, per_class=3, seed=7, long_side=(48, 64))
    curated = tmp_path / "curated"
    shardio.pack(tmp_path / "more", curated, num_workers=1, progress=False)
    out = run_example("train_mixed.py", "--source", f"{imagefolder_pack}:3", "--source",
                      f"{curated}:1", "--epoch-size", "16", "--epochs", "2", *SMALL,
                      cwd=tmp_path)
    epochs = [json.loads(line) for line in out.splitlines()]
    assert [e["epoch"] for e in epochs] == [0, 1]
    for epoch in epochs:  # 3:1 of 16 in every epoch; "pack" is the first source's folder
        assert epoch["samples"] == {imagefolder_pack.name: 12, "curated": 4}
