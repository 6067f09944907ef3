"""The package as published and as set up from a clone: one version, the distribution
name and extras the README's install lines use, a license file matching the metadata,
and two independent environments in the README's set-up commands."""

from __future__ import annotations

import importlib.metadata
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

import shardio

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

REPO = Path(__file__).resolve().parents[2]
DISTRIBUTION = "shardio-torch"
"""The name on PyPI (``shardio`` there is an unrelated project); imported as ``shardio``."""


def pyproject() -> dict[str, Any]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return dict(tomllib.load(f))


def readme_section(title: str) -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_version_is_set_in_one_place() -> None:
    project = pyproject()["project"]
    assert project["name"] == DISTRIBUTION
    assert "version" not in project and "version" in project["dynamic"]
    assert pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "shardio.version.__version__"}
    # the installed distribution (README step 2, .ci/run) reports what the code says
    assert importlib.metadata.version(DISTRIBUTION) == shardio.__version__
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"\n## [{shardio.__version__}]" in changelog


def test_the_license_file_matches_the_metadata() -> None:
    project = pyproject()["project"]
    assert project["license"] == "Apache-2.0"  # an SPDX expression, not a table
    assert project["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert importlib.metadata.metadata(DISTRIBUTION)["License-Expression"] == "Apache-2.0"


def test_every_install_line_of_the_readme_names_this_package_and_extras_it_has() -> None:
    extras = set(pyproject()["project"]["optional-dependencies"])
    text = (REPO / "README.md").read_text(encoding="utf-8")
    lines = re.findall(r"pip install ([^`\n&;]+)", text)
    assert len(lines) >= 6
    named = []
    for line in lines:
        for word in shlex.split(line.split("#", 1)[0]):
            match = re.fullmatch(r"(\.|shardio[-\w]*)(?:\[([\w,]+)\])?", word)
            if match is None:
                continue  # torch==2.13.0, pillow-simd, -e
            # the clone (".") or the published name, never PyPI's unrelated `shardio`
            assert match[1] in {".", DISTRIBUTION}, line
            assert set((match[2] or "").split(",")) - {""} <= extras, line
            named.append(match[1])
    assert "." in named and DISTRIBUTION in named


def test_the_two_set_up_commands_build_two_independent_environments() -> None:
    block = re.search(r"```bash\n(.*?)```", readme_section("Set up"), re.DOTALL)
    assert block is not None
    commands = [line for line in block[1].splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    venvs = []
    for command in commands:
        made = re.findall(r"python3 -m venv (\S+)", command)
        used = set(re.findall(r"(\.venv[-\w]*)/bin/", command))
        assert len(made) == 1 and used == set(made), command  # made here, and only it used
        venvs.append(made[0])
    assert venvs[0] != venvs[1]
    main, tests = commands
    assert "-e . " in main + " " and "[test]" not in main  # the main job's: no test extra
    assert '-e ".[test]"' in tests and "pytest" in tests
