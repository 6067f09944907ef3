"""Looking inside a dataset cheaply: ``cat`` by key from the key blocks, ``ls`` labels without
checking images, ``--json`` documents, ``DATASET`` in the read-only commands, and the
``ShardWriter`` keywords."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from shardio import ShardWriter, WriteOptions, open_dataset, read_manifest
from shardio.backends import ShardFileReader
from shardio.cli import main
from shardio.errors import ShardCorruptError
from shardio.packing.pack import pack
from shardio.reading.catalog import find_key, read_label
from shardio.reading.reader import DatasetReader

READ_ONLY = ("info", "ls", "cat", "verify", "bench", "unpack", "preview")


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def labelled(tmp_path: Path, imagefolder: Path, backend: str) -> Path:
    """The session ImageFolder (4 classes × 12) packed shuffled into shards of 5."""
    out = tmp_path / "labelled"
    pack(imagefolder, out, options=WriteOptions(backend=backend, max_shard_samples=5),
         num_workers=1)
    return out


def test_find_key_gives_every_index_from_the_key_blocks(labelled: Path) -> None:
    with open_dataset(labelled) as reader:
        keys = list(reader.keys())
        assert [find_key(reader, key) for key in keys] == list(range(len(keys)))
        assert find_key(reader, "class_00/nope.jpg") is None
        assert find_key(reader, keys[0][:-1]) is None, "a prefix of a key is not the key"


def test_find_key_confirms_a_match_inside_a_longer_key(tmp_path: Path, backend: str) -> None:
    """msgpack of "ab" is b"\\xa2ab", which "¢ab" (c2 a2 61 62) holds: the search must confirm."""
    out = tmp_path / "keys"
    with ShardWriter(out, backend=backend, max_shard_samples=1) as writer:
        for key in ("¢ab", "ab"):
            writer.write({"__key__": key, "bin": key.encode()})
    with open_dataset(out) as reader:
        assert (find_key(reader, "ab"), find_key(reader, "¢ab")) == (1, 0)
    code, out_text, _err = invoke("cat", str(out), "ab")
    assert (code, out_text) == (0, "ab")


@pytest.mark.parametrize("backend", ["records"])
def test_find_key_decodes_only_the_key_block_that_holds_the_key(
    labelled: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[int] = []
    real_shard = DatasetReader.shard

    def counting_shard(self: DatasetReader, shard: int) -> ShardFileReader:
        opened.append(shard)
        return real_shard(self, shard)

    with open_dataset(labelled) as reader:
        key = reader.shard(6).keys()[3]
        monkeypatch.setattr(DatasetReader, "shard", counting_shard)
        assert find_key(reader, key) == read_manifest(labelled).shards[6].first_index + 3
        assert opened == [6]
        opened.clear()
        assert find_key(reader, "class_00/nope.jpg") is None
        assert opened == []


@pytest.mark.parametrize("backend", ["records"])
def test_cat_reads_no_record_but_the_one_asked(labelled: Path, imagefolder: Path) -> None:
    """Every other shard's records are damaged; cat still finds and prints the key's image."""
    manifest = read_manifest(labelled)
    with open_dataset(labelled) as reader:
        key = reader.shard(len(manifest.shards) - 1).keys()[-1]
    for shard in manifest.shards[:-1]:
        path = labelled / shard.name
        data = bytearray(path.read_bytes())
        middle = len(data) // 3  # inside the records of both backends, away from the key block
        data[middle:middle + 64] = bytes(64)
        path.write_bytes(bytes(data))
    result = CliRunner().invoke(main, ["cat", str(labelled), key], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert result.stdout_bytes == (imagefolder / key).read_bytes()


def _damage_one_image(dataset: Path) -> tuple[str, int]:
    """Flip a byte in the middle of one record's image; its CRC now fails. Returns shard, record."""
    manifest = read_manifest(dataset)
    assert manifest.backend == "records"
    with open_dataset(dataset) as reader:
        shard = reader.shard(1)
        start, end = shard.offset(2), shard.offset(3)
    path = dataset / manifest.shards[1].name
    data = bytearray(path.read_bytes())
    data[(start + end) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return manifest.shards[1].name, 2


@pytest.mark.parametrize("backend", ["records"])
def test_ls_prints_labels_without_checking_images(labelled: Path) -> None:
    with open_dataset(labelled) as reader:
        expected = [(s["__key__"], s["label"]) for s in reader]
        classes = reader.manifest.classes
    assert classes is not None
    shard, record = _damage_one_image(labelled)
    code, out, err = invoke("ls", str(labelled), "--json")
    assert code == 0, err
    entries = json.loads(out)
    assert [(e["key"], e["label"]) for e in entries] == expected
    assert all(e["class"] == classes[e["label"]] == e["key"].split("/")[0] for e in entries)
    code, _out, err = invoke("verify", str(labelled))
    # v3: the fault is the block holding the record (its first record, and its records)
    assert code == 1 and f"FAULT {shard} record 0" in err, "verify is what checks"
    assert f"(records 0..{4 if record < 5 else record})" in err


def test_read_label_gives_the_stored_labels(labelled: Path) -> None:
    with open_dataset(labelled) as reader:
        assert [read_label(reader, i) for i in range(len(reader))] == [
            s["label"] for s in reader
        ]


def test_read_label_refuses_a_record_that_holds_another_key(tmp_path: Path) -> None:
    out = tmp_path / "renamed"
    # format v2: a v3 record holds no key of its own (the key section, checked, does)
    with ShardWriter(out, WriteOptions(version=2), classes=["a", "b"]) as writer:
        writer.write({"__key__": "a/1.jpg", "image": b"\xff\xd8", "label": 0})
        writer.write({"__key__": "b/2.jpg", "image": b"\xff\xd8", "label": 1})
    path = out / read_manifest(out).shards[0].name
    # the record's own key is renamed, the key block (at the tail) is not: same length,
    # so the frame still fits, and read_label does not check the record's CRC
    path.write_bytes(path.read_bytes().replace(b"a/1.jpg", b"z/1.jpg", 1))
    with open_dataset(out) as reader:
        assert read_label(reader, 1) == 1
        with pytest.raises(ShardCorruptError, match=r"record 0 .*'z/1.jpg'.*'a/1.jpg'"):
            read_label(reader, 0)


@pytest.mark.parametrize("backend", ["records"])
@pytest.mark.parametrize("command", ["info", "ls", "verify"])
def test_json_is_one_document(labelled: Path, command: str) -> None:
    code, out, err = invoke(command, str(labelled), "--json")
    assert code == 0, err
    document = json.loads(out)
    if command == "ls":
        assert [e["index"] for e in document] == list(range(48))
    elif command == "info":
        assert document["num_samples"] == 48
    else:
        assert (document["ok"], document["num_records"]) == (True, 48)
    code, out, _err = invoke("ls", str(labelled), "--json", "--limit", "0")
    assert (code, json.loads(out)) == (0, [])


@pytest.mark.parametrize("command", READ_ONLY)
def test_read_only_commands_call_their_argument_dataset(command: str, tmp_path: Path) -> None:
    code, out, _err = invoke(command, "--help")
    usage = out.splitlines()[0]
    assert code == 0
    assert "DATASET" in usage and "OUT" not in usage and "PATH" not in usage, usage
    result = CliRunner().invoke(main, [command])
    assert result.exit_code == 2
    assert "Missing argument 'DATASET'" in result.output


def test_missing_key_message_names_the_dataset(labelled: Path) -> None:
    code, _out, err = invoke("cat", str(labelled), "class_00/nope.jpg")
    assert code == 1
    assert f"{labelled}: no sample has key 'class_00/nope.jpg'" in err


def test_shard_writer_takes_the_options_as_keywords(tmp_path: Path) -> None:
    out = tmp_path / "kw"
    with ShardWriter(out, max_shard_samples=3, backend="lmdb", codec="none",
                     max_shard_bytes=10**6) as writer:
        assert writer.options == WriteOptions(backend="lmdb", codec="none",
                                              max_shard_bytes=10**6, max_shard_samples=3)
        for i in range(7):
            writer.write({"__key__": f"k{i}", "txt": f"sample {i}"})
    manifest = read_manifest(out)
    assert (manifest.backend, manifest.codec) == ("lmdb", "none")
    assert manifest.shard_sizes == (3, 3, 1)
    with pytest.raises(TypeError, match=r"both options= and max_shard_samples=, codec="):
        ShardWriter(tmp_path / "both", WriteOptions(), max_shard_samples=3, codec="none")
    assert not (tmp_path / "both").exists(), "refused before creating anything"
