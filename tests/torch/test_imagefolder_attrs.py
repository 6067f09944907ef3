"""classes, class_to_idx and targets on both datasets, as torchvision's ImageFolder has them.

The reference is computed the way torchvision does it (sorted class folders, then
``sorted(os.walk(class_dir))`` with files sorted by name), on the awkward tree that
``tools/check_imagefolder.py`` checks against real torchvision.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.utils.data import DataLoader

import shardio
from shardio import WriteOptions
from shardio.torch.dataset import StreamingDataset
from shardio.torch.indexed import IndexedDataset
from tools.check_imagefolder import make_awkward_tree

TORCHVISION_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff",
                          ".webp")


def torchvision_reference(root: Path) -> tuple[list[str], dict[str, int], list[tuple[str, int]]]:
    """``ImageFolder(root)``'s classes, class_to_idx and samples (as relative keys)."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    class_to_idx = {name: i for i, name in enumerate(classes)}
    samples = []
    for name in classes:
        for folder, _, names in sorted(os.walk(root / name, followlinks=True)):
            for fname in sorted(names):
                if fname.lower().endswith(TORCHVISION_EXTENSIONS):
                    rel = Path(folder, fname).relative_to(root).as_posix()
                    samples.append((rel, class_to_idx[name]))
    return classes, class_to_idx, samples


@pytest.fixture(scope="module")
def awkward(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("awkward") / "tree"
    make_awkward_tree(root)
    return root


@pytest.mark.parametrize("backend", ["records", "lmdb"])
def test_unshuffled_pack_has_torchvisions_attributes(
    awkward: Path, tmp_path: Path, backend: str
) -> None:
    out = tmp_path / "out"
    shardio.pack(awkward, out, shuffle=False, num_workers=1,
                 options=WriteOptions(backend=backend, max_shard_samples=4))
    classes, class_to_idx, samples = torchvision_reference(awkward)
    for ds in (StreamingDataset(out), IndexedDataset(out)):
        assert ds.classes == classes
        assert ds.class_to_idx == class_to_idx
        assert ds.targets == [label for _, label in samples]  # ImageFolder(root).targets
        assert ds.targets is ds.targets  # read once, then kept
    assert isinstance(ds.classes, list) and isinstance(ds.class_to_idx, dict)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_targets_follow_the_datasets_own_index_order(
    awkward: Path, tmp_path: Path, num_workers: int
) -> None:
    out = tmp_path / "out"
    shardio.pack(awkward, out, seed=3, num_workers=1, options=WriteOptions(max_shard_samples=5))
    classes, class_to_idx, samples = torchvision_reference(awkward)
    expected = dict(samples)
    raw = IndexedDataset(out, decode="raw")
    keys = [raw[i]["__key__"] for i in range(len(raw))]
    assert keys != [k for k, _ in samples]  # the pack is shuffled: the order differs
    indexed = IndexedDataset(out, transform=lambda image: 0)
    assert indexed.targets == [expected[k] for k in keys]
    labels = [label for _, label in DataLoader(indexed, batch_size=None,
                                                num_workers=num_workers)]
    assert labels == indexed.targets  # what IndexedDataset[i] yields, position i
    stream = StreamingDataset(out, transform=lambda image: 0)
    streamed = [int(label) for _, label in DataLoader(stream, batch_size=None,
                                                     num_workers=num_workers)]
    assert collections.Counter(streamed) == collections.Counter(stream.targets)
    assert stream.classes == classes and stream.class_to_idx == class_to_idx


def test_pack_imagefolder_of_a_dataset_object_keeps_its_classes(
    awkward: Path, tmp_path: Path
) -> None:
    classes, class_to_idx, samples = torchvision_reference(awkward)
    folder = SimpleNamespace(root=str(awkward), classes=classes, class_to_idx=class_to_idx,
                             samples=[(str(awkward / k), label) for k, label in samples])
    out = tmp_path / "out"
    shardio.pack_imagefolder(folder, out, shuffle=False, num_workers=1)
    ds = IndexedDataset(out)
    assert (ds.classes, ds.class_to_idx) == (classes, class_to_idx)
    assert ds.targets == [label for _, label in samples]


def test_generic_pack_has_no_classes(tiny_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "generic"
    shardio.pack(tiny_tree, out, num_workers=1)
    for ds in (StreamingDataset(out), IndexedDataset(out)):
        for name in ("classes", "class_to_idx", "targets"):
            assert not hasattr(ds, name)
            with pytest.raises(AttributeError, match=rf"{out}: \w+Dataset has no '{name}': "
                                                     "this is a generic pack, which has no "
                                                     "classes"):
                getattr(ds, name)


def test_mixture_has_classes_but_targets_only_of_one_source(
    awkward: Path, imagefolder: Path, tmp_path: Path
) -> None:
    packed = {}
    for name, src in (("a", awkward), ("b", awkward), ("other", imagefolder)):
        packed[name] = tmp_path / name
        shardio.pack(src, packed[name], seed=len(name), num_workers=1)
    classes, class_to_idx, _ = torchvision_reference(awkward)
    mixture = StreamingDataset([shardio.Source(packed["a"]), shardio.Source(packed["b"])])
    assert (mixture.classes, mixture.class_to_idx) == (classes, class_to_idx)
    assert not hasattr(mixture, "targets")
    with pytest.raises(AttributeError, match="StreamingDataset has no 'targets': a mixture of 2 "
                                             "sources has no fixed index order.*use each "
                                             r"source's targets"):
        _ = mixture.targets

    # one source drawn epoch_size at a time: its samples carry its own __index__
    one = StreamingDataset(packed["a"], epoch_size=7, decode="raw")
    assert one.targets == IndexedDataset(packed["a"]).targets
    for num_workers in (0, 2):
        samples = list(DataLoader(one, batch_size=None, num_workers=num_workers))
        assert len(samples) == 7
        assert all(one.targets[int(s["__index__"])] == s["label"] for s in samples)

    other = StreamingDataset([shardio.Source(packed["a"]), shardio.Source(packed["other"])])
    for name in ("classes", "class_to_idx", "targets"):
        with pytest.raises(AttributeError, match=f"has no '{name}': the sources of this mixture "
                                                 "do not all have the same classes"):
            getattr(other, name)
