"""The remote benchmark's fetch ceiling: every byte of a copy fetched by ``curl`` in ranges,
through a real HTTP server on loopback, and the report's reading of it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.fetch_ceiling import PARALLEL, fetch_ceiling, ranges
from benchmarks.remote_report import ceiling_line, ceiling_rate, target_rows
from tests.storage_servers import RangeHTTPServer

pytestmark = [pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl"),
              pytest.mark.servers]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, dict[str, int]]]:
    sizes = {"a.rec": 10_000, "b.rec": 2_500, "sub/c.rec": 1}
    for i, (name, size) in enumerate(sizes.items()):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(bytes([i]) * size)
    server = RangeHTTPServer(tmp_path)
    try:
        yield server.url, sizes
    finally:
        server.close()


def test_ranges_cover_every_byte_once_largest_object_first() -> None:
    cut = ranges({"small": 5, "big": 25}, range_bytes=10)
    assert cut == [("big", 0, 9), ("big", 10, 19), ("big", 20, 24), ("small", 0, 4)]


@pytest.mark.parametrize("parallel", [1, 3])
def test_every_byte_is_fetched_once(served: tuple[str, dict[str, int]], parallel: int) -> None:
    url, sizes = served
    got = fetch_ceiling(url, sizes, parallel, range_bytes=4096)
    assert got["bytes"] == sum(sizes.values())
    assert got["requests"] == 3 + 1 + 1 and got["parallel"] == parallel
    assert got["wall_s"] > 0


def test_a_missing_object_or_a_short_copy_is_an_error(
        served: tuple[str, dict[str, int]]) -> None:
    url, sizes = served
    with pytest.raises(RuntimeError, match=r"missing\.rec"):
        fetch_ceiling(url, {**sizes, "missing.rec": 10}, 2)
    with pytest.raises(RuntimeError, match="received 12501 bytes of 12502"):
        fetch_ceiling(url, {**sizes, "b.rec": 2_501}, 2)  # the server has one byte less


def _tree(walls: list[float]) -> dict[str, object]:
    runs = [{"parallel": p, "wall_s": w} for w in walls for p in PARALLEL]
    for i, run in enumerate(runs):  # the faster parallelism: the second of each repeat
        run["wall_s"] = run["wall_s"] * (1 if i % len(PARALLEL) else 2)
    return {"num_files": 1000, "systems": {"shardio-records": {"ceiling": runs},
                                           "webdataset": {}}}


def test_the_report_takes_each_repeats_faster_parallelism_and_their_median() -> None:
    tree = _tree([0.5, 0.25, 1.0])
    assert ceiling_rate(tree, "shardio-records") == (2000.0, PARALLEL[1])
    assert ceiling_rate(tree, "webdataset") is None
    line = ceiling_line(tree, {"shardio-records": {}, "webdataset": {}})
    assert line is not None and "shardio-records 2,000 samples/s" in line
    assert "webdataset" not in line.split(":", 1)[1]


def test_the_first_epoch_target_names_the_ceiling() -> None:
    summary = {"epoch1": 500.0, "first_batch_s": 0.5, "down1": 1.0}
    systems = {"shardio-records": {"fits-w0": summary},
               "webdataset": {"fits-w0": {"epoch1": 400.0}}}
    row = target_rows(systems, _tree([0.5]), {"bandwidth_mbs": 0})[0]
    assert row[:5] == ["first epoch x best peer (webdataset)", "fits-w0", "1.25", ">= 1.5",
                       "**NO**"]
    assert row[5] == ("its fetch ceiling allows at most 5.00x (2,000 samples/s); shardio "
                      "reached 25% of it")
