"""``shardio.pack`` end to end: round trips, determinism, bad input, resume after SIGKILL, CLI."""

from __future__ import annotations

import io
import itertools
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from PIL import Image

from shardio import open_dataset, read_manifest, verify
from shardio.cli import main
from shardio.errors import (
    BadInputError,
    EmptySourceError,
    OutputExistsError,
    PackError,
    StorageError,
)
from shardio.format.manifest import MANIFEST_NAME
from shardio.packing.journal import load_journal
from shardio.packing.pack import PackSummary, pack, pack_imagefolder
from shardio.packing.writer import JOURNAL_NAME, WriteOptions
from shardio.synth import make_photo, make_tiny_tree


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_imagefolder_round_trip(imagefolder: Path, tmp_path: Path, backend: str) -> None:
    summary = pack(imagefolder, tmp_path / "out", num_workers=1,
                   options=WriteOptions(backend=backend, max_shard_samples=10))
    manifest = read_manifest(tmp_path / "out")
    assert manifest.classes == tuple(f"class_{i:02d}" for i in range(4))
    assert summary.samples == manifest.num_samples == 48 and summary.shards == 5
    assert summary.imagefolder and summary.skipped == () and summary.ratio > 0
    files = _tree(imagefolder)
    with open_dataset(tmp_path / "out") as reader:
        got = {s["__key__"]: (s["image"], s["label"]) for s in reader}
    assert got == {k: (v, manifest.classes.index(k.split("/")[0])) for k, v in files.items()}
    assert summary.input_bytes == manifest.input_bytes == sum(map(len, files.values()))
    assert summary.output_bytes == manifest.num_bytes


def test_generic_round_trip_both_codecs(tiny_tree: Path, tmp_path: Path, codec: str) -> None:
    (tiny_tree.parent / "extra").mkdir(exist_ok=True)
    pack(tiny_tree, tmp_path / "out", num_workers=1, options=WriteOptions(codec=codec))
    with open_dataset(tmp_path / "out") as reader:
        got = {f"{s['__key__']}.bin": s["bin"] for s in reader}
    assert got == _tree(tiny_tree)
    manifest = read_manifest(tmp_path / "out")
    assert manifest.fields == ("bin",) and manifest.classes is None
    assert (manifest.num_bytes < manifest.input_bytes) == (codec == "zstd")


@pytest.mark.parametrize("backend", ["records", "lmdb"])
def test_output_is_identical_for_any_number_of_workers(
    imagefolder: Path, tmp_path: Path, backend: str
) -> None:
    options = WriteOptions(backend=backend, max_shard_samples=7)
    runs = [pack(imagefolder, tmp_path / f"w{w}", options=options, num_workers=w, seed=5)
            for w in (1, 2, 3)]
    assert _files(tmp_path / "w1") == _files(tmp_path / "w2") == _files(tmp_path / "w3")
    assert {(r.samples, r.shards) for r in runs} == {(48, 7)}


def test_files_found_bad_while_packing_are_skipped_alike_by_any_number_of_workers(
    imagefolder: Path, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    shutil.copytree(imagefolder / "class_00", src / "a")
    shutil.copytree(imagefolder / "class_01", src / "b")
    for name in ("a/bad1.jpg", "a/bad2.jpg", "b/bad3.jpg"):
        _bad_jpeg(src / name)
    options = WriteOptions(max_shard_bytes=12_000, codec="none")
    runs = [pack(src, tmp_path / f"w{w}", options=options, num_workers=w, check_images=True,
                 skip_bad=True) for w in (1, 2, 3)]
    assert _files(tmp_path / "w1") == _files(tmp_path / "w2") == _files(tmp_path / "w3")
    assert {r.samples for r in runs} == {24}
    assert [p for p, _ in runs[0].skipped] == ["a/bad1.jpg", "a/bad2.jpg", "b/bad3.jpg"]


def _framed_sizes(out: Path) -> list[list[int]]:
    with open_dataset(out) as reader:
        return [[len(f) for _, f in reader.shard(n).scan()]
                for n in range(len(read_manifest(out).shards))]


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_shards_never_exceed_max_shard_bytes(
    imagefolder: Path, tiny_tree: Path, tmp_path: Path, codec: str
) -> None:
    for src, limit in ((imagefolder, 9000), (tiny_tree, 20_000)):
        out = tmp_path / src.name
        pack(src, out, options=WriteOptions(codec=codec, max_shard_bytes=limit), num_workers=2)
        manifest = read_manifest(out)
        assert len(manifest.shards) > 3
        # the whole file: blocks, index, keys, header and footer
        assert all(s.num_bytes == (out / s.name).stat().st_size for s in manifest.shards)
        assert all(s.num_bytes <= limit or s.num_samples == 1 for s in manifest.shards)
        assert sum(s.num_samples for s in manifest.shards) == len(list(open_dataset(out)))


def test_a_planned_shard_of_only_bad_samples_is_left_out(
    imagefolder: Path, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    shutil.copytree(imagefolder / "class_00", src / "cat")
    _bad_jpeg(src / "cat" / "aaa.jpg")
    summary = pack(src, tmp_path / "out", options=WriteOptions(max_shard_samples=1),
                   shuffle=False, check_images=True, skip_bad=True, num_workers=2)
    manifest = read_manifest(tmp_path / "out")
    assert summary.shards == len(manifest.shards) == 12
    assert manifest.shards[0].name == "shard-00001.rec" and manifest.shards[0].first_index == 0
    assert sorted(os.listdir(tmp_path / "out")) == sorted(
        [MANIFEST_NAME] + [s.name for s in manifest.shards])
    assert verify(tmp_path / "out").ok
    with open_dataset(tmp_path / "out") as reader:
        assert [s["__key__"] for s in reader] == sorted(
            f"cat/{p.name}" for p in (imagefolder / "class_00").iterdir())


def test_shuffle_is_a_seeded_permutation(tiny_tree: Path, tmp_path: Path) -> None:
    def keys(seed: int, shuffle: bool = True) -> list[str]:
        out = tmp_path / f"s{seed}{shuffle}"
        pack(tiny_tree, out, seed=seed, shuffle=shuffle, num_workers=1, overwrite=True)
        with open_dataset(out) as reader:
            return list(reader.keys())

    ordered = keys(0, shuffle=False)
    assert ordered == sorted(ordered)
    assert keys(1) == keys(1) != keys(2)
    assert sorted(keys(1)) == ordered != keys(1)
    assert read_manifest(tmp_path / "s1True").seed == 1


def test_pack_options_land_in_the_manifest(imagefolder: Path, tmp_path: Path) -> None:
    pack(imagefolder, tmp_path / "out", num_workers=2, exclude=["*_000001.jpg"], seed=9,
         progress=False)
    manifest = read_manifest(tmp_path / "out")
    assert manifest.seed == 9 and manifest.shuffle and manifest.num_samples == 47
    assert manifest.options["exclude"] == ["*_000001.jpg"]
    assert manifest.options["imagefolder"] is True and "num_workers" not in manifest.options
    assert not (tmp_path / "out" / JOURNAL_NAME).exists()


def _bad_jpeg(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # whole in form (start, a scan, the end marker), so only a decode (check_images) finds it
    path.write_bytes(b"\xff\xd8\xff\xda\x00\x02 this is not really a JPEG \xff\xd9")


def test_bad_input_fails_naming_the_file_and_the_fix(imagefolder: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for cls in ("class_00", "class_01"):
        (src / cls).symlink_to(imagefolder / cls, target_is_directory=True)
    (src / "class_01-notes.txt").write_bytes(b"")
    with pytest.raises(BadInputError) as info:
        pack(src, tmp_path / "out", follow_symlinks=True, imagefolder=True)
    message = str(info.value)
    assert "class_01-notes.txt" in message and "empty file" in message
    assert "--skip-bad" in message
    assert "--no-imagefolder" not in message  # an empty file is bad whatever the mode
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_imagefolder_errors_offer_no_imagefolder_beside_skip_bad(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "cat").mkdir(parents=True)
    _bad_jpeg(src / "cat" / "1.jpg")
    (src / "cat" / "labels.csv").write_bytes(b"1,cat")
    with pytest.raises(BadInputError) as info:
        pack(src, tmp_path / "out", num_workers=1)
    message = str(info.value)
    assert "cat/labels.csv" in message and "not an image" in message
    assert "--skip-bad" in message and "--no-imagefolder" in message
    summary = pack(src, tmp_path / "out", imagefolder=False, num_workers=1)
    assert not summary.imagefolder and summary.files == 2 and summary.skipped == ()


def test_url_sources_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StorageError, match="s3://bucket/src: the source is a URL; shardio "
                       "pack reads SRC from a local folder"):
        pack("s3://bucket/src", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []  # no local folder named s3:
    # URL outputs are packed to (tests/packing/test_remote_pack.py)


def test_skip_bad_lists_skipped_files_in_summary_and_manifest(
    imagefolder: Path, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    for cls in ("a", "b"):
        for path in sorted((imagefolder / "class_00").iterdir())[:3]:
            (src / cls).mkdir(parents=True, exist_ok=True)
            (src / cls / path.name).write_bytes(path.read_bytes())
    (src / "a" / "empty.jpg").write_bytes(b"")
    (src / "a" / "readme.md").write_bytes(b"# notes")
    (src / "b" / "dangling.jpg").symlink_to(src / "nowhere.jpg")
    _bad_jpeg(src / "b" / "broken.jpg")
    (src / ".DS_Store").write_bytes(b"finder")
    summary = pack(src, tmp_path / "out", skip_bad=True, check_images=True, num_workers=2)
    assert summary.hidden_ignored == 1
    expected = {"a/empty.jpg", "a/readme.md", "b/dangling.jpg", "b/broken.jpg"}
    assert {p for p, _ in summary.skipped} == expected
    assert "does not decode as an image" in dict(summary.skipped)["b/broken.jpg"]
    manifest = read_manifest(tmp_path / "out")
    assert [(s.path, s.reason) for s in manifest.skipped] == list(summary.skipped)
    assert summary.samples == manifest.num_samples == 6
    assert manifest.input_bytes == sum(len(v) for k, v in _tree(src).items()
                                       if k not in expected and k != ".DS_Store")


def test_an_image_that_does_not_decode_stops_the_pack(imagefolder: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    _bad_jpeg(src / "cat" / "x.jpg")
    (src / "cat" / "y.jpg").write_bytes((imagefolder / "class_00" / "img_000000.jpg").read_bytes())
    pack(src, tmp_path / "unchecked", num_workers=1)
    with pytest.raises(BadInputError, match=r"(?s)x\.jpg: does not decode as an image.*--resume"):
        pack(src, tmp_path / "out", check_images=True, num_workers=1)
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_a_file_that_fails_to_read_is_reported(
    tiny_tree: Path, tmp_path: Path, unreadable: Callable[[str], None]
) -> None:
    victim = str(sorted(tiny_tree.rglob("*.bin"))[3])
    unreadable(victim)
    with pytest.raises(BadInputError, match="Permission denied"):
        pack(tiny_tree, tmp_path / "out", num_workers=1)
    summary = pack(tiny_tree, tmp_path / "out", num_workers=1, skip_bad=True, resume=True)
    rel = Path(victim).relative_to(tiny_tree).as_posix()
    assert summary.skipped == ((rel, "cannot be read (Permission denied)"),)
    assert summary.samples == 299


@pytest.mark.parametrize("change", ["grows", "goes"])
def test_a_file_that_changes_while_packing_is_named_with_advice_that_works(
        tiny_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    # the advice once said --skip-bad --resume, which a changed SRC refuses
    import shardio.packing.build as build

    src = shutil.copytree(tiny_tree, tmp_path / "src")  # the tree is shared: change a copy
    victim = sorted(src.rglob("*.bin"))[3]
    real = build.read_sample

    changed: list[bool] = []

    def read_after_a_change(*args: Any, **kwargs: Any) -> Any:
        if not changed:  # once, after the scan listed the file with its size
            changed.append(True)
            if change == "grows":
                victim.write_bytes(victim.read_bytes() + b"more")
            else:
                victim.unlink()
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "read_sample", read_after_a_change)
    with pytest.raises(BadInputError, match="changed while packing") as info:
        pack(src, tmp_path / "out", num_workers=1)
    assert str(victim) in str(info.value) and "--resume" not in str(info.value)
    monkeypatch.undo()
    summary = pack(src, tmp_path / "out", num_workers=1, overwrite=True)
    assert summary.samples == 300 - (change == "goes")


def test_empty_sources_are_refused(tmp_path: Path) -> None:
    (tmp_path / "src" / ".git").mkdir(parents=True)
    (tmp_path / "src" / ".DS_Store").write_bytes(b"x")
    with pytest.raises(EmptySourceError, match="2 hidden entries ignored"):
        pack(tmp_path / "src", tmp_path / "out")
    (tmp_path / "src" / "empty.txt").write_bytes(b"")
    with pytest.raises(EmptySourceError):
        pack(tmp_path / "src", tmp_path / "out", skip_bad=True)
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_output_rules(tiny_tree: Path, tmp_path: Path) -> None:
    pack(tiny_tree, tmp_path / "out", num_workers=1)
    with pytest.raises(OutputExistsError):
        pack(tiny_tree, tmp_path / "out", num_workers=1)
    assert pack(tiny_tree, tmp_path / "out", num_workers=1, overwrite=True).samples == 300
    with pytest.raises(PackError, match="inside the source"):
        pack(tiny_tree, tiny_tree / "out")


KILLER = textwrap.dedent("""
    import json, os, signal, sys, time
    from pathlib import Path
    from shardio.backends.lmdb import LmdbShardWriter
    from shardio.backends.records import RecordsShardWriter
    from shardio.packing.journal import load_journal
    from shardio.packing.pack import pack
    from shardio.packing.writer import JOURNAL_NAME, WriteOptions

    journal = Path(sys.argv[2]) / JOURNAL_NAME
    main_pid = os.getpid()

    def first_shard_journaled():
        return any(s["number"] == 0 for s in load_journal(journal.read_bytes())["shards"])

    def killing(append):
        def append_then_maybe_kill(self, sample):
            append(self, sample)
            self.appended = getattr(self, "appended", 0) + 1
            if self.appended == 2 and not self.path.name.startswith(".shard-00000"):
                while not first_shard_journaled():
                    time.sleep(0.01)
                os.kill(main_pid, signal.SIGKILL)
                os._exit(0)  # in a worker: nothing more to do
        return append_then_maybe_kill

    for cls in (RecordsShardWriter, LmdbShardWriter):
        cls.add = killing(cls.add)
    kwargs = json.loads(sys.argv[3])
    options = WriteOptions(backend=kwargs.pop("backend"), max_shard_samples=5)
    pack(sys.argv[1], sys.argv[2], options=options, num_workers=2, **kwargs)
""")


def _kill_midway(src: Path, out: Path, backend: str, **kwargs: object) -> None:
    """Pack with 2 workers in a subprocess, SIGKILLed once the first shard is journaled.

    Every other shard stops two samples in until then, so exactly the first
    shard is finished and one or two others are in flight when the pack dies.
    """
    killed = subprocess.run([sys.executable, "-c", KILLER, str(src), str(out),
                             json.dumps({"backend": backend, **kwargs})], capture_output=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    assert not (out / MANIFEST_NAME).exists()
    journaled = load_journal((out / JOURNAL_NAME).read_bytes())["shards"]
    assert [s["number"] for s in journaled] == [0]


def test_resume_after_sigkill_is_identical_to_an_uninterrupted_pack(
    imagefolder: Path, tmp_path: Path, backend: str
) -> None:
    _kill_midway(imagefolder, tmp_path / "out", backend, seed=7)
    with pytest.raises(OutputExistsError):
        pack(imagefolder, tmp_path / "out")
    options = WriteOptions(backend=backend, max_shard_samples=5)
    with pytest.raises(PackError, match="other options or input"):
        pack(imagefolder, tmp_path / "out", options=options, seed=8, resume=True)
    resumed = pack(imagefolder, tmp_path / "out", options=options, seed=7, resume=True,
                   num_workers=1)
    assert resumed.resumed_samples == 5
    whole = pack(imagefolder, tmp_path / "whole", options=options, seed=7, num_workers=1)
    assert _files(tmp_path / "out") == _files(tmp_path / "whole")
    assert resumed.samples == whole.samples == 48


def test_resume_keeps_what_the_interrupted_pack_skipped(imagefolder: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(imagefolder / "class_00", src / "cat")
    _bad_jpeg(src / "cat" / "aaa.jpg")  # first in sorted order: skipped inside the first shard
    flags: dict[str, bool] = {"check_images": True, "skip_bad": True, "shuffle": False}
    _kill_midway(src, tmp_path / "out", "records", **flags)
    options = WriteOptions(max_shard_samples=5)
    resumed = pack(src, tmp_path / "out", options=options, resume=True, num_workers=1, **flags)
    whole = pack(src, tmp_path / "whole", options=options, num_workers=1, **flags)
    assert resumed.resumed_samples == 4  # the first shard's 5 samples less the bad one
    assert _files(tmp_path / "out") == _files(tmp_path / "whole")
    assert resumed.skipped == whole.skipped
    assert [p for p, _ in whole.skipped] == ["cat/aaa.jpg"]


STALLER = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    from pathlib import Path
    from shardio.backends.records import RecordsShardWriter
    from shardio.packing.journal import load_journal
    from shardio.packing.pack import pack
    from shardio.packing.writer import JOURNAL_NAME, WriteOptions

    src, out, marks = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    stall, workers, journaled, how, interrupt_after_sending = json.loads(sys.argv[4])
    append = RecordsShardWriter.add

    def stalling(self, sample):
        append(self, sample)
        self.appended = getattr(self, "appended", 0) + 1
        if self.appended == 2 and int(self.path.name[7:12]) in stall:
            (marks / f"{self.path.name[7:12]}-{os.getpid()}").touch()
            parent = os.getppid()
            while os.getppid() == parent:  # in flight until the pack is stopped
                time.sleep(0.01)
            os._exit(0)

    def stop_when_ready():
        while True:
            time.sleep(0.01)
            if len(os.listdir(marks)) < len(stall) or not (out / JOURNAL_NAME).exists():
                continue
            if len(load_journal((out / JOURNAL_NAME).read_bytes())["shards"]) >= journaled:
                os.kill(os.getpid(), getattr(signal, how))
                return

    def interrupt_right_after(self, obj):
        # Ctrl-C just after the pack sent shard `interrupt_after_sending` to a worker
        send(self, obj)
        if os.getpid() == main and obj == interrupt_after_sending:
            while len(os.listdir(marks)) < len(stall):  # every stalled shard is in flight
                time.sleep(0.01)
            raise KeyboardInterrupt

    RecordsShardWriter.add = stalling
    # Ctrl-C as in a terminal: a suite started in the background by a shell without job
    # control inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    out.mkdir()
    if interrupt_after_sending is None:
        threading.Thread(target=stop_when_ready, daemon=True).start()
    else:
        from multiprocessing.connection import Connection
        send, main = Connection.send, os.getpid()
        Connection.send = interrupt_right_after
    pack(src, out, options=WriteOptions(max_shard_samples=5), num_workers=workers, seed=3)
""")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def _stop_with_shards_in_flight(
    src: Path, out: Path, tmp_path: Path, *, stall: list[int], workers: int, journaled: int,
    how: str = "SIGKILL", interrupt_after_sending: int | None = None,
) -> tuple[subprocess.CompletedProcess[bytes], list[int]]:
    """Pack with ``workers`` in a subprocess whose shards ``stall`` stop two samples in; stop it
    with signal ``how`` once they all have and ``journaled`` shards are finished, or with a
    ``KeyboardInterrupt`` raised right after sending shard ``interrupt_after_sending`` to a
    worker (once all of ``stall`` are in flight): Ctrl-C at the worst moment, every time.

    Returns the process and the shard numbers in the journal, after every worker is gone.
    """
    marks = tmp_path / "marks"
    marks.mkdir()
    stopped = subprocess.run(
        [sys.executable, "-c", STALLER, str(src), str(out), str(marks),
         json.dumps([stall, workers, journaled, how, interrupt_after_sending])],
        capture_output=True, timeout=60)
    pids = [int(m.name.split("-")[1]) for m in marks.iterdir()]
    for _ in range(1000):
        if all(_gone(pid) for pid in pids):
            break
        time.sleep(0.01)
    assert all(_gone(pid) for pid in pids), "workers outlived the pack"
    assert sorted(int(m.name.split("-")[0]) for m in marks.iterdir()) == stall
    assert not (out / MANIFEST_NAME).exists()
    return stopped, [s["number"] for s in load_journal((out / JOURNAL_NAME).read_bytes())["shards"]]


def _stamps(out: Path, numbers: list[int]) -> dict[int, tuple[int, int]]:
    paths = {n: out / f"shard-{n:05d}.rec" for n in numbers}
    return {n: (p.stat().st_ino, p.stat().st_mtime_ns) for n, p in paths.items()}


@pytest.mark.parametrize(("stall", "workers", "journaled"), [
    ([2, 3, 4], 3, 2),  # three shards in flight behind two finished ones
    ([0], 2, 3),  # the first shard in flight behind later ones: finished out of order
])
def test_resume_after_sigkill_with_shards_in_flight_is_identical(
    imagefolder: Path, tmp_path: Path, stall: list[int], workers: int, journaled: int
) -> None:
    out = tmp_path / "out"
    killed, finished = _stop_with_shards_in_flight(
        imagefolder, out, tmp_path, stall=stall, workers=workers, journaled=journaled)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    assert len(finished) >= journaled and not set(finished) & set(stall)
    in_flight = {n for n in os.listdir(out) if n.startswith(".shard-")}
    assert {f".shard-{n:05d}.rec.tmp" for n in stall} <= in_flight and len(in_flight) <= workers
    before = _stamps(out, finished)
    options = WriteOptions(max_shard_samples=5)
    resumed = pack(imagefolder, out, options=options, seed=3, resume=True, num_workers=2)
    pack(imagefolder, tmp_path / "whole", options=options, seed=3, num_workers=1)
    sizes = {s.name: s.num_samples for s in read_manifest(tmp_path / "whole").shards}
    assert resumed.resumed_samples == sum(sizes[f"shard-{n:05d}.rec"] for n in finished)
    assert _stamps(out, finished) == before, "finished shards are reused, not rewritten"
    assert _files(out) == _files(tmp_path / "whole")


def test_ctrl_c_stops_every_worker_and_removes_shards_in_flight(
    imagefolder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    stopped, finished = _stop_with_shards_in_flight(
        imagefolder, out, tmp_path, stall=[1, 2], workers=2, journaled=0, how="SIGINT")
    assert stopped.returncode == -signal.SIGINT and b"KeyboardInterrupt" in stopped.stderr
    assert not [n for n in os.listdir(out) if n.startswith(".shard-")]
    resumed = pack(imagefolder, out, options=WriteOptions(max_shard_samples=5), seed=3,
                   resume=True, num_workers=1)
    assert resumed.resumed_samples == 5 * len(finished) and resumed.samples == 48
    assert 9 not in finished, "the last shard, of 3 samples, waits behind the stalled ones"


def test_ctrl_c_right_after_a_shard_is_sent_still_removes_it(
    imagefolder: Path, tmp_path: Path
) -> None:
    """The flaky failure of the test above, made certain: shard 2's temporary file was left
    when Ctrl-C came between sending it to a worker and recording it as in flight."""
    out = tmp_path / "out"
    stopped, finished = _stop_with_shards_in_flight(
        imagefolder, out, tmp_path, stall=[1, 2], workers=2, journaled=0,
        interrupt_after_sending=2)
    assert stopped.returncode == -signal.SIGINT and b"KeyboardInterrupt" in stopped.stderr
    assert not [n for n in os.listdir(out) if n.startswith(".shard-")]
    assert finished == [0]
    resumed = pack(imagefolder, out, options=WriteOptions(max_shard_samples=5), seed=3,
                   resume=True, num_workers=1)
    assert resumed.resumed_samples == 5 and resumed.samples == 48


@pytest.mark.parametrize(("workers", "failure"), [(1, "raises"), (2, "raises"), (2, "dies")])
def test_a_failing_worker_leaves_no_manifest_and_no_partial_shard(
    imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, failure: str
) -> None:
    from shardio.backends.records import RecordsShardWriter

    append = RecordsShardWriter.add

    def failing(self: RecordsShardWriter, sample: Any) -> None:
        append(self, sample)
        if self.path.name.startswith(".shard-00003") and failure == "dies":
            os._exit(3)  # like a worker the OOM killer took
        if self.path.name.startswith(".shard-00003"):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(RecordsShardWriter, "add", failing)
    options = WriteOptions(max_shard_samples=5)
    expected = "No space left" if failure == "raises" else r"shard 3 died \(exit code 3\)"
    with pytest.raises((OSError, PackError), match=expected):
        pack(imagefolder, tmp_path / "out", options=options, num_workers=workers)
    names = os.listdir(tmp_path / "out")
    assert MANIFEST_NAME not in names and JOURNAL_NAME in names
    assert not [n for n in names if n.startswith(".shard-")]
    monkeypatch.setattr(RecordsShardWriter, "add", append)
    pack(imagefolder, tmp_path / "out", options=options, resume=True, num_workers=workers)
    pack(imagefolder, tmp_path / "whole", options=options, num_workers=1)
    assert _files(tmp_path / "out") == _files(tmp_path / "whole")


def test_the_journal_appends_a_line_a_shard_and_reads_what_a_kill_left(tmp_path: Path) -> None:
    # a journal rewritten whole after every shard made a pack of n shards cost n^2
    from shardio.packing.journal import JournalWriter, parse_journal

    identity = {"write": {"level": 3}, "source": "ab"}
    writer, shards = JournalWriter(tmp_path), []
    writer.write({"identity": identity, "shards": shards})
    for number in range(3):
        shards.append({"number": number})
        writer.write({"identity": identity, "shards": shards})
    path = tmp_path / JOURNAL_NAME
    assert path.read_text().count("\n") == 4 and not path.with_suffix(".json.tmp").exists()
    whole = {"identity": identity, "shards": [{"number": n} for n in range(3)]}
    assert parse_journal(path.read_bytes(), identity, where="out") == whole
    # a kill mid-append: the cut line is a shard not journaled, which a resume builds again
    cut = path.read_bytes() + b'{"numb'
    assert parse_journal(cut, identity, where="out")["shards"] == whole["shards"]
    # a journal written whole, as one JSON object, reads the same
    assert parse_journal(json.dumps(whole).encode(), identity, where="out") == whole
    with pytest.raises(PackError, match="damaged"):
        parse_journal(path.read_bytes().replace(b'{"number": 1}', b"{nu"), identity, where="out")
    writer.write({"identity": {**identity, "source": "cd"}, "shards": shards})  # all again
    assert parse_journal(path.read_bytes(), {**identity, "source": "cd"}, where="out") == {
        **whole, "identity": {**identity, "source": "cd"}}


def test_shards_may_finish_out_of_order(
    imagefolder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardio.backends.records import RecordsShardWriter
    from shardio.packing.journal import JournalWriter

    out = tmp_path / "out"
    append = RecordsShardWriter.add

    def first_shard_waits(self: RecordsShardWriter, sample: Any) -> None:
        while self.path.name.startswith(".shard-00000") and '"number": 1' not in (
                (out / JOURNAL_NAME).read_text()):
            time.sleep(0.01)
        append(self, sample)

    journaled: list[list[int]] = []

    write = JournalWriter.write

    def recording(self: JournalWriter, state: dict[str, Any]) -> None:
        journaled.append([s["number"] for s in state["shards"]])
        write(self, state)

    monkeypatch.setattr(RecordsShardWriter, "add", first_shard_waits)
    monkeypatch.setattr(JournalWriter, "write", recording)
    options = WriteOptions(max_shard_samples=5)
    pack(imagefolder, out, options=options, num_workers=2)
    # in the order they finished, each state the last one and one more
    assert journaled[1] != [0] and sorted(journaled[-1]) == list(range(10))
    assert all(a == b[:-1] for a, b in itertools.pairwise(journaled))
    monkeypatch.setattr(RecordsShardWriter, "add", append)
    pack(imagefolder, tmp_path / "whole", options=options, num_workers=1)
    assert _files(out) == _files(tmp_path / "whole")


ORPHANED = textwrap.dedent("""
    import ctypes, os, sys, time
    from pathlib import Path
    from shardio.backends.records import RecordsShardWriter
    from shardio.packing.pack import pack
    from shardio.packing.writer import WriteOptions

    def no_prctl(*args, **kwargs):
        raise OSError("no PR_SET_PDEATHSIG")  # only the workers' own check is left

    ctypes.CDLL = no_prctl
    append = RecordsShardWriter.add

    def slow(self, sample):
        (Path(sys.argv[3]) / str(os.getpid())).touch()
        time.sleep(0.02)
        append(self, sample)

    RecordsShardWriter.add = slow
    pack(sys.argv[1], sys.argv[2], options=WriteOptions(max_shard_samples=5), num_workers=2)
""")


def test_workers_of_a_killed_pack_exit_by_themselves(imagefolder: Path, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    main = subprocess.Popen([sys.executable, "-c", ORPHANED, str(imagefolder),
                             str(tmp_path / "out"), str(marks)])
    for _ in range(1000):
        if len(os.listdir(marks)) == 2:
            break
        time.sleep(0.01)
    main.kill()
    main.wait()
    workers = [int(m.name) for m in marks.iterdir()]
    assert len(workers) == 2
    for _ in range(500):
        if all(_gone(pid) for pid in workers):
            break
        time.sleep(0.01)
    assert all(_gone(pid) for pid in workers), "workers outlived the pack"
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


class FakeImageFolder:
    """Quacks like torchvision's ImageFolder: root, classes, class_to_idx and samples."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.classes = sorted(p.name for p in root.iterdir())
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = [(str(p), i) for i, c in enumerate(self.classes)
                        for p in sorted((root / c).iterdir())]


def test_pack_imagefolder_accepts_a_dataset_object_or_a_root(
    imagefolder: Path, tmp_path: Path
) -> None:
    by_object = pack_imagefolder(FakeImageFolder(imagefolder), tmp_path / "a", num_workers=1)
    by_root = pack_imagefolder(imagefolder, tmp_path / "b", num_workers=2)
    assert by_object.samples == by_root.samples == 48
    with open_dataset(tmp_path / "a") as a, open_dataset(tmp_path / "b") as b:
        assert sorted((s["__key__"], s["label"]) for s in a) == sorted(
            (s["__key__"], s["label"]) for s in b)
    assert read_manifest(tmp_path / "a").class_to_idx == read_manifest(tmp_path / "b").class_to_idx


def test_check_images_accepts_real_images(tmp_path: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    for fmt, ext in (("JPEG", "jpg"), ("PNG", "png")):
        (tmp_path / "src" / fmt).mkdir(parents=True)
        (tmp_path / "src" / fmt / f"a.{ext}").write_bytes(make_photo(rng, 24, 16, fmt=fmt))
    summary = pack(tmp_path / "src", tmp_path / "out", check_images=True, num_workers=1)
    assert summary.samples == 2 and summary.skipped == ()
    with open_dataset(tmp_path / "out") as reader:
        assert {Image.open(io.BytesIO(s["image"])).format for s in reader} == {"JPEG", "PNG"}


def test_cli_pack_json_and_help(tiny_tree: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["pack", "--help"])
    assert result.exit_code == 0 and "--max-shard-bytes" in result.output
    result = runner.invoke(main, ["pack", str(tiny_tree), str(tmp_path / "out"), "--json",
                                  "--max-shard-bytes", "100KB", "--num-workers", "1",
                                  "--backend", "lmdb", "--no-shuffle"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["samples"] == 300 and summary["shards"] > 3 and summary["skipped"] == []
    manifest = read_manifest(tmp_path / "out")
    assert manifest.backend == "lmdb" and not manifest.shuffle
    assert sorted(PackSummary.__dataclass_fields__) == sorted(summary)


def test_cli_pack_prints_a_summary_and_clear_errors(tmp_path: Path) -> None:
    make_tiny_tree(tmp_path / "src", num_files=20, seed=1)
    (tmp_path / "src" / "d00" / "zero.bin").write_bytes(b"")
    runner = CliRunner()
    failed = runner.invoke(main, ["pack", str(tmp_path / "src"), str(tmp_path / "out")])
    assert failed.exit_code == 1
    assert "zero.bin: empty file (0 bytes)" in failed.output and "--skip-bad" in failed.output
    done = runner.invoke(main, ["pack", str(tmp_path / "src"), str(tmp_path / "out"),
                                "--skip-bad", "--seed", "3", "--codec", "none"])
    assert done.exit_code == 0, done.output
    assert "samples       20" in done.output
    assert "d00/zero.bin: empty file (0 bytes)" in done.output
    bad_size = runner.invoke(main, ["pack", str(tmp_path / "src"), str(tmp_path / "o2"),
                                    "--max-shard-bytes", "lots"])
    assert bad_size.exit_code == 2 and "not a size" in bad_size.output


def test_worker_pool_is_not_used_for_one_worker(
    tiny_tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_pool(*args: object, **kwargs: object) -> None:
        raise AssertionError("a pool was started for one worker")

    monkeypatch.setattr(multiprocessing, "get_context", no_pool)
    assert pack(tiny_tree, tmp_path / "out", num_workers=1).samples == 300
