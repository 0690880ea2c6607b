"""benchmarks/e2e_decode.py's case selection and summary of repeated cases (CPU: no SGLang process runs)."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import e2e_decode as e2e  # noqa: E402


def _row(context, fullkv, locks, **extra):
    return dict(shape="llama8b", batch=1, context=context, budget=2048, fullkv_ms=fullkv, locks_ms=locks,
                speedup=round(fullkv / locks, 3), tool="synthetic", locks_args="", **extra)


def test_cases_pick_plan_contexts_and_refuse_others():
    assert e2e.selected_cases(None, ["interleaved:llama8b:1:262144"]) == [("interleaved", "llama8b", 1, [262144])]
    with pytest.raises(ValueError, match=r"contexts \[4096\] are not in the plan"):
        e2e.selected_cases(None, ["interleaved:llama8b:1:4096,131072"])
    with pytest.raises(ValueError, match="no such TOOL:SHAPE:BATCH"):
        e2e.selected_cases(None, ["interleaved:llama8b:3"])


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


class _Backend:
    """The LOCKS backend's part that alternate_variants drives: a step's variant follows min_step_tokens."""

    def __init__(self, variants=("locks", "dense")):
        self.min_step_tokens = 32768
        self.variants = variants

    def graph_variants(self):
        return self.variants

    def variant(self, tokens=131072):
        return "dense" if tokens < self.min_step_tokens else "locks"


def test_interleaved_steps_alternate_the_variants_and_restore_the_threshold():
    backend = _Backend()
    seen = []

    def step():
        seen.append(backend.variant())
        return {"locks": 6.0, "dense": 9.0}[seen[-1]] + len(seen) / 1000

    times = e2e.alternate_variants(backend, step, 4, block=2)
    assert seen == ["locks", "locks", "dense", "dense"] * 2
    assert [round(t) for t in times[""]] == [6] * 4 and [round(t) for t in times["dense_"]] == [9] * 4
    assert backend.min_step_tokens == 32768
    with pytest.raises(ValueError, match="multiple of the block"):
        e2e.alternate_variants(backend, step, 4, block=3)
    with pytest.raises(ValueError, match="both decode graph variants"):
        e2e.alternate_variants(_Backend(("locks",)), step, 1)


def test_an_interleaved_case_is_one_locks_process_whose_dense_steps_are_the_fullkv_side(tmp_path, capsys):
    out = tmp_path / "e2e.json"
    assert e2e.main(["--dry-run", "--case", "interleaved:llama8b:1:131072", "--out", str(out)]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("e2e_decode: ")
                and "--synthetic-worker" in line]
    assert len(commands) == 1 and "--interleave" in commands[0] and "--enable-locks" in commands[0]
    result = tmp_path / "r.jsonl"
    result.write_text(json.dumps(dict(batch_size=1, input_len=131072, median_decode_latency=0.0062,
                                      mean_decode_latency=0.0063, dense_median_decode_latency=0.0095,
                                      dense_mean_decode_latency=0.0096)) + "\n")
    locks, dense = e2e.read_step_times(str(result)), e2e.read_step_times(str(result), "dense_")
    (row,) = e2e.merge_rows("interleaved", "llama8b", 1, [131072], 2048, dense, locks, {})
    assert (row["fullkv_ms"], row["locks_ms"], row["speedup"]) == (9.5, 6.2, round(9.5 / 6.2, 3))
