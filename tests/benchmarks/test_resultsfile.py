"""``benchmarks/resultsfile.py``, the one results writer: every file carries what a figure
needs to be read later, and a question's own fields win over the stamp."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.resultsfile import command_line, write_results


def test_a_results_file_is_stamped_and_the_question_s_fields_win(tmp_path: Path) -> None:
    out = write_results(tmp_path / "sub" / "q.json", {"rows": [1, 2], "date": "2026-01-01"},
                        command="python -m benchmarks.q --rounds 3")
    assert out == tmp_path / "sub" / "q.json"
    written = json.loads(out.read_text(encoding="utf-8"))
    assert written["rows"] == [1, 2]
    assert written["date"] == "2026-01-01"
    assert written["command"] == "python -m benchmarks.q --rounds 3"
    assert written["machine"]["cores"] >= 1
    assert written["shardio_source"]["sha256"]
    assert "shardio" in written["versions"]
    assert isinstance(written["load_avg_1min_end"], float)


def test_the_command_defaults_to_how_this_process_was_started(tmp_path: Path) -> None:
    written = json.loads(write_results(tmp_path / "q.json", {}).read_text(encoding="utf-8"))
    assert written["command"].startswith("python -m ")
    assert str(tmp_path) not in written["command"]


def test_a_command_keeps_what_shapes_the_run_and_no_path_of_this_machine(tmp_path: Path
                                                                         ) -> None:
    argv = ["--rounds", "5", "--out", str(tmp_path / "w.json"), f"--work={tmp_path}",
            "--images", "400", "--json", str(tmp_path), "--quick"]
    assert command_line("benchmarks.bench_warm", argv) == (
        "python -m benchmarks.bench_warm --rounds 5 --images 400 --quick")
