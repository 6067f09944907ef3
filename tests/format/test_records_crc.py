"""The records writer's checksums: the v2 chain and the file checksum, against a plain CRC-32C."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import crc32c
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio.backends.records import RecordsShardReader, RecordsShardWriter
from shardio.format.frames import CODEC_NONE, CODEC_ZSTD, FRAME_SIZE, check_frames, frame


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(0, 40_000), min_size=1, max_size=12),
       codec=st.sampled_from([CODEC_NONE, CODEC_ZSTD]))
def test_chain_is_the_crc32c_of_the_file_before_each_record(
    tmp_path_factory: object, sizes: list[int], codec: int
) -> None:
    path = Path(tmp_path_factory.mktemp("crc")) / "s.rec"  # type: ignore[attr-defined]
    writer = RecordsShardWriter(path, version=2)
    for i, size in enumerate(sizes):
        writer.append(f"k{i}", frame(os.urandom(size), codec))
    total, checksum = writer.finish()
    data = path.read_bytes()
    assert (total, checksum) == (len(data), f"crc32c:{crc32c.crc32c(data):08x}")
    reader = RecordsShardReader(path)
    try:
        offsets = reader.offsets.tolist()
        run = reader.read_run(0, len(sizes))
        assert run.chain is not None
        assert run.chain.tolist() == [crc32c.crc32c(data[:at]) for at in offsets]
        assert check_frames(run, path=str(path), first_record=0) == [codec] * len(sizes)
    finally:
        reader.close()


def test_v1_writer_writes_the_v1_layout(tmp_path: Path) -> None:
    """Forced to v1: 16-byte header, u64 offsets only, zlib CRC-32 everywhere."""
    path = tmp_path / "s.rec"
    writer = RecordsShardWriter(path, version=1)
    frames = [frame(os.urandom(n), CODEC_NONE, "crc32") for n in (3, 0, 70_000)]
    for i, framed in enumerate(frames):
        writer.append(f"k{i}", framed)
    _size, checksum = writer.finish()
    data = path.read_bytes()
    assert checksum == f"crc32:{zlib.crc32(data):08x}"
    assert data[:16] == b"SHARDIO\0" + (1).to_bytes(4, "little") + bytes(4)
    index_offset = 16 + sum(map(len, frames))
    assert data[16:index_offset] == b"".join(frames)
    offsets = np.frombuffer(data, "<u8", 4, index_offset).tolist()
    assert offsets == [16, 16 + len(frames[0]), 16 + len(frames[0]) + FRAME_SIZE, index_offset]
    assert int.from_bytes(data[-12:-8], "little") == 1 and len(data) - 40 > index_offset + 32
