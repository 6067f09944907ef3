"""Every code example of README.md, docs/*.md and shardio's docstrings runs, as written.

Collected, one test each:

* fenced ```` ```python ```` blocks of README.md and docs/*.md;
* docstring examples of every module, class and function under ``shardio/``: doctest
  ``>>>`` lines, and literal blocks (``::``) introduced by ``Example::`` or starting
  with an import (diagrams such as the error tree are not code);
* the ```` ```bash ```` blocks of README.md and docs/*.md, each in its section (the page's
  title before its first ``## ``), run line by line by bash, with ``shardio`` meaning
  ``python -m shardio`` of this interpreter; the sections whose blocks change the Python
  environment itself, or run for half an hour, are collected but skipped, each with its
  reason (``BASH_NOT_RUN``).

Each example runs in a fresh temporary directory prepared with what the examples
name, and nothing else (``FIXTURE`` below is the whole list):

* ``./train``: a small ImageFolder, classes ``class_a`` and ``class_b``, images
  ``img_000.jpg``…, and ``./anything``: a generic tree ``a/b/x.jpg`` + ``a/b/x.json``;
* ``out/train``: ``./train`` packed, for the examples that name it and do not pack it
  themselves (others, such as ``ShardWriter("out/")``, write their own);
* names the Python examples use without defining them: ``shardio`` and ``torch``
  imported; ``my_samples()`` yielding ``(key, jpeg bytes, label)``; ``tf``, a transform
  from a PIL image to a 3×32×32 uint8 tensor; ``epochs = 1``;
* buckets the examples name (``s3://my-bucket/…``): moto's S3 server on 127.0.0.1
  (``storage_servers.MotoS3``), emptied and with those buckets made for each example,
  the ``AWS_*`` environment pointing at it (``AWS_ENDPOINT_URL``, as a user of an
  S3-compatible store sets it) and ``SHARDIO_CACHE_DIR`` in the example's temp dir;
* for ``shardio bench``: ``SHARDIO_BENCH_MIN_SECONDS=0.2`` and
  ``SHARDIO_BENCH_MAX_WORKERS=1`` (its documented environment variables), so it takes
  seconds, not a minute.

An example that is broken in a file this test's owner does not own is marked
``xfail(strict=True)`` with the reason (``BROKEN``): the owner's fix turns it into an
unexpected pass, and then the mark goes.
"""

from __future__ import annotations

import ast
import doctest
import io
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FIXTURE = ("train/", "anything/", "out/train/ (Python examples)", "shardio", "torch",
           "my_samples", "tf", "epochs", "s3://<bucket>/")
BROKEN: dict[str, str] = {}
"""Example id -> why it fails today (someone else's file); xfail(strict=True) until fixed."""
CANNOT_RUN: dict[str, str] = {}
"""Example id -> why it cannot run on this machine at all (none so far)."""
_VENV = "makes a virtual environment and installs torch and shardio into it from the network"
BASH_NOT_RUN: dict[str, str] = {
    "README.md: Set up": _VENV,
    "README.md: Documentation": "installs the docs extra from the network; .ci/run builds the "
                                "site",
    "docs/getting-started.md: Install": _VENV,
    "docs/getting-started.md: Run the tests": _VENV,
    "docs/getting-started.md: Pillow or pillow-simd": "uninstalls Pillow from the environment "
                                                      "and builds pillow-simd from source",
    "docs/getting-started.md: Build these docs": "installs the docs extra from the network; "
                                                 ".ci/run builds the site",
    "docs/performance.md: Reproduce": "makes the benchmarks' own environment and runs the "
                                      "full harness, about 35 minutes",
}
"""``document: section`` -> why its bash blocks are not run here; every other section's are."""


@dataclass(frozen=True)
class Example:
    """One example: where it is, what language, its code."""

    id: str
    kind: str  # "python", "bash" or "doctest"
    code: str
    section: str = ""  # a bash block's ``document: section``


def _fenced(path: Path, kind: str, text: str | None = None) -> Iterator[Example]:
    text = path.read_text(encoding="utf-8") if text is None else text
    rel = path.relative_to(REPO).as_posix()
    full = path.read_text(encoding="utf-8")
    for match in re.finditer(rf"^```{kind}\n(.*?)^```$", text, re.DOTALL | re.MULTILINE):
        line = full[: full.index(match[0])].count("\n") + 1
        yield Example(f"{rel}:{line}", kind, match[1])


def sections(path: Path) -> dict[str, str]:
    """A page's ``## `` sections, title -> text; what precedes the first one is under the
    page's ``# `` title."""
    head, *parts = path.read_text(encoding="utf-8").split("\n## ")
    title = head.split("\n", 1)[0].removeprefix("# ")
    return {title: head} | {part.split("\n", 1)[0]: part for part in parts}


def bash_blocks() -> Iterator[Example]:
    """The bash blocks of README and the docs, each with its ``document: section``."""
    for path in DOCUMENTS:
        rel = path.relative_to(REPO).as_posix()
        for title, text in sections(path).items():
            for example in _fenced(path, "bash", text):
                yield replace(example, section=f"{rel}: {title}")


def _literal_blocks(doc: str) -> Iterator[tuple[str, str]]:
    """``(introducing line, dedented block)`` for every ``::`` literal block of ``doc``."""
    lines = doc.expandtabs().splitlines()
    for i, line in enumerate(lines):
        if not line.rstrip().endswith("::"):
            continue
        indent = len(line) - len(line.lstrip())
        body: list[str] = []
        for nxt in lines[i + 1:]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                break
            body.append(nxt)
        block = textwrap.dedent("\n".join(body)).strip("\n")
        if block:
            yield line.strip(), block + "\n"


def _docstrings(path: Path) -> Iterator[tuple[str, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes: list[tuple[str, ast.AST]] = [("", tree)]
    while nodes:
        prefix, node = nodes.pop(0)
        doc = ast.get_docstring(node, clean=True)  # type: ignore[arg-type]
        if doc:
            yield prefix or "<module>", doc
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                nodes.append((f"{prefix}.{child.name}".lstrip("."), child))


def docstring_examples() -> Iterator[Example]:
    """Doctests and example literal blocks of every docstring under ``shardio/``."""
    for path in sorted((REPO / "shardio").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for where, doc in _docstrings(path):
            if ">>>" in doc:
                yield Example(f"{rel}:{where}:doctest", "doctest", doc)
            for n, (intro, block) in enumerate(_literal_blocks(doc), 1):
                first = block.lstrip().split("\n", 1)[0]
                if intro.endswith(("Example::", "Examples::")) or first.startswith(
                        ("import ", "from ")):
                    yield Example(f"{rel}:{where}:{n}", "python", block)


def collect() -> list[Example]:
    """Every example this test runs."""
    found = [e for path in DOCUMENTS for e in _fenced(path, "python")]
    found += bash_blocks()
    found += docstring_examples()
    return found


EXAMPLES = collect()


SLOW = {"docs/packing.md:7"}
"""Examples that take half a minute (the whole command tour: ``shardio bench`` and ``shardio
doctor`` measure): in CI's slow step, not the default run."""


def _params() -> list[Any]:
    out = []
    for example in EXAMPLES:
        marks: list[Any] = []
        if example.id in BROKEN:
            marks.append(pytest.mark.xfail(strict=True, reason=BROKEN[example.id]))
        if example.id in CANNOT_RUN:
            marks.append(pytest.mark.skip(reason=CANNOT_RUN[example.id]))
        if example.id in SLOW:
            marks.append(pytest.mark.slow)
        if example.kind == "bash" and example.section in BASH_NOT_RUN:
            marks.append(pytest.mark.skip(
                reason=f"{example.section}: {BASH_NOT_RUN[example.section]}"))
        out.append(pytest.param(example, id=example.id, marks=marks))
    return out


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files of ``FIXTURE``, made once; each example gets a copy."""
    from shardio.packing.pack import pack
    from shardio.synth import make_imagefolder

    root = tmp_path_factory.mktemp("examples")
    made = root / "made"
    make_imagefolder(made, num_classes=2, per_class=4, seed=5, long_side=(40, 56))
    for cls, name in (("class_00", "class_a"), ("class_01", "class_b")):
        target = root / "train" / name
        target.mkdir(parents=True)
        for i, image in enumerate(sorted((made / cls).iterdir())):
            shutil.copy(image, target / f"img_{i:03d}.jpg")
    (root / "anything" / "a" / "b").mkdir(parents=True)
    shutil.copy(root / "train" / "class_a" / "img_000.jpg", root / "anything/a/b/x.jpg")
    (root / "anything" / "a" / "b" / "x.json").write_text('{"caption": "a photo"}\n')
    pack(root / "train", root / "packed" / "train", num_workers=1)
    shutil.rmtree(made)
    return root


@pytest.fixture(scope="session")
def example_s3() -> Iterator[Any]:
    """moto's S3 server for the examples that name an ``s3://`` bucket."""
    from storage_servers import MotoS3

    server = MotoS3()
    yield server
    server.close()


def _serve_s3(example: Example, request: pytest.FixtureRequest,
              monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Give an example naming ``s3://bucket/…`` an empty S3 server holding those buckets."""
    import urllib.request

    buckets = sorted(set(re.findall(r"s3://([a-z0-9][a-z0-9.-]+)/", example.code)))
    if not buckets:
        return
    server = request.getfixturevalue("example_s3")
    urllib.request.urlopen(urllib.request.Request(f"{server.url}/moto-api/reset",
                                                  method="POST"), timeout=30).close()
    for bucket in buckets:
        server.create_bucket(bucket)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": server.url,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "SHARDIO_CACHE_DIR": str(tmp_path / "cache"),
    }.items():
        monkeypatch.setenv(name, value)


def _workdir(prepared: Path, tmp_path: Path, *, packed: bool) -> Path:
    work = tmp_path / "work"
    for name in ("train", "anything"):
        shutil.copytree(prepared / name, work / name)
    if packed:
        shutil.copytree(prepared / "packed", work / "out")
    return work


def namespace() -> dict[str, Any]:
    """The names Python examples use without defining them."""
    import numpy as np
    import torch

    import shardio

    def my_samples() -> Iterator[tuple[str, bytes, int]]:
        for i, image in enumerate(sorted(Path("train").rglob("*.jpg"))):
            yield f"mine/{i:04d}", image.read_bytes(), i % 2

    def tf(image: Any) -> torch.Tensor:
        pixels = np.asarray(image.convert("RGB").resize((32, 32)))
        return torch.from_numpy(pixels.copy()).permute(2, 0, 1)

    return {"__name__": "__example__", "shardio": shardio, "torch": torch,
            "my_samples": my_samples, "tf": tf, "epochs": 1}


def _run_bash(example: Example, work: Path) -> None:
    bin_dir = work.parent / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "shardio"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m shardio "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "SHARDIO_BENCH_MIN_SECONDS": "0.2", "SHARDIO_BENCH_MAX_WORKERS": "1"}
    proc = subprocess.run(["bash", "-e", "-x", "-c", example.code], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, f"{example.id} failed:\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("example", _params())
def test_example_runs(example: Example, prepared: Path, tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    packed = "out/train" in example.code and not re.search(
        r"shardio pack \S+ out/train(?!\S)", example.code)
    work = _workdir(prepared, tmp_path, packed=packed)
    _serve_s3(example, request, monkeypatch, tmp_path)
    if example.kind == "bash":
        _run_bash(example, work)
        return
    monkeypatch.chdir(work)
    if example.kind == "doctest":
        test = doctest.DocTestParser().get_doctest(example.code, namespace(), example.id,
                                                   example.id, 0)
        out = io.StringIO()
        result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test, out=out.write)
        assert result.failed == 0, out.getvalue()
        return
    code = compile(example.code, example.id, "exec")
    exec(code, namespace())  # the documentation's own example, run as a user would


def test_examples_are_found() -> None:
    """The collector finds what is there (a parser that finds nothing passes everything)."""
    ids = {e.id for e in EXAMPLES}
    kinds = {e.kind for e in EXAMPLES}
    assert {"python", "bash"} <= kinds
    assert sum(i.startswith("README.md:") for i in ids) >= 2
    assert any(i.startswith("shardio/packing/writer.py:ShardWriter:") for i in ids)
    assert not any(i.startswith("shardio/errors.py") for i in ids), "a diagram is not code"
    assert set(BROKEN) <= ids and set(CANNOT_RUN) <= ids
    bash_sections = {e.section for e in EXAMPLES if e.kind == "bash"}
    assert {"README.md: From ImageFolder to shardio", "docs/packing.md: Packing",
            "docs/getting-started.md: Look before you train",
            "docs/growing.md: Growing a dataset",
            "docs/remote-datasets.md: Remote datasets"} <= bash_sections - set(BASH_NOT_RUN)
    assert set(BASH_NOT_RUN) <= bash_sections, "a section listed as not run has no bash block"
