"""benchmarks/e2e_decode.py's summary of repeated cases (CPU: the rows are given, no SGLang process runs)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import e2e_decode as e2e  # noqa: E402


def _row(context, fullkv, locks, **extra):
    return dict(shape="llama8b", batch=1, context=context, budget=2048, fullkv_ms=fullkv, locks_ms=locks,
                speedup=round(fullkv / locks, 3), tool="synthetic", locks_args="", **extra)


def test_repeated_cases_get_medians_and_the_range_of_their_speedups():
    rows = [_row(131072, 9.4, 6.2), _row(262144, 13.6, 7.0), _row(131072, 9.9, 6.1), _row(131072, 9.6, 6.4),
            _row(262144, 13.5, 6.8), _row(32768, 6.5, 6.0)]
    summary = {r["context"]: r for r in e2e.summarize(rows)}
    assert set(summary) == {131072, 262144}  # a case measured once gets no summary row
    s = summary[131072]
    assert (s["samples"], s["fullkv_ms"], s["locks_ms"]) == (3, 9.6, 6.2)
    assert s["speedup"] == round(9.6 / 6.2, 3)
    assert (s["speedup_min"], s["speedup_max"]) == (round(9.6 / 6.4, 3), round(9.9 / 6.1, 3))
    assert summary[262144]["fullkv_ms"] == (13.6 + 13.5) / 2


def test_failed_samples_and_other_locks_flags_are_kept_apart():
    rows = [_row(131072, 9.4, 6.2), _row(131072, 9.4, 6.0, error="exit 1"), _row(131072, 9.5, 6.3),
            dict(_row(131072, 9.4, 5.9), locks_args="--locks-prefilter 8")]
    (s,) = e2e.summarize(rows)
    assert s["samples"] == 2 and s["locks_args"] == "" and s["locks_ms"] == (6.2 + 6.3) / 2
