"""The records writer's file CRC, extended past large frames by combining: equal to a plain CRC."""

from __future__ import annotations

import os
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from shardio.backends.records import COMBINE_MIN_BYTES, crc32_after_frame
from shardio.format import CODEC_NONE, CODEC_ZSTD, frame


@settings(max_examples=60, deadline=None)
@given(
    start=st.integers(0, 2**32 - 1),
    size=st.one_of(st.integers(0, 100), st.integers(COMBINE_MIN_BYTES - 20, 3 * COMBINE_MIN_BYTES)),
    codec=st.sampled_from([CODEC_NONE, CODEC_ZSTD]),
)
def test_crc_after_a_frame_is_the_crc_over_its_bytes(start: int, size: int, codec: int) -> None:
    framed = frame(os.urandom(size), codec)
    assert crc32_after_frame(start, framed) == zlib.crc32(framed, start)
