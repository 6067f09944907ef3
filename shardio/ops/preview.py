"""Contact sheets: a seeded, random selection of a dataset's samples, drawn as thumbnails.

Before a long run people look at a few samples with their labels. ``make_sheet``
chooses samples (``choose_indices``), reads each by global index through
``DatasetReader.get`` (one read per sample, never a scan), and draws every image
field as a thumbnail captioned with the sample's key (an ImageFolder key starts
with its class folder, left out when the sheet shows one class), so a bad tile
can be traced to its file; a generic sample's other fields are kept as short
reprs for the CLI to print (``shardio.decode.fields.is_image_field`` says which fields
are images).
``preview`` saves the sheet. Pillow only; torch-free; nothing here imports above
the reader.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from shardio.decode.fields import is_image_field
from shardio.decode.image import decode_image
from shardio.errors import DecodeError
from shardio.format.record import INDEX_FIELD, KEY_FIELD
from shardio.reading.catalog import read_label
from shardio.reading.reader import DatasetReader, open_dataset
from shardio.storage.options import RemoteOptions

THUMB_PX: Final = 128
"""Longest side of a thumbnail."""
CAPTION_PX: Final = 16
PAD_PX: Final = 4
CELL_SIZE: Final = (THUMB_PX + 2 * PAD_PX, THUMB_PX + CAPTION_PX + 2 * PAD_PX)
"""``(width, height)`` of one cell of the sheet: thumbnail, caption and margins."""
MAX_REPR: Final = 60
MAX_CLASSES_LISTED: Final = 30
_BACKGROUND: Final = (24, 24, 24)
_PLACEHOLDER: Final = (72, 40, 40)
_TEXT: Final = (235, 235, 235)


def short_repr(value: Any, limit: int = MAX_REPR) -> str:
    """A one-line description of a field value: text for UTF-8 bytes, a size for others."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        try:
            shown = repr(data.decode("utf-8"))
        except UnicodeDecodeError:
            shown = f"<{len(data)} bytes {data[:12]!r}…>"
    elif isinstance(value, np.ndarray):
        shown = f"<array shape={value.shape} dtype={value.dtype}>"
    else:
        shown = repr(value)
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


@dataclass(frozen=True)
class PreviewSample:
    """One drawn sample: where it is, its class name, and what the sheet leaves out."""

    index: int
    key: str
    class_name: str | None
    """The class name on ImageFolder packs, None on generic packs."""
    images: tuple[str, ...]
    """The fields drawn as thumbnails, in the sample's order."""
    others: tuple[tuple[str, str], ...]
    """``(field, short repr)`` of every field not drawn (generic packs)."""


@dataclass(frozen=True)
class Sheet:
    """A drawn contact sheet and the samples on it, in the order drawn."""

    image: Image.Image
    samples: tuple[PreviewSample, ...]
    columns: int
    rows: int
    problems: tuple[str, ...]
    """One message per image field that could not be decoded (drawn as a placeholder)."""
    captions: tuple[str, ...] = ()
    """The caption drawn under each cell, in the order drawn (cut to fit in the middle)."""


def _class_error(root: Path | str, classes: tuple[str, ...] | None, class_name: str) -> ValueError:
    if classes is None:
        return ValueError(
            f"{root}: cannot choose class {class_name!r}: this is a generic pack, which has no "
            "classes (only ImageFolder packs do); leave the class out"
        )
    listed = ", ".join(classes[:MAX_CLASSES_LISTED])
    if len(classes) > MAX_CLASSES_LISTED:
        listed += f", … ({len(classes) - MAX_CLASSES_LISTED} more: `shardio info --json` lists all)"
    close = difflib.get_close_matches(class_name, classes, n=3)
    hint = f". Did you mean {' or '.join(map(repr, close))}?" if close else ""
    return ValueError(f"{root}: no class {class_name!r}; its {len(classes)} classes are "
                      f"{listed}{hint}")


def choose_indices(
    reader: DatasetReader, *, n: int = 64, class_name: str | None = None, seed: int = 0
) -> list[int]:
    """Global indices of up to ``n`` random samples (of class ``class_name``), sorted.

    The same ``seed`` chooses the same samples. With a class, labels are read
    (``catalog.read_label``, no image bytes) in a seeded random order until
    ``n`` match, so a rare class costs more label reads than a common one.

    Raises:
        ValueError: ``n`` is below 1, or ``class_name`` is given on a generic pack
            or names no class (the message lists the classes).
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    manifest = reader.manifest
    rng = np.random.default_rng(seed)
    total = manifest.num_samples
    if class_name is None:
        return sorted(int(i) for i in rng.choice(total, size=min(n, total), replace=False))
    if manifest.classes is None or class_name not in manifest.classes:
        raise _class_error(reader.root, manifest.classes, class_name)
    wanted = manifest.classes.index(class_name)
    chosen: list[int] = []
    for index in rng.permutation(total).tolist():
        if read_label(reader, index) == wanted:
            chosen.append(index)
            if len(chosen) == n:
                break
    return sorted(chosen)


def _describe(sample: Mapping[str, Any], classes: tuple[str, ...] | None) -> PreviewSample:
    fields = [name for name in sample if name not in (KEY_FIELD, INDEX_FIELD)]
    if classes is not None:  # a labelled record is exactly {__key__, image, label}
        return PreviewSample(sample[INDEX_FIELD], sample[KEY_FIELD], classes[sample["label"]],
                             ("image",), ())
    return PreviewSample(
        sample[INDEX_FIELD], sample[KEY_FIELD], None,
        tuple(name for name in fields if is_image_field(name)),
        tuple((name, short_repr(sample[name])) for name in fields if not is_image_field(name)),
    )


def _fit(draw: ImageDraw.ImageDraw, text: str, font: Any, width: int) -> str:
    """``text``, cut in the middle with … until it fits ``width`` pixels: a key's start (its
    folder) and end (its file name) stay readable."""
    if draw.textlength(text, font=font) <= width:
        return text
    head, tail = text[: len(text) // 2], text[len(text) // 2:]
    while head + tail and draw.textlength(f"{head}…{tail}", font=font) > width:
        if len(head) >= len(tail):
            head = head[:-1]
        else:
            tail = tail[1:]
    return f"{head}…{tail}"


def _thumbnail(data: Any, key: str) -> Image.Image:
    image = decode_image(bytes(data), draft_size=(THUMB_PX, THUMB_PX), key=key)
    image.thumbnail((THUMB_PX, THUMB_PX))
    return image


def make_sheet(
    path: str | os.PathLike[str], *, n: int = 64, class_name: str | None = None, seed: int = 0,
    remote: RemoteOptions | None = None,
) -> Sheet:
    """Choose up to ``n`` samples of the dataset at ``path`` and draw them as one image.

    Each image field is a cell of ``CELL_SIZE`` (a sample without one gets a
    placeholder cell, so that every chosen sample shows); cells fill a near-square
    grid row by row. An image that does not decode is drawn as a placeholder
    and named in ``Sheet.problems``: a preview shows what is there.

    Raises:
        ValueError: see ``choose_indices``.
        ShardioError: the dataset cannot be read.
    """
    cells: list[tuple[Image.Image | str, str]] = []  # (thumbnail or placeholder text, caption)
    described: list[PreviewSample] = []
    problems: list[str] = []
    with open_dataset(path, remote=remote) as reader:
        classes = reader.manifest.classes
        for index in choose_indices(reader, n=n, class_name=class_name, seed=seed):
            sample = reader.get(index)
            info = _describe(sample, classes)
            described.append(info)
            # one class shown: its folder, the start of every key, is said once, by --class
            caption = info.key if class_name is None else info.key.removeprefix(class_name + "/")
            for name in info.images:
                label = caption if len(info.images) == 1 else f"{caption} {name}"
                try:
                    cells.append((_thumbnail(sample[name], info.key), label))
                except DecodeError as exc:
                    problems.append(f"sample {info.key!r} field {name!r}: {exc}")
                    cells.append(("not an image", label))
            if not info.images:
                cells.append(("no image field", caption))
    columns = max(1, math.ceil(math.sqrt(len(cells))))
    rows = max(1, math.ceil(len(cells) / columns))
    width, height = CELL_SIZE
    sheet = Image.new("RGB", (columns * width, rows * height), _BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    captions = [_fit(draw, caption, font, THUMB_PX) for _thumb, caption in cells]
    for number, ((thumb, _caption), caption) in enumerate(zip(cells, captions, strict=True)):
        left, top = number % columns * width, number // columns * height
        if isinstance(thumb, str):
            box = (left + PAD_PX, top + PAD_PX, left + PAD_PX + THUMB_PX - 1,
                   top + PAD_PX + THUMB_PX - 1)
            draw.rectangle(box, fill=_PLACEHOLDER)
            draw.text((left + 2 * PAD_PX, top + 2 * PAD_PX), thumb, fill=_TEXT, font=font)
        else:
            sheet.paste(thumb, (left + PAD_PX + (THUMB_PX - thumb.width) // 2,
                                top + PAD_PX + (THUMB_PX - thumb.height) // 2))
        draw.text((left + PAD_PX, top + PAD_PX + THUMB_PX + 2), caption, fill=_TEXT, font=font)
    return Sheet(sheet, tuple(described), columns, rows, tuple(problems), tuple(captions))


def preview(
    path: str | os.PathLike[str], out: str | os.PathLike[str], *, n: int = 64,
    class_name: str | None = None, seed: int = 0, remote: RemoteOptions | None = None,
) -> Path:
    """Draw a contact sheet of up to ``n`` random samples of ``path`` into the image ``out``.

    Thumbnails are captioned with the sample's key (see ``make_sheet``). The
    format follows the suffix of ``out``; without one it is PNG.

    Example::

        import shardio

        sheet = shardio.preview("out/train", "grid.png", n=16, seed=1)

    Args:
        path: the dataset folder, or its URL.
        out: the image file to write.
        n: how many samples (fewer when the dataset or class holds fewer).
        class_name: only samples of this class (ImageFolder packs).
        seed: the same seed draws the same samples.
        remote: how a URL is reached and cached (``RemoteOptions``).

    Returns:
        ``out`` as a ``Path``.

    Raises:
        ValueError: ``n`` is below 1, or ``class_name`` is not a class of the dataset.
        ShardioError: the dataset cannot be read.
    """
    target = Path(out)
    sheet = make_sheet(path, n=n, class_name=class_name, seed=seed, remote=remote)
    sheet.image.save(target, format=None if target.suffix else "PNG")
    return target
