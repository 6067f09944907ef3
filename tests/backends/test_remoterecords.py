"""``shardio.backends.remoterecords.partition``: how a remote shard is cut into fetch ranges."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio.backends.remoterecords import JOIN_RANGE_BYTES, partition


def _offsets(sizes: list[int], header: int = 64) -> np.ndarray:
    return np.concatenate(([header], header + np.cumsum(sizes))).astype(np.uint64)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 3 << 20), min_size=1, max_size=60),
       block=st.integers(1, 9), range_bytes=st.sampled_from([64 << 10, 2 << 20, 16 << 20]))
def test_ranges_are_whole_blocks_capped_at_range_bytes(
        sizes: list[int], block: int, range_bytes: int) -> None:
    offsets = _offsets(sizes)
    n = len(sizes)
    cuts = partition(offsets, range_bytes, block)
    assert cuts[0] == 0 and cuts[-1] == n and cuts == sorted(set(cuts))
    joined = min(range_bytes, JOIN_RANGE_BYTES)
    for lo, hi in itertools.pairwise(cuts):
        span = int(offsets[hi] - offsets[lo])
        largest = max(sizes[lo:hi])
        assert span <= range_bytes + largest or hi - lo == 1
        if lo // block == (hi - 1) // block:
            continue  # inside one block: that block, or a part of one too large for a range
        # several blocks: whole ones, joined only while small
        assert lo % block == 0 and (hi % block == 0 or hi == n)
        assert span <= joined
    # a block that fits in a range is never split across two
    for start in range(0, n, block):
        stop = min(n, start + block)
        if int(offsets[stop] - offsets[start]) <= range_bytes:
            assert not [c for c in cuts if start < c < stop]


def test_blocks_of_two_megabytes_are_joined_up_to_range_bytes() -> None:
    offsets = _offsets([100_000] * 400)  # blocks of 20 records: 2 MB
    assert partition(offsets, 16 << 20, 20) == [0, 160, 320, 400]
    assert partition(offsets, 4 << 20, 20) == list(range(0, 401, 40))
    # under a budget below the dataset (join_bytes 0): a block a range
    assert partition(offsets, 16 << 20, 20, max_join_bytes=0) == list(range(0, 401, 20))
    # without a block size: equal parts of about range_bytes, across blocks
    assert partition(offsets, 16 << 20) == [0, 133, 266, 400]


@pytest.mark.parametrize("block", [1, 3])
def test_small_blocks_are_joined_up_to_the_smaller_of_range_bytes_and_the_join_cap(
        block: int) -> None:
    offsets = _offsets([10_000] * 5000)
    cuts = partition(offsets, 64 << 20, block)
    spans = np.diff(offsets[cuts].astype(np.int64))
    assert spans.max() <= JOIN_RANGE_BYTES and spans[:-1].min() > JOIN_RANGE_BYTES // 2
    assert all(c % block == 0 for c in cuts[:-1])
