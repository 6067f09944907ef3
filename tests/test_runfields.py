"""shardio.runfields against msgpack: the same values, or None and msgpack decides."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio.runfields import BYTES, INT, STR, Edges, parse_edges, parse_flat_maps

INTS = st.integers(min_value=-(2**63), max_value=2**64 - 1)
VALUES = st.one_of(INTS, st.binary(max_size=300), st.text(max_size=40))
NAMES = st.text(min_size=0, max_size=35)


def pack(records: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, bytes]:
    payloads = [msgpack.packb(r, use_bin_type=True) for r in records]
    blob = b"".join(payloads)
    lengths = np.array([len(p) for p in payloads], np.int64)
    ends = np.cumsum(lengths)
    return np.frombuffer(blob, np.uint8), ends - lengths, ends, blob


def decoded(maps: Any, blob: bytes, count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{} for _ in range(count)]
    for name, column in zip(maps.names, maps.columns, strict=True):
        for i in range(count):
            if column.kind == INT:
                out[i][name] = int(column.ints[i])
            else:
                piece = blob[int(column.starts[i]) : int(column.ends[i])]
                out[i][name] = piece.decode() if column.kind == STR else piece
    return out


def draw_records(data: st.DataObject, max_fields: int) -> list[dict[str, Any]]:
    """A dozen records at most, of one set of field names, each field of one kind or any."""
    names = data.draw(st.lists(NAMES, min_size=0, max_size=max_fields, unique=True))
    kinds = [data.draw(st.sampled_from([INTS, st.binary(max_size=300),
                                        st.text(max_size=40), VALUES])) for _ in names]
    count = data.draw(st.integers(1, 12))
    return [{n: data.draw(k) for n, k in zip(names, kinds, strict=True)} for _ in range(count)]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_parsed_like_msgpack_or_refused(data: st.DataObject) -> None:
    records = draw_records(data, 17)
    count = len(records)
    arr, starts, ends, blob = pack(records)
    maps = parse_flat_maps(arr, starts, ends)
    if maps is None:
        return  # msgpack parses these one by one
    assert decoded(maps, blob, count) == [msgpack.unpackb(blob[s:e], raw=False) for s, e in
                                          zip(starts.tolist(), ends.tolist(), strict=True)]
    assert [list(r) for r in records] == [maps.names] * count


def test_the_common_shapes_are_parsed() -> None:
    images = [{"__key__": f"c/{i}.jpg", "image": bytes([i]) * (70000 + i), "label": i - 3}
              for i in range(40)]
    tiny = [{"__key__": f"t/{i}", "txt": b"x" * i, "n": 2**40 + i, "m": -(2**31) - i}
            for i in range(40)]
    for records in (images, tiny):
        arr, starts, ends, blob = pack(records)
        maps = parse_flat_maps(arr, starts, ends)
        assert maps is not None and decoded(maps, blob, len(records)) == records
    assert [c.kind for c in parse_flat_maps(*pack(images)[:3]).columns] == [STR, BYTES, INT]


@given(st.binary(min_size=1, max_size=200), st.integers(0, 199))
def test_damaged_or_cut_records_never_parse_past_their_end(blob: bytes, cut: int) -> None:
    record = msgpack.packb({"__key__": "k", "bin": blob, "n": 7}, use_bin_type=True)
    for bad in (record[: min(cut, len(record) - 1)] or b"\x80\x00",
                record[:cut] + bytes([record[cut % len(record)] ^ 0xFF]) + record[cut + 1:]):
        arr = np.frombuffer(bad + b"\xc6\xff\xff\xff\xff" * 4, np.uint8)
        got = parse_flat_maps(arr, np.array([0], np.int64), np.array([len(bad)], np.int64))
        if got is None:
            continue
        try:  # only what msgpack itself reads from exactly those bytes
            mine = decoded(got, bad, 1)
        except UnicodeDecodeError:  # a str that is not utf-8: msgpack refuses it too
            with pytest.raises(UnicodeDecodeError):
                msgpack.unpackb(bad, raw=False)
            continue
        assert mine == [msgpack.unpackb(bad, raw=False)]


def test_shapes_left_to_msgpack() -> None:
    for records in ([{"a": 1.5}], [{"a": None}], [{"a": [1]}], [{"a": 1}, {"b": 1}],
                    [{"a": 1}, {"a": b"x"}], [{"a": 2**63}],
                    [{str(i): i for i in range(16)}], [{"x" * 32: 1}]):
        assert parse_flat_maps(*pack(records)[:3]) is None, records


@pytest.mark.parametrize("values", [
    [300, 301, 65535],  # uint 16
    [-200, -300, -32768],  # int 16
    [-(2**40), -1 - 2**62, -(2**63)],  # int 64
    [2**32, 2**40, 2**63 - 1],  # uint 64 within int64
    [-5, -5, -5],  # one negative fixint
    [7, 7, 7],  # one positive fixint
    ["abc", "xyz", "q\u00e9"],  # fixstr of one length (in bytes)
    ["a" * 40, "b" * 40, "c" * 40],  # str 8
    [b"x" * 10, b"y" * 10, b"z" * 10],  # bin 8
    [b"x" * 300, b"y" * 301, b"z" * 302],  # bin 16
])
def test_a_column_of_one_tag_is_parsed_like_msgpack(values: list[Any]) -> None:
    # every record's value with the same tag takes a shorter path (``_one_tag_values``)
    records = [{"__key__": f"k{i}", "v": v, "n": i} for i, v in enumerate(values)]
    arr, starts, ends, blob = pack(records)
    # map, "__key__", "kN", "v": the tag of "v"'s value 14 bytes in
    assert len({blob[s + 14] for s in starts.tolist()}) == 1  # one tag, as meant
    maps = parse_flat_maps(arr, starts, ends)
    assert maps is not None
    assert decoded(maps, blob, len(records)) == records


def test_a_column_of_uint64_beyond_int64_is_left_to_msgpack() -> None:
    records = [{"v": 2**63 + i} for i in range(3)]
    arr, starts, ends, _blob = pack(records)
    assert parse_flat_maps(arr, starts, ends) is None


def test_a_column_of_bin16_and_bin32_with_fixint_labels_is_parsed_like_msgpack() -> None:
    # JPEGs either side of 64 KB: two length widths in one column; labels all fixints
    records = [{"__key__": f"c/{i:03d}.jpg", "image": bytes([i]) * (65536 + 700 * (i - 5)),
                "label": i - 40} for i in range(60)]
    arr, starts, ends, blob = pack(records)
    maps = parse_flat_maps(arr, starts, ends)
    assert maps is not None
    assert decoded(maps, blob, len(records)) == records


def edges_of(arr: np.ndarray, starts: np.ndarray, ends: np.ndarray, head: int, tail: int
             ) -> Edges:
    """Each record's first ``head`` and last ``tail`` bytes, as ``windowdecode`` gathers them."""
    padded = np.concatenate([np.zeros(tail, np.uint8), arr, np.zeros(head, np.uint8)])
    heads = padded[(starts + tail)[:, None] + np.arange(head)]
    tails = padded[ends[:, None] + np.arange(tail)]
    return Edges(heads, tails, ends - starts)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_edges_parse_like_the_whole_records_or_refuse(data: st.DataObject) -> None:
    arr, starts, ends, _blob = pack(draw_records(data, 6))
    head, tail = data.draw(st.integers(1, 80)), data.draw(st.integers(1, 80))
    whole = parse_flat_maps(arr, starts, ends)
    got = parse_edges(edges_of(arr, starts, ends, head, tail))
    if head >= int((ends - starts).max()):  # every byte in reach: refused only as a whole is
        assert (got is None) == (whole is None)
    if got is None:
        return
    assert whole is not None and got.names == whole.names
    for mine, theirs in zip(got.columns, whole.columns, strict=True):
        assert mine.kind == theirs.kind
        if mine.kind == INT:
            assert np.array_equal(mine.ints, theirs.ints)
        else:
            assert np.array_equal(mine.starts + starts, theirs.starts)
            assert np.array_equal(mine.ends + starts, theirs.ends)


def test_edges_reach_a_label_after_a_large_value_and_refuse_a_field_between() -> None:
    images = [{"__key__": f"c/{i}.jpg", "image": bytes([i]) * (5000 + i), "label": i}
              for i in range(20)]
    arr, starts, ends, blob = pack(images)
    got = parse_edges(edges_of(arr, starts, ends, 64, 16))
    assert got is not None
    assert decoded_edges(got, blob, starts) == images
    between = [{**r, "n": 5, "tail": b"t" * 40} for r in images]  # "n" in neither edge
    arr, starts, ends, _blob = pack(between)
    assert parse_edges(edges_of(arr, starts, ends, 64, 16)) is None
    assert parse_flat_maps(arr, starts, ends) is not None


def decoded_edges(maps: Any, blob: bytes, starts: np.ndarray) -> list[dict[str, Any]]:
    for column in maps.columns:
        if column.kind != INT:
            column.starts, column.ends = column.starts + starts, column.ends + starts
    return decoded(maps, blob, len(starts))
