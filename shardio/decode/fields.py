"""Decoding a sample's fields by their names: ``fields=("jpg", "cls", "json")`` → a tuple.

A WebDataset user writes ``.decode("pil").to_tuple("jpg", "cls")``; here a
``Fields`` spec says which fields a dataset yields, in which order, and how
each is decoded: by the name's last extension (``seg.png`` decodes as
``png``), unless ``decoders`` overrides it. ``FieldDecoder`` applies the spec
to one sample dict. This module also owns the one definition of which field
names hold images (``is_image_field``), used by ``shardio.preview`` too.
Torch-free: the image decoder (PIL, or a uint8 tensor from ``shardio.torch.collate``)
is passed in by the torch layer; nothing here imports above the record layer.
"""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np

from shardio.errors import DecodeError
from shardio.format.record import INDEX_FIELD, KEY_FIELD

IMAGE_EXTENSIONS: Final = frozenset(
    {"jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "ppm", "pgm"}
)
"""A field holds an encoded image when its name, or the part after its last dot, is one of
these (or the name is ``image``, the field of ImageFolder packs)."""
INT_EXTENSIONS: Final = frozenset({"cls", "label", "index"})
TEXT_EXTENSIONS: Final = frozenset({"txt", "text"})
_INT_TEXT: Final = re.compile(rb"\s*[+-]?[0-9]+\s*")
"""What a ``.cls`` file holds: ASCII digits, maybe signed, maybe with a newline."""

Kind = Literal["image", "int", "text", "json", "npy", "bytes"]
Missing = Literal["error", "none"]
ValueDecoder = Callable[[Any], Any]
"""Stored value (bytes for a packed file; whatever ``ShardWriter`` was given) → decoded value."""
ImageDecoder = Callable[[Any, Mapping[str, Any]], Any]
"""An image field's stored value and its sample → the decoded image. The sample's
``__index__`` draws its crop (``crop=``), its ``__key__`` names it in errors."""
ImagesDecoder = Callable[[list[Any], list[Mapping[str, Any]]], list[Any]]
"""Many image values and their samples → their images, decoded as ``ImageDecoder`` would."""


def extension(name: str) -> str:
    """The part of field ``name`` after its last dot, lower-cased (the name itself without one)."""
    return name.rsplit(".", 1)[-1].lower()


def is_image_field(name: str) -> bool:
    """Whether field ``name`` holds an encoded image: ``image`` or an image extension."""
    return name == "image" or extension(name) in IMAGE_EXTENSIONS


def field_kind(name: str) -> Kind:
    """How field ``name`` decodes by default, from its last extension.

    ``image`` and image extensions → ``"image"``; ``cls``, ``label``, ``index`` →
    ``"int"``; ``txt``, ``text`` → ``"text"``; ``json``; ``npy``; anything else → ``"bytes"``.
    """
    if is_image_field(name):
        return "image"
    ext = extension(name)
    if ext in INT_EXTENSIONS:
        return "int"
    if ext in TEXT_EXTENSIONS:
        return "text"
    if ext == "json":
        return "json"
    if ext == "npy":
        return "npy"
    return "bytes"


def _shown(value: Any) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        return f"{len(data)} bytes starting {data[:16]!r}"
    return f"a stored {type(value).__name__}"


def to_int(value: Any) -> int:
    """An int stored as an int, or as ASCII digits (``b"3\\n"``) in a file.

    Raises:
        ValueError: anything else (a bool, a float, text that is not an integer).
    """
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (bytes, bytearray, memoryview)) and _INT_TEXT.fullmatch(bytes(value)):
        return int(bytes(value))
    raise ValueError(f"expected an integer (stored as int, or ASCII digits), found {_shown(value)}")


def to_text(value: Any) -> str:
    """A str stored as str, or UTF-8 bytes.

    Raises:
        ValueError: the bytes are not UTF-8, or the value is neither.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8")
    raise ValueError(f"expected UTF-8 text, found {_shown(value)}")


def to_json(value: Any) -> Any:
    """The parsed JSON text (bytes or str); a value stored already parsed is returned as is.

    Raises:
        ValueError: the text is not JSON.
    """
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        try:
            return json.loads(bytes(value) if not isinstance(value, str) else value)
        except RecursionError as exc:  # a few KB of "[[[[..." outnests Python's parser
            raise ValueError("JSON nested deeper than Python's recursion limit") from exc
    return value


def to_array(value: Any) -> np.ndarray:
    """A numpy array from ``.npy`` bytes (never unpickled), or the array stored as one.

    Raises:
        ValueError: the bytes are not an ``.npy`` file of a plain dtype.
    """
    if isinstance(value, np.ndarray):
        return value
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise ValueError(f"expected .npy bytes or an array, found {_shown(value)}")
    try:
        stream = io.BytesIO(value)
        _check_npy_size(stream)
        # read_array, not np.load: only the .npy format, and object arrays are refused
        array: np.ndarray = np.lib.format.read_array(stream, allow_pickle=False)
    except (OSError, EOFError) as exc:  # a truncated file: numpy raises these, not ValueError
        raise ValueError(f"not a complete .npy file ({exc})") from exc
    return array


def _check_npy_size(stream: io.BytesIO) -> None:
    """Refuse an ``.npy`` whose header claims more data than follows it, and rewind.

    ``read_array`` allocates the array the header describes before it reads the data:
    a 100-byte file claiming shape ``(10**12,)`` would ask for terabytes.
    """
    version = np.lib.format.read_magic(stream)
    # 3.0 differs from 2.0 only in decoding the dtype's names as UTF-8: sizes are the same
    read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                   else np.lib.format.read_array_header_2_0)
    shape, _fortran, dtype = read_header(stream)
    claimed = math.prod(shape) * dtype.itemsize
    with stream.getbuffer() as whole:
        held = whole.nbytes - stream.tell()
    if claimed > held:
        raise ValueError(f"the .npy header claims shape {shape} of {dtype} ({claimed:,} bytes) "
                         f"but {held:,} bytes follow it")
    stream.seek(0)


def to_bytes(value: Any) -> Any:
    """Bytes as ``bytes`` (not a view of a block); a value stored as something else, as is."""
    return bytes(value) if isinstance(value, (bytearray, memoryview)) else value


_BY_KIND: Final[Mapping[str, ValueDecoder]] = {
    "int": to_int, "text": to_text, "json": to_json, "npy": to_array, "bytes": to_bytes,
}


@dataclass(frozen=True)
class Fields:
    """Which fields a dataset yields as a tuple, in order, and how each is decoded.

    ``StreamingDataset(path, fields=("jpg", "cls"))`` is ``fields=Fields(("jpg", "cls"))``.

    Attributes:
        names: the fields of each yielded tuple, in order.
        decoders: ``{name: fn}``: ``fn(stored value)`` replaces the decoding by
            extension for that field (``bytes`` keeps it raw).
        transforms: one callable or None per field, applied to the decoded value
            (before the dataset's ``transform``, which takes the whole tuple).
        missing: a sample without one of the fields raises ``DecodeError``
            naming key and field (``"error"``), or gets ``None`` there (``"none"``;
            that field's transform is then not called).
    """

    names: tuple[str, ...]
    decoders: Mapping[str, ValueDecoder] = field(default_factory=dict)
    transforms: tuple[Callable[[Any], Any] | None, ...] | None = None
    missing: Missing = "error"

    def __post_init__(self) -> None:
        if isinstance(self.names, str) or not all(isinstance(n, str) for n in self.names):
            raise TypeError(
                f"fields must be a tuple of field names such as ('jpg', 'cls'), got {self.names!r}"
            )
        object.__setattr__(self, "names", tuple(self.names))
        if not self.names:
            raise ValueError("fields names no field; pass at least one, e.g. ('jpg', 'cls')")
        unknown = sorted(set(self.decoders) - set(self.names))
        if unknown:
            raise ValueError(f"decoders for {unknown}, which are not among fields {self.names}; "
                             "add them to the fields or drop those decoders")
        if self.transforms is not None:
            object.__setattr__(self, "transforms", tuple(self.transforms))
            if len(self.transforms) != len(self.names):
                raise ValueError(f"transforms has {len(self.transforms)} entries for "
                                 f"{len(self.names)} fields {self.names}; give one callable "
                                 "or None per field")
        if self.missing not in ("error", "none"):
            raise ValueError(f"missing must be 'error' or 'none', got {self.missing!r}")


def as_fields(fields: Fields | Sequence[str]) -> Fields:
    """``fields`` as a ``Fields`` spec (a tuple of names becomes one with the defaults)."""
    return fields if isinstance(fields, Fields) else Fields(tuple(fields))


class FieldDecoder:
    """One sample dict → the tuple of its decoded fields (then ``transform`` on the tuple).

    Built by the torch layer (``shardio.torch.collate.field_decoder``), which checks
    the names against the dataset's fields and passes the image decoder of the
    decode mode (and of ``crop=``: every image field the built-in decoder decodes
    is cropped, the fields of one sample with the same draws). ``mode`` and
    ``transform`` are what ``shardio.loader`` reads to choose its collate.
    """

    def __init__(
        self,
        spec: Fields,
        *,
        mode: str,
        image: ImageDecoder,
        path: str,
        transform: Callable[[Any], Any] | None = None,
        images: ImagesDecoder | None = None,
    ) -> None:
        """``images``, where given, decodes many image values at once (their samples
        beside them) as ``image`` decodes each: ``decode_group`` uses it."""
        self.fields = spec
        self.mode = mode
        self.transform = transform
        self.path = path
        transforms = spec.transforms or (None,) * len(spec.names)
        self._image = image
        self._plan = tuple(
            (name, spec.decoders.get(name), None if field_kind(name) == "image"
             else _BY_KIND[field_kind(name)], tf)
            for name, tf in zip(spec.names, transforms, strict=True)
        )
        self._images = images
        self._image_names = tuple(dict.fromkeys(
            name for name, custom, _builtin, _tf in self._plan
            if custom is None and field_kind(name) == "image"))

    @property
    def shares_memory(self) -> bool:
        """Whether ``decode_group`` decodes image fields together (``images`` given, and
        image fields the built-in decoder decodes)."""
        return self._images is not None and bool(self._image_names)

    def decode_group(self, samples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Each sample's image fields decoded, all of them in one call of ``images``;
        ``complete(sample, part)`` makes the sample's tuple from them.

        Raises:
            DecodeError: an image does not decode (decode each sample on its own
                for the error its field gives).
        """
        assert self._images is not None
        where = [(i, name) for i, sample in enumerate(samples) for name in self._image_names
                 if name in sample]
        if not where:  # every image field missing (missing="none")
            return [{} for _ in samples]
        decoded = self._images([samples[i][name] for i, name in where],
                               [samples[i] for i, _name in where])
        parts: list[dict[str, Any]] = [{} for _ in samples]
        for (i, name), value in zip(where, decoded, strict=True):
            parts[i][name] = value
        return parts

    def complete(self, sample: Mapping[str, Any], part: Mapping[str, Any]) -> Any:
        """The sample's tuple, its image fields taken from ``part`` (``decode_group``)."""
        return self(sample, part)

    def __call__(self, sample: Mapping[str, Any], decoded: Mapping[str, Any] | None = None,
                 ) -> Any:
        """The sample's tuple (``decoded``: values of built-in image fields, decoded)."""
        out: list[Any] = []
        for name, custom, builtin, tf in self._plan:
            if name not in sample:
                if self.fields.missing == "none":
                    out.append(None)
                    continue
                raise DecodeError(self._where(sample, name) + (
                    f"is missing; the sample has {sorted(set(sample) - {KEY_FIELD, INDEX_FIELD})}."
                    " Pass fields=shardio.Fields(..., missing='none') to get None for it"),
                    key=sample.get(KEY_FIELD))
            value = sample[name]
            if decoded is not None and name in decoded:
                value = decoded[name]
            elif custom is not None:
                value = self._custom(custom, value, sample, name)
            else:
                try:
                    value = self._image(value, sample) if builtin is None else builtin(value)
                except (ValueError, TypeError) as exc:  # DecodeError (an image) is a ValueError
                    raise DecodeError(self._where(sample, name) + (
                        f"does not decode as {field_kind(name)} ({exc}); decode it yourself "
                        f"with fields=shardio.Fields(..., decoders={{{name!r}: fn}})"),
                        key=sample.get(KEY_FIELD)) from exc
            out.append(value if tf is None else tf(value))
        result = tuple(out)
        return result if self.transform is None else self.transform(result)

    def _where(self, sample: Mapping[str, Any], name: str) -> str:
        return (f"{self.path}: sample {sample.get(KEY_FIELD)!r} (index "
                f"{sample.get(INDEX_FIELD)}) field {name!r} ")

    def _custom(self, fn: ValueDecoder, value: Any, sample: Mapping[str, Any], name: str) -> Any:
        """The user's decoder; its error keeps its type and gains a note naming key and field."""
        try:
            return fn(value)
        except Exception as exc:
            note = getattr(exc, "add_note", None)  # Python 3.11+
            if note is not None:
                note(self._where(sample, name) + f"failed in decoders[{name!r}]")
            raise
