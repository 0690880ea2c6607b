"""benchmarks/hicache_summary_cost.py runs end to end (CPU: tiny sizes, no timing) and counts the bytes it moves."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import hicache_summary_cost as hsc  # noqa: E402

from sglang_locks.summaries import PageSummaries  # noqa: E402


def test_rows_count_the_summary_and_kv_bytes_of_the_reloaded_pages(tmp_path, monkeypatch):
    import sglang_locks.summaries

    # The builds' torch path: the Triton kernel (tests/test_build_summaries.py) would run interpreted here.
    monkeypatch.setattr(sglang_locks.summaries, "_BUILD_KERNEL_MAX_PROGRAMS", 0)
    out = tmp_path / "cost.json"
    assert hsc.main(["--out", str(out), "--pages", "3,5", "--pool-pages", "9", "--layers", "2", "--reps", "1",
                     "--device", "cpu"]) == 0
    result = json.loads(out.read_text())
    per_page_head = PageSummaries.allocate(1, 1, hsc.HEAD_DIM, hsc.RANK, hsc.PRECISION).bytes_per_page_per_head()
    assert [r["pages"] for r in result["rows"]] == [3, 5]
    for r in result["rows"]:
        assert r["summary_bytes"] == r["pages"] * 2 * hsc.KV_HEADS * per_page_head
        assert r["kv_bytes"] == 2 * 2 * r["pages"] * 16 * hsc.KV_HEADS * hsc.HEAD_DIM * 2  # layers x (K, V) x bf16
    assert result["command"].startswith("python benchmarks/hicache_summary_cost.py")
