"""Walking SRC: ImageFolder classes and order, stem grouping, hidden entries, globs, bad input."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardio.errors import BadInputError
from shardio.packing.sources.files import IMG_EXTENSIONS, dataset_source, scan_source

ODD_CLASSES = ("b class", "a", "A", "Ärger", "z-ünï", "a b", "日本")
ODD_FILES = ("x.jpg", "y.JPG", "sub dir/z.png", "sub/w.jpeg", "sub/deeper/v.WebP",
             "sub-2/u.bmp", "sub 3/t.tif", "é.tiff", "notes.txt")


def _touch(path: Path, data: bytes = b"\xff\xd8\xff data") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _torchvision_reference(root: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """``ImageFolder(root)``'s classes and samples, computed the way torchvision documents."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    samples = []
    for index, name in enumerate(classes):
        for folder, _, names in sorted(os.walk(root / name, followlinks=True)):
            for fname in sorted(names):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    path = os.path.join(folder, fname)
                    samples.append((Path(path).relative_to(root).as_posix(), index))
    return classes, samples


@pytest.fixture
def odd_tree(tmp_path: Path) -> Path:
    root = tmp_path / "odd"
    for cls in ODD_CLASSES:
        for rel in ODD_FILES:
            if rel != "notes.txt":
                _touch(root / cls / rel)
    return root


def test_classes_and_order_match_torchvision_on_nested_odd_names(odd_tree: Path) -> None:
    source = scan_source(odd_tree)
    classes, samples = _torchvision_reference(odd_tree)
    assert source.classes == tuple(classes)
    assert [(s.key, s.label) for s in source.samples] == samples
    assert [s.fields for s in source.samples] == [("image",)] * len(samples)
    keys = [s.key for s in source.samples if s.label == classes.index("a")]
    assert keys.index("a/sub/w.jpeg") < keys.index("a/sub dir/z.png")  # folder "a/sub" first,
    assert keys.index("a/sub dir/z.png") < keys.index("a/sub/deeper/v.WebP")  # ' ' < '/'


@settings(max_examples=25, deadline=None)
@given(names=st.lists(st.text(st.characters(codec="utf-8", exclude_characters="/\0."),
                              min_size=1, max_size=6).filter(lambda n: n.strip(". ") == n),
                      min_size=1, max_size=5, unique=True))
def test_class_to_idx_rule_for_any_names(tmp_path_factory: pytest.TempPathFactory,
                                         names: list[str]) -> None:
    root = tmp_path_factory.mktemp("names")
    for i, name in enumerate(names):
        _touch(root / name / f"{i}.png")
        _touch(root / name / name / f"{i}.jpg")
    source = scan_source(root)
    classes, samples = _torchvision_reference(root)
    assert source.classes == tuple(classes) == tuple(sorted(names))
    assert [(s.key, s.label) for s in source.samples] == samples


def test_generic_folder_groups_by_stem(tmp_path: Path) -> None:
    for rel in ("a/b/x.jpg", "a/b/x.seg.png", "a/b/y.json", "a/c", "README", "a/b/x/z.txt"):
        _touch(tmp_path / rel, rel.encode())
    source = scan_source(tmp_path)
    assert source.classes is None
    got = {s.key: dict(zip(s.fields, s.paths, strict=True)) for s in source.samples}
    assert list(got) == sorted(got) == ["README", "a/b/x", "a/b/x/z", "a/b/y", "a/c"]
    assert got["a/b/x"] == {"jpg": str(tmp_path / "a/b/x.jpg"),
                            "seg.png": str(tmp_path / "a/b/x.seg.png")}
    assert list(got["README"]) == [""]
    assert source.samples[1].rel_paths() == ("a/b/x.jpg", "a/b/x.seg.png")


def test_imagefolder_detection(imagefolder: Path, tmp_path: Path) -> None:
    assert scan_source(imagefolder).classes == tuple(f"class_{i:02d}" for i in range(4))
    _touch(tmp_path / "cat/1.jpg")
    _touch(tmp_path / ".DS_Store")
    assert scan_source(tmp_path).classes == ("cat",), "hidden entries do not block detection"
    _touch(tmp_path / "dog/readme.txt")
    assert scan_source(tmp_path).classes is None, "a top folder without images"
    assert scan_source(tmp_path, imagefolder=True).classes == ("cat", "dog")
    _touch(tmp_path / "dog/1.png")
    assert scan_source(tmp_path).classes == ("cat", "dog")
    _touch(tmp_path / "loose.jpg")
    assert scan_source(tmp_path).classes is None, "a loose file at the top"
    assert scan_source(tmp_path, imagefolder=False).classes is None


def test_images_with_non_image_stem_siblings_make_a_generic_tree(tmp_path: Path) -> None:
    """README's generic example: a/b/x.jpg + a/b/x.json is one sample, not a 1-class ImageFolder."""
    for stem in ("x", "y"):
        _touch(tmp_path / f"a/b/{stem}.jpg")
        _touch(tmp_path / f"a/b/{stem}.json", b'{"caption": "a cat"}')
    source = scan_source(tmp_path)
    assert source.classes is None and source.bad == ()
    assert [(s.key, s.fields) for s in source.samples] == [
        ("a/b/x", ("jpg", "json")), ("a/b/y", ("jpg", "json"))]


def test_a_stray_non_image_keeps_an_imagefolder_and_is_reported(tmp_path: Path) -> None:
    _touch(tmp_path / "cat/1.jpg")
    _touch(tmp_path / "cat/1.png")  # two images with one stem: both are images, both samples
    _touch(tmp_path / "dog/2.jpg")
    _touch(tmp_path / "dog/notes.txt")  # no image named notes.*: not a field of any sample
    source = scan_source(tmp_path)
    assert source.classes == ("cat", "dog")
    assert [p for p, _ in source.bad] == ["dog/notes.txt"]
    assert [s.key for s in source.samples] == ["cat/1.jpg", "cat/1.png", "dog/2.jpg"]
    _touch(tmp_path / "dog/2.cls")  # now 2.jpg has a non-image sibling: generic
    assert scan_source(tmp_path).classes is None


def test_hidden_entries_are_ignored_and_counted(tmp_path: Path) -> None:
    _touch(tmp_path / "cat/1.jpg")
    _touch(tmp_path / "cat/._1.jpg")
    _touch(tmp_path / ".git/objects/aa")
    _touch(tmp_path / ".git/HEAD")
    _touch(tmp_path / ".DS_Store")
    _touch(tmp_path / "cat/.cache/2.jpg")
    source = scan_source(tmp_path)
    assert [s.key for s in source.samples] == ["cat/1.jpg"]
    assert source.hidden_ignored == 4  # ._1.jpg, .git (once), .DS_Store, .cache (once)
    assert source.bad == ()


def test_include_exclude_globs(tiny_tree: Path) -> None:
    every = scan_source(tiny_tree)
    some = scan_source(tiny_tree, include=["d00/*"], exclude=["*5.bin"])
    keys = [s.key for s in some.samples]
    assert keys and all(k.startswith("d00/") and not k.endswith("5") for k in keys)
    assert some.excluded == len(every.samples) - len(keys)


BAD_CASES = {
    "empty": ("x/empty.bin", "empty file (0 bytes)"),
    "broken link": ("x/broken.bin", "broken symbolic link"),
    "looping link": ("x/loop.bin", "symbolic link loop"),
    "unfollowed link": ("x/link.bin", "links are not followed by default"),
    "fifo": ("x/pipe", "named pipe"),
    "trailing dot": ("x/name.", "ends in its only dot"),
    "reserved field": ("x/k.__key__", "reserved"),
    "reserved source field": ("x/k.__source__", "field name '__source__' is reserved"),
}


def _make_bad(root: Path, kind: str) -> None:
    _touch(root / "x/good.bin", b"good")
    rel = BAD_CASES[kind][0]
    path = root / rel
    if kind == "empty":
        _touch(path, b"")
    elif kind == "broken link":
        path.symlink_to(root / "missing")
    elif kind == "looping link":
        path.symlink_to(path)
    elif kind == "unfollowed link":
        path.symlink_to(root / "x/good.bin")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        _touch(path)


@pytest.mark.parametrize("kind", sorted(BAD_CASES))
def test_bad_inputs_are_classified(tmp_path: Path, kind: str) -> None:
    _make_bad(tmp_path, kind)
    source = scan_source(tmp_path)
    rel, reason = BAD_CASES[kind]
    assert [p for p, _ in source.bad] == [rel]
    assert reason in source.bad[0][1]
    assert [s.key for s in source.samples] == ["x/good"]


@pytest.mark.parametrize("name", ["self", "loop.tar"])
def test_a_looping_link_at_the_top_of_src_is_skipped_as_below_it(tmp_path: Path,
                                                                  name: str) -> None:
    # the check for a folder of tar shards once followed it first and ended the pack
    import shardio

    _touch(tmp_path / "src/x/good.bin", b"good")
    (tmp_path / "src" / name).symlink_to(tmp_path / "src" / name)
    summary = shardio.pack(tmp_path / "src", tmp_path / "out", skip_bad=True, num_workers=1,
                           progress=False)
    assert summary.samples == 1
    assert [(path, "loop" in reason) for path, reason in summary.skipped] == [(name, True)]


def test_non_utf8_names_are_bad(tmp_path: Path) -> None:
    _touch(tmp_path / "ok.bin")
    raw = os.fsencode(tmp_path)
    with open(raw + b"/caf\xe9.bin", "wb") as fh:
        fh.write(b"latin-1 name")
    os.mkdir(raw + b"/dir\xff")
    source = scan_source(tmp_path)
    assert sorted(source.bad) == [
        ("caf\\xe9.bin", "name is not valid UTF-8; rename it (e.g. with `convmv`)"),
        ("dir\\xff/", "folder name is not valid UTF-8; rename it (e.g. with `convmv`); "
                      "nothing inside it was packed"),
    ]
    assert [s.key for s in source.samples] == ["ok"]


def test_bad_file_takes_its_sample_with_it(tmp_path: Path) -> None:
    _touch(tmp_path / "s/a.jpg")
    _touch(tmp_path / "s/a.json", b"")
    source = scan_source(tmp_path, imagefolder=False)
    assert source.samples == ()
    assert dict(source.bad)["s/a.json"] == "empty file (0 bytes)"
    assert "because s/a.json is bad" in dict(source.bad)["s/a.jpg"]


def test_imagefolder_reports_non_images_and_loose_files(imagefolder: Path, tmp_path: Path) -> None:
    _touch(tmp_path / "cat/1.jpg")
    _touch(tmp_path / "cat/labels.csv")
    _touch(tmp_path / "loose.txt")
    source = scan_source(tmp_path, imagefolder=True)
    bad = dict(source.bad)
    assert bad["cat/labels.csv"].startswith("not an image")
    assert "outside every class folder" in bad["loose.txt"]
    assert [s.key for s in source.samples] == ["cat/1.jpg"]


def test_unreadable_files_are_found_from_their_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _touch(tmp_path / "d/secret.bin")
    _touch(tmp_path / "d/open.bin")
    (tmp_path / "d/secret.bin").chmod(0)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(tmp_path).st_uid + 4242)
    source = scan_source(tmp_path)
    assert [p for p, _ in source.bad] == ["d/secret.bin"]
    assert "permission denied" in source.bad[0][1]


def test_follow_symlinks_enters_links_and_stops_loops(tmp_path: Path) -> None:
    real = tmp_path / "real"
    _touch(real / "a.bin")
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d/a.bin").symlink_to(real / "a.bin")
    (src / "d/linked").symlink_to(real)
    (src / "d/up").symlink_to(src)
    source = scan_source(src, follow_symlinks=True)
    assert [s.key for s in source.samples] == ["d/a", "d/linked/a"]
    assert source.bad == (("d/up/", f"symbolic link loop (-> {src} is one of its own parents)"),)
    unfollowed = scan_source(src)
    assert unfollowed.samples == () and len(unfollowed.bad) == 3


def test_source_must_be_a_folder(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="does not exist"):
        scan_source(tmp_path / "nope")
    _touch(tmp_path / "file")
    with pytest.raises(BadInputError, match="is not a folder"):
        scan_source(tmp_path / "file")


def test_digest_tracks_content_listing(tmp_path: Path) -> None:
    _touch(tmp_path / "a.bin", b"one")
    first = scan_source(tmp_path).digest
    assert scan_source(tmp_path).digest == first
    _touch(tmp_path / "a.bin", b"three")
    assert scan_source(tmp_path).digest != first


class FakeImageFolder:
    """What pack_imagefolder needs from a torchvision ImageFolder, without torchvision."""

    def __init__(self, root: Path) -> None:
        self.root = str(root)
        self.classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = [(str(p), self.class_to_idx[p.parent.name])
                        for c in self.classes for p in sorted((root / c).iterdir())]


def test_dataset_source_keeps_the_objects_order_and_labels(imagefolder: Path) -> None:
    fake = FakeImageFolder(imagefolder)
    fake.samples.reverse()
    source = dataset_source(fake)
    assert source.classes == tuple(fake.classes)
    assert [(os.path.join(imagefolder, s.key), s.label) for s in source.samples] == fake.samples
    del fake.root
    assert [s.key for s in dataset_source(fake).samples] == [s.key for s in source.samples]
    fake.class_to_idx = {c: i + 1 for i, c in enumerate(fake.classes)}
    with pytest.raises(ValueError, match="class_to_idx"):
        dataset_source(fake)


def test_dataset_source_reports_missing_and_empty_files(imagefolder: Path, tmp_path: Path) -> None:
    fake = FakeImageFolder(imagefolder)
    fake.root = str(tmp_path)
    _touch(tmp_path / "class_00/empty.jpg", b"")
    fake.samples = [(str(tmp_path / "class_00/empty.jpg"), 0),
                    (str(tmp_path / "class_00/gone.jpg"), 0)]
    source = dataset_source(fake)
    assert source.samples == ()
    assert dict(source.bad) == {
        "class_00/empty.jpg": "empty file (0 bytes)",
        "class_00/gone.jpg": "cannot be examined (No such file or directory)",
    }


def test_pack_refuses_a_file_named_as_a_reserved_field(tmp_path: Path) -> None:
    """``x.__source__`` would be overwritten by a mixture's reader: pack stops, naming it."""
    from shardio import pack

    _touch(tmp_path / "src/x.jpg")
    _touch(tmp_path / "src/x.__source__", b"web")
    with pytest.raises(BadInputError) as info:
        pack(tmp_path / "src", tmp_path / "out", num_workers=1)
    assert "x.__source__" in str(info.value) and "'__source__' is reserved" in str(info.value)
    assert not (tmp_path / "out" / "manifest.json").exists()
