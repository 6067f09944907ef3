"""``ShardWriter``: rolling, the manifest it writes, crash safety, overwrite and resume.

Runs over backend and codec where the bytes on disk differ between them; each
test writes a few dozen small generated samples.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import crc32c
import pytest

from shardio.backends import SHARD_SUFFIX
from shardio.errors import OutputExistsError, PackError, RecordEncodeError
from shardio.format.blockfile import record_bytes
from shardio.format.codecs import get_codec
from shardio.format.manifest import load_manifest
from shardio.format.record import encode_record
from shardio.ops.verify import verify
from shardio.packing.writer import JOURNAL_NAME, ShardWriter, WriteOptions
from shardio.reading.reader import open_dataset

IDENTITY = {"source": "generated", "seed": 1}


def make_sample(i: int) -> dict[str, Any]:
    """Sample ``i``: half repeated text (compressible), half digest bytes, a label."""
    digest = hashlib.sha256(str(i).encode()).digest()
    sample: dict[str, Any] = {
        "__key__": f"dir_{i % 3}/item_{i:04d}",
        "bin": digest * (1 + i % 5) + f"sample {i} ".encode() * (10 + i % 20),
        "cls": i % 3,
    }
    if i % 7 == 3:
        sample["txt"] = f"note {i}"
    return sample


SAMPLES = [make_sample(i) for i in range(40)]


def dataset_files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def write_all(
    out: Path, options: WriteOptions, samples: list[dict[str, Any]] = SAMPLES, **kwargs: Any
) -> None:
    with ShardWriter(out, options, identity=IDENTITY, **kwargs) as writer:
        for sample in samples:
            writer.write(sample)


def interrupt(out: Path, options: WriteOptions, num_written: int) -> None:
    """Write ``num_written`` samples, then fail inside the ``with`` block."""
    with pytest.raises(RuntimeError, match="interrupted"), ShardWriter(
        out, options, identity=IDENTITY
    ) as writer:
        for sample in SAMPLES[:num_written]:
            writer.write(sample)
        raise RuntimeError("interrupted")


def assert_no_partial_output(out: Path) -> None:
    names = os.listdir(out)
    assert "manifest.json" not in names
    assert not [n for n in names if n.startswith(".shard-") or n.endswith(("-lock", ".tmp"))]


def test_rolls_at_max_shard_samples(tmp_path: Path, backend: str, codec: str) -> None:
    options = WriteOptions(backend=backend, codec=codec, max_shard_samples=10)
    writer = ShardWriter(tmp_path, options, identity=IDENTITY)
    for sample in SAMPLES[:25]:
        writer.write(sample)
    assert writer.num_samples == 25
    manifest = writer.close()
    assert load_manifest(tmp_path) == manifest
    suffix = SHARD_SUFFIX[backend]
    assert manifest.shard_sizes == (10, 10, 5)
    assert [s.first_index for s in manifest.shards] == [0, 10, 20]
    assert [s.name for s in manifest.shards] == [f"shard-0000{i}{suffix}" for i in range(3)]
    assert (manifest.backend, manifest.codec, manifest.num_samples) == (backend, codec, 25)
    assert manifest.fields == ("bin", "cls", "txt")
    assert manifest.classes is None and manifest.class_to_idx is None
    assert manifest.options["max_shard_samples"] == 10
    for shard in manifest.shards:
        data = (tmp_path / shard.name).read_bytes()
        assert shard.num_bytes == len(data)
        assert shard.checksum == f"crc32c:{crc32c.crc32c(data):08x}"
    assert manifest.num_bytes == sum(s.num_bytes for s in manifest.shards)
    assert sorted(os.listdir(tmp_path)) == ["manifest.json"] + [s.name for s in manifest.shards]
    with open_dataset(tmp_path) as reader:
        got = list(reader)
    assert [s["__index__"] for s in got] == list(range(25))
    assert [{k: v for k, v in s.items() if k != "__index__"} for s in got] == SAMPLES[:25]


@pytest.mark.parametrize("records_per_shard", [2.5, 6.5])
def test_rolls_at_max_shard_bytes(
    tmp_path: Path, backend: str, codec: str, records_per_shard: float
) -> None:
    sizes = [len(encode_record(s, get_codec(codec))) for s in SAMPLES]
    max_shard_bytes = int(records_per_shard * sum(sizes) / len(sizes))
    options = WriteOptions(backend=backend, codec=codec, max_shard_bytes=max_shard_bytes,
                           version=2)  # frames: v3 shards are bounded in test_v3_shards_...
    write_all(tmp_path, options)
    manifest = load_manifest(tmp_path)
    assert sum(manifest.shard_sizes) == len(SAMPLES)
    assert len(manifest.shards) > 2
    with open_dataset(tmp_path) as reader:
        for number, shard in enumerate(manifest.shards):
            framed = [len(f) for _, f in reader.shard(number).scan()]
            assert framed == sizes[shard.first_index : shard.first_index + shard.num_samples]
            assert sum(framed) <= max_shard_bytes or len(framed) == 1
            if number + 1 < len(manifest.shards):
                assert sum(framed) + sizes[shard.first_index + shard.num_samples] > max_shard_bytes


@pytest.mark.parametrize("records_per_shard", [2.5, 6.5])
def test_v3_shards_roll_at_max_shard_bytes(tmp_path: Path, backend: str, codec: str,
                                           records_per_shard: float) -> None:
    sizes = [record_bytes(s) for s in SAMPLES]
    max_shard_bytes = int(records_per_shard * sum(sizes) / len(sizes))
    write_all(tmp_path, WriteOptions(backend=backend, codec=codec,
                                     max_shard_bytes=max_shard_bytes))
    manifest = load_manifest(tmp_path)
    assert manifest.version == 3 and len(manifest.shards) > 2
    assert sum(manifest.shard_sizes) == len(SAMPLES)
    for shard in manifest.shards:  # the values counted: header, index and keys come on top
        counted = sum(sizes[shard.first_index : shard.first_index + shard.num_samples])
        assert counted <= max_shard_bytes or shard.num_samples == 1
    with open_dataset(tmp_path) as reader:
        got = [{k: v for k, v in s.items() if k != "__index__"} for s in reader]
    assert got == SAMPLES


def test_a_record_over_the_limit_gets_a_shard_of_its_own(tmp_path: Path, backend: str) -> None:
    big = {"__key__": "big", "bin": os.urandom(5000)}
    samples = [SAMPLES[0], big, SAMPLES[1]]
    write_all(tmp_path, WriteOptions(backend=backend, max_shard_bytes=2000), samples)
    assert load_manifest(tmp_path).shard_sizes == (1, 1, 1)
    with open_dataset(tmp_path) as reader:
        assert reader[1]["bin"] == big["bin"]


def labelled(i: int) -> dict[str, Any]:
    """Sample ``i`` as a labelled (ImageFolder) dataset holds it."""
    return {"__key__": f"dir_{i % 3}/{i:04d}.jpg", "image": SAMPLES[i]["bin"], "label": i % 3}


def test_labelled_dataset_records_classes_and_reads_back(tmp_path: Path) -> None:
    samples = [labelled(i) for i in range(6)]
    write_all(tmp_path, WriteOptions(), samples, classes=["dir_0", "dir_1", "dir_2"])
    manifest = load_manifest(tmp_path)
    assert manifest.classes == ("dir_0", "dir_1", "dir_2")
    assert manifest.class_to_idx == {"dir_0": 0, "dir_1": 1, "dir_2": 2}
    assert set(manifest.fields) == {"image", "label"}
    assert verify(tmp_path).ok
    with open_dataset(tmp_path) as reader:
        assert [{k: v for k, v in s.items() if k != "__index__"} for s in reader] == samples


@pytest.mark.parametrize(
    ("change", "found"),
    [
        ({"bin": b"x"}, r"found fields \['__key__', 'bin', 'image', 'label'\]"),
        ({"image": None, "jpg": b"x"}, r"found fields \['__key__', 'jpg', 'label'\]"),
        ({"label": None, "cls": 1}, r"found fields \['__key__', 'cls', 'image'\]"),
        ({"image": "not bytes"}, "found image of type str"),
        ({"label": 3}, r"found label 3 \(int\)"),
        ({"label": -1}, r"found label -1 \(int\)"),
        ({"label": "dir_1"}, r"found label 'dir_1' \(str\)"),
        ({"label": True}, r"found label True \(bool\)"),
        ({"label": 1.0}, r"found label 1\.0 \(float\)"),
    ],
)
def test_writer_with_classes_refuses_samples_its_readers_cannot_read(
    tmp_path: Path, change: dict[str, Any], found: str
) -> None:
    sample = {**labelled(4), **change}
    sample = {k: v for k, v in sample.items() if v is not None}
    with pytest.raises(RecordEncodeError) as info, ShardWriter(
        tmp_path, classes=["dir_0", "dir_1", "dir_2"]
    ) as writer:
        writer.write(labelled(0))
        writer.write(sample)
    message = str(info.value)
    assert "sample 'dir_1/0004.jpg'" in message, "names the sample key"
    assert "exactly {'__key__', 'image': bytes, 'label': int in 0..2}" in message, "expected"
    assert re.search(found, message), message
    assert_no_partial_output(tmp_path)


def test_writer_with_classes_takes_numpy_integer_labels(tmp_path: Path) -> None:
    import numpy as np

    write_all(tmp_path, WriteOptions(), [{**labelled(2), "label": np.int64(2)}],
              classes=["a", "b", "c"])
    with open_dataset(tmp_path) as reader:
        assert reader[0]["label"] == 2 and type(reader[0]["label"]) is int


@pytest.mark.parametrize("field", ["__index__", "__source__"])
def test_reserved_fields_are_refused(tmp_path: Path, field: str) -> None:
    """Readers set both (``__source__`` in a mixture): a stored one would be overwritten."""
    refused = pytest.raises(RecordEncodeError, match=f"sample 'a': field '{field}' is reserved "
                                                     r"\(readers set it to .*rename the field")
    with refused, ShardWriter(tmp_path) as writer:
        writer.write({"__key__": "a", field: 7, "bin": b"x"})
    assert not (tmp_path / "manifest.json").exists()


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize(("bad", "words"), [
    ({"n": 2 ** 70}, "n"), ({"n": -(2 ** 64)}, "n"), ({"s": "\ud800"}, "not UTF-8"),
    ({"\ud800": b"x"}, "not UTF-8"), ({5: b"x"}, "field name 5"),
    ({"nested": {"k": "\udfff"}}, "nested"), ({"obj": object()}, "obj"),
])
def test_a_sample_no_record_can_hold_is_refused_when_written_and_the_writer_goes_on(
        tmp_path: Path, version: int, bad: dict[Any, Any], words: str) -> None:
    # format 3 once took such a sample and failed at the block that held it: at close() or
    # in a later write() of another sample, raw for a lone surrogate, and close() then
    # left no manifest, the open shard's good samples lost
    with ShardWriter(tmp_path, options=WriteOptions(version=version)) as writer:
        writer.write({"__key__": "good", "txt": b"fine"})
        with pytest.raises(RecordEncodeError) as info:
            writer.write({"__key__": "bad", **bad})
        assert version == 2 or ("sample 'bad'" in str(info.value) and words in str(info.value))
        for i in range(3):
            writer.write({"__key__": f"after{i}", "txt": b"fine"})
    with open_dataset(tmp_path) as reader:
        assert [s["__key__"] for s in reader] == ["good", "after0", "after1", "after2"]


def test_framed_records_cannot_be_written_past_the_checks(tmp_path: Path) -> None:
    """``write_encoded`` let a record's own key and fields disagree with the key block."""
    assert not hasattr(ShardWriter, "write_encoded")


def test_docstring_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = ShardWriter.__doc__ or ""
    blocks = re.findall(r"::\n\n((?:        .*\n|\n)+)", doc)
    assert len(blocks) == 2
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(textwrap.dedent(block), {})  # our own docstring, run as a user would
    assert load_manifest(tmp_path / "out").num_samples == 1
    assert load_manifest(tmp_path / "labelled").classes == ("cat", "dog")


def test_empty_dataset(tmp_path: Path, backend: str) -> None:
    write_all(tmp_path, WriteOptions(backend=backend), [])
    manifest = load_manifest(tmp_path)
    assert (manifest.num_samples, manifest.shards, manifest.num_bytes) == (0, (), 0)
    with open_dataset(tmp_path) as reader:
        assert list(reader) == []


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"__key__": SAMPLES[2]["__key__"], "bin": b"again"}, "duplicate sample key"),
        ({"bin": b"no key"}, "needs a non-empty str"),
        ({"__key__": 7, "bin": b"int key"}, "needs a non-empty str"),
        ({"__key__": "", "bin": b"empty key"}, "needs a non-empty str"),
    ],
)
def test_bad_key_is_refused_and_leaves_no_manifest(
    tmp_path: Path, backend: str, bad: dict[str, Any], words: str
) -> None:
    with pytest.raises(RecordEncodeError, match=words), ShardWriter(
        tmp_path, WriteOptions(backend=backend, max_shard_samples=2)
    ) as writer:
        for sample in SAMPLES[:5]:
            writer.write(sample)
        writer.write(bad)
    assert_no_partial_output(tmp_path)


def test_exception_inside_with_leaves_no_manifest_and_no_temp_file(
    tmp_path: Path, backend: str
) -> None:
    interrupt(tmp_path, WriteOptions(backend=backend, max_shard_samples=10), 15)
    assert_no_partial_output(tmp_path)
    suffix = SHARD_SUFFIX[backend]
    assert sorted(os.listdir(tmp_path)) == [JOURNAL_NAME, f"shard-00000{suffix}"]


def test_closed_writer_refuses_more_samples(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path)
    writer.write(SAMPLES[0])
    writer.close()
    with pytest.raises(ValueError, match="closed"):
        writer.write(SAMPLES[1])
    with pytest.raises(ValueError, match="closed"):
        writer.close()


@pytest.mark.parametrize("existing", ["notes.txt", "manifest.json"])
def test_non_empty_output_needs_overwrite(tmp_path: Path, existing: str) -> None:
    (tmp_path / existing).write_text("keep me", encoding="utf-8")
    with pytest.raises(OutputExistsError, match="not empty") as info:
        ShardWriter(tmp_path)
    assert isinstance(info.value, FileExistsError)
    assert str(tmp_path) in str(info.value)
    assert os.listdir(tmp_path) == [existing]


def test_overwrite_replaces_a_dataset(tmp_path: Path, backend: str) -> None:
    write_all(tmp_path, WriteOptions(backend=backend, max_shard_samples=10), SAMPLES[:25])
    write_all(tmp_path, WriteOptions(backend=backend), SAMPLES[30:35], overwrite=True)
    manifest = load_manifest(tmp_path)
    assert manifest.shard_sizes == (5,)
    assert sorted(os.listdir(tmp_path)) == ["manifest.json", manifest.shards[0].name]
    with open_dataset(tmp_path) as reader:
        assert [s["__key__"] for s in reader] == [s["__key__"] for s in SAMPLES[30:35]]


def test_overwrite_refuses_a_folder_with_foreign_files(tmp_path: Path) -> None:
    write_all(tmp_path, WriteOptions(max_shard_samples=10), SAMPLES[:15])
    (tmp_path / "thesis.pdf").write_bytes(b"%PDF precious")
    before = dataset_files(tmp_path)
    with pytest.raises(OutputExistsError, match=r"thesis\.pdf"):
        ShardWriter(tmp_path, overwrite=True)
    assert dataset_files(tmp_path) == before


def test_resume_reuses_finished_shards_and_matches_an_uninterrupted_write(
    tmp_path: Path, backend: str, codec: str
) -> None:
    options = WriteOptions(backend=backend, codec=codec, max_shard_samples=10)
    reference, out = tmp_path / "reference", tmp_path / "out"
    write_all(reference, options)
    interrupt(out, options, 27)
    first = out / f"shard-00000{SHARD_SUFFIX[backend]}"
    stamp = (first.stat().st_ino, first.stat().st_mtime_ns)
    writer = ShardWriter(out, options, resume=True, identity=IDENTITY)
    assert writer.num_resumed == 20
    with writer:
        for sample in SAMPLES[writer.num_resumed :]:
            writer.write(sample)
    assert (first.stat().st_ino, first.stat().st_mtime_ns) == stamp
    assert dataset_files(out) == dataset_files(reference)


def test_resume_redoes_a_damaged_shard(tmp_path: Path, backend: str) -> None:
    options = WriteOptions(backend=backend, max_shard_samples=10)
    reference, out = tmp_path / "reference", tmp_path / "out"
    write_all(reference, options)
    interrupt(out, options, 35)
    second = out / f"shard-00001{SHARD_SUFFIX[backend]}"
    second.write_bytes(second.read_bytes()[:100])
    writer = ShardWriter(out, options, resume=True, identity=IDENTITY)
    assert writer.num_resumed == 10
    with writer:
        for sample in SAMPLES[writer.num_resumed :]:
            writer.write(sample)
    assert dataset_files(out) == dataset_files(reference)


KILLED_CHILD = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from test_writer import IDENTITY, SAMPLES
from shardio.packing.writer import ShardWriter, WriteOptions
writer = ShardWriter(sys.argv[2], WriteOptions(backend=sys.argv[3], max_shard_samples=10),
                     identity=IDENTITY)
for sample in SAMPLES[:25]:
    writer.write(sample)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_resume_after_sigkill(tmp_path: Path, backend: str) -> None:
    options = WriteOptions(backend=backend, max_shard_samples=10)
    reference, out = tmp_path / "reference", tmp_path / "out"
    write_all(reference, options)
    child = subprocess.run(
        [sys.executable, "-c", KILLED_CHILD, str(Path(__file__).parent), str(out), backend],
        capture_output=True, text=True, check=False,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert "manifest.json" not in os.listdir(out)
    assert any(n.startswith(".shard-00002") for n in os.listdir(out)), "a partial shard"
    writer = ShardWriter(out, options, resume=True, identity=IDENTITY)
    assert writer.num_resumed == 20
    with writer:
        for sample in SAMPLES[writer.num_resumed :]:
            writer.write(sample)
    assert dataset_files(out) == dataset_files(reference)


@pytest.mark.parametrize(
    ("options", "identity"),
    [
        (WriteOptions(max_shard_samples=10), {**IDENTITY, "seed": 2}),
        (WriteOptions(max_shard_samples=9), IDENTITY),
        (WriteOptions(max_shard_samples=10, codec="none"), IDENTITY),
    ],
)
def test_resume_with_another_identity_is_refused(
    tmp_path: Path, options: WriteOptions, identity: dict[str, Any]
) -> None:
    interrupt(tmp_path, WriteOptions(max_shard_samples=10), 25)
    kept = dataset_files(tmp_path)
    with pytest.raises(PackError, match="other options or input"):
        ShardWriter(tmp_path, options, resume=True, identity=identity)
    assert dataset_files(tmp_path) == kept


def test_resume_of_a_complete_dataset_is_refused(tmp_path: Path) -> None:
    write_all(tmp_path, WriteOptions(), SAMPLES[:5])
    with pytest.raises(OutputExistsError, match="already complete"):
        ShardWriter(tmp_path, resume=True, identity=IDENTITY)


def test_resume_without_a_journal_is_refused_when_files_exist(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a pack", encoding="utf-8")
    with pytest.raises(OutputExistsError, match="no pack journal"):
        ShardWriter(tmp_path, resume=True, identity=IDENTITY)


def test_resume_into_an_empty_folder_starts_fresh(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path / "new", resume=True, identity=IDENTITY)
    assert writer.num_resumed == 0
    with writer:
        writer.write(SAMPLES[0])
    assert load_manifest(tmp_path / "new").num_samples == 1
