"""README and docs figures come from committed results files through the report code.

Every generated block of the documents ``benchmarks/readme.py`` lists (``DOCUMENTS``)
must equal what its registered function renders now from ``benchmarks/results/``; a
figure edited by hand, or a results file committed without
``python -m benchmarks.readme``, fails here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks import readme


def test_every_generated_block_equals_its_rendering() -> None:
    assert readme.stale_blocks() == []
    blocks = readme.find_blocks()
    assert {"bench-summary", "bench-tables"} <= {block.name for block in blocks}
    # the README shows one headline table; the rest live in the docs and benchmarks README
    assert [b.name for b in blocks if b.document == "README.md"] == ["readme-headline"]


def _copy_documents(tmp_path: Path) -> Path:
    for document in readme.DOCUMENTS:
        (tmp_path / document).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(readme.REPO / document, tmp_path / document)
    return tmp_path


def test_a_figure_typed_by_hand_is_found_and_rewritten(tmp_path: Path) -> None:
    root = _copy_documents(tmp_path)
    summary = next(b for b in readme.find_blocks(root=root) if b.name == "bench-summary")
    edited = summary.text.replace("| 100,000 files", "| 100,001 files", 1)
    assert edited != summary.text
    path = root / summary.document
    path.write_text(path.read_text(encoding="utf-8").replace(summary.text, edited),
                    encoding="utf-8")
    assert readme.stale_blocks(root=root) == [
        f"{summary.document}: block 'bench-summary' differs from what "
        f"{readme.BLOCKS['bench-summary']} renders; run python -m benchmarks.readme"]
    assert readme.write_blocks(root=root) == [summary.document]
    assert readme.stale_blocks(root=root) == []


def test_an_unregistered_block_is_reported(tmp_path: Path) -> None:
    root = _copy_documents(tmp_path)
    path = root / "README.md"
    path.write_text(path.read_text(encoding="utf-8")
                    + "\n<!-- generated:nobody -->\n| 1 |\n<!-- end generated:nobody -->\n",
                    encoding="utf-8")
    assert readme.stale_blocks(root=root) == [
        "README.md: block 'nobody' is not registered in benchmarks/readme.py BLOCKS"]


def test_every_document_holding_a_block_is_scanned() -> None:
    """A block in a document missing from ``DOCUMENTS`` would never be checked or rewritten."""
    holding = {path.relative_to(readme.REPO).as_posix()
               for pattern in ("*.md", "docs/*.md", "benchmarks/**/*.md")
               for path in readme.REPO.glob(pattern)
               if "<!-- generated:" in path.read_text(encoding="utf-8")}
    assert "README.md" in holding
    assert holding <= set(readme.DOCUMENTS)
