"""LOCKS's decode buffers come out of the bytes SGLang sizes the KV pool from (memory.reserve_decoder_bytes, an AFTER
hook on KVCacheConfigurator._profile_available_bytes), as the summaries come out of its per-token cell size."""

from types import SimpleNamespace

import pytest

from plugin_helpers import load_sglang_plugins
from sglang_locks.config import LocksConfig
from test_plugin_args import parse

MiB = 2**20


def test_decoder_bytes_count_each_buffer_the_backend_allocates():
    """Against the buffers' shapes: 4 query heads on 2 KV heads, budget 512 (32 pages), prefilter 2 (64 pages)."""
    from sglang_locks.kernels.aggregate_scores import HIST_BINS
    from sglang_locks.kernels.page_selection import MASS_SLOTS
    from sglang_locks.plugin.memory import decoder_bytes

    config = LocksConfig(token_budget=512, prefilter=2)
    workspace = 128 * MiB
    rows = 4 * 2  # of the largest batch: candidates and selection state, shared by the graphs
    shared = 2 * rows * 64 * 4 + rows * HIST_BINS.value * 4 + rows * 4 + rows * 2 * MASS_SLOTS * 8
    # Per batch size, its rows' indptr (rows + 1), page entries (rows x (32 + the tail page)) and last page lengths.
    per_bs = sum(((2 * bs + 1) + 2 * bs * 33 + 2 * bs) * 4 for bs in (1, 2, 4))
    assert decoder_bytes(config, (1, 2, 4), 4, 2, 64) == workspace + shared + per_bs
    # FlashInfer's decode wrapper, one per batch size, holds an 8 MiB int workspace of its own.
    flashinfer = LocksConfig(token_budget=512, prefilter=2, sparse_decode="flashinfer")
    assert decoder_bytes(flashinfer, (1, 2, 4), 4, 2, 64) == workspace + shared + per_bs + 3 * 8 * MiB
    assert decoder_bytes(config, (), 4, 2, 64) == workspace  # no CUDA graphs


def _planned_kv_bytes(monkeypatch, server_args) -> int:
    """KVCacheConfigurator._profile_available_bytes (hooked) on 20 GiB free, 10 GiB before the model load and a
    static fraction of 0.9, for server_args resolved as the launcher does (ServerArgs.resolve_once, from SGLang
    0.5.19). Stand-ins for the runtime context it reads, each where this SGLang reads it."""
    import sglang.srt.mem_cache.kv_cache_configurator as kvcm
    import sglang.srt.runtime_context as rc
    from sglang.srt.configs.model_config import ModelConfig

    load_sglang_plugins()
    if hasattr(server_args, "resolve_once"):
        server_args.resolve_once()
    parallel = SimpleNamespace(attn_tp_size=1, world_size=1, launch_world_size=1, cpu_group=None,
                               world_group=SimpleNamespace(cpu_group=None))
    prefill_graphs = SimpleNamespace(prefill=SimpleNamespace(full_prefill_max_req=None))
    stand_ins = {
        "get_available_gpu_memory": lambda *a, **k: 20.0,
        "get_world_group": lambda: parallel,  # up to 0.5.20; get_parallel from 0.5.21
        "get_parallel": lambda: parallel,
        "get_schedule": lambda: SimpleNamespace(mem_fraction_static=0.9, prefill_max_requests=None),
        "get_mm": lambda: SimpleNamespace(mm_feature_transport=None),  # from 0.5.19
        "get_exec": lambda: SimpleNamespace(graph=SimpleNamespace(cuda_graph_config=prefill_graphs)),  # from 0.5.22
        "get_disagg": lambda: SimpleNamespace(disaggregation_mode="null"),  # from 0.5.22
    }
    for name, stand_in in stand_ins.items():
        if hasattr(kvcm, name):
            monkeypatch.setattr(kvcm, name, stand_in)
    monkeypatch.setattr(rc, "get_parallel", lambda: parallel)
    kvc = SimpleNamespace(device="cuda", gpu_id=0, mambaish_config=None, post_capture_kv_active=False,
                          server_args=server_args, model_config=ModelConfig.from_server_args(server_args))
    return kvcm.KVCacheConfigurator._profile_available_bytes(kvc, 10.0)


@pytest.mark.parametrize("flags, capture_bs", [
    (["--cuda-graph-bs-decode", "1", "2", "4"], (1, 2, 4)),
    (["--cuda-graph-backend-decode", "disabled"], ()),
])
def test_planned_kv_budget_shrinks_by_the_decoder_bytes(flags, capture_bs, monkeypatch):
    from sglang_locks.plugin.memory import decoder_bytes

    stock = _planned_kv_bytes(monkeypatch, parse(*flags))
    assert stock == int((20.0 - 10.0 * (1 - 0.9)) * 2**30)
    sa = parse("--enable-locks", "--locks-token-budget", "512", "--locks-prefilter", "2", *flags)
    # tests/data/tiny-llama: 4 query heads on 2 KV heads of 64 dimensions.
    expected = decoder_bytes(sa.locks_config, capture_bs, 4, 2, 64)
    assert _planned_kv_bytes(monkeypatch, sa) == stock - expected


def test_the_hook_is_applied():
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator

    load_sglang_plugins()
    assert hasattr(KVCacheConfigurator._profile_available_bytes, "__wrapped__")
