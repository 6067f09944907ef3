"""WebDataset tar shards as a source to pack: which tars SRC names, and their samples.

SRC names tar shards as a folder of ``.tar``/``.tar.gz``/``.tgz`` files, a
glob, WebDataset's brace notation (``train-{000000..000099}.tar``) or one tar
(``tar_shards``). Each tar is read once, as a stream (``tarfile`` mode
``r|*``; never extracted), by one task per tar, in parallel; members are
grouped into samples exactly as ``webdataset.WebDataset`` groups them: the key
is the member name up to the first dot of its last component, the rest
(lower-cased) the field, and a new sample starts whenever the key changes.
A sample's fields are located, not copied (``shardio.packing.sources.inputbytes``): the
build reads each member's bytes where it lies in its tar. The samples keep
WebDataset's order (tars in order, members in order), which is the order a
pack without shuffle keeps. What WebDataset skips silently is reported as bad
input here (a member without an extension, a link, a key seen again later, a
damaged tar); ``__meta__`` members, which WebDataset skips as metadata, and
folders are ignored and counted. Imports ``errors``, ``inputbytes``,
``source``, ``stems`` and ``walk`` from shardio; never torch.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import glob
import hashlib
import mmap
import multiprocessing
import os
import re
import tarfile
from collections.abc import Iterator, Sequence
from typing import Final
from zlib import adler32

from shardio.errors import BadInputError, PackError
from shardio.packing.sources.files import PackSource
from shardio.packing.sources.inputbytes import locator
from shardio.packing.stems import RESERVED_FIELDS, SourceSample
from shardio.packing.walk import Bad, display_path, is_utf8

TAR_SUFFIXES: Final = (".tar", ".tar.gz", ".tgz")
_BRACE: Final = re.compile(r"\{([^{}]*)\}")
_RANGE: Final = re.compile(r"^(\d+)\.\.(\d+)$")
_META: Final = re.compile(r"__[^/]*__($|/)")
"""WebDataset's ``skip_meta``: members it skips as metadata."""
MAX_LABEL_BYTES: Final = 4096


def expand_braces(pattern: str) -> list[str]:
    """WebDataset's brace notation expanded: ``{000..099}`` (zero-padded as written) and
    ``{a,b}``, left to right, every combination in order."""
    match = _BRACE.search(pattern)
    if match is None:
        return [pattern]
    body, head, tail = match.group(1), pattern[:match.start()], pattern[match.end():]
    numbers = _RANGE.match(body)
    if numbers is not None:
        lo, hi = numbers.groups()
        width = len(lo) if lo.startswith("0") else 0
        choices = [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    else:
        choices = body.split(",")
    return [out for choice in choices for out in expand_braces(head + choice + tail)]


def _is_file(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` is a file, following links; a link that loops or dangles is not
    (the folder's walk reports it, and ``--skip-bad`` skips it, as any other bad entry)."""
    try:
        return entry.is_file()
    except OSError:
        return False


def tar_shards(src: str | os.PathLike[str]) -> list[str] | None:
    """The tar shards ``src`` names, in order, or ``None`` when it does not name tars.

    A folder names its visible files when every one of them is a tar (and it has
    no sub-folder); a glob or brace pattern names what it matches or expands to.

    Raises:
        BadInputError: a pattern that matches nothing, or a shard it names is missing.
    """
    text = os.fspath(src)
    if os.path.isdir(text):
        entries = [e for e in os.scandir(text) if not e.name.startswith(".")]
        if entries and all(e.name.endswith(TAR_SUFFIXES) and _is_file(e) for e in entries):
            return sorted(e.path for e in entries)
        return None
    if os.path.isfile(text):
        return [text] if text.endswith(TAR_SUFFIXES) else None
    if "{" in text:
        paths = expand_braces(text)
    elif glob.has_magic(text):
        paths = sorted(glob.glob(text))
    else:
        return None
    missing = [p for p in paths if not os.path.isfile(p)]
    if not paths or missing:
        what = f"{missing[0]} does not exist" if missing else "it matches no file"
        raise BadInputError(f"{text}: {what}; the pattern must name existing tar shards "
                            f"({len(missing)} of {len(paths)} missing)", path=text)
    return paths


TarSample = tuple[str, tuple[str, ...], tuple[str, ...], tuple[int, ...], "str | None"]
"""``(key, fields, locators, sizes, label text)`` of one sample of a tar."""
TarScan = tuple[list[TarSample], list[Bad], int]
"""What one tar holds: its samples in order, its bad members and the members ignored."""


class TarDamage(ValueError):
    """A tar that cannot be read on: a header with a wrong checksum or a bad number, a member
    claiming bytes past the file's end, a malformed pax record."""


_ZERO_BLOCK: Final = bytes(512)
_SKIPS_NO_DATA: Final = frozenset(b"123456")
"""Link, device, folder and pipe types, whose size field ``tarfile`` does not skip."""
_REGULAR: Final = frozenset(b"0\x007")
"""Regular members (``7``, contiguous, as ``tarfile`` reads it: a regular file)."""

Member = tuple[str, int, str, int, int]
"""``(name, type flag, link name, offset of the data, size)`` of one member of a tar."""


def _number(field: bytes, what: str, at: int) -> int:
    """A header's numeric field: octal text, or base-256 when its first byte is 0x80 or
    0xff (GNU, for sizes of 8 GiB and more)."""
    if field[0] in (0o200, 0o377):
        value = int.from_bytes(field[1:], "big")
        return value - 256 ** (len(field) - 1) if field[0] == 0o377 else value
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise TarDamage(f"the header at byte {at} has no number in its {what} field") from None


def _text(raw: bytes) -> str:
    """A name as ``tarfile`` decodes it: UTF-8, undecodable bytes kept as surrogates."""
    return raw.decode("utf-8", "surrogateescape")


def _pax_records(buf: bytes, at: int) -> dict[str, str]:
    """The ``length key=value\\n`` records of a pax header's data."""
    records = {}
    pos = 0
    while pos < len(buf) and buf[pos]:
        space = buf.find(b" ", pos, pos + 20)
        length = int(buf[pos:space]) if buf[pos:space].isdigit() else 0
        key, equals, value = buf[space + 1:pos + length - 1].partition(b"=")
        if space < 0 or length <= space - pos or pos + length > len(buf) or \
                buf[pos + length - 1] != 0x0A or not equals:
            raise TarDamage(f"the pax header at byte {at} has a malformed record")
        records[_text(key)] = _text(value)
        pos += length
    return records


def tar_members(data: bytes | mmap.mmap) -> Iterator[Member]:
    """The members of the uncompressed tar ``data``, in order, read from their headers
    (ustar, GNU and pax; as ``tarfile`` reads them, at a fraction of its cost a member).

    GNU long names and links (``L``, ``K``) and pax headers (``x``, global ``g``) are
    applied to the member they describe and not yielded themselves. Numbers are read by
    one ``int`` unless they need more, and a link name or a prefix only when present:
    ``scan_tars`` of the tiny tree's 4 tars (100,000 members, ``python -m
    benchmarks.bench_import``) took 0.66 s of CPU instead of 0.74 (one process, best of 4).

    Raises:
        TarDamage: a header's checksum or a number is wrong, a pax record is malformed, or
            the tar is cut short: a member's bytes or a header run past the file's end.
    """
    end = len(data)
    pos = 0
    long_name = long_link = None
    pax: dict[str, str] = {}
    global_pax: dict[str, str] = {}
    while pos + 512 <= end:
        block = data[pos:pos + 512]
        if block == _ZERO_BLOCK:
            return  # the end-of-archive marker
        try:  # octal text between spaces and NULs; anything else, the general reading
            stored = int(block[148:156].strip(b" \0"), 8)
            size = int(block[124:136].strip(b" \0"), 8)
        except ValueError:
            stored = _number(block[148:156], "checksum", pos)
            size = _number(block[124:136], "size", pos)
        # the sum of the header's bytes, the checksum field counted as spaces: Adler-32's low
        # half is 1 + the sum of the bytes modulo 65521, which is the sum itself for 256 bytes
        # or fewer (at most 65280); four times faster than sum() over 512 bytes
        total = (adler32(block[:256]) & 0xFFFF) + (adler32(block[256:]) & 0xFFFF) - 2 \
            - sum(block[148:156]) + 256
        if stored != total and stored != total - 256 * sum(
                1 for b in block[:148] + block[156:] if b > 127):  # old tars sum signed bytes
            raise TarDamage(f"the header at byte {pos} has a wrong checksum")
        kind = block[156]
        start = pos + 512
        if kind in (0x78, 0x67, 0x58):  # x, g, X: pax headers
            data_size = size
        else:
            merged = {**global_pax, **pax} if global_pax else pax
            if "size" in merged:
                size = _number(merged["size"].encode(), "pax size", pos)
            data_size = 0 if kind in _SKIPS_NO_DATA else size
        if size < 0 or start + data_size > end:
            raise TarDamage(f"the member at byte {pos} claims {size} bytes, past the file's "
                            f"end ({end} bytes): the tar is cut short")
        pos = start + -(-data_size // 512) * 512
        if kind in (0x4C, 0x4B):  # L, K: GNU long name or link of the next member
            value = _text(data[start:start + size].split(b"\0", 1)[0])
            if kind == 0x4C:
                long_name = value
            else:
                long_link = value
            continue
        if kind in (0x78, 0x67, 0x58):
            (global_pax if kind == 0x67 else pax).update(_pax_records(data[start:pos], start))
            continue
        name = block[:100].split(b"\0", 1)[0]
        prefix = block[345:500].split(b"\0", 1)[0] if block[345] else b""
        if kind == 0 and name.endswith(b"/"):
            kind = 0x35  # an old tar's folder: a regular member named with a slash
        if prefix and kind != 0x53:
            name = prefix + b"/" + name
        if pax or global_pax:
            merged = {**global_pax, **pax}
            path, link = merged.get("path", long_name), merged.get("linkpath", long_link)
        else:
            path, link = long_name, long_link
        if path is None:
            path = name.decode("utf-8", "surrogateescape")
        if kind == 0x35:
            path = path.rstrip("/")  # as tarfile names folders
        if link is None:
            link = _text(block[157:257].split(b"\0", 1)[0]) if block[157] else ""
        yield path, kind, link, start, size
        long_name = long_link = None
        pax = {}
    if data[pos:end].strip(b"\0") or pax or long_name is not None or long_link is not None:
        raise TarDamage(f"the file ends at byte {end}, inside the header at byte "
                        f"{min(pos, end)} or before the member it describes: the tar is cut short")


def _member_problem(name: str, kind: int, linkname: str) -> str | None:
    """Why a member cannot be a field: a link or a special file, or a name leaving the tar."""
    if kind in (0x31, 0x32):
        what = "symbolic" if kind == 0x32 else "hard"
        return (f"a {what} link member (-> {display_path(linkname)}); only regular "
                "members hold bytes to pack (WebDataset skips links)")
    if kind not in _REGULAR:
        return "a special member (device, pipe or sparse file), not a regular file"
    if name.startswith("/") or ".." in name.split("/"):
        return "its name is absolute or climbs out with '..'; such a name is never packed"
    if not is_utf8(name):
        return "its name is not valid UTF-8"
    return None


def _gzip_members(stream: tarfile.TarFile, current: list[tarfile.TarInfo]) -> Iterator[Member]:
    """The members of a gzip-compressed tar, read forward by ``tarfile``; ``current`` holds
    the one last yielded (only it can be read: the stream goes forward)."""
    for info in stream:
        current[:] = [info]
        kind = 0x53 if info.issparse() else info.type[0]
        yield info.name, kind, info.linkname, info.offset_data, info.size


def scan_tar(path: str, name: str, label_field: str | None) -> TarScan:
    """Read the headers of the tar at ``path`` (reported as ``name``) and group its members.

    An uncompressed tar is mapped and its headers parsed here (``tar_members``); a
    gzip-compressed one is read forward by ``tarfile``. ``label_field``'s members are
    read (their text is the label) and not kept as fields.
    """
    samples: list[TarSample] = []
    bad: list[Bad] = []
    ignored = 0
    seen: set[str] = set()
    current: list[tuple[str, str, int, int, str | None]] = []  # key, field, offset, size
    key = ""
    with open(path, "rb") as raw, contextlib.ExitStack() as resources:
        compressed = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        try:
            if compressed:
                stream = resources.enter_context(tarfile.open(fileobj=raw, mode="r|gz"))
                current_info: list[tarfile.TarInfo] = []
                members = _gzip_members(stream, current_info)

                def read(offset: int, count: int) -> bytes:
                    member = stream.extractfile(current_info[0])
                    return member.read(count) if member is not None else b""
            else:
                size = os.fstat(raw.fileno()).st_size
                if size == 0:
                    raise TarDamage("the file is empty")
                mapped = resources.enter_context(
                    mmap.mmap(raw.fileno(), size, access=mmap.ACCESS_READ))
                members = tar_members(mapped)

                def read(offset: int, count: int) -> bytes:
                    return mapped[offset:offset + count]
            for member_name, kind, linkname, offset, member_size in members:
                if kind == 0x35 or ("__" in member_name and _META.match(member_name)):
                    ignored += 1
                    continue
                if kind in _REGULAR and member_name.isascii() and ".." not in member_name \
                        and member_name[:1] != "/":  # most members: nothing to look into
                    shown, reason = f"{name}/{member_name}", None
                else:
                    shown = f"{name}/{display_path(member_name)}"
                    reason = _member_problem(member_name, kind, linkname)
                base, dot, field = member_name.rpartition("/")[2].partition(".")
                if reason is None and (not dot or not base or not field):
                    reason = ("no extension after its name (WebDataset skips such members): "
                              "it is no field of any sample")
                member_key = member_name[:len(member_name) - len(field) - 1]
                field = field.lower()  # WebDataset lower-cases extensions
                if reason is None and field in RESERVED_FIELDS:
                    reason = f"field name {field!r} is reserved; rename the member"
                if reason is not None:
                    bad.append((shown, reason))
                    continue
                if member_key != key:
                    _close(current, key, name, samples, bad, seen, compressed, path)
                    current, key = [], member_key
                text = None
                if field == label_field:
                    label = read(offset, min(member_size, MAX_LABEL_BYTES + 1))
                    text = label.decode("utf-8", "replace")
                current.append((field, shown, offset, member_size, text))
        except (TarDamage, tarfile.TarError, EOFError, OSError) as exc:
            bad.append((name, f"the tar is damaged or cut short after {len(samples)} samples "
                              f"({exc}); download or copy it again"))
            return [], bad, ignored
    _close(current, key, name, samples, bad, seen, compressed, path)
    return samples, bad, ignored


def _close(members: list[tuple[str, str, int, int, str | None]], key: str, name: str,
           samples: list[TarSample], bad: list[Bad], seen: set[str], compressed: bool,
           path: str) -> None:
    """Make the members of one key a sample, or report them all with why not."""
    if not members:
        return
    fields = [m[0] for m in members]
    reason = None
    if key in seen:
        reason = (f"key {display_path(key)!r} appears again after other samples of the tar "
                  "(WebDataset would read two samples with one key); group a sample's "
                  "members together")
    elif len(set(fields)) != len(fields):
        reason = (f"sample {display_path(key)!r} has two members for one field "
                  "(WebDataset refuses it: duplicate file name)")
    seen.add(key)
    if reason is not None:
        bad.extend((m[1], reason) for m in members)
        return
    labels = [m[4] for m in members if m[4] is not None]
    kept = [m for m in members if m[4] is None]
    samples.append((key, tuple(m[0] for m in kept),
                    tuple(locator(path, m[2], m[3], m[1], compressed=compressed) for m in kept),
                    tuple(m[3] for m in kept), labels[0] if labels else None))


def _scan_task(args: tuple[str, str, str | None]) -> TarScan:
    return scan_tar(*args)


def scan_tars(
    shards: Sequence[str], *, label_field: str | None = None, shuffle: bool = True,
    num_workers: int = 1,
) -> PackSource:
    """The samples of the tar ``shards``, in WebDataset's order, as a ``PackSource``.

    Args:
        shards: tar paths, in order (``tar_shards``).
        label_field: a field (``cls``) whose text becomes each sample's ``label``:
            integers as they are, otherwise class names, numbered in sorted order
            (``classes``). A sample without it is bad.
        shuffle: whether the pack shuffles: a ``.tar.gz`` can only be read in order.
        num_workers: tars read at once, in forked processes.

    Raises:
        PackError: a ``.tar.gz`` with ``shuffle``.
    """
    root = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in shards])
    names = [os.path.relpath(os.path.abspath(p), root).replace(os.sep, "/") for p in shards]
    tasks = [(p, n, label_field) for p, n in zip(shards, names, strict=True)]
    if num_workers > 1 and len(tasks) > 1:
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        with cf.ProcessPoolExecutor(min(num_workers, len(tasks)),
                                    multiprocessing.get_context(method)) as pool:
            scans = list(pool.map(_scan_task, tasks))
    else:
        scans = [_scan_task(t) for t in tasks]
    digest = hashlib.sha256(f"webdataset\n{label_field}\n".encode())
    bad: list[Bad] = []
    first: dict[str, str] = {}
    found: list[TarSample] = []
    ignored = 0
    for path, name, (samples, tar_bad, tar_ignored) in zip(shards, names, scans, strict=True):
        st = os.stat(path)
        digest.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "replace"))
        bad += tar_bad
        ignored += tar_ignored
        for sample in samples:
            other = first.setdefault(sample[0], name)
            if other != name:
                bad.extend((loc.rsplit("\0", 1)[1], f"key {display_path(sample[0])!r} is also "
                            f"a sample of {other}; keys must be unique across the shards")
                           for loc in sample[2])
            else:
                found.append(sample)
    if shuffle and any(samples and samples[0][2][:1] and samples[0][2][0].split("\0")[1][:1]
                       == "z" for samples, _, _ in scans):  # a tar's members share its gzip
        raise PackError(
            f"{root}: .tar.gz members can only be read in order, and a shuffled pack reads them "
            "in random order (decompressing a shard for every sample). Pass --no-shuffle "
            "(shuffle=False), or decompress the shards first (`gunzip -k *.tar.gz`; WebDataset "
            "reads the .tar files too)", path=root)
    classes, labels = _labels(found, label_field, bad)
    out = []
    for (key, fields, locs, sizes, _), label in zip(found, labels, strict=True):
        if label_field is None or label is not None:
            out.append(SourceSample(key, fields, locs, sizes, label, sum(sizes)))
    return PackSource(root=root, samples=tuple(out), classes=classes, hidden_ignored=ignored,
                  bad=tuple(sorted(bad)), digest=digest.hexdigest(),
                  origin="webdataset")


def _labels(found: list[TarSample], label_field: str | None,
            bad: list[Bad]) -> tuple[tuple[str, ...] | None, list[int | None]]:
    """Each sample's label (``None``: none asked, or it has none, which is bad) and the
    classes: none when every label text is an integer, else the sorted names."""
    if label_field is None:
        return None, [None] * len(found)
    texts = [s[4].strip() if s[4] is not None else None for s in found]
    for sample, text in zip(found, texts, strict=True):
        if text is None:
            bad.extend((loc.rsplit("\0", 1)[1], f"sample {display_path(sample[0])!r} has no "
                        f"{label_field!r} member, which --label-field asks for")
                       for loc in sample[2])
    given = [t for t in texts if t is not None]
    if all(t.isdecimal() or (t[:1] == "-" and t[1:].isdecimal()) for t in given):  # -?\d+
        return None, [int(t) if t is not None else None for t in texts]
    classes = tuple(sorted(set(given)))
    index = {c: i for i, c in enumerate(classes)}
    return classes, [index[t] if t is not None else None for t in texts]
