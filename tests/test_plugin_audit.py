"""--locks-audit-every: the recall audit through LOCKS's attention backend on the CPU (SGLang's pools and the
summary store of plugin_helpers.Harness), its Prometheus series, and its flag."""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from plugin_helpers import FP8, FP8_K_SCALES, FP8_V_SCALES, HEAD_DIM, KV_HEADS, LAYERS, Harness, cached_form
from sglang_locks.config import PAGE_SIZE, LocksConfig
from sglang_locks.evaluate import _token_mask, evaluate
from sglang_locks.kernels.page_selection import selected_indices_torch
from sglang_locks.plugin.audit import AuditConfig, RecallAudit, layer_groups
from sglang_locks.plugin.audit_metrics import AuditMetrics
from sglang_locks.plugin.graph_variants import DENSE, LOCKS
from sglang_locks.scoring import locks_aggregate_torch
from sglang_locks.selection import select_pages, selected_pages
from sglang_locks.sparse_decode import sparse_decode_reference

GROUP = 4
Q_HEADS = KV_HEADS * GROUP
CONFIG = LocksConfig(token_budget=64, min_context=64)  # 4 pages: sink, local and 2 chosen
LABELS = {"model_name": "tiny", "tp_rank": "0"}
LENS = (300, 37, 150, 200)  # request 1 fits in the budget (not observed); new_audit captures the first 3


class TorchDecode:
    """LocksDecode's torch reference (the Triton kernels do not run in this process): the selection the decode
    reference makes, its page entries left where the sparse decode's are, then exact attention over them."""

    def __init__(self, bs, sm_scale):
        bp = CONFIG.budget_pages
        self.sm_scale = sm_scale
        self.sparse = SimpleNamespace(indptr=torch.zeros(bs * KV_HEADS + 1, dtype=torch.int32),
                                      indices=torch.full((bs * KV_HEADS * (bp + 1),), 7, dtype=torch.int32))
        self.selections = []

    def run(self, q, k_cache, v_cache, summaries, req_to_token, req_pool_indices, seq_lens, new_kv=None,
            k_scale=None, v_scale=None):
        assert new_kv is None
        bp = CONFIG.budget_pages
        max_pages = max(1, int(seq_lens.max()) // PAGE_SIZE)
        agg = locks_aggregate_torch(q, summaries, req_to_token, req_pool_indices, seq_lens, max_pages, self.sm_scale,
                                    CONFIG)
        sel = select_pages(agg, bp)
        indptr, indices = selected_indices_torch(sel, req_to_token, req_pool_indices, seq_lens, KV_HEADS, bp)
        self.sparse.indptr.copy_(indptr)
        self.sparse.indices[: indices.numel()] = indices
        self.selections.append(sel)
        last = selected_pages(seq_lens, KV_HEADS, bp)[1]
        return sparse_decode_reference(q, k_cache, v_cache, indptr, indices, last, KV_HEADS, self.sm_scale,
                                       1.0 if k_scale is None else k_scale, 1.0 if v_scale is None else v_scale)


def decode_backend(h, audit):
    """LOCKS's attention backend as far as a LOCKS decode step goes (forward_decode, locks_audit_step)."""
    from sglang_locks.plugin.attention_backend import LocksFlashInferAttnBackend, _k_scale, _kv_written_in_select

    class Backend(LocksFlashInferAttnBackend):
        def __init__(self):  # none of FlashInfer's set-up
            self.config, self.store, self.audit, self.variant = CONFIG, h.store, audit, LOCKS
            self.token_to_kv_pool, self.req_to_token_pool = h.kv, h.req_to_token_pool
            self.num_qo_heads, self.num_kv_heads, self.head_dim = Q_HEADS, KV_HEADS, HEAD_DIM
            self.sm_scale, self.dense_rows = HEAD_DIM**-0.5, False
            self.k_scales = {layer.layer_id: _k_scale(layer) for layer in h.layers}
            self.write_kv_in_select = _kv_written_in_select(torch.float32, h.kv.dtype, h.kv)
            self.kv_cache_quant_method = h.kv.get_kv_cache_quant_method()  # FlashInfer's, for _kv_write_scales

    return Backend()


def new_audit(every, requests=3, captured_requests=3):
    """(a fresh registry, store -> a RecallAudit of this test's shapes reporting there)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    metrics = AuditMetrics(LABELS, registry=registry)
    config = AuditConfig(every=every, requests=requests, captured_requests=captured_requests)
    return registry, lambda store: RecallAudit(config, range(LAYERS), Q_HEADS, KV_HEADS, HEAD_DIM,
                                              CONFIG.budget_pages, torch.float32, "cpu", store, metrics)


def run_steps(make_audit, steps, kv_dtype=torch.float32):
    """Extend LENS, then decode steps through the backend; per step and layer: (q, selection, lengths, output)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    h = Harness(CONFIG, pages=96, kv_dtype=kv_dtype)
    for layer in h.layers:
        values = torch.empty(h.kv.v_buffer[layer.layer_id].shape).normal_(generator=h.gen)
        h.kv.v_buffer[layer.layer_id][:] = cached_form(h.kv, values, layer.v_scale_float)
    reqs = [h.new_request() for _ in LENS]
    h.extend(reqs, list(LENS))
    audit = None if make_audit is None else make_audit(h.store)
    backend = decode_backend(h, audit)
    record = []
    for _ in range(steps):
        h.decode(reqs)
        seq = torch.tensor([h.seq_lens[r] for r in reqs])
        fb = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=len(reqs), req_pool_indices=torch.tensor(reqs),
                             seq_lens_cpu=seq)
        backend.decoder, backend.locks_seq_lens = TorchDecode(len(reqs), HEAD_DIM**-0.5), seq.clone()
        step = []
        for layer in range(LAYERS):
            q = torch.randn(len(reqs), Q_HEADS * HEAD_DIM, generator=h.gen)
            o = backend.forward_decode(q, None, None, h.layers[layer], fb, save_kv_cache=False)
            step.append((q.view(len(reqs), Q_HEADS, HEAD_DIM), backend.decoder.selections[-1], seq, o))
        backend.locks_audit_step(fb)
        record.append(step)
    return h, reqs, audit, record


def expected_recall(h, reqs, layer, q, sel, seq, b):
    """evaluate()'s recall of the same selection: per query head, averaged over each KV head's group."""
    n = int(seq[b])
    keys = h.keys_at(layer, h.req_to_token[reqs[b], :n].long()).double()
    probs = torch.softmax(torch.einsum("hd,nhd->hn", q[b].double(), keys.repeat_interleave(GROUP, 1))
                          * HEAD_DIM**-0.5, -1)
    mask = _token_mask(sel[b * KV_HEADS : (b + 1) * KV_HEADS], n, CONFIG.budget_pages, KV_HEADS, 1)[0]
    return (probs * mask.repeat_interleave(GROUP, 0)).sum(-1).view(KV_HEADS, GROUP).mean(-1)


def recall_samples(registry, layer):
    labels = {**LABELS, "layer_group": f"{layer}-{layer}", "layer": str(layer)}
    return (registry.get_sample_value("sglang:locks_audit_recall_count", labels),
            registry.get_sample_value("sglang:locks_audit_recall_sum", labels))


AUDITED = [b for b in range(3) if LENS[b] // PAGE_SIZE > CONFIG.budget_pages]  # requests 0 and 2


@pytest.mark.parametrize("kv_dtype", [torch.float32, FP8])
def test_audit_recall_is_the_offline_recall_of_the_same_selection(kv_dtype):
    """With an fp8 pool the audit's exact mass is that of the dequantised keys (each audited layer's k scale)."""
    registry, make = new_audit(every=1)
    h, reqs, audit, record = run_steps(make, steps=3, kv_dtype=kv_dtype)
    assert audit.publish()  # the last audit's results, which the next audit would publish
    for layer in range(LAYERS):
        want = [expected_recall(h, reqs, layer, *record[s][layer][:3], b) for s in range(3) for b in AUDITED]
        count, total = recall_samples(registry, layer)
        assert count == 3 * len(AUDITED) * KV_HEADS
        assert total == pytest.approx(float(torch.cat(want).sum()), abs=1e-4)
        assert 0.3 < total / count < 1  # a real selection: some mass lost, most kept


@pytest.mark.parametrize("requests, captured, audited", [
    (1, 64, [[0], [1], [2], [3], [0]]),  # the whole batch captured
    (1, 2, [[0], [1], [0], [1]]),
    (3, 64, [[0, 1, 2], [3], [0, 1, 2]]),  # the last window holds what is left
])
def test_audits_take_the_captured_requests_in_turn(requests, captured, audited):
    """Audit k takes the k-th window of `requests` of the batch's first `captured`, cyclically (request 1's
    pages all fit in the budget, so it is never observed)."""
    registry, make = new_audit(every=1, requests=requests, captured_requests=captured)
    h, reqs, audit, record = run_steps(make, steps=len(audited))
    assert audit.publish() and audit.audits == len(audited)
    for layer in range(LAYERS):
        want = [expected_recall(h, reqs, layer, *record[s][layer][:3], b) for s, window in enumerate(audited)
                for b in window if b in AUDITED + [3]]
        count, total = recall_samples(registry, layer)
        assert count == len(want) * KV_HEADS
        assert total == pytest.approx(float(torch.cat(want).sum()), abs=1e-4)


def test_audit_config_bounds():
    with pytest.raises(ValueError, match="captured_requests"):
        AuditConfig(every=1, requests=4, captured_requests=2)
    with pytest.raises(ValueError, match="every must be >= 1"):
        AuditConfig(every=0)


def test_audit_recall_is_within_a_point_of_sglang_locks_evaluate():
    """The same keys and query through the offline tool, which summarises and selects on its own."""
    registry, make = new_audit(every=1)
    h, reqs, audit, record = run_steps(make, steps=1)
    audit.publish()
    for layer in range(LAYERS):
        q = record[0][layer][0]
        offline = []
        for b in AUDITED:
            n = h.seq_lens[reqs[b]]
            keys = h.kv.get_key_buffer(layer)[h.req_to_token[reqs[b], :n].long()]
            row = evaluate({"keys": keys, "queries": q[b : b + 1]}, [CONFIG.token_budget], ["locks"])[0]
            offline.append(row["recall"])
        count, total = recall_samples(registry, layer)
        assert total / count == pytest.approx(sum(offline) / len(offline), abs=0.01)


def test_decode_outputs_are_the_same_with_the_audit_on():
    _, make = new_audit(every=1)
    with_audit = run_steps(make, steps=3)[3]
    without = run_steps(None, steps=3)[3]
    for step_on, step_off in zip(with_audit, without):
        for (q_on, sel_on, _, o_on), (q_off, sel_off, _, o_off) in zip(step_on, step_off):
            assert torch.equal(q_on, q_off) and torch.equal(sel_on, sel_off) and torch.equal(o_on, o_off)


def test_every_nth_locks_step_is_audited_and_counters_exported():
    registry, make = new_audit(every=2)
    h, reqs, audit, _ = run_steps(make, steps=5)
    audit.publish()
    assert audit.steps == 5
    assert recall_samples(registry, 0)[0] == 2 * len(AUDITED) * KV_HEADS  # steps 2 and 4
    for name, value in h.store.counters().items():
        assert registry.get_sample_value(f"sglang:locks_{name}", LABELS) == value, name
    assert registry.get_sample_value("sglang:locks_store_bytes", LABELS) == h.store.nbytes() > 0


def test_fp8_decode_passes_the_layer_scales_and_writes_the_step_kv_through_set_kv_buffer():
    """An fp8 pool: the step's keys and values are quantised by SGLang's set_kv_buffer with the layer's scales (not
    copied in the selection launch), and the decoder reads the cache with the layer's float scales."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    class RecordingDecode:
        def __init__(self):
            self.calls = []

        def run(self, q, *args, **kwargs):
            self.calls.append((args, kwargs))
            return torch.zeros_like(q)

    h = Harness(CONFIG, kv_dtype=FP8)
    reqs = [h.new_request() for _ in range(2)]
    h.extend(reqs, [100, 37])
    backend = decode_backend(h, None)
    assert not backend.write_kv_in_select
    backend.decoder = RecordingDecode()
    loc = h.decode(reqs)
    seq = torch.tensor([h.seq_lens[r] for r in reqs])
    backend.locks_seq_lens = seq
    fb = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=2, req_pool_indices=torch.tensor(reqs),
                         seq_lens_cpu=seq, out_cache_loc=loc)
    for layer in h.layers:
        k, v = (torch.randn(2, KV_HEADS, HEAD_DIM, generator=h.gen) for _ in range(2))
        want_k, want_v = cached_form(h.kv, k, layer.k_scale_float), cached_form(h.kv, v, layer.v_scale_float)
        backend.forward_decode(torch.randn(2, Q_HEADS * HEAD_DIM, generator=h.gen), k, v, layer, fb)
        assert torch.equal(h.kv.k_buffer[layer.layer_id][loc], want_k)
        assert torch.equal(h.kv.v_buffer[layer.layer_id][loc], want_v)
        args, kwargs = backend.decoder.calls[-1]
        assert args[0].dtype == FP8 and args[6] is None  # the fp8 cache, and no new_kv for the selection to copy
        assert kwargs == {"k_scale": FP8_K_SCALES[layer.layer_id], "v_scale": FP8_V_SCALES[layer.layer_id]}


def test_dense_steps_are_not_counted():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    _, make = new_audit(every=1)
    h = Harness(CONFIG)
    backend = decode_backend(h, make(h.store))
    backend.variant = DENSE
    backend.locks_audit_step(SimpleNamespace(forward_mode=ForwardMode.DECODE))
    backend.variant = LOCKS
    backend.locks_audit_step(SimpleNamespace(forward_mode=ForwardMode.EXTEND))
    assert backend.audit.steps == 0


def test_layer_groups_audit_each_groups_middle_layer():
    assert layer_groups(range(32), 4) == [(3, "0-7"), (11, "8-15"), (19, "16-23"), (27, "24-31")]
    assert layer_groups([0, 1, 2, 5, 6], 4) == [(0, "0-0"), (1, "1-1"), (2, "2-2"), (5, "5-6")]
    assert layer_groups([3], 4) == [(3, "3-3")]


MULTIPROCESS = """
import sys; sys.path.insert(0, {tests!r})
from sglang_locks.plugin.audit_metrics import AuditMetrics
m = AuditMetrics({{"model_name": "tiny", "tp_rank": "1"}})
m.observe_recall("0-7", 3, [0.9, 0.95])
m.set_counters({{"built_pages": 12}})
"""


def test_series_made_in_another_process_reach_a_multiprocess_collector(tmp_path):
    """SGLang's /metrics: prometheus_client's multiprocess mode, PROMETHEUS_MULTIPROC_DIR set before the scheduler
    processes start."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    tests = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([sys.executable, "-c", MULTIPROCESS.format(tests=tests)], check=True, timeout=120,
                   env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))
    labels = {"model_name": "tiny", "tp_rank": "1"}
    assert registry.get_sample_value("sglang:locks_audit_recall_count",
                                     {**labels, "layer_group": "0-7", "layer": "3"}) == 2
    assert registry.get_sample_value("sglang:locks_built_pages", labels) == 12


# ---------------------------------------------------------------------- the flag
BASE_FLAGS = ["--enable-locks", "--enable-metrics"]


def parse(*flags):
    from test_plugin_args import parse as parse_args

    return parse_args(*flags)


def test_flag_gives_the_audit_config():
    import pickle

    sa = parse(*BASE_FLAGS, "--locks-audit-every", "64")
    assert sa.locks_audit == AuditConfig(every=64)
    assert pickle.loads(pickle.dumps(sa)).locks_audit == sa.locks_audit
    assert parse(*BASE_FLAGS).locks_audit is None
    assert parse(*BASE_FLAGS, "--locks-audit-every", "0").locks_audit is None


@pytest.mark.parametrize("flags, message", [
    (BASE_FLAGS + ["--locks-audit-every", "-1"], r"--locks-audit-every must be >= 1 \(audit every N-th LOCKS decode "
                                                 r"step\) or 0 \(off\), got -1"),
    (["--enable-locks", "--locks-audit-every", "64"], r"--locks-audit-every needs --enable-metrics"),
])
def test_bad_flag_names_itself(flags, message):
    with pytest.raises(ValueError, match=message):
        parse(*flags)


def test_flag_without_enable_locks_warns(caplog):
    from test_plugin_args import _flag_warnings

    assert _flag_warnings(caplog, "--locks-audit-every", "64") == ["--locks-audit-every: no effect without "
                                                                   "--enable-locks"]
    assert parse("--locks-audit-every", "64").locks_audit is None
