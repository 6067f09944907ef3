"""Shared fixtures: generated data (never checked in), parametrized over backend × codec."""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shardio.synth import make_imagefolder, make_tiny_tree

BACKENDS = ("records", "lmdb")
CODECS = ("zstd", "none")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Every test that takes ``backend`` runs once per backend."""
    return str(request.param)


@pytest.fixture(params=CODECS)
def codec(request: pytest.FixtureRequest) -> str:
    """Every test that takes ``codec`` runs once per codec."""
    return str(request.param)


@pytest.fixture(scope="session")
def imagefolder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small class-ordered ImageFolder of real JPEGs: 4 classes × 12 images, 48–64 px."""
    root = tmp_path_factory.mktemp("imagefolder")
    make_imagefolder(root, num_classes=4, per_class=12, seed=1, long_side=(48, 64))
    return root


@pytest.fixture(scope="session")
def imagefolder_pack(imagefolder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``imagefolder`` packed into shards of 10 samples, for tests that only read it."""
    import shardio

    out = tmp_path_factory.mktemp("imagefolder-pack") / "pack"
    shardio.pack_imagefolder(imagefolder, out, options=shardio.WriteOptions(
        max_shard_samples=10), num_workers=1, progress=False)
    return out


@pytest.fixture
def unreadable(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """``unreadable(path)``: opening ``path`` fails with EACCES in this process (as root,
    file modes do not stop reads), whatever else ``os.open`` is asked."""
    real_open = os.open
    victims: set[str] = set()

    def failing_open(path: str, *args: int, **kwargs: int) -> int:
        if path in victims:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing_open)
    return victims.add


@pytest.fixture(scope="session")
def tiny_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A nested tree of 300 small binary files."""
    root = tmp_path_factory.mktemp("tiny")
    make_tiny_tree(root, num_files=300, seed=2, files_per_folder=25)
    return root


@pytest.fixture
def staging_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Staging folders (a remote pack's) under this test's own temporary folder, here and in
    child processes, so that a test can see what a pack left there."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Fail a test that leaves threads running (a prefetcher or writer that never stopped)."""
    before = set(threading.enumerate())
    yield
    leaked = [
        t for t in threading.enumerate()
        if t not in before and t.is_alive() and not t.daemon
    ]
    for thread in leaked:
        thread.join(timeout=5)
    still = [t.name for t in leaked if t.is_alive()]
    assert not still, f"test leaked threads: {still}"
