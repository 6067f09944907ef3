"""README's "Layout" names every module of ``shardio/``, once, in an order its imports follow.

The Layout block lists one module per line, lower layers first. Checked here:

* every ``.py`` file under ``shardio/`` has its line, and every line names a file;
* each module's import-time shardio imports name modules listed above it (imports
  inside functions load lazily and may point anywhere; ``if TYPE_CHECKING:`` blocks
  are never run). Importing ``shardio.storage.x`` also runs ``shardio/storage/__init__.py``,
  so a subpackage's ``__init__`` counts for modules outside it; ``shardio/__init__.py``
  loads its names on first use and does not;
* the lines marked ``(torch)`` are exactly the modules that import torch at import time.

A module added or removed, or an import pointing down the list, fails here, naming the
line to add, delete or move.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def layout_lines(readme: str | None = None) -> list[tuple[str, str]]:
    """``(module path, description)`` of each line of README's Layout block, in order."""
    text = (REPO / "README.md").read_text(encoding="utf-8") if readme is None else readme
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("\n```\n", 1)[1].split("\n```", 1)[0]
    return [(m[1], m[2]) for m in re.finditer(r"^(shardio/\S+\.py) +(.+)$", block, re.M)]


def module_files() -> list[str]:
    """Every module file under ``shardio/``, as a path relative to the repository."""
    return sorted(p.relative_to(REPO).as_posix() for p in (REPO / "shardio").rglob("*.py"))


def _file_of(module: str) -> str | None:
    for candidate in (f"{module.replace('.', '/')}.py", f"{module.replace('.', '/')}/__init__.py"):
        if (REPO / candidate).is_file():
            return candidate
    return None


def _import_time_nodes(body: list[ast.stmt]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                out += _import_time_nodes(node.body) + _import_time_nodes(node.orelse)
        elif isinstance(node, ast.Try):
            out += _import_time_nodes(node.body)
            for handler in node.handlers:
                out += _import_time_nodes(handler.body)
        else:
            out.append(node)
    return out


def imported_modules(path: str) -> set[str]:
    """Dotted names ``path`` imports at import time, submodules resolved (``from a import b``)."""
    tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
    package = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    if not path.endswith("__init__.py"):
        package = package.rsplit(".", 1)[0]
    names: set[str] = set()
    for node in _import_time_nodes(tree.body):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                names.add(sub if _file_of(sub) else base)
    return names


def dependencies(path: str) -> set[str]:
    """The shardio module files that importing ``path`` runs first (see the module docstring)."""
    own = path.removesuffix(".py").replace("/", ".")
    out: set[str] = set()
    for name in imported_modules(path):
        parts = name.split(".")
        if parts[0] != "shardio":
            continue
        for n in range(2, len(parts) + 1):  # the module and its subpackages, not shardio itself
            module = ".".join(parts[:n])
            if n < len(parts) and own.startswith(module + "."):
                continue  # the importing module's own package: already being imported
            found = _file_of(module)
            if found is not None and found != path:
                out.add(found)
    return out


def upward_imports(order: list[str]) -> list[str]:
    """A line per import of a module listed below (or not at all in) ``order``."""
    position = {path: i for i, path in enumerate(order)}
    return [f"{path} imports {dep}, listed below it: move {dep}'s line above {path}'s"
            for i, path in enumerate(order) for dep in sorted(dependencies(path))
            if position.get(dep, len(order)) > i]


def test_layout_names_every_module_once() -> None:
    listed = [path for path, _ in layout_lines()]
    assert len(listed) == len(set(listed)), "a module has two lines in README's Layout"
    missing = sorted(set(module_files()) - set(listed))
    assert not missing, f"README's Layout has no line for {missing}: add one each"
    gone = sorted(set(listed) - set(module_files()))
    assert not gone, f"README's Layout names {gone}, which are not in shardio/: delete them"


def test_layout_order_follows_the_imports() -> None:
    assert upward_imports([path for path, _ in layout_lines()]) == []


def test_torch_marks_are_the_modules_that_import_torch() -> None:
    marked = {path for path, what in layout_lines() if what.endswith("(torch)")}
    importers = {path for path in module_files()
                 if any(name.split(".")[0] == "torch" for name in imported_modules(path))}
    assert importers == marked
    assert "shardio/dataset.py" in importers  # the reading of imports finds a real one


def test_an_import_pointing_down_the_list_is_found() -> None:
    """The order check is not vacuous: ``format`` imports ``errors``, so errors comes first."""
    assert "shardio/errors.py" in dependencies("shardio/format.py")
    assert "shardio/storage/__init__.py" in dependencies("shardio/location.py")
    assert "shardio/storage/__init__.py" not in dependencies("shardio/storage/local.py")
    order = [path for path, _ in layout_lines()]
    errors_last = [path for path in order if path != "shardio/errors.py"] + ["shardio/errors.py"]
    assert ("shardio/format.py imports shardio/errors.py, listed below it: move "
            "shardio/errors.py's line above shardio/format.py's") in upward_imports(errors_last)
