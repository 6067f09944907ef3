"""The docs site shows what the code and the committed results say.

* ``docs/api.md`` documents every public name, ``shardio.__all__``, by that name;
* the Performance page's figures (``docs/img/perf-*.png``) are what
  ``benchmarks/performance.py`` draws now from the newest committed full run, so a new
  run committed without ``python -m benchmarks.performance`` is found (its tables are
  generated blocks, checked by ``tests/project/test_readme_blocks.py``).

``mkdocs build --strict`` itself runs in ``.ci/run`` (it needs the ``docs`` extra).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from PIL import Image

import shardio
from benchmarks import performance

REPO = Path(__file__).resolve().parents[2]


def test_the_api_page_documents_every_public_name() -> None:
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    documented = re.findall(r"^::: shardio\.(\w+)$", text, re.MULTILINE)
    assert len(documented) == len(set(documented)), "a name documented twice"
    assert set(shardio.__all__) - {"__version__"} == set(documented)


def test_the_performance_figures_are_drawn_from_the_newest_run(tmp_path: Path) -> None:
    drawn = performance.draw_figures(tmp_path)
    assert {p.name for p in drawn} == {"perf-images.png", "perf-tiny.png"}
    for path in drawn:
        committed = REPO / "docs" / "img" / path.name
        with Image.open(path) as new, Image.open(committed) as old:
            same = new.size == old.size and np.array_equal(np.asarray(new.convert("RGB")),
                                                           np.asarray(old.convert("RGB")))
        assert same, f"docs/img/{path.name} is stale: run python -m benchmarks.performance"
