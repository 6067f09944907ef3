"""The tar header parser of ``shardio.packing.sources.tars`` against Python's ``tarfile``."""

from __future__ import annotations

import contextlib
import io
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardio.errors import BadInputError
from shardio.packing.pack import pack
from shardio.packing.sources.tars import TarDamage, tar_members

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
NAMES = st.text(alphabet="ab9._-/é", min_size=1, max_size=240).filter(
    lambda n: n.strip("/") and not n.endswith("/"))
MEMBERS = st.lists(st.tuples(st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE,
                                              tarfile.SYMTYPE, tarfile.LNKTYPE]),
                             NAMES, st.integers(0, 1500), NAMES), min_size=1, max_size=8)


def _write(members: list[tuple[bytes, str, int, str]], fmt: int, mtime: int = 0) -> bytes:
    """A tar written by ``tarfile`` in ``fmt`` (members ``tarfile`` cannot write left out)."""
    out = io.BytesIO()
    globals_ = {"comment": "written by the test"} if fmt == tarfile.PAX_FORMAT else None
    with tarfile.open(fileobj=out, mode="w", format=fmt, pax_headers=globals_) as tar:
        for kind, name, size, link in members:
            info = tarfile.TarInfo(name)
            info.type, info.mtime = kind, mtime
            payload = None
            if kind == tarfile.REGTYPE:
                info.size, payload = size, io.BytesIO(bytes([size % 251]) * size)
            else:
                info.linkname = link if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
            with contextlib.suppress(ValueError):  # a name too long for ustar
                tar.addfile(info, payload)
    return out.getvalue()


def _as_tarfile_reads(data: bytes) -> list[tuple[str, int, str, int, int]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        return [(i.name, i.type[0], i.linkname, i.offset_data, i.size) for i in tar]


def _reheader(data: bytes, at: int, field: slice, value: bytes) -> bytes:
    """``data`` with the header at byte ``at`` given ``value`` in ``field``, checksum redone."""
    block = bytearray(data[at:at + 512])
    block[field] = value
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return data[:at] + bytes(block) + data[at + 512:]


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(members=MEMBERS, mtime=st.sampled_from([0, 1_700_000_000, -5]))
def test_headers_read_as_tarfile_reads_them(fmt: str, members: list[tuple[bytes, str, int, str]],
                                            mtime: int) -> None:
    if mtime < 0 and fmt == "ustar":
        mtime = 0  # only GNU and pax tars hold a negative time (base-256 or a pax record)
    data = _write(members, FORMATS[fmt], mtime)
    assert list(tar_members(data)) == _as_tarfile_reads(data)


def test_a_base_256_size_is_read() -> None:
    data = _write([(tarfile.REGTYPE, "k.bin", 700, "")], tarfile.GNU_FORMAT)
    data = _reheader(data, 0, slice(124, 136), b"\x80" + (700).to_bytes(11, "big"))
    assert [m[4] for m in tar_members(data)] == [m[4] for m in _as_tarfile_reads(data)] == [700]


def test_a_wrong_checksum_is_refused_by_name(tmp_path: Path) -> None:
    data = _write([(tarfile.REGTYPE, "k1.txt", 3, ""), (tarfile.REGTYPE, "k2.txt", 3, "")],
                  tarfile.USTAR_FORMAT)
    corrupt = data[:1024] + b"j" + data[1025:]  # the second header's name, checksum kept
    with pytest.raises(TarDamage, match="header at byte 1024 has a wrong checksum"):
        list(tar_members(corrupt))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.tar").write_bytes(corrupt)
    with pytest.raises(BadInputError, match=r"a\.tar: the tar is damaged or cut short after 0 "
                                            r"samples \(the header at byte 1024 has a wrong "
                                            r"checksum\)"):
        pack(tmp_path / "src", tmp_path / "out", num_workers=1)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_size_past_the_end_is_a_cut_tar(fmt: str) -> None:
    data = _write([(tarfile.REGTYPE, "d" * 120 + "/" + "k" * 90 + ".txt", 3, "")], FORMATS[fmt])
    last = _as_tarfile_reads(data)[0][3] - 512  # the header of the one member
    cut = _reheader(data, last, slice(124, 136), b"%011o\0" % 99_999)
    with pytest.raises(TarDamage, match=r"claims 99999 bytes, past the file's end"):
        list(tar_members(cut))
    if fmt != "ustar":  # a GNU long name or a pax header, then nothing
        with pytest.raises(TarDamage, match="cut short"):
            list(tar_members(data[:last]))
