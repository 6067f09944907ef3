"""A hostile manifest's sample counts are bounded by its shards' bytes before anything is planned.

A reader plans an epoch (an array per sample) before it opens a shard, so a
manifest claiming 10^10 samples in a 15 KB shard once cost 74.5 GiB and an
untyped ``MemoryError``. Every record takes ``MIN_RECORD_BYTES`` at least, so a
count above ``bytes // MIN_RECORD_BYTES`` is refused when the manifest is read,
with a ``ManifestError`` naming the manifest and the shard: locally (where the
files' real sizes bound the counts too), over HTTP, through the torch datasets,
``verify`` and the CLI. Peak memory is measured with ``tracemalloc`` (numpy
reports its arrays to it).
"""

from __future__ import annotations

import json
import shutil
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from storage_servers import FAST_RETRY, HttpEndpoint

import shardio
from shardio import IndexedDataset, ManifestError, StreamingDataset
from shardio.cli import main
from shardio.format.manifest import MIN_RECORD_BYTES_V3 as MIN_RECORD_BYTES
from shardio.format.manifest import Manifest
from shardio.storage.options import RemoteOptions
from shardio.synth import make_imagefolder

pytest_plugins = ("storage_plugin",)

HOSTILE = 30_000_000
"""Samples the forged manifest claims for its first shard: 240 MB of plan at 8 bytes each."""
MAX_PEAK_BYTES = 32 << 20
"""What refusing it may allocate at most (the plan alone would be 240 MB)."""


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 small JPEGs in two shards of 10."""
    src = tmp_path_factory.mktemp("hostile-src")
    make_imagefolder(src, num_classes=2, per_class=10, seed=1, long_side=(32, 48))
    out = tmp_path_factory.mktemp("hostile") / "ds"
    shardio.pack(src, out, options=shardio.WriteOptions(max_shard_samples=10))
    return out


def forge(packed: Path, dest: Path, *, num_samples: int = HOSTILE,
          num_bytes: int | None = None) -> Path:
    """A copy of ``packed`` whose manifest says shard 0 holds ``num_samples`` (and, when given,
    ``num_bytes``), with every other count and index made to add up."""
    shutil.copytree(packed, dest)
    data = json.loads((dest / "manifest.json").read_text())
    first = data["shards"][0]
    first["num_samples"] = num_samples
    if num_bytes is not None:
        first["num_bytes"] = num_bytes
    total = 0
    for shard in data["shards"]:
        shard["first_index"] = total
        total += shard["num_samples"]
    data["num_samples"] = total
    (dest / "manifest.json").write_text(json.dumps(data))
    return dest


def refused(open_it: Callable[[], Any]) -> ManifestError:
    """The ``ManifestError`` ``open_it`` raises (iterating what it returns), and its peak memory
    below ``MAX_PEAK_BYTES``."""
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError) as info:
            opened = open_it()
            next(iter(opened))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MAX_PEAK_BYTES, f"refusing the manifest allocated {peak} bytes"
    return info.value


def names_manifest_and_shard(exc: BaseException, where: str) -> None:
    text = str(exc)
    assert where in text and "shard-00000" in text and str(HOSTILE) in text, text
    assert f"at least {MIN_RECORD_BYTES} bytes" in text, text


def test_a_count_beyond_the_shards_bytes_is_refused_as_the_manifest_is_parsed(
        packed: Path) -> None:
    data = json.loads((packed / "manifest.json").read_text())
    shard = data["shards"][0]
    most = shard["num_bytes"] // MIN_RECORD_BYTES
    assert most >= shard["num_samples"]  # the real count fits, as every packed shard's does
    for count, num_bytes in ((most + 1, shard["num_bytes"]), (1, -1)):
        forged = json.loads(json.dumps(data))
        forged["shards"][0].update(num_samples=count, num_bytes=num_bytes)
        forged["num_samples"] = sum(s["num_samples"] for s in forged["shards"])
        for later in forged["shards"][1:]:
            later["first_index"] += count - shard["num_samples"]
        with pytest.raises(ManifestError, match=r"forged.*shard-00000|shard-00000.*forged"):
            Manifest.from_json(forged, path="somewhere/manifest.json")


@pytest.mark.parametrize("open_it", ["streaming", "indexed", "read_manifest"])
def test_a_local_manifest_claiming_too_many_samples_is_refused_before_planning(
        packed: Path, tmp_path: Path, open_it: str) -> None:
    ds = forge(packed, tmp_path / "ds")
    opener: dict[str, Callable[[], Any]] = {
        "streaming": lambda: StreamingDataset(ds, decode="raw"),
        "indexed": lambda: IndexedDataset(ds, decode="raw"),
        "read_manifest": lambda: [shardio.read_manifest(ds)],
    }
    names_manifest_and_shard(refused(opener[open_it]), str(ds / "manifest.json"))


def test_a_local_manifest_overstating_bytes_and_counts_alike_is_refused_by_the_files_size(
        packed: Path, tmp_path: Path) -> None:
    ds = forge(packed, tmp_path / "ds", num_bytes=HOSTILE * MIN_RECORD_BYTES * 10)
    exc = refused(lambda: StreamingDataset(ds, decode="raw"))
    names_manifest_and_shard(exc, str(ds / "manifest.json"))
    assert f"in {(ds / 'shard-00000.rec').stat().st_size} bytes" in str(exc)


def test_verify_and_the_cli_report_the_forged_count(packed: Path, tmp_path: Path) -> None:
    ds = forge(packed, tmp_path / "ds")
    report = shardio.verify(ds)
    assert not report.ok
    names_manifest_and_shard(ManifestError(report.faults[0].message), str(ds))
    for args in (["verify", str(ds)], ["ls", str(ds)], ["info", str(ds)]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code != 0 and not isinstance(result.exception, MemoryError), args
        assert "forged" in result.output and "shard-00000" in result.output, (args, result.output)


@pytest.mark.servers
@pytest.mark.parametrize("open_it", ["streaming", "indexed"])
def test_a_remote_manifest_claiming_too_many_samples_is_refused_before_planning(
        packed: Path, http: HttpEndpoint, tmp_path: Path, open_it: str) -> None:
    forge(packed, http.root / "ds")
    url = f"{http.url}/ds"
    remote = RemoteOptions(cache_dir=tmp_path / "cache", max_cache_bytes=64 << 20,
                           retry=FAST_RETRY)
    cls = StreamingDataset if open_it == "streaming" else IndexedDataset
    exc = refused(lambda: cls(url, decode="raw", remote=remote))
    names_manifest_and_shard(exc, f"{url}/manifest.json")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.rec*"))


def _edited(packed: Path, dest: Path, edit: Callable[[dict[str, Any]], Any] | bytes) -> Path:
    """A copy of ``packed`` whose manifest is ``edit`` (bytes) or what ``edit`` makes of it."""
    shutil.copytree(packed, dest)
    if isinstance(edit, bytes):
        (dest / "manifest.json").write_bytes(edit)
        return dest
    data = json.loads((dest / "manifest.json").read_text())
    edit(data)
    (dest / "manifest.json").write_text(json.dumps(data))  # NaN and Infinity as JSON has none
    return dest


DAMAGED_TEXT: dict[str, Callable[[dict[str, Any]], Any] | bytes] = {
    "nested deeper than the parser goes": b"[" * 200_000,
    "not UTF-8": b'{"format": "shardio\xff"}',
    "num_samples Infinity": lambda m: m.update(num_samples=float("inf")),
    "input_bytes -Infinity": lambda m: m.update(input_bytes=float("-inf")),
    "num_bytes NaN": lambda m: m.update(num_bytes=float("nan")),
    "a count of 1e400": lambda m: m["shards"][0].update(num_samples=10 ** 400),
}
ESCAPING_NAMES = ["../other/shard-00000.rec", "/abs/shard-00000.rec", "sub/shard-00000.rec",
                  "..\\shard-00000.rec", "a\x00b", "..", ""]


@pytest.mark.parametrize("case", [*DAMAGED_TEXT, *ESCAPING_NAMES])
def test_a_damaged_or_escaping_manifest_is_a_manifest_error_everywhere(
        packed: Path, tmp_path: Path, case: str) -> None:
    # RecursionError, UnicodeDecodeError, OverflowError and the shard name that climbs out of
    # the folder once came out of the readers raw, or (the name) read another folder's file
    if case in DAMAGED_TEXT:
        ds = _edited(packed, tmp_path / "ds", DAMAGED_TEXT[case])
    else:
        # the shard the name points to exists: a reader that joined it would read it quietly
        shutil.copytree(packed, tmp_path / "other")
        ds = _edited(packed, tmp_path / "ds",
                     lambda m: m["shards"][0].update(name=case))
    where = str(ds / "manifest.json")
    for open_it in (lambda: StreamingDataset(ds, decode="raw"),
                    lambda: IndexedDataset(ds, decode="raw"),
                    lambda: [shardio.read_manifest(ds)]):
        with pytest.raises(ManifestError) as info:
            next(iter(open_it()))
        assert where in str(info.value)
    result = CliRunner().invoke(main, ["verify", str(ds)])
    assert result.exit_code == 1 and "manifest.json" in result.output, result.output
    assert "unexpected" not in result.output, result.output


@pytest.mark.servers
@pytest.mark.parametrize("case", ["nested deeper than the parser goes", "not UTF-8",
                                  "num_samples Infinity", "../other/shard-00000.rec"])
def test_a_damaged_or_escaping_remote_manifest_is_a_manifest_error(
        packed: Path, http: HttpEndpoint, tmp_path: Path, case: str) -> None:
    if case in DAMAGED_TEXT:
        _edited(packed, http.root / "ds", DAMAGED_TEXT[case])
    else:
        shutil.copytree(packed, http.root / "other")
        _edited(packed, http.root / "ds", lambda m: m["shards"][0].update(name=case))
    remote = RemoteOptions(cache_dir=tmp_path / "cache", retry=FAST_RETRY)
    with pytest.raises(ManifestError, match=r"manifest\.json"):
        next(iter(StreamingDataset(f"{http.url}/ds", decode="raw", remote=remote)))
