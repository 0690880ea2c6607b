"""benchmarks/attention_shared_prefix.py's CPU parts: cases, shared-prefix page tables, byte accounting, the
selected-page overlap and the ncu CSV parsing."""

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import attention_shared_prefix as asp  # noqa: E402

from sglang_locks.config import LocksConfig  # noqa: E402
from sglang_locks.summaries import PageSummaries  # noqa: E402


# ---------------------------------------------------------------------------------------------- cases
def test_parse_case_reads_k_suffixes():
    assert asp.parse_case("llama3.1-8b:32:96K:4k") == asp.Case("llama3.1-8b", 32, 98304, 4096)
    assert asp.parse_case("glm4-9b-1m:8:1000:17").key == "glm4-9b-1m:8:1000:17"


@pytest.mark.parametrize("text, field", [
    ("llama3.1-8b:32:96K", "shape:requests"), ("gpt:32:96K:4K", "shape"), ("llama3.1-8b:0:96K:4K", "requests"),
    ("llama3.1-8b:2:8:4K", "shared_tokens"), ("llama3.1-8b:2:96M:4K", "shared_tokens"),
    ("llama3.1-8b:2:96K:0", "own_tokens")])
def test_parse_case_names_the_bad_field(text, field):
    with pytest.raises(ValueError, match=field):
        asp.parse_case(text)


def test_own_lengths_are_seeded_and_within_the_spread():
    lens = asp.own_lengths(4096, 32, 1000, seed=3)
    assert lens == asp.own_lengths(4096, 32, 1000, seed=3)
    assert lens != asp.own_lengths(4096, 32, 1000, seed=4)
    assert all(3096 <= n <= 5096 for n in lens) and len(set(lens)) > 1
    assert asp.own_lengths(100, 3, 0, seed=0) == [100, 100, 100]
    with pytest.raises(ValueError, match="--own-spread"):
        asp.own_lengths(100, 3, 100, seed=0)


# ---------------------------------------------------------------------------------------------- page tables
@pytest.mark.parametrize("shared, own", [(64, [20, 40, 1]), (70, [10, 26, 3, 16]), (16, [5])])
def test_requests_share_the_prefix_pages_and_own_the_rest(shared, own):
    batch = asp.shared_prefix_batch(shared, own)
    s = shared // 16
    table = batch.req_to_token()
    assert batch.seq_lens == [shared + n for n in own]
    assert batch.shared_pages == list(range(1, s + 1))  # page 0 unused
    assert (table[:, : s * 16] == table[0, : s * 16]).all()
    own_pages = [set(p[s:]) for p in batch.request_pages]
    seen = set(batch.shared_pages)
    for pages in own_pages:
        assert pages and not pages & seen
        seen |= pages
    assert max(seen) == batch.num_pages - 1
    for b, pages in enumerate(batch.request_pages):
        n = batch.seq_lens[b]
        t = torch.arange(n)
        assert torch.equal(table[b, :n].long(), torch.tensor(pages)[t // 16] * 16 + t % 16)  # pages hold 16 slots
        assert (table[b, n:] == 0).all()
        assert len(pages) == -(-n // 16)


def test_a_prefix_ending_mid_page_is_each_requests_own():
    batch = asp.shared_prefix_batch(40, [8, 8])
    table = batch.req_to_token()
    assert len(batch.shared_pages) == 2
    assert torch.equal(table[0, :32], table[1, :32])
    assert not (table[0, 32:40] == table[1, 32:40]).any()  # the prefix's last 8 tokens: a copy per request


def test_cascade_levels_concatenate_to_the_stock_tables():
    batch = asp.shared_prefix_batch(70, [10, 26, 3, 16])
    indptr, indices, last = batch.stock_tables()
    qo, kv_indptr, kv_indices, kv_last = batch.cascade_tables()
    assert qo[0].tolist() == [0, 4] and qo[1].tolist() == [0, 1, 2, 3, 4]
    assert kv_indptr[0].tolist() == [0, 4] and kv_last[0].tolist() == [16]
    assert torch.equal(kv_last[1], last)
    for b in range(4):
        stock = indices[indptr[b]:indptr[b + 1]].tolist()
        own = kv_indices[1][kv_indptr[1][b]:kv_indptr[1][b + 1]].tolist()
        assert stock == kv_indices[0].tolist() + own == batch.request_pages[b]
        assert (len(stock) - 1) * 16 + int(last[b]) == batch.seq_lens[b]
        assert 1 <= int(last[b]) <= 16


# ---------------------------------------------------------------------------------------------- bytes
def test_step_bytes_count_each_mode():
    cfg = LocksConfig(token_budget=48)  # 3 pages a row
    batch = asp.shared_prefix_batch(64, [20, 40])  # lengths 84 and 104: 5 and 6 sealed pages, 4 shared
    layers, hkv, hq, d = asp.SHAPES["llama3.1-8b"]
    kv_token, summary = hkv * d * 4, hkv * 804
    got = asp.step_bytes("llama3.1-8b", batch, cfg)
    parts = got["locks_parts"]
    assert got["stock"] == layers * (84 + 104) * kv_token
    assert got["cascade"] == layers * (64 + 20 + 40) * kv_token
    assert parts["summaries"] == layers * (5 + 6) * summary
    assert parts["summaries_once"] == layers * (4 + 1 + 2) * summary
    # rows attend 3 sealed pages and their tails of 4 and 8 tokens: 1 + 1 entries more
    assert parts["selected_kv"] == layers * hkv * (48 + 4 + 48 + 8) * d * 4
    assert parts["entries"] == layers * hkv * (4 + 4) * 8
    assert got["locks"] - got["locks_once"] == parts["summaries"] - parts["summaries_once"]


def test_one_request_reads_no_less_for_sharing():
    got = asp.step_bytes("glm4-9b-1m", asp.shared_prefix_batch(4096, [1000]), LocksConfig())
    assert got["cascade"] == got["stock"]
    assert got["locks_parts"]["summaries_once"] == got["locks_parts"]["summaries"]


def test_step_bytes_match_issue_40s_estimates():
    """Llama-3.1-8B, 32 requests x 96K shared + 4K own, budget 2048, per layer: stock ~13 GB, cascade ~0.93 GB,
    summaries ~1.3 GB per request and ~0.09 GB once, ~0.27 GB of selected KV."""
    batch = asp.shared_prefix_batch(98304, asp.own_lengths(4096, 32, 1000, 0))
    got = asp.step_bytes("llama3.1-8b", batch, LocksConfig())
    per_layer = {k: v / 32 / 1e9 for k, v in {**got, **got["locks_parts"]}.items() if k != "locks_parts"}
    for key, issue in (("stock", 13), ("cascade", 0.93), ("summaries", 1.3), ("summaries_once", 0.09),
                       ("selected_kv", 0.27)):
        assert per_layer[key] == pytest.approx(issue, rel=0.1), key


# ---------------------------------------------------------------------------------------------- overlap
def _entries(rows, hkv):
    """indptr, indices of rows given as lists of physical pages (entry = first slot * hkv + head)."""
    indptr = torch.tensor([0] + [len(r) for r in rows]).cumsum(0)
    indices = torch.tensor([p * 16 * hkv + i % hkv for i, r in enumerate(rows) for p in r])
    return indptr, indices


def test_selection_overlap_counts_shared_pages_once_per_head():
    hkv = 2
    # requests 0 and 1, heads 0 and 1; shared pages 1-4, own pages 5+
    rows = [[1, 2, 5], [1, 3, 6], [1, 2, 7], [4, 8, 9]]
    got = asp.selection_overlap(*_entries(rows, hkv), hkv, shared_pages=[1, 2, 3, 4])
    assert got["selected_pages"] == 12 and got["selected_shared_pages"] == 2 + 2 + 2 + 1
    assert got["shared_fraction"] == 7 / 12
    assert got["distinct_shared_pages"] == 2 + 3  # head 0: {1, 2}; head 1: {1, 3, 4}
    assert got["shared_once_fraction"] == 5 / 7
    assert got["selected_kv_saved_fraction"] == 2 / 12


def test_selection_overlap_rejects_an_entry_of_another_head():
    indptr, indices = _entries([[1], [2]], 2)
    with pytest.raises(ValueError, match="KV head"):
        asp.selection_overlap(indptr, indices.flip(0), 2, [1, 2])


def _random_summaries_on(device):
    def make(num_pages, hkv, d, rank):
        s = PageSummaries.allocate(num_pages, hkv, d, rank, "int8-int4-int8", device)
        for t, lo, hi in ((s.mu, -127, 128), (s.basis, 0, 256), (s.coef, -127, 128)):
            t.random_(lo, hi)
        s.mu_scale.uniform_(0.01, 0.05)
        s.coef_scale.uniform_(0.001, 0.01)
        return s
    return make


def test_selected_entries_are_each_requests_own_pages(device, monkeypatch):
    """One layer of LocksDecode on a shared-prefix batch (Triton's interpreter on CPU): the entries read back are
    each row's selected pages of its own request and KV head, the forced sink page among them."""
    if device == "cpu":  # attention_decode.random_summaries allocates on the GPU
        monkeypatch.setattr(asp, "random_summaries", _random_summaries_on("cpu"))
    torch.manual_seed(0)
    cfg = LocksConfig(token_budget=64)
    batch = asp.shared_prefix_batch(200, [37, 60, 5])  # 12 shared pages; lengths 237, 260, 205
    inputs = asp.DeviceInputs("glm4-9b-1m", batch, cfg, 0, 0, device=device)
    dec, _ = inputs.locks(cfg)
    indptr, indices = asp.selected_entries(dec, inputs, batch, inputs.q)
    hkv = inputs.hkv
    assert indptr.tolist() == [5 * r for r in range(7)]  # 4 budget pages and the tail, per row
    for row in range(batch.requests * hkv):
        b, h = divmod(row, hkv)
        entries = indices[indptr[row]:indptr[row + 1]].long()
        assert (entries % hkv == h).all()
        first = entries // hkv
        assert (first % 16 == 0).all()
        pages = (first // 16).tolist()
        assert set(pages) <= set(batch.request_pages[b])
        assert pages[0] == batch.shared_pages[0] and pages[-1] == batch.request_pages[b][-1]
    got = asp.selection_overlap(indptr, indices, hkv, batch.shared_pages)
    assert got["selected_pages"] == 30 and got["distinct_shared_pages"] >= hkv


# ---------------------------------------------------------------------------------------------- ncu
NCU_CSV = """==PROF== Connected to process 123 (/usr/bin/python3.12)
profiled one LOCKS step, this line, too, is no table
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","dram__bytes_read.sum"
"","","","","","","","Mbyte"
"0","123","python3.12","127.0.0.1","_score_pages_gluon_kernel","1","7","46.25"
"1","123","python3.12","127.0.0.1","_select_kernel","1","7","3.00"
"2","123","python3.12","127.0.0.1","_score_pages_gluon_kernel","1","7","1,046.75"
==PROF== Disconnected from process 123
"""


def test_parse_ncu_csv_sums_the_score_launches_in_bytes():
    total, launches = asp.parse_ncu_csv(NCU_CSV)
    assert launches == 2 and total == pytest.approx((46.25 + 1046.75) * 1e6)
    assert asp.parse_ncu_csv(NCU_CSV.replace("Mbyte", "byte"), "select") == (3.0, 1)


@pytest.mark.parametrize("text, message", [("no table at all", "dram__bytes_read.sum"),
                                           (NCU_CSV.replace("_score_pages", "_other"), "no launch"),
                                           (NCU_CSV.replace("46.25", "n/a"), "not a number")])
def test_parse_ncu_csv_says_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        asp.parse_ncu_csv(text)


LAUNCHES_CSV = """==PROF== Connected to process 77 (/usr/bin/python3.12)
"ID","Kernel Name","Block Size","gpu__time_duration.sum","dram__bytes_read.sum","launch__block_dim_x","launch__grid_size"
"","","","ns","byte","block",""
"0","_score_pages_kernel","(128, 1, 1)","432,384","55,715,328","128","1,280"
"1","_score_pages_kernel","(128, 1, 1)","120,992","73,807,872","128","1,280"
"2","_score_pages_kernel","(128, 1, 1)","434,208","55,772,416","128","1,280"
"""


def test_ncu_launches_reads_every_metric_in_base_units():
    metrics = tuple(asp.LAUNCH_METRICS)
    launches = asp.ncu_launches(LAUNCHES_CSV.replace('"ns"', '"usecond"'), "_score_", metrics)
    assert [launch["kernel"] for launch in launches] == ["_score_pages_kernel"] * 3
    assert launches[1]["gpu__time_duration.sum"] == pytest.approx(120992e-6)
    assert launches[1]["launch__grid_size"] == 1280 and launches[2]["dram__bytes_read.sum"] == 55772416
    with pytest.raises(ValueError, match="unit 'furlong'"):
        asp.ncu_launches(LAUNCHES_CSV.replace('"ns"', '"furlong"'), "_score_", metrics)
    # columns not asked for are not read: their units are theirs (launch__block_dim_x's "block")
    assert "launch__block_dim_x" not in launches[0] and len(asp.ncu_launches(LAUNCHES_CSV)) == 3


def test_score_launch_rows_name_each_launch_by_its_place_in_the_layer():
    rows = asp.score_launch_rows("locks_prefilter", LAUNCHES_CSV)
    assert [r["launch"] for r in rows] == ["estimate", "candidates", "estimate"]
    assert rows[0]["gpu_time_us"] == pytest.approx(432.384) and rows[0]["grid_size"] == 1280
    # a profile without the time metric leaves it None rather than guessing
    dram_only = asp.score_launch_rows("locks", NCU_CSV, "_score_pages")
    assert [(r["launch"], r["gpu_time_us"]) for r in dram_only] == [("per_request", None)] * 2
    assert dram_only[1]["dram_bytes"] == pytest.approx(1046.75e6)
    with pytest.raises(ValueError, match="mode 'dense'"):
        asp.score_launch_rows("dense", LAUNCHES_CSV)


def _results():
    row = {"case": "llama3.1-8b:32:98304:4096", "own_spread": 1000, "seed": 0, "layers": 32,
           "summary_bytes_once": 4e9, "summary_bytes": 40e9}
    return {"rows": [row, {**row, "seed": 1}]}


def test_merge_scoring_dram_scales_one_layer_to_the_step():
    results = _results()
    case = asp.parse_case("llama3.1-8b:32:96K:4K")
    row = asp.merge_scoring_dram(results, case, 1000, 0, dram_bytes=250e6, launches=2)
    assert row is results["rows"][0] and "scoring_dram_bytes" not in results["rows"][1]
    assert row["scoring_dram_bytes"] == 125e6 * 32
    assert row["scoring_dram_vs_summary_once"] == pytest.approx(1.0)
    assert row["scoring_dram_vs_summary_per_request"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="matches 0 rows"):
        asp.merge_scoring_dram(results, case, 500, 0, 1.0, 1)


def test_cli_help_and_ncu_merge_run_without_a_gpu(tmp_path):
    script = os.path.join(ROOT, "benchmarks", "attention_shared_prefix.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and "--profile-scoring" in run.stdout
    out, ncu = tmp_path / "r.json", tmp_path / "ncu.csv"
    out.write_text(json.dumps(_results()))
    ncu.write_text(NCU_CSV)
    run = subprocess.run([sys.executable, script, "--out", str(out), "--ncu-csv", str(ncu), "--case",
                          "llama3.1-8b:32:96K:4K"], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert json.loads(out.read_text())["rows"][0]["scoring_dram_bytes"] == pytest.approx(1093e6 / 2 * 32)
    run = subprocess.run([sys.executable, script, "--case", "llama3.1-8b:32:96K:4K", "--case", "glm4-9b-1m:1:32:4",
                          "--profile-scoring", "--own-spread", "0"], capture_output=True, text=True, env=env)
    assert run.returncode == 2 and "exactly one --case" in run.stderr


def test_cli_writes_the_score_launches_under_the_runs_header(tmp_path):
    script = os.path.join(ROOT, "benchmarks", "attention_shared_prefix.py")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out, launches, prefilter, shared = (tmp_path / n for n in ("r.json", "k.json", "p.csv", "s.csv"))
    out.write_text(json.dumps({"gpu": "NVIDIA H200", "git": "abc1234", "date": "2026-12-02", **_results()}))
    prefilter.write_text(LAUNCHES_CSV)
    shared.write_text(LAUNCHES_CSV.replace("_score_pages_kernel", "_score_segments_kernel"))
    run = subprocess.run([sys.executable, script, "--out", str(out), "--case", "llama3.1-8b:32:96K:4K",
                          "--launches-out", str(launches), "--ncu-launches", f"locks_prefilter={prefilter}",
                          "--ncu-launches", f"locks_shared={shared}"], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    written = json.loads(launches.read_text())
    assert (written["git"], written["case"]) == ("abc1234", "llama3.1-8b:32:98304:4096")
    assert [(r["mode"], r["launch"]) for r in written["rows"]] == [
        ("locks_prefilter", "estimate"), ("locks_prefilter", "candidates"), ("locks_prefilter", "estimate"),
        ("locks_shared", "shared_run"), ("locks_shared", "own_pages"), ("locks_shared", "shared_run")]
    run = subprocess.run([sys.executable, script, "--ncu-launches", "fast=x.csv", "--case", "llama3.1-8b:32:96K:4K"],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 2 and "--ncu-launches takes MODE=CSV" in run.stderr


def test_the_prefilter_mode_is_configured_from_its_flags():
    args = asp.parse_args(["--prefilter", "4", "--prefilter-rank", "2", "--case", "llama3.1-8b:4:32K:1K"])
    assert (args.prefiltered.prefilter, args.prefiltered.prefilter_rank) == (4, 2)
    assert args.prefiltered.token_budget == args.config.token_budget and args.config.prefilter == 0
    assert asp.parse_args(["--prefilter", "0", "--case", "llama3.1-8b:4:32K:1K"]).prefiltered is None


@pytest.mark.parametrize("argv, message", [(["--prefilter", "-1"], "--prefilter"),
                                           (["--prefilter-rank", "9"], "--prefilter-rank")])
def test_bad_prefilter_flags_name_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        asp.parse_args(argv + ["--case", "llama3.1-8b:4:32K:1K"])
    assert e.value.code == 2 and message in capsys.readouterr().err
