"""``bench_remote`` records the command that reproduces its figures: every argument that
changed them, and none of this machine's scratch folders."""

from __future__ import annotations

from benchmarks.bench_remote import replayed


def test_the_recorded_command_keeps_what_shaped_the_figures() -> None:
    argv = ["--datasets", "images,tiny", "--work-dir", "/scratch/w", "--data-dir=/scratch/d",
            "-v", "--budgets", "fits", "--bandwidth-mbs", "0", "--update-readme",
            "--out", "benchmarks/results/remote-uncapped.json"]
    assert replayed(argv) == ["--datasets", "images,tiny", "--budgets", "fits",
                              "--bandwidth-mbs", "0",
                              "--out", "benchmarks/results/remote-uncapped.json"]
