"""Every argument and option of every ``shardio`` command, fed invalid values (issue 28, item 12).

The commands and their parameters are walked from ``shardio.cli`` itself, so a new option is
fuzzed without a line here. Each parameter gets values its type must refuse (out of range,
wrong type, empty, a missing path, a URL with an odd scheme) and values it may take or refuse
(a huge seed, a NUL byte in a glob). Whatever happens, no exception escapes the command (in a
shell: no traceback), and a non-zero exit prints an ``Error:`` line saying what to fix. Runs
in-process through click's ``CliRunner``; nothing contacts any address but 127.0.0.1.
"""

from __future__ import annotations

import itertools
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

import shardio
from shardio.cli import COMMANDS, load_command, main
from shardio.cli.options import DatasetParam, SizeParam
from shardio.synth import make_imagefolder, make_tiny_tree

pytestmark = pytest.mark.slow

OUTPUTS = {("pack", "out"), ("merge", "out"), ("unpack", "dest"), ("preview", "output"),
           ("demo", "keep"), ("cat", "output"), ("doctor", "plot"), ("*", "cache_dir")}
"""Paths a command creates: a missing one is what they expect, so it is not fed as invalid."""


@dataclass(frozen=True)
class Bad:
    """One value for one parameter; ``refused``: the command must exit non-zero."""

    text: str
    refused: bool
    why: str


@dataclass
class World:
    """Real files the baselines run on; ``new()`` is a path no case has used."""

    root: Path
    counter: itertools.count[int]

    def new(self) -> str:
        return str(self.root / f"new{next(self.counter)}")

    def fill(self, argv: list[str]) -> list[str]:
        return [self.new() if a == "{new}" else a.format(root=self.root) for a in argv]


BASELINES = {
    "pack": ["{root}/src", "{new}", "--num-workers", "1", "--no-progress"],
    "merge": ["{root}/gen", "{root}/gen2", "{new}"],
    "info": ["{root}/gen"],
    "ls": ["{root}/gen", "--limit", "2"],
    "cat": ["{root}/gen", "d00/d00/file_0000000", "bin"],
    "preview": ["{root}/img", "-o", "{new}", "--n", "2"],
    "verify": ["{root}/gen"],
    "unpack": ["{root}/gen", "{new}"],
    "demo": ["--images", "5", "--keep", "{new}"],
    "bench": ["{root}/gen", "--max-workers", "0", "--max-samples", "1", "--min-seconds", "0"],
    "doctor": ["{root}/gen", "--steps", "2", "--batch-size", "2", "--num-workers", "0",
               "--no-verify"],
}
"""A valid command line per command, options first where a case appends its own."""


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("cli-fuzz")
    make_tiny_tree(root / "src", num_files=6, files_per_folder=3, min_bytes=64, max_bytes=128)
    make_tiny_tree(root / "src2", num_files=3, seed=1, min_bytes=64, max_bytes=128)
    (root / "src2" / "d00").rename(root / "src2" / "e00")  # keys apart from src's
    make_imagefolder(root / "imgsrc", num_classes=2, per_class=2, long_side=(32, 40))
    for src, out in (("src", "gen"), ("src2", "gen2"), ("imgsrc", "img")):
        shardio.pack(root / src, root / out, num_workers=1, progress=False)
    (root / "a-file").write_bytes(b"not a folder")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # a relative path a case makes lands here, not in the checkout
        yield World(root, itertools.count())


def run(argv: list[str], env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, argv, env=env)


def check(result: Result, case: str, bad: Bad | None) -> None:
    """No exception escaped; a failure says ``Error:``; a value that must be refused was."""
    escaped = result.exception is not None and not isinstance(result.exception, SystemExit)
    assert not escaped, f"{case}: {result.exception!r} escaped (a traceback in a shell)"
    assert "Traceback" not in result.output, f"{case}: {result.output}"
    if result.exit_code != 0:
        assert "Error:" in result.output, f"{case}: exit {result.exit_code}, no Error: line: " \
                                          f"{result.output}"
    if bad is not None and bad.refused:
        assert result.exit_code != 0, f"{case}: {bad.why} was accepted: {result.output}"


def bad_values(command: str, param: click.Parameter, world: World) -> Iterator[Bad]:
    """The values ``param`` of ``command`` is fed, from its type."""
    kind = param.type
    if isinstance(param, click.Option) and param.is_flag:
        return  # a flag takes no value: fed as --flag=value by flag_cases
    if isinstance(kind, click.Choice):
        yield Bad("bogus", True, "a value not among the choices")
        yield Bad("", True, "an empty choice")
    elif isinstance(kind, (click.types.IntParamType, click.types.FloatParamType)):
        yield Bad("abc", True, "a word for a number")
        yield Bad("", True, "an empty number")
        if isinstance(kind, click.types.IntParamType):
            yield Bad("1.5", True, "a fraction for an integer")
        else:
            yield Bad("nan", True, "nan")
        low = getattr(kind, "min", None)
        high = getattr(kind, "max", None)
        if low is not None:
            yield Bad(str(low - 1), True, "below the range")
        if high is not None:
            yield Bad(str(high + 1), True, "above the range")
            yield Bad(str(10**30), True, "far above the range")
        if low is None and high is None:
            yield Bad(str(2**64), False, "a huge number")
            yield Bad("-1", False, "a negative number")
    elif isinstance(kind, SizeParam):
        for text, why in (("-1", "a negative size"), ("abc", "a word"), ("", "an empty size"),
                          ("0", "zero bytes"), ("1ZB", "an unknown unit")):
            yield Bad(text, True, why)
        yield Bad("9" * 30 + "TB", False, "a huge size")
    elif isinstance(kind, (click.Path, DatasetParam)):
        output = (command, param.name) in OUTPUTS or ("*", param.name) in OUTPUTS
        yield Bad("", True, "an empty path")
        yield Bad(" ", not output, "a blank path")
        yield Bad("zz://host/x", True, "a URL with an unknown scheme")
        yield Bad("s3://", True, "a URL naming no bucket")
        if not output:
            yield Bad(str(world.root / "missing"), True, "a missing path")
            yield Bad("memory://nothing/here", True, "a URL holding no dataset")
            yield Bad("file:///nonexistent/x", True, "a file:// URL to nothing")
        if isinstance(kind, click.Path):  # LocalPath too
            yield Bad("memory://x/y", True, "a URL for a local path")
        if getattr(kind, "file_okay", True) is False or isinstance(kind, DatasetParam):
            yield Bad(str(world.root / "a-file"), True, "a file for a folder")
    else:  # free text: a glob, a class name, a key, an address
        yield Bad("", False, "an empty string")
        yield Bad("a\x00b", False, "a NUL byte")
        yield Bad("../../../etc/passwd", False, "a path escaping upwards")


def cases(world: World) -> Iterator[tuple[str, list[str], dict[str, str] | None, Bad]]:
    """``(case name, argv, env, value)`` for every parameter of every command."""
    for name in COMMANDS:
        command = load_command(name)
        base = BASELINES[name]
        arguments = [p for p in command.params if isinstance(p, click.Argument)]
        for param in command.params:
            if isinstance(param, click.Argument):
                position = arguments.index(param)
                for bad in bad_values(name, param, world):
                    argv = list(base)
                    argv[position] = bad.text
                    yield f"{name} {param.name}={bad.text!r}", [name, *argv], None, bad
                continue
            assert isinstance(param, click.Option)
            flag = param.opts[-1]
            if param.is_flag:
                yield (f"{name} {flag}=bogus", [name, *base, f"{flag}=bogus"], None,
                       Bad("bogus", True, "a value for a flag"))
                continue
            for bad in bad_values(name, param, world):
                yield f"{name} {flag} {bad.text!r}", [name, *base, flag, bad.text], None, bad
                if isinstance(param.envvar, str) and bad.text:  # click ignores an empty one
                    given = [i for i, a in enumerate(base) if a in param.opts]
                    unset = base[:given[0]] + base[given[0] + 2:] if given else base
                    yield (f"{name} ${param.envvar}={bad.text!r}", [name, *unset],
                           {param.envvar: bad.text}, bad)


def test_every_baseline_runs(world: World) -> None:
    """The command lines the values are swapped into are valid: a refusal is the value's."""
    for name in COMMANDS:
        result = run([name, *world.fill(BASELINES[name])])
        check(result, name, None)
        assert result.exit_code == 0, f"{name}: {result.output}"


def test_every_invalid_value_is_an_error_line(world: World) -> None:
    seen, failures = set(), []
    for case, argv, env, bad in cases(world):
        seen.add(argv[0])
        try:
            check(run(world.fill(argv), env), case, bad)
        except AssertionError as exc:
            failures.append(str(exc).partition("\n")[0])
    assert not failures, "\n".join(failures)
    assert seen == set(COMMANDS)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("extra", [
    ["--level", "99"],
    ["--level", "-200000"],
    ["--codec", "none", "--level", "5"],
    ["--engine", "dask", "--scheduler", "tcp://127.0.0.1:{port}"],
    ["--engine", "dask", "--scheduler", "127.0.0.1"],
    ["--engine", "dask", "--scheduler", "ftp://127.0.0.1:{port}"],
    ["--engine", "dask", "--scheduler", ""],
])
def test_pack_arguments_from_the_issue(world: World, extra: list[str]) -> None:
    """``pack --level 99`` was a ValueError from zstd after the walk; a scheduler address that
    nothing answers was a raw OSError after 30 s; an empty one started a local cluster."""
    port = str(free_port())
    argv = ["pack", *world.fill(BASELINES["pack"]), *(a.replace("{port}", port) for a in extra)]
    result = run(argv)
    check(result, " ".join(extra), Bad(extra[-1], True, "the issue's value"))
    assert "--scheduler" not in extra or "scheduler" in result.output


def test_bench_tensor_on_a_generic_pack_says_use_raw(world: World) -> None:
    result = run(["bench", *world.fill(BASELINES["bench"]), "--mode", "tensor"])
    check(result, "bench --mode tensor", Bad("tensor", True, "tensor on a generic pack"))
    assert "--mode raw" in result.output


def test_in_a_shell_the_error_is_one_line_and_no_traceback(world: World) -> None:
    """The same through a real process: stderr holds the ``Error:`` line and no traceback."""
    out = world.new()
    done = subprocess.run(
        [sys.executable, "-m", "shardio", "pack", str(world.root / "src"), out, "--level", "23"],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "Error:" in done.stderr
