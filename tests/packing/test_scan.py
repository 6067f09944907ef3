"""The walk split into tasks (``packing.scan``): any split finds what one serial walk finds."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import pytest

from shardio.packing.engines.local import ExecutorWalkPool, LocalEngine
from shardio.packing.scan import ScanPart, WalkSpec, split_folders, walk_part
from shardio.packing.sources.files import scan_source
from shardio.packing.walk import Folder
from shardio.synth import make_photo, make_tiny_tree


class CountingPool(ExecutorWalkPool):
    """Records every task's folders and the entries it walked."""

    def __init__(self, kind: Literal["processes", "threads"], max_entries: int) -> None:
        super().__init__(2, kind=kind, max_entries=max_entries)
        self.tasks: list[list[Folder]] = []
        self.entries: list[int] = []

    def submit(self, spec: WalkSpec, folders: list[Folder]) -> None:
        self.tasks.append(folders)
        super().submit(spec, folders)

    def next_done(self) -> ScanPart:
        part = super().next_done()
        self.entries.append(part.walk.entries)
        return part


def _odd_tree(root: Path) -> Path:
    """Nested generic samples, odd names, hidden entries and every kind of bad input."""
    import numpy as np

    rng = np.random.default_rng(3)
    for i in range(40):
        folder = root / f"d{i % 4}" / ("deep/er" if i % 3 else "") / f"s{i % 5}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"x{i}.jpg").write_bytes(make_photo(rng, 24, 16))
        if i % 2:
            (folder / f"x{i}.json").write_text(f'{{"i": {i}}}')
    (root / "d0" / "ü name.txt").write_text("unicode")
    (root / "d1" / "empty.bin").write_bytes(b"")
    (root / "d1" / ".hidden").write_text("h")
    (root / "d2" / ".hidden-folder").mkdir()
    (root / "d2" / "broken").symlink_to(root / "nowhere")
    (root / "d3" / "loop").symlink_to(root / "d3")
    (root / "d3" / "linked").symlink_to(root / "d0")
    (root / "d3" / "s0" / "no-dot").write_bytes(b"plain")
    os.mkfifo(root / "d0" / "pipe")
    (root / os.fsdecode(b"bad\xffname.bin")).write_bytes(b"x")
    return root


@pytest.mark.parametrize("kind", ["processes", "threads"])
@pytest.mark.parametrize("options", [
    {}, {"follow_symlinks": True}, {"include": ["d[0-2]/*"], "exclude": ["*.json"]},
    {"imagefolder": True},
])
def test_a_walk_split_into_tiny_tasks_finds_what_one_walk_finds(
    tmp_path: Path, kind: Literal["processes", "threads"], options: dict[str, object]
) -> None:
    root = _odd_tree(tmp_path / "src")
    serial = scan_source(root, **options)  # type: ignore[arg-type]
    pool = CountingPool(kind, max_entries=3)
    try:
        split = scan_source(root, pool=pool, **options)  # type: ignore[arg-type]
    finally:
        pool.close()
    assert split == serial  # samples, paths, classes, bad inputs, counts and digest
    assert len(pool.tasks) > 10 and max(len(t) for t in pool.tasks) > 1
    # a task stops once it has seen its budget, between folders (one folder is listed whole)
    assert max(pool.entries) < 3 + 20
    assert serial.bad and serial.samples


def test_tasks_walking_the_absolute_root_name_files_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tiny_tree(tmp_path / "src", num_files=60, seed=1, files_per_folder=7)
    monkeypatch.chdir(tmp_path)
    pool = CountingPool("threads", max_entries=5)
    try:
        split = scan_source("src", pool=pool, walk_root=str(tmp_path / "src"))
    finally:
        pool.close()
    assert split == scan_source("src")
    assert split.samples[0].paths[0].startswith("src/") and len(pool.tasks) > 3
    assert all(f[0].startswith(str(tmp_path)) for task in pool.tasks for f in task)


def test_a_task_returns_the_folders_it_did_not_reach(tmp_path: Path) -> None:
    make_tiny_tree(tmp_path, num_files=300, seed=1, files_per_folder=10)
    spec = WalkSpec(str(tmp_path), "src/")
    part = walk_part(spec, [(str(tmp_path), "", frozenset())], 25)
    assert part.walk.pending and len(part.walk.files) < 300
    rest = walk_part(spec, part.walk.pending, None)
    assert not rest.walk.pending
    assert sorted(f[0] for f in part.walk.files + rest.walk.files) == sorted(
        p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.bin"))
    samples = [g[2] for g in part.groups + rest.groups]  # grouped in the tasks
    assert len(samples) == 300 and all(s and s.paths[0] == f"src/{s.key}.bin" for s in samples)


def test_split_folders_deals_round_robin() -> None:
    folders: list[Folder] = [(f"/r/{i}", f"{i}/", frozenset()) for i in range(7)]
    batches = split_folders(folders, 3)
    assert [[f[1] for f in b] for b in batches] == [["0/", "3/", "6/"], ["1/", "4/"], ["2/", "5/"]]
    assert split_folders(folders[:2], 5) == [[folders[0]], [folders[1]]]
    assert split_folders(folders, 0) == [folders]


def test_local_engine_starts_its_pool_only_beyond_one_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tiny_tree(tmp_path / "src", num_files=200, seed=1, files_per_folder=10)
    started: list[int] = []
    submit = ExecutorWalkPool.submit

    def counting(self: ExecutorWalkPool, spec: WalkSpec, folders: list[Folder]) -> None:
        started.append(len(folders))
        submit(self, spec, folders)

    monkeypatch.setattr(ExecutorWalkPool, "submit", counting)
    serial = scan_source(tmp_path / "src")
    for budget, tasks in ((4096, 0), (16, 3)):
        started.clear()
        engine = LocalEngine(2, scan_with="processes", max_walk_entries=budget)
        assert engine.scan(tmp_path / "src", imagefolder=None, include=(), exclude=(),
                           follow_symlinks=False) == serial
        assert len(started) >= tasks and (tasks or not started)
