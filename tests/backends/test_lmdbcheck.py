"""No file content makes shardio die by a signal on an LMDB shard (issue 7, item 2).

liblmdb follows page numbers and value sizes without checking them against the
file's end; ``shardio.backends.lmdbcheck`` proves them inside the file before
liblmdb maps it. Every read of a damaged shard runs in a child process here, so
a regression shows as a failed test naming the signal, not a dead test run.
Run as a script (``python tests/backends/test_lmdbcheck.py MODE DATASET ...``) this file
is that child.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardio.backends.lmdbcheck import (
    F_BIGDATA,
    NODE_HEADER,
    P_BRANCH,
    P_LEAF,
    PAGE_HEADER,
    PAGE_HEADER_BYTES,
    check_lmdb_file,
)
from shardio.errors import ShardCorruptError, ShardioError
from shardio.format.manifest import file_checksum, load_manifest, write_manifest
from shardio.ops.verify import verify
from shardio.packing.writer import ShardWriter, WriteOptions
from shardio.reading.reader import DatasetReader

NUM_SAMPLES = 40
SIZES = (200, 1500, 9000, 3000)
"""Inline values (200, 1500 B) and big values on runs of 3 and 1 overflow pages; the last
record's run is a 1-page run near the end of the file."""
PSIZE = 4096
CHILD_TIMEOUT_S = 60


def blob(i: int) -> bytes:
    return np.random.default_rng(i).integers(0, 256, SIZES[i % len(SIZES)], np.uint8).tobytes()


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One LMDB shard of 40 samples: inline and overflow values, a branch page at the root,
    written in several transactions (both meta pages in use, freed pages in the file)."""
    out = tmp_path_factory.mktemp("lmdbcheck") / "ds"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("shardio.backends.lmdb.BATCH_BYTES", 40_000)
        with ShardWriter(out, WriteOptions(backend="lmdb", codec="none", version=2)) as writer:
            for i in range(NUM_SAMPLES):
                writer.write({"__key__": f"s{i:02d}", "bin": blob(i)})
    return out


def shard_of(dataset: Path) -> Path:
    shards = load_manifest(dataset).shards
    assert len(shards) == 1
    return dataset / shards[0].name


def tree_pages(data: bytes) -> Iterator[tuple[int, int, list[tuple[int, int, int]]]]:
    """``(pgno, flags, [(node offset, node flags, lo | hi << 16)])`` of each B-tree page."""
    for pgno in range(2, len(data) // PSIZE):
        base = pgno * PSIZE
        _pgno, _pad, flags, lower, _upper = PAGE_HEADER.unpack_from(data, base)
        if flags in (P_BRANCH, P_LEAF):
            num = (lower - PAGE_HEADER_BYTES) // 2
            ptrs = struct.unpack_from(f"={num}H", data, base + PAGE_HEADER_BYTES)
            nodes = []
            for ptr in ptrs:
                lo, hi, nflags, _ksize = NODE_HEADER.unpack_from(data, base + ptr)
                nodes.append((base + ptr, nflags, lo | hi << 16))
            yield pgno, flags, nodes


def leaf_node(data: bytes, *, big: bool, size: int) -> int:
    """File offset of the first leaf node holding a sample of ``size`` bytes (framed)."""
    for _pgno, flags, nodes in tree_pages(data):
        for offset, nflags, dsize in nodes:
            if flags == P_LEAF and (nflags == F_BIGDATA) == big and size < dsize < size + 100:
                return offset
    raise AssertionError(f"no leaf node with a {size}-byte value")


def grow_big_value(data: bytearray) -> None:
    """A 3-page big value's size + 1 MiB: its run ends past the end of the file."""
    struct.pack_into("=H", data, leaf_node(data, big=True, size=9000) + 2, 0x10)


def move_overflow_run(data: bytearray) -> None:
    """A 3-page big value's overflow page number -> the file's last (1-page) run, so that
    the run it now claims ends past the end of the file."""
    def run_start(node: int) -> int:
        ksize = NODE_HEADER.unpack_from(data, node)[3]
        return int(struct.unpack_from("=Q", data, node + 8 + ksize)[0])

    big = [offset for _p, flags, nodes in tree_pages(data) if flags == P_LEAF
           for offset, nflags, _size in nodes if nflags == F_BIGDATA]
    last = max(map(run_start, big))
    assert last + 3 > len(data) // PSIZE, "the last run should lie within 3 pages of the end"
    node = leaf_node(data, big=True, size=9000)
    struct.pack_into("=Q", data, node + 8 + NODE_HEADER.unpack_from(data, node)[3], last)


def branch_child_past_eof(data: bytearray) -> None:
    """The root branch page's second child -> 7 pages past the end of the file."""
    _pgno, _flags, nodes = next(p for p in tree_pages(data) if p[1] == P_BRANCH)
    child = len(data) // PSIZE + 7
    struct.pack_into("=HHH", data, nodes[1][0], child & 0xFFFF, child >> 16 & 0xFFFF, child >> 32)


def grow_inline_value(data: bytearray) -> None:
    """An inline value's size + 1 MiB: it runs past its page and the file."""
    struct.pack_into("=H", data, leaf_node(data, big=False, size=1500) + 2, 0x10)


DAMAGE: dict[str, Callable[[bytearray], None]] = {
    "big value size": grow_big_value,
    "overflow page number": move_overflow_run,
    "branch child page number": branch_child_past_eof,
    "inline value size": grow_inline_value,
}


def damaged_copy(clean: Path, dest: Path, damage: str, *, agree: bool = True) -> Path:
    """A copy of ``clean`` with ``damage`` done to its shard.

    ``agree``: the manifest's checksum matches the damaged file (damage done before
    packing finished), so verify too must rely on the structure check.
    """
    shutil.copytree(clean, dest)
    shard = shard_of(dest)
    data = bytearray(shard.read_bytes())
    DAMAGE[damage](data)
    shard.write_bytes(bytes(data))
    if agree:
        manifest = load_manifest(dest)
        info = dataclasses.replace(manifest.shards[0], checksum=file_checksum(shard))
        write_manifest(dest, dataclasses.replace(manifest, shards=(info,)))
    return dest


def run_child(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", code, *args] if code else [
        sys.executable, __file__, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
                          check=False)


UNCHECKED_READ = """
import sys
import lmdb
env = lmdb.open(sys.argv[1], subdir=False, readonly=True, lock=False, create=False)
with env.begin() as txn:
    for key, value in txn.cursor():
        bytes(value)
"""

@pytest.mark.parametrize("damage", ["big value size", "overflow page number"])
def test_unchecked_read_dies_by_sigbus(clean: Path, tmp_path: Path, damage: str) -> None:
    """The damage is real: liblmdb reading the file unchecked is killed by SIGBUS."""
    dataset = damaged_copy(clean, tmp_path / "ds", damage)
    assert run_child(str(shard_of(dataset)), code=UNCHECKED_READ).returncode == -signal.SIGBUS


def test_every_entry_point_refuses_damaged_shard(clean: Path, tmp_path: Path) -> None:
    """DatasetReader, verify, unpack, StreamingDataset: ShardCorruptError naming the shard."""
    datasets = [damaged_copy(clean, tmp_path / f"ds{i}", name) for i, name in enumerate(DAMAGE)]
    child = run_child("entry-points", str(tmp_path / "dest"), *map(str, datasets))
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    results = json.loads(child.stdout)
    for dataset, damage in zip(datasets, DAMAGE, strict=True):
        shard = str(shard_of(dataset))
        for entry, (kind, message) in results[str(dataset)].items():
            assert kind == "ShardCorruptError", (damage, entry, kind, message)
            assert message.startswith(shard) and "LMDB page" in message, (damage, entry, message)
            assert "re-pack" in message and "shardio verify" in message


@pytest.mark.parametrize("damage", ["overflow page number", "big value size"])
def test_cli_exits_1_without_a_signal(clean: Path, tmp_path: Path, damage: str) -> None:
    dataset = damaged_copy(clean, tmp_path / "ds", damage)
    shard = shard_of(dataset)
    cli = "from shardio.cli import main; main()"
    checked = run_child("verify", str(dataset), code=cli)
    assert checked.returncode == 1, checked.stderr
    assert f"FAULT {shard.name}: {shard}: LMDB page" in checked.stderr
    restored = run_child("unpack", str(dataset), str(tmp_path / "dest"), code=cli)
    assert restored.returncode == 1, restored.stderr
    assert f"{shard}: LMDB page" in restored.stderr


def test_verify_never_opens_lmdb_shard_with_bad_checksum(
    clean: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = damaged_copy(clean, tmp_path / "ds", "overflow page number", agree=False)

    def opened(path: str) -> None:
        raise AssertionError(f"verify opened {path} although its file checksum failed")

    monkeypatch.setattr("shardio.backends.lmdb.check_lmdb_file", opened)
    report = verify(dataset)
    assert [(f.shard, f.record) for f in report.faults] == [(shard_of(dataset).name, None)]
    assert "checksum" in report.faults[0].message


def test_clean_shard_passes_the_check(clean: Path) -> None:
    layout = check_lmdb_file(str(shard_of(clean)))
    assert layout.num_entries == NUM_SAMPLES + 2  # the records and the two metadata entries
    assert layout.txnid > 2  # several commits
    assert layout.depth == 2
    assert (layout.last_pgno + 1) * layout.page_bytes == shard_of(clean).stat().st_size


def test_pages_shared_or_in_a_loop_are_refused(clean: Path, tmp_path: Path) -> None:
    """A branch child pointing back at its parent would send a walk round forever."""
    shard = tmp_path / "loop.mdb"
    data = bytearray(shard_of(clean).read_bytes())
    root, _flags, nodes = next(p for p in tree_pages(data) if p[1] == P_BRANCH)
    struct.pack_into("=HHH", data, nodes[1][0], root & 0xFFFF, root >> 16 & 0xFFFF, 0)
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardCorruptError, match=rf"page {root}.*already used"):
        check_lmdb_file(str(shard))


def node_fields(data: bytes) -> list[int]:
    """Byte offsets of every node header and overflow page number: sizes and page numbers."""
    spots = []
    for _pgno, _flags, nodes in tree_pages(data):
        for offset, nflags, _size in nodes:
            spots += range(offset, offset + NODE_HEADER.size)
            if nflags == F_BIGDATA:
                pgno_at = offset + NODE_HEADER.size + NODE_HEADER.unpack_from(data, offset)[3]
                spots += range(pgno_at, pgno_at + 8)
    return spots


def test_overflow_headers_checked_on_request(clean: Path, tmp_path: Path) -> None:
    """A damaged overflow header is harmless to readers (never read); asked for, it is found."""
    dataset = shutil.copytree(clean, tmp_path / "ds")
    shard = shard_of(dataset)
    data = bytearray(shard.read_bytes())
    node = leaf_node(data, big=True, size=9000)
    run = struct.unpack_from("=Q", data, node + 8 + NODE_HEADER.unpack_from(data, node)[3])[0]
    data[run * PSIZE + 10] ^= 0x04  # P_OVERFLOW flag off
    shard.write_bytes(bytes(data))
    check_lmdb_file(str(shard))
    with DatasetReader(dataset) as damaged, DatasetReader(clean) as original:
        assert list(damaged) == list(original)
    with pytest.raises(ShardCorruptError, match=rf"overflow header says page {run}, flags 0x0"):
        check_lmdb_file(str(shard), overflow_headers=True)


def test_random_bit_flips_never_kill_hang_or_lie(clean: Path, tmp_path: Path) -> None:
    """Seeded single-bit flips, read in child processes: an error or the original, always.

    400 flips anywhere in the file, 300 in its meta, branch and leaf pages (freed ones
    included), 300 in node headers and overflow page numbers, where liblmdb takes its
    sizes and page numbers from (without the check, about 1 in 15 of these last ones
    killed the reader by SIGBUS).
    """
    dataset = shutil.copytree(clean, tmp_path / "ds")
    data = shard_of(dataset).read_bytes()
    pages = [p * PSIZE for p in (0, 1)] + [p * PSIZE for p, _f, _n in tree_pages(data)]
    rng = np.random.default_rng(7)
    anywhere = rng.integers(0, len(data) * 8, 400)
    in_tree = (rng.choice(pages, 300) + rng.integers(0, PSIZE, 300)) * 8
    in_nodes = rng.choice(node_fields(data), 300) * 8
    offsets = np.concatenate([anywhere, in_tree + rng.integers(0, 8, 300),
                              in_nodes + rng.integers(0, 8, 300)])
    bits = list(dict.fromkeys(int(b) for b in offsets))
    outcomes: dict[int, str] = {}
    while todo := [b for b in bits if b not in outcomes]:
        shard_of(dataset).write_bytes(data)  # a child killed mid-flip left its flip behind
        try:
            child = run_child("flips", str(dataset), *map(str, todo))
            out, err, code = child.stdout, child.stderr, child.returncode
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
            err, code = "timed out", None
        started = None
        for line in out.splitlines():
            word, bit, *outcome = line.split(" ", 2)
            if word == "start":
                started = int(bit)
            else:
                outcomes[int(bit)], started = outcome[0], None
        if started is not None:  # the child died (or hung) on this flip
            outcomes[started] = "hang" if code is None else f"signal {-code}"
        elif code != 0:
            pytest.fail(f"flip child failed before any flip: {err[-2000:]}")
    bad = {b: o for b, o in outcomes.items() if o not in ("error", "same")}
    assert bad == {}, f"flips (bit offsets) that killed, hung or lied: {bad}"
    errors = sum(o == "error" for o in outcomes.values())
    # Slack in pages, freed pages and unused meta fields are never read: those flips change
    # nothing; the rest must be found.
    assert errors > len(bits) // 3, outcomes


# --- the child side -------------------------------------------------------------------------


def _outcome(call: Callable[[], Any]) -> tuple[str, str]:
    try:
        call()
    except ShardioError as exc:
        return type(exc).__name__, str(exc)
    return "no error", ""


def _entry_points(dest: Path, datasets: list[str]) -> None:
    """Each entry point on each damaged dataset; prints ``{dataset: {entry: (type, msg)}}``."""
    results = {ds: _entry_point_outcomes(ds, dest / str(n)) for n, ds in enumerate(datasets)}
    print(json.dumps(results))


def _entry_point_outcomes(dataset: str, dest: Path) -> dict[str, tuple[str, str]]:
    import shardio
    from shardio.ops.unpack import unpack

    def read_all() -> None:
        with DatasetReader(dataset) as reader:
            for index in range(len(reader)):
                reader.get(index)

    def verified() -> None:
        for fault in verify(dataset).faults:
            raise ShardCorruptError(fault.message)

    return {
        "DatasetReader": _outcome(read_all),
        "verify": _outcome(verified),
        "unpack": _outcome(lambda: unpack(dataset, dest)),
        "StreamingDataset": _outcome(lambda: list(shardio.StreamingDataset(dataset))),
        "IndexedDataset": _outcome(lambda: shardio.IndexedDataset(dataset)[0]),
    }


def _flips(dataset: Path, bits: list[int]) -> None:
    """Flip each bit in turn and read every sample by index and in order."""
    shard = shard_of(dataset)
    with DatasetReader(dataset) as reader:
        expected = [reader.get(i) for i in range(len(reader))]
    fd = os.open(shard, os.O_RDWR)
    try:
        for bit in bits:
            print(f"start {bit}", flush=True)
            original = os.pread(fd, 1, bit // 8)
            os.pwrite(fd, bytes([original[0] ^ (1 << bit % 8)]), bit // 8)
            try:
                with DatasetReader(dataset) as reader:
                    same = [reader.get(i) for i in range(len(reader))] == expected
                    same = same and list(reader) == expected
                outcome = "same" if same else "wrong bytes"
            except ShardioError:
                outcome = "error"
            except Exception as exc:  # any other type is a finding: report it, keep going
                outcome = f"{type(exc).__name__}: {exc}"[:200]
            finally:
                os.pwrite(fd, original, bit // 8)
            print(f"done {bit} {outcome}", flush=True)
    finally:
        os.close(fd)


if __name__ == "__main__":
    mode, where, *rest = sys.argv[1:]
    if mode == "entry-points":
        _entry_points(Path(where), rest)
    else:
        _flips(Path(where), [int(b) for b in rest])


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 20_000), min_size=0, max_size=60),
       big_named=st.booleans())
def test_the_check_finds_every_value_where_liblmdb_does(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], big_named: bool
) -> None:
    """The places the check reports are where liblmdb reads each value (inline values and
    overflow runs, numbered and named keys): the reader reads LMDB files only through them."""
    import lmdb

    path = tmp_path_factory.mktemp("lmdb") / "values.mdb"
    rng = np.random.default_rng(len(sizes))
    entries = {i.to_bytes(8, "big"): rng.bytes(n) for i, n in enumerate(sizes)}
    entries[b"__shardio__"] = b"meta"
    entries[b"__shardio_keys__"] = rng.bytes(5000 if big_named else 3)
    env = lmdb.open(str(path), subdir=False, lock=False, map_size=1 << 28, meminit=True)
    with env.begin(write=True) as txn:
        for key, value in entries.items():
            txn.put(key, value)
    env.close()
    layout = check_lmdb_file(str(path))
    data = path.read_bytes()
    located = {key: data[at : at + size] for key, (at, size) in layout.named.items()}
    for key, at, size in layout.numbered.tolist():
        located[key.to_bytes(8, "big")] = data[at : at + size]
    assert located == entries
