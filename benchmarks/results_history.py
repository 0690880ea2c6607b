"""Append one benchmark run to benchmarks/results/history.csv, one line per case of the run.

    python benchmarks/results_history.py benchmarks/results/attention_decode.json [--benchmark NAME]

Columns: benchmark, case, figures, git, gpu, date, source. ``case`` holds a row's identifying
fields (its strings and booleans, and the integer settings named in CASE_KEYS) and ``figures`` its
measured numbers (nested ones as ``outer.inner``), both as space-separated key=value pairs; numbers
keep 4 significant digits. git, gpu and date come from the result's header (--git, --gpu, --date
where it has none). The file is append-only: a run already recorded (same source, git and date)
is refused.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from typing import Dict, Iterator, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HISTORY = os.path.join(REPO, "benchmarks", "results", "history.csv")
COLUMNS = ("benchmark", "case", "figures", "git", "gpu", "date", "source")
# Integer fields that say which case a row is rather than what it measured.
CASE_KEYS = {"batch", "bs", "context", "context_len", "budget", "group", "hkv", "hq", "pages", "rank", "prefilter", "prefilter_rank",
             "block_pages", "num_warps", "num_stages", "chunk_pages", "maxnreg", "programs_per_sm", "process",
             "device_call", "call", "run", "pairs", "stages", "split", "tile", "layers", "queries_per_layer", "n",
             "secrets", "samples", "processes", "head_dim", "rep", "round", "repeat"}
# Lists of rows in a result (in this order); a "runs" list holds runs with headers of their own.
ROW_LISTS = ("rows", "summary", "recall_summary")


def _number(value: float) -> str:
    return f"{value:.4g}"


def _flatten(prefix: str, value, out: Dict[str, str]) -> None:
    """Numbers of a nested dict as prefix.key; lists and strings below the row's top level are left out."""
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        out[prefix] = _number(value)
    elif isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}", inner, out)


def split_row(row: dict) -> Tuple[str, str]:
    """(case, figures) of one result row."""
    case: Dict[str, str] = {}
    figures: Dict[str, str] = {}
    for key, value in row.items():
        if isinstance(value, bool) or value is None:
            case[key] = str(value)
        elif isinstance(value, str):
            if value:
                case[key] = "_".join(value.split())
        elif isinstance(value, int) and key in CASE_KEYS:
            case[key] = str(value)
        else:
            _flatten(key, value, figures)
    return (" ".join(f"{k}={v}" for k, v in case.items()),
            " ".join(f"{k}={v}" for k, v in figures.items()))


def _header(result: dict, parent: dict) -> Dict[str, str]:
    head = {}
    for key, names in (("git", ("git",)), ("gpu", ("gpu", "device", "machine")), ("date", ("date",))):
        value = next((r[n] for n in names for r in (result, parent) if r.get(n) not in (None, "")), None)
        head[key] = " ".join(str(value).split()) if value is not None else ""
    return head


def _rows_of(result: dict) -> Iterator[Tuple[str, dict]]:
    """(kind, row) of a result: its row lists, the sizes of summary_build.py, or its top-level numbers."""
    found = False
    for name in ROW_LISTS:
        rows = result.get(name)
        if isinstance(rows, list):
            found = True
            for row in rows:
                if isinstance(row, dict):
                    yield name, row
    if isinstance(result.get("sizes"), dict):  # summary_build.py: {pages: {path: {ms, ...}}}
        found = True
        for pages, paths in result["sizes"].items():
            yield "rows", {"pages": int(pages), **paths}
    if not found:
        numbers = {k: v for k, v in result.items() if k not in ("git", "gpu", "date", "command") and
                   not isinstance(v, (str, list))}
        if numbers:
            yield "rows", numbers


def runs_of(data) -> Iterator[Tuple[dict, dict]]:
    """(run, parent) pairs: a result with "runs" holds several, each with its own header."""
    if isinstance(data, list):
        yield {"rows": data}, {}
    elif isinstance(data.get("runs"), list):
        for run in data["runs"]:
            yield run, data
    else:
        yield data, {}


def history_lines(data, benchmark: str, source: str, defaults: Dict[str, str]) -> List[Dict[str, str]]:
    lines = []
    for run, parent in runs_of(data):
        head = _header(run, parent)
        head = {k: head[k] or defaults.get(k, "") for k in head}
        for kind, row in _rows_of(run):
            case, figures = split_row(row)
            if kind != "rows":
                case = f"{kind} {case}".strip()
            lines.append(dict(benchmark=benchmark, case=case, figures=figures, source=source, **head))
    return lines


def append(path: str, benchmark: Optional[str] = None, source: Optional[str] = None,
           defaults: Optional[Dict[str, str]] = None, history: str = HISTORY) -> int:
    """Append the run in result file path to history; the number of lines written."""
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not a result JSON ({e})") from None
    name = benchmark or os.path.splitext(os.path.basename(path))[0]
    lines = history_lines(data, name, source or os.path.relpath(os.path.abspath(path), REPO), defaults or {})
    if not lines:
        raise ValueError(f"{path}: no rows to record (expected 'rows', 'runs', 'summary' or 'sizes')")
    exists = os.path.exists(history) and os.path.getsize(history) > 0
    if exists:
        with open(history, newline="") as f:
            recorded = {(r["source"], r["git"], r["date"]) for r in csv.DictReader(f)}
        if (lines[0]["source"], lines[0]["git"], lines[0]["date"]) in recorded:
            raise ValueError(f"{path}: this run (git {lines[0]['git']!r}, date {lines[0]['date']!r}) is "
                             f"already in {history}")
    with open(history, "a", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        if not exists:
            writer.writeheader()
        writer.writerows(lines)
    return len(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("result", help="a benchmark's result JSON")
    p.add_argument("--benchmark", help="name in the history (default: the file's name without .json)")
    p.add_argument("--source", help="file named in the history (default: the result's path from the repository root)")
    p.add_argument("--git", default="", help="revision measured, where the result's header has none")
    p.add_argument("--gpu", default="", help="GPU, where the result's header has none")
    p.add_argument("--date", default="", help="date of the run, where the result's header has none")
    p.add_argument("--history", default=HISTORY)
    args = p.parse_args(argv)
    try:
        n = append(args.result, args.benchmark, args.source, dict(git=args.git, gpu=args.gpu, date=args.date),
                   args.history)
    except (OSError, ValueError) as e:
        print(f"results_history: {e}", file=sys.stderr)
        return 1
    print(f"{n} lines appended to {args.history}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
