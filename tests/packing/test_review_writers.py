"""Writers of one local dataset take turns; readers never wait; an append packs as the dataset was.

Real processes throughout: ``python -m shardio`` subprocesses started at once on
a generated tree, and a subprocess that holds a dataset's write lock while this
process reads or writes.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import shardio
from shardio.errors import DatasetLockedError
from shardio.format.manifest import load_manifest
from shardio.packing import journal
from shardio.reading.reader import DatasetReader
from shardio.synth import make_photo

SHARDIO = [sys.executable, "-m", "shardio"]


def make_files(root: Path, prefix: str, count: int) -> dict[str, bytes]:
    """``count`` small generic files ``root/<prefix>/f<n>.bin``; returns key -> bytes."""
    (root / prefix).mkdir(parents=True)
    files = {}
    for n in range(count):
        data = f"{prefix}:{n}:".encode() * (1 + n % 7)
        (root / prefix / f"f{n:04d}.bin").write_bytes(data)
        files[f"{prefix}/f{n:04d}"] = data
    return files


def stored(out: Path) -> collections.Counter[tuple[str, bytes]]:
    """Every (key, bytes) the dataset in ``out`` holds, counted."""
    with DatasetReader(out) as reader:
        return collections.Counter((s["__key__"], bytes(s["bin"]))
                                   for i in range(reader.manifest.num_samples)
                                   for s in [reader.get(i)])


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SHARDIO, *map(str, args)], capture_output=True, text=True,
                          check=False)


@pytest.mark.parametrize("trial", range(3))
def test_two_appends_at_once_keep_every_sample_once(tmp_path: Path, trial: int) -> None:
    files = make_files(tmp_path / "base", "base", 40)
    out = tmp_path / "ds"
    shardio.pack(tmp_path / "base", out, num_workers=1, imagefolder=False)
    news = [make_files(tmp_path / f"src{n}", f"new{n}", 300) for n in range(2)]
    procs = [subprocess.Popen([*SHARDIO, "pack", str(tmp_path / f"src{n}"), str(out), "--append",
                               "--num-workers", "1", "--max-shard-samples", "50"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in range(2)]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    assert [rc for rc, _, _ in results] == [0, 0], results
    expected = collections.Counter({**files, **news[0], **news[1]}.items())
    assert stored(out) == expected
    assert load_manifest(out).num_samples == 640
    assert run_cli("verify", out).returncode == 0
    assert sorted(os.listdir(out)) == sorted(["manifest.json",
                                              *(s.name for s in load_manifest(out).shards)])


HOLD = textwrap.dedent("""
    import sys
    from pathlib import Path
    from shardio.packing.journal import dataset_lock
    with dataset_lock(Path(sys.argv[1]), "a test holding the lock"):
        print("held", flush=True)
        sys.stdin.read()
""")


Held = tuple[Path, dict[str, bytes], "subprocess.Popen[str]"]


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Held]:
    """A dataset of 40 samples whose write lock another process holds until the test ends."""
    files = make_files(tmp_path / "base", "base", 40)
    out = tmp_path / "ds"
    shardio.pack(tmp_path / "base", out, num_workers=1, imagefolder=False)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    yield out, files, holder
    holder.communicate("", timeout=30)


def test_readers_are_not_blocked_by_a_writer(held: Held) -> None:
    out, files, holder = held
    assert stored(out) == collections.Counter(files.items())
    assert shardio.verify(out).ok
    ds = shardio.StreamingDataset(out, decode="raw", shuffle_buffer=4)
    assert sorted(s["__key__"] for s in ds) == sorted(files)
    assert holder.poll() is None  # the lock was held throughout


def test_a_writer_that_cannot_get_the_lock_says_who_holds_it(
        held: Held, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, files, holder = held
    monkeypatch.setattr(journal, "LOCK_WAIT_S", 0.5)
    make_files(tmp_path / "more", "more", 3)
    for write in (lambda: shardio.pack(tmp_path / "more", out, append=True, num_workers=1),
                  lambda: shardio.pack(tmp_path / "more", out, overwrite=True, num_workers=1),
                  lambda: shardio.merge([tmp_path / "ds"], out)):
        with pytest.raises(DatasetLockedError) as caught:
            write()
        message = str(caught.value)
        assert str(out) in message and f"pid {holder.pid}" in message, message
        assert "a test holding the lock" in message, message
        assert isinstance(caught.value, TimeoutError)
    assert stored(out) == collections.Counter(files.items())  # nothing was changed


def test_a_failed_first_pack_leaves_no_folder_and_no_lock(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "empty.bin").write_bytes(b"")
    with pytest.raises(shardio.BadInputError):
        shardio.pack(tmp_path / "src", tmp_path / "ds", num_workers=1)
    assert not (tmp_path / "ds").exists()


# item 15: an append packs as the dataset was packed


def broken_jpeg(seed: int) -> bytes:
    return make_photo(np.random.default_rng(seed), 16, 12)[:40]  # the header, no scan


@pytest.mark.parametrize("flags", [(), ("--skip-bad",)])
def test_append_keeps_the_datasets_check_images_and_skip_bad(
        tmp_path: Path, flags: tuple[str, ...]) -> None:
    src = tmp_path / "src"
    rng = np.random.default_rng(0)
    (src / "cat").mkdir(parents=True)
    for n in range(4):
        (src / "cat" / f"ok{n}.jpg").write_bytes(make_photo(rng, 16, 12))
    (src / "cat" / "broken.jpg").write_bytes(broken_jpeg(1))
    (src / "cat" / "empty.jpg").write_bytes(b"")
    out = tmp_path / "ds"
    first = run_cli("pack", src, out, "--check-images", "--skip-bad", "--num-workers", "1")
    assert first.returncode == 0, first.stderr
    skipped_before = load_manifest(out).skipped
    assert {s.path for s in skipped_before} == {"cat/broken.jpg", "cat/empty.jpg"}
    for n in range(4, 6):  # two new images in the same folder, appended by re-running on it
        (src / "cat" / f"ok{n}.jpg").write_bytes(make_photo(rng, 16, 12))
    again = run_cli("pack", src, out, "--append", "--skip-existing", "--num-workers", "1", *flags)
    assert again.returncode == 0, again.stderr
    manifest = load_manifest(out)
    with DatasetReader(out) as reader:
        keys = sorted(reader.keys())
    assert keys == [f"cat/ok{n}.jpg" for n in range(6)]  # broken.jpg is not let in
    assert manifest.skipped == skipped_before  # once each, as before
    assert manifest.options["check_images"] is True and manifest.options["skip_bad"] is True
    assert run_cli("verify", out).returncode == 0


def test_append_never_packs_a_file_the_dataset_skipped_unless_asked(tmp_path: Path) -> None:
    src = tmp_path / "src"
    files = make_files(src, "a", 3)
    (src / "a" / "f0009.bin").write_bytes(b"")  # empty: bad input
    out = tmp_path / "ds"
    shardio.pack(src, out, num_workers=1, imagefolder=False, skip_bad=True)
    (src / "a" / "f0009.bin").write_bytes(b"fixed")  # the file is fine now, but was skipped
    summary = shardio.pack(src, out, append=True, skip_existing=True, num_workers=1)
    assert summary.samples == 0 and [p for p, _ in summary.skipped] == ["a/f0009.bin"]
    assert stored(out) == collections.Counter(files.items())
    assert [s.path for s in load_manifest(out).skipped] == ["a/f0009.bin"]
    summary = shardio.pack(src, out, append=True, skip_existing=True, num_workers=1,
                           retry_skipped=True)
    assert summary.samples == 1 and summary.skipped == ()
    assert stored(out) == collections.Counter({**files, "a/f0009": b"fixed"}.items())
    assert load_manifest(out).skipped == ()  # packed now: no longer listed as skipped
    assert shardio.verify(out).ok
