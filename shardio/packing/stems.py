"""The naming rules that need one folder's files only, so that walk tasks can apply them.

Generic samples follow the WebDataset rule: files of one folder whose names
share the part before the first dot are one sample, keyed by that relative
path, one field per file named by the rest of the name (``group_stems``).
ImageFolder detection needs two facts of each folder (``image_facts``): which
top-level folders hold an image, and whether an image shares its name stem with
a non-image file. Both depend on one folder's files alone and a walk task
lists whole folders, so ``shardio.packing.scan`` applies them in its tasks and the
packing process only merges what they return (``shardio.packing.sources.files``). Also home
of ``SourceSample``, what one sample to pack is. Imports only ``walk`` from
shardio.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple

import msgpack

from shardio.format.manifest import IMG_EXTENSIONS
from shardio.packing.walk import Bad, FileEntry, display_path

RESERVED_FIELDS: Final = ("__key__", "__index__", "__source__")
"""Set by readers (``__source__`` in a mixture), so no file may name a field so."""


class SourceSample(NamedTuple):
    """One sample to pack: its key, and per field the file holding the field's bytes."""

    key: str
    fields: tuple[str, ...]
    paths: tuple[str, ...]
    sizes: tuple[int, ...]
    label: int | None
    num_bytes: int

    def rel_paths(self) -> tuple[str, ...]:
        """Each field's file relative to the source root, as the naming rules rebuild it."""
        if self.label is not None and self.fields == ("image",) and not self.paths[0].endswith(
                f"{self.key}.image"):  # an ImageFolder's image: its key is its path
            return (self.key,)
        return tuple(f"{self.key}.{f}" if f else self.key for f in self.fields)

    def bad(self, failed: int, reason: str) -> list[Bad]:
        """The skipped entries when file ``failed`` is bad: it, and its companions."""
        rels = [display_path(r) for r in self.rel_paths()]
        return [(rel, reason if i == failed else f"left out with the rest of sample "
                 f"{display_path(self.key)!r} because {rels[failed]} is bad")
                for i, rel in enumerate(rels)]


def pack_samples(samples: Sequence[SourceSample]) -> bytes:
    """``samples`` as msgpack, to send to a task on another machine (``unpack_samples``).

    pickle calls Python code for every ``SourceSample`` (a namedtuple): 3.7 µs
    each against about 1 µs here, in the packing process, which is serial.
    """
    data: bytes = msgpack.packb(samples, unicode_errors="surrogateescape")
    return data


def unpack_samples(data: bytes) -> tuple[SourceSample, ...]:
    """The samples ``pack_samples`` wrote."""
    rows = msgpack.unpackb(data, use_list=False, unicode_errors="surrogateescape")
    return tuple(SourceSample._make(r) for r in rows)


Group = tuple[str, str, "SourceSample | None", list[Bad]]
"""One generic sample: ``(key, its files' rows of the input digest, the sample or None when
one of its files is bad, the bad files with their reasons)``."""


def row(rel: str, size: int, mtime_ns: int, reason: str | None) -> str:
    """One file's line of the input digest (``shardio.packing.sources.files``)."""
    return f"{rel}\0{size}\0{mtime_ns}\0{reason or ''}\n"


def group_stems(files: Iterable[FileEntry], prefix: str) -> list[Group]:
    """The generic samples of ``files`` (whole folders), in no particular order.

    Args:
        files: walked files; every file of a folder must be among them.
        prefix: SRC as given plus a separator: a sample's paths are ``prefix + rel``.
    """
    groups: dict[str, list[tuple[str, int, int, str | None, str]]] = {}
    for rel, size, mtime, reason in files:
        dot = rel.find(".", rel.rfind("/") + 1)
        key, fld = (rel, "") if dot < 0 else (rel[:dot], rel[dot + 1 :])
        if reason is None and dot >= 0 and not fld:
            reason = "name ends in its only dot, which the sample naming cannot restore; rename it"
        elif reason is None and fld in RESERVED_FIELDS:
            reason = f"field name {fld!r} is reserved; rename the file"
        group = groups.get(key)
        if group is None:
            groups[key] = [(rel, size, mtime, reason, fld)]
        else:
            group.append((rel, size, mtime, reason, fld))
    out: list[Group] = []
    for key, members in groups.items():
        if len(members) == 1:
            rel, size, mtime, reason, fld = members[0]
            if reason is None:
                out.append((key, f"{rel}\0{size}\0{mtime}\0\n",
                            SourceSample(key, (fld,), (prefix + rel,), (size,), None, size), []))
                continue
        else:
            members.sort()  # by name, which is by field: they share the key as prefix
        text = "".join([row(*m[:4]) for m in members])
        culprit = next((m[0] for m in members if m[3] is not None), None)
        if culprit is None:
            out.append((key, text, SourceSample(
                key, tuple(m[4] for m in members), tuple(prefix + m[0] for m in members),
                tuple(m[1] for m in members), None, sum(m[1] for m in members)), []))
        else:
            note = (f"left out with the rest of sample {display_path(key)!r} because "
                    f"{display_path(culprit)} is bad")
            out.append((key, text, None, [(display_path(m[0]), m[3] or note) for m in members]))
    return out


def image_facts(files: Iterable[FileEntry]) -> tuple[set[str], bool]:
    """``(top-level folders holding an image, whether an image shares its stem with another
    file)`` of ``files`` (whole folders): what ImageFolder detection needs of them."""
    with_images: set[str] = set()
    image_stems: set[str] = set()
    other_stems: set[str] = set()
    for f in files:
        rel = f[0]
        dot = rel.find(".", rel.rfind("/") + 1)
        stem = rel if dot < 0 else rel[:dot]
        if rel[-5:].lower().endswith(IMG_EXTENSIONS):
            with_images.add(rel.partition("/")[0])
            image_stems.add(stem)
        else:
            other_stems.add(stem)
    return with_images, not image_stems.isdisjoint(other_stems)
