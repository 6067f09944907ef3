"""Zero-copy reading of the common record shape: a flat msgpack map of scalars and bytes.

``msgpack.unpackb`` copies every ``bin`` value into a new ``bytes``. For a
record holding an 80 KB JPEG that copy costs as much as reading it. Most
records are flat maps with str keys whose values are bytes, str, int, float,
bool or nil; for those, ``view_flat_map`` returns the bytes values as
``memoryview`` slices of the payload instead. Anything else (nested values,
arrays, extension types, or malformed input) returns None, and the caller
falls back to msgpack, so results never differ from ``msgpack.unpackb``
beyond bytes arriving as views. Byte layouts follow the msgpack specification.
The map comes back as a ``ViewedSample``: a dict that can hand out an owned copy,
so a reader keeps views while a consumer gets ``bytes`` only when it takes the
sample (the copy then lives as long as the consumer holds it, not a whole window).
"""

from __future__ import annotations

import struct
from typing import Any

_BE16 = struct.Struct(">H").unpack_from
_BE32 = struct.Struct(">I").unpack_from
_SCALARS: dict[int, tuple[struct.Struct, int]] = {
    0xCA: (struct.Struct(">f"), 4),
    0xCB: (struct.Struct(">d"), 8),
    0xCC: (struct.Struct(">B"), 1),
    0xCD: (struct.Struct(">H"), 2),
    0xCE: (struct.Struct(">I"), 4),
    0xCF: (struct.Struct(">Q"), 8),
    0xD0: (struct.Struct(">b"), 1),
    0xD1: (struct.Struct(">h"), 2),
    0xD2: (struct.Struct(">i"), 4),
    0xD3: (struct.Struct(">q"), 8),
}
_CONSTANTS = {0xC0: None, 0xC2: False, 0xC3: True}


class ViewedSample(dict[str, Any]):
    """A sample dict whose bytes values are ``memoryview`` slices of the record read."""

    def owned(self) -> dict[str, Any]:
        """A plain dict with every view copied into ``bytes`` (what msgpack would give)."""
        return {k: bytes(v) if type(v) is memoryview else v for k, v in self.items()}


def _length(buf: memoryview, pos: int, tag: int, short: int) -> tuple[int, int] | None:
    """``(length, data start)`` of a str/bin whose 8/16/32-bit forms start at tag ``short``."""
    if tag == short:
        return buf[pos + 1], pos + 2
    if tag == short + 1:
        return _BE16(buf, pos + 1)[0], pos + 3
    if tag == short + 2:
        return _BE32(buf, pos + 1)[0], pos + 5
    return None


def _str(buf: memoryview, pos: int) -> tuple[str, int] | None:
    tag = buf[pos]
    if 0xA0 <= tag <= 0xBF:
        size, start = tag & 0x1F, pos + 1
    else:
        found = _length(buf, pos, tag, 0xD9)
        if found is None:
            return None
        size, start = found
    end = start + size
    if end > len(buf):
        return None
    return str(buf[start:end], "utf-8"), end


def view_flat_map(buf: memoryview) -> dict[str, Any] | None:
    """Decode a flat msgpack map with ``bin`` values as views of ``buf``; None if not flat."""
    try:
        return _view(buf)
    except (IndexError, UnicodeDecodeError, struct.error):
        return None


def _view(buf: memoryview) -> dict[str, Any] | None:
    tag = buf[0]
    if 0x80 <= tag <= 0x8F:
        count, pos = tag & 0x0F, 1
    elif tag == 0xDE:
        count, pos = _BE16(buf, 1)[0], 3
    elif tag == 0xDF:
        count, pos = _BE32(buf, 1)[0], 5
    else:
        return None
    out = ViewedSample()
    for _ in range(count):
        key = _str(buf, pos)
        if key is None:
            return None
        name, pos = key
        tag = buf[pos]
        value: Any
        if tag <= 0x7F:
            value, pos = tag, pos + 1
        elif tag >= 0xE0:
            value, pos = tag - 0x100, pos + 1
        elif 0xC4 <= tag <= 0xC6:
            found = _length(buf, pos, tag, 0xC4)
            assert found is not None
            size, start = found
            if start + size > len(buf):
                return None
            value, pos = buf[start : start + size], start + size
        elif tag in _SCALARS:
            layout, size = _SCALARS[tag]
            value, pos = layout.unpack_from(buf, pos + 1)[0], pos + 1 + size
        elif tag in _CONSTANTS:
            value, pos = _CONSTANTS[tag], pos + 1
        else:
            text = _str(buf, pos)
            if text is None:
                return None
            value, pos = text
        out[name] = value
    return out if pos == len(buf) else None
