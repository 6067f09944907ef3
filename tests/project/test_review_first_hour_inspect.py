"""The inspection tools as a new user meets them: preview tiles traceable to their files,
``ls`` with a header, ``cat`` that keeps binary bytes off a terminal, and ``bench``
recommending no shuffle window larger than the dataset."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from shardio.ops.preview import make_sheet
from shardio.packing.writer import ShardWriter
from shardio.reading.reader import open_dataset


def shardio(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "shardio", *args], capture_output=True,
                          timeout=300)


def read_into(caption: str, key: str) -> bool:
    """Whether ``caption`` is ``key``, or ``key`` cut in the middle with …."""
    head, cut, tail = caption.partition("…")
    return caption == key if not cut else key.startswith(head) and key.endswith(tail)


@pytest.fixture(scope="module")
def generic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two samples: binary bytes, and text."""
    out = tmp_path_factory.mktemp("generic") / "pack"
    with ShardWriter(out) as writer:
        writer.write({"__key__": "a/blob", "bin": bytes(range(256)) * 4})
        writer.write({"__key__": "b/note", "txt": b"a line\tand more\n"})
    return out


def test_preview_captions_are_the_keys_and_a_chosen_class_is_not_repeated(
    imagefolder_pack: Path,
) -> None:
    sheet = make_sheet(imagefolder_pack, n=6, seed=2)
    keys = [sample.key for sample in sheet.samples]
    assert len(sheet.captions) == len(keys) == 6
    assert all(read_into(caption, key) for caption, key in zip(sheet.captions, keys, strict=True))
    assert all(caption.startswith("class_0") for caption in sheet.captions)  # the class shows
    assert all(caption.endswith(".jpg") for caption in sheet.captions)  # so does the file
    one = make_sheet(imagefolder_pack, n=4, class_name="class_02", seed=2)
    assert {sample.class_name for sample in one.samples} == {"class_02"}
    for caption, sample in zip(one.captions, one.samples, strict=True):
        assert "class_02" not in caption
        assert caption == sample.key.removeprefix("class_02/")


def test_a_long_key_is_cut_in_the_middle_so_its_folder_and_file_show(tmp_path: Path) -> None:
    photo = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 90, 10)).save(photo, format="JPEG")
    key = "train/some/deeply/nested/folder/of/the/camera/photo_000123"
    with ShardWriter(tmp_path / "pack") as writer:
        writer.write({"__key__": key, "jpg": photo.getvalue()})
    (caption,) = make_sheet(tmp_path / "pack", n=1).captions
    assert "…" in caption and read_into(caption, key)
    assert caption.startswith("train/") and caption.endswith("photo_000123")


def test_ls_prints_a_header_row_and_json_stays_a_document(
    imagefolder_pack: Path, generic: Path,
) -> None:
    with open_dataset(imagefolder_pack) as reader:
        keys = list(reader.keys())
    listed = shardio("ls", str(imagefolder_pack))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.decode().splitlines()
    assert lines[0].split() == ["bytes", "label", "class", "key"]
    assert [line.split()[-1] for line in lines[1:]] == keys
    assert shardio("ls", str(generic)).stdout.decode().splitlines()[0].split() == ["bytes", "key"]
    document = json.loads(shardio("ls", str(imagefolder_pack), "--json").stdout)
    assert [entry["key"] for entry in document] == keys


def run_on_a_terminal(*args: str) -> tuple[int, bytes, bytes]:
    """Run ``shardio *args`` with stdout on a pseudo-terminal: (status, what the terminal
    received, stderr)."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "shardio", *args], stdout=follower,
                                stderr=subprocess.PIPE)
        os.close(follower)
        received = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            received += chunk
        _out, err = proc.communicate(timeout=120)
    finally:
        os.close(leader)
    return proc.returncode, received, err


def test_cat_keeps_binary_bytes_off_a_terminal(generic: Path, tmp_path: Path) -> None:
    code, shown, err = run_on_a_terminal("cat", str(generic), "a/blob")
    assert code == 2 and shown == b""
    assert b"binary" in err and b"-o FILE" in err and b"'a/blob'" in err
    code, shown, _err = run_on_a_terminal("cat", str(generic), "b/note")  # text is fine
    assert code == 0 and b"a line" in shown
    target = tmp_path / "blob.bin"
    code, shown, err = run_on_a_terminal("cat", str(generic), "a/blob", "-o", str(target))
    assert code == 0 and shown == b"", err
    assert target.read_bytes() == bytes(range(256)) * 4
    piped = shardio("cat", str(generic), "a/blob")
    assert piped.returncode == 0 and piped.stdout == bytes(range(256)) * 4


@pytest.mark.slow
def test_bench_recommends_a_window_no_larger_than_the_dataset(imagefolder_pack: Path) -> None:
    args = ("bench", str(imagefolder_pack), "--max-workers", "0", "--max-samples", "8",
            "--batch-size", "4", "--mode", "raw")
    report = json.loads(shardio(*args, "--json").stdout)
    assert report["num_samples"] == 48 and report["recommended_shuffle_buffer"] == 48
    assert any("the whole dataset: 48 samples" in note for note in report["notes"])
    assert b"shuffle_buffer=48" in shardio(*args).stdout
