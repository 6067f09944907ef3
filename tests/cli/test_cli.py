"""The shardio commands info, ls, cat, verify, unpack and demo, run through CliRunner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardio import ShardWriter, WriteOptions, open_dataset, read_manifest
from shardio.cli import COMMANDS, load_command, main
from shardio.packing.pack import pack
from shardio.synth import make_imagefolder

MY_COMMANDS = ("info", "ls", "cat", "verify", "unpack", "demo")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ImageFolder of 12 classes of 2 tiny JPEGs (enough classes and shards to abbreviate)."""
    root = tmp_path_factory.mktemp("src")
    make_imagefolder(root, num_classes=12, per_class=2, seed=3, long_side=(16, 24))
    return root


@pytest.fixture
def labelled(tmp_path: Path, source: Path) -> Path:
    """``source`` packed (shuffled) into 12 shards of 2 samples."""
    out = tmp_path / "labelled"
    pack(source, out, options=WriteOptions(max_shard_samples=2), num_workers=1)
    return out


@pytest.fixture
def generic(tmp_path: Path) -> Path:
    """Two generic samples: one with fields jpg and txt, one with a single field."""
    out = tmp_path / "generic"
    with ShardWriter(out, WriteOptions(backend="records", codec="zstd")) as writer:
        writer.write({"__key__": "a/x", "jpg": b"\xff\xd8\xff fake", "txt": b"caption"})
        writer.write({"__key__": "b/y", "bin": bytes(range(256))})
    return out


def invoke(*args: str) -> tuple[int, str, str, bytes]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr, result.stdout_bytes


def test_every_command_is_registered_and_has_help() -> None:
    assert set(MY_COMMANDS) <= set(COMMANDS)
    for name, (_module, short_help) in COMMANDS.items():
        code, out, _err, _raw = invoke(name, "--help")
        assert code == 0, name
        assert f"Usage: main {name}" in out or f"Usage: shardio {name}" in out
        # --help lists the commands from COMMANDS without importing them: same words
        assert load_command(name).get_short_help_str(limit=1000) == short_help, name


HEAVY = ("numpy", "PIL", "torch", "lmdb", "zstandard", "tqdm")


def test_python_m_shardio_help_lists_every_command() -> None:
    proc = subprocess.run([sys.executable, "-m", "shardio", "--help"], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage: shardio ")
    assert all(f"  {name} " in proc.stdout for name in COMMANDS)


def test_help_imports_nothing_heavy() -> None:
    """``shardio --help`` must start at once: no torch, numpy, Pillow, lmdb, zstd or tqdm."""
    code = (
        "import runpy, sys\n"
        "sys.argv = ['shardio', '--help']\n"
        "try:\n"
        "    runpy.run_module('shardio', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Commands:" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "HEAVY []"


def test_a_command_imports_only_its_own_module() -> None:
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from shardio.cli import main\n"
        "assert CliRunner().invoke(main, ['info', '--help']).exit_code == 0\n"
        "print(*sorted(m for m in sys.modules if m.startswith('shardio.cli.')))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.split())
    assert "shardio.cli.inspect" in loaded
    assert not loaded & {f"shardio.cli.{m}" for m in ("pack", "verify", "unpack", "demo", "bench")}


def test_readme_generic_example_packs_every_field(tmp_path: Path) -> None:
    """README, Pack: ``a/b/x.jpg + a/b/x.json -> key a/b/x`` (it used to fail as an ImageFolder)."""
    src = tmp_path / "anything"
    (src / "a" / "b").mkdir(parents=True)
    # fake, but whole in form (start, a scan, end marker): pack decodes nothing by default
    (src / "a" / "b" / "x.jpg").write_bytes(b"\xff\xd8\xff\xda\x00\x02 fake jpeg \xff\xd9")
    (src / "a" / "b" / "x.json").write_bytes(b'{"caption": "a cat"}')
    out = tmp_path / "out" / "any"
    code, text, err, _raw = invoke("pack", str(src), str(out), "--num-workers", "1")
    assert code == 0, err
    assert "(generic folder)" in text and "samples       1 (2 files)" in text
    code, _text, err, raw = invoke("cat", str(out), "a/b/x", "json")
    assert code == 0, err
    assert raw == b'{"caption": "a cat"}'


def test_imagefolder_error_names_skip_bad_and_no_imagefolder(tmp_path: Path, source: Path) -> None:
    src = tmp_path / "train"
    for path in sorted(source.rglob("*.jpg"))[:4]:
        (src / path.parent.name).mkdir(parents=True, exist_ok=True)
        (src / path.parent.name / path.name).write_bytes(path.read_bytes())
    (src / "class_00" / "README.txt").write_bytes(b"where these came from")
    code, _text, err, _raw = invoke("pack", str(src), str(tmp_path / "out"))
    assert code == 1
    assert "class_00/README.txt: not an image" in err
    assert "--skip-bad" in err and "--no-imagefolder" in err
    code, text, err, _raw = invoke("pack", str(src), str(tmp_path / "out"), "--no-imagefolder")
    assert code == 0, err
    assert "(generic folder)" in text and "samples       5 (5 files)" in text


@pytest.mark.parametrize("args", [
    ("pack", "gs://bucket/src", "{tmp}/out"),  # pack's OUT may be a URL: test_remote_pack.py
    ("unpack", "{src}", "s3://bucket/dest"),  # DATASET arguments may be URLs: test_remote_read.py
])
def test_urls_are_refused_not_made_into_local_folders(
    args: tuple[str, ...], tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = [a.format(src=source, tmp=tmp_path) for a in args]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2, result.output
    assert "is a URL" in result.output and "is not supported yet" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no folder named s3: or gs:


def test_info_text(labelled: Path) -> None:
    code, out, _err, _raw = invoke("info", str(labelled))
    assert code == 0
    assert "samples      24" in out
    assert "records" in out and "zstd" in out
    assert "12: class_00, class_01" in out and "more" in out, "12 classes are abbreviated"
    assert "shard-00000.rec" in out and "shard-00011.rec" in out
    assert "shard-00008.rec" not in out, "the shard table is abbreviated"
    assert "ratio" in out and "seed 0" in out


def test_info_lists_skipped_files(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.txt").write_bytes(b"content")
    (src / "empty.txt").write_bytes(b"")
    pack(src, tmp_path / "out", skip_bad=True, num_workers=1)
    code, out, _err, _raw = invoke("info", str(tmp_path / "out"))
    assert code == 0
    assert "skipped      1 file(s)" in out
    assert "empty.txt" in out


def test_info_json_is_the_manifest(labelled: Path) -> None:
    code, out, _err, _raw = invoke("info", str(labelled), "--json")
    assert code == 0
    assert json.loads(out) == json.loads((labelled / "manifest.json").read_text())


def test_info_of_missing_dataset_exits_1(tmp_path: Path) -> None:
    code, _out, err, _raw = invoke("info", str(tmp_path / "none"))
    assert code == 1
    assert "manifest.json" in err and "shardio pack" in err


def test_ls_lists_keys_sizes_and_labels(labelled: Path) -> None:
    code, out, _err, _raw = invoke("ls", str(labelled), "--limit", "5", "--json")
    assert code == 0
    entries = json.loads(out)
    with open_dataset(labelled) as reader:
        keys = list(reader.keys())
        stored = [reader.get(i) for i in range(5)]
    assert [e["key"] for e in entries] == keys[:5]
    assert [e["label"] for e in entries] == [s["label"] for s in stored]
    assert all(e["class"] == e["key"].split("/")[0] for e in entries)
    assert all(e["bytes"] > len(s["image"]) for e, s in zip(entries, stored, strict=True))
    code, out, _err, _raw = invoke("ls", str(labelled))
    assert len(out.splitlines()) == len(keys) + 1  # the header row
    assert keys[-1] in out.splitlines()[-1]


def test_ls_generic(generic: Path) -> None:
    code, out, _err, _raw = invoke("ls", str(generic), "--json")
    entries = json.loads(out)
    assert code == 0
    assert [e["key"] for e in entries] == ["a/x", "b/y"]
    assert all("label" not in e for e in entries)


def test_cat_writes_raw_image_bytes(labelled: Path, source: Path) -> None:
    key = "class_07/img_000015.jpg"
    code, _out, _err, raw = invoke("cat", str(labelled), key)
    assert code == 0
    assert raw == (source / key).read_bytes()
    code, _out, _err, raw = invoke("cat", str(labelled), key, "label")
    assert (code, raw) == (0, b"7")


def test_cat_field_choice(generic: Path) -> None:
    code, _out, _err, raw = invoke("cat", str(generic), "b/y")
    assert (code, raw) == (0, bytes(range(256)))
    code, _out, _err, raw = invoke("cat", str(generic), "a/x", "txt")
    assert (code, raw) == (0, b"caption")
    code, _out, err, _raw = invoke("cat", str(generic), "a/x")
    assert code == 1
    assert "'jpg'" in err and "'txt'" in err
    code, _out, err, _raw = invoke("cat", str(generic), "a/x", "png")
    assert code == 1
    assert "'png'" in err and "'jpg'" in err


def test_cat_unknown_key_exits_1(labelled: Path) -> None:
    code, _out, err, raw = invoke("cat", str(labelled), "class_00/nope.jpg")
    assert code == 1
    assert raw == b""
    assert "'class_00/nope.jpg'" in err and "shardio ls" in err


def test_verify_clean_and_corrupt(labelled: Path) -> None:
    code, out, _err, _raw = invoke("verify", str(labelled))
    assert code == 0
    assert "24 records" in out and "OK" in out
    shard = read_manifest(labelled).shards[3]
    path = labelled / shard.name
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    code, out, err, _raw = invoke("verify", str(labelled))
    assert code == 1
    assert f"FAULT {shard.name} record 0" in err
    code, out, _err, _raw = invoke("verify", str(labelled), "--json")
    report = json.loads(out)
    assert code == 1
    assert report["ok"] is False
    assert {(f["shard"], f["record"]) for f in report["faults"]} == {
        (shard.name, None), (shard.name, 0)
    }
    code, out, _err, _raw = invoke("verify", str(labelled), "--quick", "--json")
    report = json.loads(out)
    assert (code, report["quick"], report["num_records"]) == (1, True, 0)
    assert [(f["shard"], f["record"]) for f in report["faults"]] == [(shard.name, None)]


def test_verify_of_missing_dataset_exits_1(tmp_path: Path) -> None:
    code, _out, err, _raw = invoke("verify", str(tmp_path))
    assert code == 1
    assert "manifest.json" in err


def test_unpack_round_trip_and_refusals(tmp_path: Path, labelled: Path, source: Path) -> None:
    dest = tmp_path / "dest"
    code, out, _err, _raw = invoke("unpack", str(labelled), str(dest), "--json")
    assert code == 0
    assert json.loads(out)["num_files"] == 24
    restored = {p.relative_to(dest): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    original = {p.relative_to(source): p.read_bytes() for p in source.rglob("*") if p.is_file()}
    assert restored == original
    code, _out, err, _raw = invoke("unpack", str(labelled), str(dest))
    assert code == 1
    assert "--overwrite" in err
    code, out, _err, _raw = invoke("unpack", str(labelled), str(dest), "--overwrite")
    assert code == 0
    assert "24 samples" in out


def test_unpack_refuses_escaping_key(tmp_path: Path) -> None:
    out = tmp_path / "evil"
    with ShardWriter(out) as writer:
        writer.write({"__key__": "../escaped", "txt": b"x"})
    code, _out, err, _raw = invoke("unpack", str(out), str(tmp_path / "dest"))
    assert code == 1
    assert "'../escaped'" in err
    assert not (tmp_path / "escaped.txt").exists()


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    keep = tmp_path / "kept"
    code, out, _err, _raw = invoke("demo", "--images", "10", "--keep", str(keep))
    assert code == 0, out
    assert "verified" in out and ": OK" in out
    assert "streamed   10 samples" in out
    assert "imaging    P" in out
    assert read_manifest(keep / "dataset").num_samples == 10
    code, _out, err, _raw = invoke("demo", "--images", "10", "--keep", str(keep))
    assert code == 1
    assert "not empty" in err


def test_demo_streams_one_epoch(labelled: Path) -> None:
    from shardio.cli.demo import imaging_backend, stream_epoch

    streamed = stream_epoch(labelled)
    assert streamed.samples == 24
    assert streamed.samples_per_s > 0
    assert "StreamingDataset" in streamed.how
    assert imaging_backend().startswith(("Pillow ", "pillow-simd "))


def test_demo_streams_without_torch(labelled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from shardio.cli import demo

    monkeypatch.setattr(demo, "torch_available", lambda: False)
    streamed = demo.stream_epoch(labelled)
    assert streamed.samples == 24
    assert "open_dataset" in streamed.how


def test_import_shardio_does_not_import_torch() -> None:
    code = (
        "import sys, shardio, shardio.ops.verify, shardio.ops.unpack, shardio.cli; "
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
