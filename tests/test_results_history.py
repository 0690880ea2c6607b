"""benchmarks/results_history.py: a run's rows appended to the history once, split into case and figures."""

import csv
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import results_history as rh  # noqa: E402


def _result(tmp_path, **header):
    path = tmp_path / "attention_decode.json"
    rows = [{"shape": "llama", "batch": 8, "context": 131072, "dense_ms": 29.6781, "locks_ms": 4.50412,
             "parts": {"score": 3.346}, "ok": True},
            {"shape": "glm", "batch": 1, "context": 1048576, "dense_ms": 10.007, "locks_ms": 2.089}]
    path.write_text(json.dumps({**header, "rows": rows}))
    return path


def test_rows_become_case_and_figures(tmp_path):
    history = tmp_path / "history.csv"
    path = _result(tmp_path, git="abc1234", gpu="NVIDIA H200", date="2026-12-01")
    assert rh.append(str(path), source="r.json", history=str(history)) == 2
    lines = list(csv.DictReader(open(history)))
    assert [l["benchmark"] for l in lines] == ["attention_decode"] * 2
    assert lines[0]["case"] == "shape=llama batch=8 context=131072 ok=True"
    assert lines[0]["figures"] == "dense_ms=29.68 locks_ms=4.504 parts.score=3.346"
    assert (lines[1]["git"], lines[1]["gpu"], lines[1]["date"]) == ("abc1234", "NVIDIA H200", "2026-12-01")


def test_a_run_is_recorded_once_and_later_runs_append(tmp_path):
    history = tmp_path / "history.csv"
    path = _result(tmp_path, git="abc1234", date="2026-12-01")
    rh.append(str(path), history=str(history))
    with pytest.raises(ValueError, match="already in"):
        rh.append(str(path), history=str(history))
    rh.append(str(_result(tmp_path, git="def5678", date="2026-12-02")), history=str(history))
    assert [l["git"] for l in csv.DictReader(open(history))] == ["abc1234"] * 2 + ["def5678"] * 2


def test_header_fields_missing_from_the_result_come_from_the_flags(tmp_path):
    history = tmp_path / "history.csv"
    path = _result(tmp_path)
    assert rh.main([str(path), "--git", "abc1234", "--gpu", "H200", "--date", "d", "--history", str(history)]) == 0
    assert {l["git"] for l in csv.DictReader(open(history))} == {"abc1234"}


@pytest.mark.parametrize("text, message", [("{not json", "not a result JSON"), ('{"command": "x"}', "no rows")])
def test_files_that_are_not_results_are_refused(tmp_path, capsys, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    assert rh.main([str(path), "--history", str(tmp_path / "h.csv")]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "h.csv").exists()
