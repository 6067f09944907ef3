"""``shardio preview`` / ``shardio.preview``: contact sheets of seeded random samples."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import shardio
from shardio import ShardWriter, WriteOptions, open_dataset
from shardio.cli import main
from shardio.ops.preview import CELL_SIZE, choose_indices, make_sheet
from shardio.packing.pack import pack
from shardio.synth import make_photo


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory, imagefolder: Path) -> Path:
    """The session ImageFolder (4 classes × 12 JPEGs) packed, shuffled, in shards of 10."""
    out = tmp_path_factory.mktemp("preview") / "labelled"
    pack(imagefolder, out, options=WriteOptions(max_shard_samples=10), num_workers=1)
    return out


@pytest.fixture(scope="module")
def generic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three samples: jpg + seg.png + json; a broken jpg + txt; txt only."""
    rng = np.random.default_rng(4)
    out = tmp_path_factory.mktemp("preview") / "generic"
    with ShardWriter(out) as writer:
        writer.write({"__key__": "a/photo", "jpg": make_photo(rng, 40, 30),
                      "seg.png": make_photo(rng, 40, 30, fmt="PNG"),
                      "json": b'{"caption": "a photo"}'})
        writer.write({"__key__": "b/broken", "jpg": b"\xff\xd8\xff not a jpeg", "txt": b"hi"})
        writer.write({"__key__": "c/text", "txt": b"only text"})
    return out


def invoke(*args: str) -> tuple[int, str, str, bytes]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr, result.stdout_bytes


@pytest.mark.parametrize(("n", "grid"), [(16, (4, 4)), (5, (3, 2)), (100, (7, 7))])
def test_preview_writes_a_png_of_the_expected_grid(
    labelled: Path, tmp_path: Path, n: int, grid: tuple[int, int]
) -> None:
    written = shardio.preview(labelled, tmp_path / "grid.png", n=n)
    assert written == tmp_path / "grid.png"
    with Image.open(written) as image:
        assert image.format == "PNG"
        assert image.size == (grid[0] * CELL_SIZE[0], grid[1] * CELL_SIZE[1])
        # thumbnails were drawn: the top-left cell is not all background
        pixels = np.asarray(image.crop((0, 0, *CELL_SIZE))).reshape(-1, 3)
        assert len(np.unique(pixels, axis=0)) > 100


def test_selection_is_seeded_random_and_captioned_with_class_names(labelled: Path) -> None:
    with open_dataset(labelled) as reader:
        first = choose_indices(reader, n=8, seed=3)
        assert first == choose_indices(reader, n=8, seed=3)
        assert first != choose_indices(reader, n=8, seed=4)
        assert len(set(first)) == 8 and first == sorted(first)
        assert first != list(range(8)), "random, not the first samples"
        classes = reader.manifest.classes
        assert classes is not None
        expected = [(i, reader.get(i)["__key__"], classes[reader.get(i)["label"]])
                    for i in first]
    sheet = make_sheet(labelled, n=8, seed=3)
    assert [(s.index, s.key, s.class_name) for s in sheet.samples] == expected
    assert all(s.images == ("image",) and s.others == () for s in sheet.samples)


def test_class_picks_only_that_class(labelled: Path) -> None:
    with open_dataset(labelled) as reader:
        chosen = choose_indices(reader, n=5, class_name="class_02", seed=1)
        assert len(chosen) == 5
        assert {reader.get(i)["label"] for i in chosen} == {2}
        every = choose_indices(reader, n=64, class_name="class_02", seed=1)
        assert every == [i for i in range(len(reader)) if reader.get(i)["label"] == 2]
    code, out, err, _raw = invoke("preview", str(labelled), "--class", "class_02", "--n", "5",
                                  "--seed", "1", "-o", str(labelled.parent / "c2.png"))
    assert code == 0, err
    assert out.strip() == str(labelled.parent / "c2.png")
    with Image.open(labelled.parent / "c2.png") as image:
        assert image.size == (3 * CELL_SIZE[0], 2 * CELL_SIZE[1])


def test_generic_pack_draws_image_fields_and_prints_the_others(generic: Path,
                                                              tmp_path: Path) -> None:
    sheet = make_sheet(generic, n=10)
    by_key = {s.key: s for s in sheet.samples}
    assert by_key["a/photo"].images == ("jpg", "seg.png")
    assert by_key["a/photo"].others == (("json", """'{"caption": "a photo"}'"""),)
    assert by_key["c/text"].images == ()
    # jpg + seg.png, broken jpg (placeholder), text only (placeholder): 4 cells, 2 × 2
    assert (sheet.columns, sheet.rows) == (2, 2)
    assert len(sheet.problems) == 1 and "'b/broken'" in sheet.problems[0]
    code, out, err, _raw = invoke("preview", str(generic), "-o", str(tmp_path / "g.png"))
    assert code == 0, err
    assert out.splitlines() == [
        """a/photo  json='{"caption": "a photo"}'""",
        "b/broken  txt='hi'",
        "c/text  txt='only text'",
        str(tmp_path / "g.png"),
    ]
    assert "warning: sample 'b/broken' field 'jpg'" in err
    with Image.open(tmp_path / "g.png") as image:
        assert image.size == (2 * CELL_SIZE[0], 2 * CELL_SIZE[1])


def test_without_output_a_terminal_gets_a_temporary_file_and_a_pipe_the_png(
    labelled: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardio.cli.preview as command

    code, _out, err, raw = invoke("preview", str(labelled), "--n", "4")
    assert code == 0, err
    with Image.open(io.BytesIO(raw)) as image:
        assert image.size == (2 * CELL_SIZE[0], 2 * CELL_SIZE[1])
    monkeypatch.setattr(command, "_stdout_is_terminal", lambda: True)
    code, out, err, _raw = invoke("preview", str(labelled), "--n", "4")
    assert code == 0, err
    path = Path(out.strip())
    try:
        assert path.name.startswith("shardio-preview-") and path.suffix == ".png"
        with Image.open(path) as image:
            assert image.tobytes() == Image.open(io.BytesIO(raw)).tobytes()
    finally:
        path.unlink()


def test_errors_say_what_to_do(labelled: Path, generic: Path, tmp_path: Path) -> None:
    code, _out, err, _raw = invoke("preview", str(generic), "--class", "cat")
    assert code == 2
    assert "generic pack" in err and "no classes" in err
    code, _out, err, _raw = invoke("preview", str(labelled), "--class", "class_7")
    assert code == 2
    assert "no class 'class_7'" in err and "class_00, class_01, class_02, class_03" in err
    with pytest.raises(ValueError, match="its 4 classes are class_00"):
        shardio.preview(labelled, tmp_path / "x.png", class_name="dog")
    with pytest.raises(ValueError, match="n must be at least 1"):
        shardio.preview(labelled, tmp_path / "x.png", n=0)
    code, _out, err, _raw = invoke("preview", str(labelled), "-o", str(tmp_path / "x.nope"))
    assert code == 2 and "cannot write this image format" in err
    assert not (tmp_path / "x.nope").exists()
    code, _out, err, _raw = invoke("preview", str(tmp_path / "none"), "-o",
                                   str(tmp_path / "x.png"))
    assert code == 1 and "manifest.json" in err
    assert not (tmp_path / "x.png").exists()


def test_preview_stays_the_function_after_its_module_is_imported() -> None:
    import importlib

    module = importlib.import_module("shardio.ops.preview")
    assert "preview" in shardio.__all__
    assert callable(shardio.preview) and shardio.preview is module.preview
