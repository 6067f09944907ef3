"""``shardio.unpack``: byte-for-byte round trips, and refusal of keys that escape DEST."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio import (
    OutputExistsError,
    ShardCorruptError,
    ShardWriter,
    UnsafeKeyError,
    WriteOptions,
    read_manifest,
)
from shardio.cli import main
from shardio.format.codecs import get_codec
from shardio.format.record import encode_record
from shardio.ops.unpack import _DestFiles, check_key, field_bytes, unpack
from shardio.packing.pack import pack
from shardio.synth import make_photo


def make_tree(root: Path) -> None:
    """A mixed tree: JPEG and PNG images, text, random binary, nesting, no extension."""
    rng = np.random.default_rng(7)
    files = {
        "photos/cats/tom.jpg": make_photo(rng, 64, 48),
        "photos/cats/tom.seg.png": make_photo(rng, 64, 48, fmt="PNG"),
        "photos/dogs/deep/er/rex.jpg": make_photo(rng, 40, 30, quality=80),
        "photos/dogs/deep/er/rex.txt": b"a dog called rex\n",
        "docs/readme.txt": ("lines of text, some unicode: \u00e9\u00e8 \u2713\n" * 40).encode(),
        "docs/data.json": b'{"a": [1, 2, 3], "b": null}',
        "bin/blob.bin": rng.integers(0, 256, 5000, dtype=np.uint8).tobytes(),
        "bin/zeros.bin": bytes(4096),
        "bin/noext": rng.integers(0, 256, 300, dtype=np.uint8).tobytes(),
        "LICENSE": b"Apache-2.0\n",
        "caf\u00e9 menu.txt": "cr\u00e8me br\u00fbl\u00e9e".encode(),
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def pack_options(backend: str, codec: str) -> WriteOptions:
    return WriteOptions(backend=backend, codec=codec, max_shard_samples=3)


def write_keys(out: Path, keys: list[str]) -> None:
    with ShardWriter(out) as writer:
        for key in keys:
            writer.write({"__key__": key, "txt": b"payload"})


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_generic_round_trip_byte_for_byte(tmp_path: Path, backend: str, codec: str) -> None:
    src, out, dest = tmp_path / "src", tmp_path / "out", tmp_path / "dest"
    make_tree(src)
    packed = pack(src, out, options=pack_options(backend, codec), num_workers=1, seed=5)
    assert not packed.imagefolder
    summary = unpack(out, dest)
    assert tree(dest) == tree(src)
    assert summary.num_files == len(tree(src))
    assert summary.num_bytes == sum(len(b) for b in tree(src).values())
    assert summary.num_samples == len(tree(src)) - 2, "tom and rex have two fields each"


def test_imagefolder_round_trip_byte_for_byte(
    tmp_path: Path, imagefolder: Path, backend: str, codec: str
) -> None:
    out, dest = tmp_path / "out", tmp_path / "dest"
    packed = pack(imagefolder, out, options=pack_options(backend, codec), num_workers=1)
    assert packed.imagefolder
    summary = unpack(out, dest, progress=True)
    assert tree(dest) == tree(imagefolder)
    assert summary.num_samples == summary.num_files == len(tree(imagefolder))


def test_refuses_existing_files_unless_overwrite(tmp_path: Path) -> None:
    src, out, dest = tmp_path / "src", tmp_path / "out", tmp_path / "dest"
    make_tree(src)
    pack(src, out, num_workers=1)
    unpack(out, dest)
    (dest / "LICENSE").write_bytes(b"changed")
    (dest / "docs" / "readme.txt").unlink()
    with pytest.raises(OutputExistsError, match="--overwrite"):
        unpack(out, dest)
    assert not (dest / "docs" / "readme.txt").exists(), "wrote before refusing"
    unpack(out, dest, overwrite=True)
    assert tree(dest) == tree(src)


WINDOWS_ONLY = ["C:/x", "C:x", "..\\x", "a\\..\\..\\x"]
"""Paths outside DEST on Windows; on Linux and macOS, names with a backslash or colon."""


@pytest.mark.parametrize(
    "key", ["../x", "a/../../x", "/abs", "/etc/passwd", "a/./b", "a//b",
            *(WINDOWS_ONLY if os.name == "nt" else [])]
)
def test_refuses_unsafe_keys_before_writing(tmp_path: Path, key: str) -> None:
    out, dest = tmp_path / "out", tmp_path / "sub" / "dest"
    write_keys(out, ["fine/first", key, "fine/last"])
    with pytest.raises(UnsafeKeyError) as info:
        unpack(out, dest)
    assert repr(key) in str(info.value)
    assert info.value.record == 1
    assert not (tmp_path / "sub").exists(), "unpack wrote before refusing"
    assert not Path("/abs").exists()


@pytest.mark.skipif(os.name == "nt", reason="Windows reads these names as paths")
def test_names_with_backslashes_and_colons_are_restored_where_they_are_names(
        tmp_path: Path) -> None:
    # pack takes them (they are Linux file names); unpack once refused the whole dataset by
    # Windows' rules, saying it was altered
    src = tmp_path / "src"
    names = ["x:y.txt", "c:\\d.txt", "\\lead.txt", "a\\\\b.txt", "trail\\", "x.a\\b",
             "sub/x:y.txt", "up\\..\\..\\x.txt"]
    for i, name in enumerate(names):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(f"file {i}".encode())
    pack(src, tmp_path / "ds", num_workers=1, progress=False)
    unpack(tmp_path / "ds", tmp_path / "dest")
    assert tree(tmp_path / "dest") == tree(src)
    assert files_outside(tmp_path, src, tmp_path / "ds", tmp_path / "dest") == []
    assert all(check_key(name, portable=True) is not None for name in WINDOWS_ONLY)


def test_refuses_key_escaping_through_symlink(tmp_path: Path) -> None:
    outside, out, dest = tmp_path / "outside", tmp_path / "out", tmp_path / "dest"
    outside.mkdir()
    dest.mkdir()
    (dest / "link").symlink_to(outside, target_is_directory=True)
    write_keys(out, ["a", "link/evil"])
    with pytest.raises(UnsafeKeyError, match="symlink"):
        unpack(out, dest, overwrite=True)
    assert list(outside.iterdir()) == []
    assert not (dest / "a.txt").exists()


def test_refuses_overwriting_a_symlinked_file_that_points_outside(tmp_path: Path) -> None:
    outside, out, dest = tmp_path / "outside.txt", tmp_path / "out", tmp_path / "dest"
    outside.write_bytes(b"precious")
    dest.mkdir()
    (dest / "evil.txt").symlink_to(outside)
    write_keys(out, ["evil"])
    with pytest.raises(UnsafeKeyError):
        unpack(out, dest, overwrite=True)
    assert outside.read_bytes() == b"precious"


def test_symlink_inside_dest_is_followed_safely(tmp_path: Path) -> None:
    out, dest = tmp_path / "out", tmp_path / "dest"
    (dest / "real").mkdir(parents=True)
    (dest / "alias").symlink_to(dest / "real", target_is_directory=True)
    write_keys(out, ["alias/x"])
    unpack(out, dest)
    assert (dest / "real" / "x.txt").read_bytes() == b"payload"


def test_field_bytes_of_non_bytes_values() -> None:
    assert field_bytes(b"\x00\x01") == b"\x00\x01"
    assert field_bytes("caf\u00e9") == "caf\u00e9".encode()
    assert field_bytes(3) == b"3"
    assert field_bytes({"a": [1, None]}) == b'{"a": [1, null]}'
    array = np.arange(6, dtype=np.int16).reshape(2, 3)
    assert np.array_equal(np.load(io.BytesIO(field_bytes(array))), array)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab./\\:C\x00~"), max_size=12))
def test_accepted_keys_stay_inside_dest(key: str) -> None:
    root = os.path.realpath("/tmp/shardio-dest-that-need-not-exist")
    if check_key(key) is None:
        target = os.path.normpath(os.path.join(root, key))
        assert target.startswith(root + os.sep)


# --- records that disagree with their key block or manifest (hostile or tampered shards) ---


def craft(out: Path, backend: str, records: list[dict[str, Any]]) -> None:
    """A dataset whose key block says ``fine/<i>`` while record ``i`` holds ``records[i]``.

    ``ShardWriter._write_encoded`` takes the key and fields as given, as a tampered
    or hostile download can; the manifest lists the field ``txt`` only.
    """
    codec = get_codec("none")
    with ShardWriter(out, WriteOptions(backend=backend, codec="none", version=2)) as writer:
        for i, sample in enumerate(records):
            writer._write_encoded(f"fine/{i}", encode_record(sample, codec), ["txt"])


HOSTILE = {
    "dotdot key": {"__key__": "../escaped", "txt": b"evil"},
    "deep dotdot key": {"__key__": "fine/../../../escaped", "txt": b"evil"},
    "absolute key": {"__key__": "{tmp}/absolute", "txt": b"evil"},
    "field with slashes": {"__key__": "fine/1", "x/../../../escaped": b"evil"},
    "unlisted field": {"__key__": "fine/1", "txt": b"ok", "extra": b"unlisted"},
    "key of another record": {"__key__": "fine/0", "txt": b"again"},
}


def files_outside(tmp_path: Path, *inside: Path) -> list[str]:
    return sorted(
        p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")
        if p.is_file() and not any(p.is_relative_to(d) for d in inside)
    )


@pytest.mark.parametrize("case", HOSTILE)
def test_cli_refuses_records_that_disagree_with_key_block_or_manifest(
    tmp_path: Path, backend: str, case: str
) -> None:
    out, dest = tmp_path / "ds", tmp_path / "dest"
    hostile = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v
               for k, v in HOSTILE[case].items()}
    craft(out, backend, [{"__key__": "fine/0", "txt": b"first"}, hostile,
                         {"__key__": "fine/2", "txt": b"last"}])
    shard = read_manifest(out).shards[0].name

    result = CliRunner().invoke(main, ["unpack", str(out), str(dest / "inner")])
    assert result.exit_code != 0, result.output
    assert shard in result.output and "record 1" in result.output, result.output
    assert files_outside(tmp_path, out, dest / "inner") == []
    assert not (dest / "inner" / "fine" / "2.txt").exists(), "went on past the bad record"

    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 1, result.output
    assert f"FAULT {shard} record 1:" in result.output, result.output


def test_python_unpack_names_shard_and_record(tmp_path: Path, backend: str) -> None:
    out = tmp_path / "ds"
    craft(out, backend, [{"__key__": "fine/0", "txt": b"a"}, HOSTILE["dotdot key"]])
    with pytest.raises(ShardCorruptError) as info:
        unpack(out, tmp_path / "dest")
    assert info.value.record == 1
    assert str(info.value.path).endswith(read_manifest(out).shards[0].name)
    assert "'../escaped'" in str(info.value)
    assert not (tmp_path / "escaped.txt").exists()


def test_final_paths_are_checked_where_they_are_written(tmp_path: Path) -> None:
    """Whatever the planning pass missed, the write itself refuses to leave DEST."""
    outside, dest = tmp_path / "outside", tmp_path / "dest"
    outside.mkdir()
    (dest / "real").mkdir(parents=True)
    (dest / "link").symlink_to(outside, target_is_directory=True)
    (dest / "file-link").symlink_to(outside / "precious")
    (outside / "precious").write_bytes(b"precious")
    files = _DestFiles(dest, overwrite=False)
    for rel in ("link/x", "link/new/deeper/x", "../x", "/abs/x", "real/../../x"):
        with pytest.raises(UnsafeKeyError, match="refusing to write"):
            files.write(rel, b"evil", "test")
    with pytest.raises(OutputExistsError):
        files.write("file-link", b"evil", "test")  # O_EXCL | O_NOFOLLOW: never through a link
    files = _DestFiles(dest, overwrite=True)
    files.write("file-link", b"mine", "test")  # the link itself is replaced
    assert (outside / "precious").read_bytes() == b"precious"
    assert sorted(p.name for p in outside.iterdir()) == ["precious"]
    assert (dest / "file-link").read_bytes() == b"mine" and not (dest / "file-link").is_symlink()


@pytest.mark.parametrize("overwrite", [False, True])
def test_two_samples_naming_one_file_are_refused(tmp_path: Path, overwrite: bool) -> None:
    out, dest = tmp_path / "ds", tmp_path / "dest"
    with ShardWriter(out) as writer:
        writer.write({"__key__": "a", "txt": b"first"})
        writer.write({"__key__": "a.txt", "": b"second"})
    with pytest.raises(OutputExistsError, match="names the same file") as info:
        unpack(out, dest, overwrite=overwrite)
    assert info.value.path == str(dest / "a.txt")
    assert (dest / "a.txt").read_bytes() == b"first", "the second sample overwrote the first"
