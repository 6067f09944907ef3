"""Packing WebDataset tar shards (``packing.sources.tars``), written by the real ``webdataset``."""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_pack import _kill_midway

from shardio.cli import main
from shardio.errors import BadInputError, PackError
from shardio.packing.pack import pack
from shardio.packing.writer import WriteOptions
from shardio.reading.reader import open_dataset

wds = pytest.importorskip("webdataset")

SMALL = WriteOptions(max_shard_samples=7)


def _jpeg(seed: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (seed % 256, 3, 5)).save(out, format="JPEG")
    return out.getvalue()


def _write_shards(folder: Path, count: int = 30, per_shard: int = 10,
                  label: Any = int) -> list[dict[str, Any]]:
    """``count`` samples in tars of ``per_shard`` by webdataset's ShardWriter; returns them."""
    folder.mkdir(parents=True, exist_ok=True)
    samples = [{"__key__": f"s{i:05d}", "jpg": _jpeg(i), "json": json.dumps({"i": i}).encode(),
                "cls": str(label(i % 3)).encode()} for i in range(count)]
    with wds.ShardWriter(str(folder / "train-%06d.tar"), maxcount=per_shard) as sink:
        for sample in samples:
            sink.write(dict(sample))
    return samples


def _as_wds(urls: str | list[str]) -> list[dict[str, Any]]:
    """What webdataset itself reads from ``urls``: key and raw fields."""
    return [{k: v for k, v in s.items() if not k.startswith("__") or k == "__key__"}
            for s in wds.WebDataset(urls, shardshuffle=False)]


def _read(out: Path) -> list[dict[str, Any]]:
    with open_dataset(out) as reader:
        return [dict(s) for s in reader]


def _tree_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_every_sample_once_with_webdatasets_keys_and_bytes(tmp_path: Path) -> None:
    _write_shards(tmp_path / "src")
    summary = pack(tmp_path / "src", tmp_path / "out", num_workers=1, options=SMALL)
    assert summary.samples == 30 and not summary.imagefolder
    expected = {s["__key__"]: s for s in _as_wds(str(tmp_path / "src/train-{000000..000002}.tar"))}
    got = {s["__key__"]: s for s in _read(tmp_path / "out")}
    assert sorted(got) == sorted(expected)
    for key, sample in got.items():
        assert {f: sample[f] for f in ("jpg", "json", "cls")} == {
            f: expected[key][f] for f in ("jpg", "json", "cls")}


def test_no_shuffle_keeps_webdatasets_order(tmp_path: Path) -> None:
    _write_shards(tmp_path / "src")
    pack(tmp_path / "src", tmp_path / "out", shuffle=False, num_workers=1)
    keys = [s["__key__"] for s in _read(tmp_path / "out")]
    assert keys == [s["__key__"] for s in _as_wds(sorted(map(str, (tmp_path / "src").iterdir())))]


def test_folder_glob_and_braces_give_the_same_bytes_for_any_worker_count(tmp_path: Path) -> None:
    _write_shards(tmp_path / "src")
    pack(tmp_path / "src", tmp_path / "a", num_workers=1, options=SMALL)
    pack(str(tmp_path / "src/train-*.tar"), tmp_path / "b", num_workers=3, options=SMALL)
    pack(str(tmp_path / "src/train-{000000..000002}.tar"), tmp_path / "c", num_workers=2,
         options=SMALL)
    assert _tree_bytes(tmp_path / "a") == _tree_bytes(tmp_path / "b") == _tree_bytes(
        tmp_path / "c")
    assert len(_tree_bytes(tmp_path / "a")) > 3  # several shards, built in parallel


def test_label_field_integers_become_label(tmp_path: Path) -> None:
    samples = _write_shards(tmp_path / "src")
    pack(tmp_path / "src", tmp_path / "out", label_field="cls", num_workers=1)
    got = {s["__key__"]: s for s in _read(tmp_path / "out")}
    assert {k: s["label"] for k, s in got.items()} == {
        s["__key__"]: int(s["cls"]) for s in samples}
    assert all("cls" not in s for s in got.values())
    with open_dataset(tmp_path / "out") as reader:
        assert reader.manifest.classes is None


def test_label_field_names_become_classes(tmp_path: Path) -> None:
    names = ["zebra", "ant", "moth"]
    samples = _write_shards(tmp_path / "src", label=lambda i: names[i])
    pack(tmp_path / "src", tmp_path / "out", label_field="cls", num_workers=1)
    with open_dataset(tmp_path / "out") as reader:
        classes = reader.manifest.classes
        assert classes == ("ant", "moth", "zebra")
        got = {s["__key__"]: classes[s["label"]] for s in reader}
    assert got == {s["__key__"]: s["cls"].decode() for s in samples}


def _tar(path: Path, members: list[tarfile.TarInfo | tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                tar.addfile(info, io.BytesIO(member[1]))


def _link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def test_hostile_members_are_named_and_nothing_is_written_outside(tmp_path: Path) -> None:
    src = tmp_path / "deep" / "src"
    src.mkdir(parents=True)
    _tar(src / "a.tar", [("ok.txt", b"fine"), ("../x.txt", b"climb"), ("/abs.txt", b"abs"),
                         _link("sym.txt", "/etc/passwd", tarfile.SYMTYPE),
                         _link("hard.txt", "ok.txt", tarfile.LNKTYPE), ("README", b"no ext")])
    with pytest.raises(BadInputError) as err:
        pack(src, tmp_path / "deep" / "out", num_workers=1)
    text = str(err.value)
    for name in ("a.tar/../x.txt", "a.tar//abs.txt", "a.tar/sym.txt", "a.tar/hard.txt",
                 "a.tar/README"):
        assert name in text
    assert "climbs out" in text and "symbolic link" in text and "hard link" in text
    summary = pack(src, tmp_path / "deep" / "out", num_workers=1, skip_bad=True, overwrite=True)
    assert summary.samples == 1 and len(summary.skipped) == 5
    assert [s["__key__"] for s in _read(tmp_path / "deep" / "out")] == ["ok"]
    assert not (tmp_path / "deep" / "x.txt").exists() and not (tmp_path / "x.txt").exists()
    assert sorted(os.listdir(tmp_path / "deep")) == ["out", "src"]


def test_truncated_tar_is_reported_by_name(tmp_path: Path) -> None:
    _write_shards(tmp_path / "src")
    victim = tmp_path / "src" / "train-000001.tar"
    victim.write_bytes(victim.read_bytes()[:3000])
    with pytest.raises(BadInputError, match=r"train-000001\.tar: the tar is damaged or cut short"):
        pack(tmp_path / "src", tmp_path / "out", num_workers=2)
    summary = pack(tmp_path / "src", tmp_path / "out", num_workers=2, skip_bad=True,
                   overwrite=True)
    assert summary.samples == 20


def test_repeated_and_duplicate_keys_are_bad(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    _tar(src / "a.tar", [("k1.txt", b"1"), ("k2.txt", b"2"), ("k1.json", b"3")])
    _tar(src / "b.tar", [("k2.txt", b"again"), ("k3.txt", b"3")])
    with pytest.raises(BadInputError) as err:
        pack(src, tmp_path / "out", num_workers=1)
    assert "appears again after other samples" in str(err.value)
    assert "is also a sample of a.tar" in str(err.value)


def test_gzipped_tars_pack_in_order_and_refuse_shuffle(tmp_path: Path) -> None:
    _write_shards(tmp_path / "plain")
    (tmp_path / "gz").mkdir()
    for tar in sorted((tmp_path / "plain").iterdir()):
        with gzip.open(tmp_path / "gz" / f"{tar.name}.gz", "wb") as out:
            out.write(tar.read_bytes())
    with pytest.raises(PackError, match="--no-shuffle"):
        pack(tmp_path / "gz", tmp_path / "out", num_workers=1)
    pack(tmp_path / "gz", tmp_path / "a", shuffle=False, num_workers=2, options=SMALL,
         overwrite=True)
    pack(tmp_path / "plain", tmp_path / "b", shuffle=False, num_workers=1, options=SMALL)
    assert _tree_bytes(tmp_path / "a") == _tree_bytes(tmp_path / "b")


def test_resume_after_sigkill_is_identical(tmp_path: Path) -> None:
    _write_shards(tmp_path / "src")
    _kill_midway(tmp_path / "src", tmp_path / "out", "records", label_field="cls")
    options = WriteOptions(max_shard_samples=5)
    resumed = pack(tmp_path / "src", tmp_path / "out", options=options, label_field="cls",
                   resume=True, num_workers=1)
    assert resumed.resumed_samples == 5 and resumed.samples == 30
    pack(tmp_path / "src", tmp_path / "whole", options=options, label_field="cls", num_workers=1)
    assert _tree_bytes(tmp_path / "out") == _tree_bytes(tmp_path / "whole")


def test_cli_packs_a_brace_pattern_with_labels(tmp_path: Path) -> None:
    _write_shards(tmp_path / "src")
    result = CliRunner().invoke(main, [
        "pack", str(tmp_path / "src/train-{000000..000002}.tar"), str(tmp_path / "out"),
        "--label-field", "cls", "--num-workers", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["samples"] == 30
    missing = CliRunner().invoke(main, [
        "pack", str(tmp_path / "src/train-{000000..000009}.tar"), str(tmp_path / "o2")])
    assert missing.exit_code == 1 and "train-000003.tar does not exist" in missing.output


def test_a_shard_build_opens_each_tar_once_and_closes_it(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _write_shards(tmp_path / "src")
    opened: list[str] = []
    real_open, real_close = os.open, os.close
    open_fds: set[int] = set()

    def counting_open(path: Any, *args: Any, **kwargs: Any) -> int:
        fd = real_open(path, *args, **kwargs)
        if str(path).endswith(".tar"):
            opened.append(str(path))
            open_fds.add(fd)
        return fd

    def counting_close(fd: int) -> None:
        open_fds.discard(fd)
        real_close(fd)

    monkeypatch.setattr(os, "open", counting_open)
    monkeypatch.setattr(os, "close", counting_close)
    pack(tmp_path / "src", tmp_path / "out", num_workers=1, options=WriteOptions())
    assert sorted(opened) == sorted(map(str, (tmp_path / "src").iterdir()))  # one shard
    assert not open_fds
    assert len(_read(tmp_path / "out")) == 30
