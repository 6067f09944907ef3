"""Shard planning: the framed-size bound holds for any sample, and plans obey every limit."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio.format.codecs import get_codec
from shardio.format.record import encode_record
from shardio.packing.plan import (
    MIN_SHARD_BYTES,
    PARALLEL_SHARDS,
    framed_bound,
    framed_bounds,
    plan_shards,
    target_shard_bytes,
)
from shardio.packing.sources.files import SourceSample

NAMES = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=40)
PAYLOADS = st.one_of(
    st.binary(min_size=1, max_size=3000),
    st.integers(1, 70_000).map(lambda n: bytes(n)),  # compresses to almost nothing
    st.integers(1, 3000).map(lambda n: b"\xff\xd8\xff" + os.urandom(n)),  # looks like a JPEG
)


@settings(max_examples=150, deadline=None)
@given(
    key=NAMES,
    files=st.dictionaries(NAMES.filter(lambda n: n not in ("__key__", "label")), PAYLOADS,
                          min_size=1, max_size=4),
    label=st.one_of(st.none(), st.integers(0, 2**63)),
    codec=st.sampled_from(["zstd", "none"]),
)
def test_framed_bound_is_never_below_the_record(
    key: str, files: dict[str, bytes], label: int | None, codec: str
) -> None:
    fields = tuple(files)
    sizes = tuple(len(v) for v in files.values())
    sample = SourceSample(key, fields, fields, sizes, label, sum(sizes))
    values: dict[str, object] = {"__key__": key, **files}
    if label is not None:
        values["label"] = label
    assert len(encode_record(values, get_codec(codec))) <= framed_bound(sample)
    assert framed_bounds([sample, sample]) == [framed_bound(sample)] * 2  # the bulk form agrees


def test_framed_bound_is_close_for_plain_samples() -> None:
    data = os.urandom(2000)
    sample = SourceSample("d01/f000123", ("bin",), ("x",), (2000,), None, 2000)
    framed = encode_record({"__key__": sample.key, "bin": data}, get_codec("zstd"))
    assert 0 <= framed_bound(sample) - len(framed) <= 24  # headers counted at their largest


@settings(max_examples=200, deadline=None)
@given(
    bounds=st.lists(st.integers(1, 5000), max_size=300),
    max_shard_bytes=st.integers(1, 20_000),
    max_shard_samples=st.one_of(st.none(), st.integers(1, 50)),
)
def test_plans_cover_every_sample_once_within_the_limits(
    bounds: list[int], max_shard_bytes: int, max_shard_samples: int | None
) -> None:
    plan = plan_shards(bounds, max_shard_bytes=max_shard_bytes,
                       max_shard_samples=max_shard_samples)
    assert [i for shard in plan for i in shard] == list(range(len(bounds)))
    target = target_shard_bytes(sum(bounds), max_shard_bytes)
    assert target <= max_shard_bytes
    for number, shard in enumerate(plan):
        size = sum(bounds[i] for i in shard)
        assert len(shard) >= 1
        assert size <= target or len(shard) == 1
        assert max_shard_samples is None or len(shard) <= max_shard_samples
        if number + 1 < len(plan):  # greedy: the next sample would not have fitted
            full = max_shard_samples is not None and len(shard) == max_shard_samples
            assert full or size + bounds[shard.stop] > target


def test_small_inputs_are_spread_over_parallel_shards() -> None:
    assert target_shard_bytes(10**9, 256 * 10**6) == max(MIN_SHARD_BYTES, 10**9 // PARALLEL_SHARDS)
    assert target_shard_bytes(10**6, 256 * 10**6) == MIN_SHARD_BYTES
    assert target_shard_bytes(10**12, 256 * 10**6) == 256 * 10**6
    assert target_shard_bytes(10**9, 1000) == 1000
    plan = plan_shards([100_000] * 10_000, max_shard_bytes=256 * 10**6)
    assert len(plan) == pytest.approx(PARALLEL_SHARDS, abs=1)


def test_an_empty_stream_has_no_shards() -> None:
    assert plan_shards([], max_shard_bytes=10) == []
