"""--enable-locks and the --locks-* flags through SGLang's own prepare_server_args (plugins loaded)."""

import logging
import pickle
import re

import pytest

from plugin_helpers import MODEL_DIR, load_sglang_plugins
from sglang_locks.config import LocksConfig

BASE = ["--model-path", MODEL_DIR, "--device", "cpu", "--skip-tokenizer-init"]


def parse(*flags):
    from sglang.srt.server_args import prepare_server_args

    load_sglang_plugins()
    return prepare_server_args(BASE + list(flags))


def test_flags_reach_server_args_as_one_validated_config():
    sa = parse("--enable-locks", "--locks-token-budget", "512", "--locks-rank", "4", "--locks-sink-pages", "2",
               "--locks-local-pages", "3", "--locks-dense-layers", "1,0", "--locks-min-step-tokens", "0", "--locks-prefilter", "4",
               "--locks-prefilter-rank", "1", "--locks-sparse-decode", "flashinfer")
    assert sa.locks_config == LocksConfig(token_budget=512, rank=4, sink_pages=2, local_pages=3, dense_layers=(0, 1),
                                          min_context=512, min_step_tokens=0, prefilter=4,
                                          prefilter_rank=1, sparse_decode="flashinfer")
    assert (sa.page_size, sa.attention_backend) == (16, "flashinfer")
    # It travels to the scheduler processes pickled with server_args.
    assert pickle.loads(pickle.dumps(sa)).locks_config == sa.locks_config


def test_defaults():
    cfg = parse("--enable-locks").locks_config
    assert (cfg.token_budget, cfg.rank, cfg.sink_pages, cfg.local_pages, cfg.dense_layers, cfg.min_context) == (
        2048, 8, 1, 1, (), 2048)
    assert cfg.min_step_tokens is None  # the backend's default for the model (graph_variants)
    assert (cfg.prefilter, cfg.prefilter_rank, cfg.sparse_decode) == (0, 0, "triton")


def test_without_enable_locks_server_args_are_stock():
    sa, stock = parse("--locks-token-budget", "512"), parse()
    assert sa.locks_config is None
    assert (sa.page_size, sa.attention_backend) == (stock.page_size, stock.attention_backend) != (16, "flashinfer")


def _flag_warnings(caplog, *flags):
    """The warnings parsing logs from server_args (caught at its logger: SGLang's log set-up replaces the root's
    handlers, caplog's among them)."""
    log = logging.getLogger("sglang_locks.plugin.server_args")
    caplog.clear()
    log.addHandler(caplog.handler)
    try:
        parse(*flags)
    finally:
        log.removeHandler(caplog.handler)
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_locks_flags_without_enable_locks_warn_once_naming_them(caplog):
    got = _flag_warnings(caplog, "--locks-token-budget", "512", "--locks-prefilter", "2", "--locks-rank", "8")
    # One line, naming the flags given other values than their defaults (--locks-rank 8 is the default).
    assert got == ["--locks-token-budget, --locks-prefilter: no effect without --enable-locks"]
    assert _flag_warnings(caplog) == []
    assert _flag_warnings(caplog, "--enable-locks", "--locks-token-budget", "512") == []


def test_prefilter_rank_without_prefilter_warns(caplog):
    assert _flag_warnings(caplog, "--enable-locks", "--locks-prefilter-rank", "2") == [
        "--locks-prefilter-rank 2: no effect without --locks-prefilter (0: every page is scored in full)"]
    assert _flag_warnings(caplog, "--enable-locks", "--locks-prefilter", "2", "--locks-prefilter-rank", "2") == []


def test_help_lists_the_flags():
    import argparse

    from sglang.srt.server_args import ServerArgs

    load_sglang_plugins()
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    text = parser.format_help()
    for flag in ("--enable-locks", "--locks-token-budget", "--locks-rank", "--locks-sink-pages", "--locks-local-pages",
                 "--locks-dense-layers", "--locks-min-context", "--locks-min-step-tokens", "--locks-prefilter", "--locks-prefilter-rank", "--locks-sparse-decode", "--locks-audit-every"):
        assert flag in text
    # The range the flag's errors give.
    assert re.search(r"--locks-local-pages LOCKS_LOCAL_PAGES [^-]*\(>= 1\)", " ".join(text.split()))


@pytest.mark.parametrize("flags, message", [
    (["--locks-token-budget", "40"], r"--locks-token-budget must be a multiple of 16 and >= \(--locks-sink-pages"),
    (["--locks-token-budget", "100"], r"--locks-token-budget must be a multiple of 16"),
    (["--locks-rank", "0"], r"--locks-rank must be in \[1, page_size=16\], got 0"),
    (["--locks-rank", "17"], r"--locks-rank must be in \[1"),
    (["--locks-sink-pages", "-1"], r"--locks-sink-pages must be >= 0"),
    (["--locks-local-pages", "0"], r"--locks-local-pages must be >= 1, got 0"),
    (["--locks-local-pages", "-1"], r"--locks-local-pages must be >= 1, got -1"),  # LocksConfig's own bound is 0
    (["--locks-dense-layers", "-2"], r"--locks-dense-layers must be layer indices >= 0"),
    (["--locks-min-context", "-5"], r"--locks-min-context must be >= 0"),
    (["--locks-min-step-tokens", "-1"], r"--locks-min-step-tokens must be >= 0 tokens \(0: never dense\), got -1"),
    (["--locks-prefilter-rank", "9"], r"--locks-prefilter-rank must be in \[0, --locks-rank=8\], got 9"),
    (["--locks-prefilter", "-1"], r"--locks-prefilter must be >= 0 \(candidate pages per budget page; 0: off\)"),
    (["--locks-min-context", "8192", "--locks-dense-layers", "0"], r"--locks-min-context above --locks-token-budget"),
    # Bounded by --context-length: above it every page is attended anyway, and the buffers sized for nothing.
    (["--context-length", "4100", "--locks-token-budget", str(2**40)],
     r"--locks-token-budget must be a multiple of 16 in \[48, 4096\] \(up to the context length 4100;"),
    (["--context-length", "4096", "--locks-token-budget", "4112"], r"--locks-token-budget must be a multiple of 16 in"),
    (["--context-length", "32"], r"the context length 32 is below the smallest --locks-token-budget, "
                                 r"\(--locks-sink-pages \+ --locks-local-pages \+ 1\) \* page_size = 48"),
    (["--context-length", "4096", "--locks-token-budget", "512", "--locks-prefilter", str(10**9)],
     r"--locks-prefilter must be in \[0, 8\] \(--locks-prefilter \* --locks-token-budget / page_size candidate "
     r"pages, at most the 256 pages of the context length 4096\), got 1000000000"),
])
def test_invalid_values_name_the_flag_and_range(flags, message):
    with pytest.raises(ValueError, match=message):
        parse("--enable-locks", *flags)


def test_budget_and_prefilter_up_to_the_context_length_accepted():
    cfg = parse("--enable-locks", "--context-length", "4096", "--locks-token-budget", "4096").locks_config
    assert cfg.token_budget == 4096
    cfg = parse("--enable-locks", "--context-length", "4096", "--locks-token-budget", "512",
                "--locks-prefilter", "8").locks_config
    assert cfg.candidate_pages == 256


def test_summaries_are_int8_int4_int8_in_the_server(capsys):
    """fp32 and bf16 summaries (sglang_locks.summaries) read 6.4x / 3.2x the bytes for no recall gained
    (docs/performance.md): no server flag chooses them."""
    assert parse("--enable-locks").locks_config.summary_precision == "int8-int4-int8"
    with pytest.raises(SystemExit):
        parse("--enable-locks", "--locks-summary-precision", "fp32")
    assert "--locks-summary-precision" in capsys.readouterr().err


@pytest.mark.parametrize("flags, named", [
    (["--page-size", "32"], "--page-size 32"),
    (["--attention-backend", "triton"], "--attention-backend triton"),
    (["--decode-attention-backend", "fa3"], "--decode-attention-backend fa3"),
    (["--kv-cache-dtype", "fp8_e5m2"], r"--kv-cache-dtype fp8_e5m2: supported: auto, .*fp8_e4m3"),
    (["--kv-cache-dtype", "fp4_mx_block16"], "--kv-cache-dtype fp4_mx_block16: supported:"),
    (["--speculative-algorithm", "NGRAM"], "--speculative-algorithm"),
    (["--dcp-size", "2"], "--dcp-size 2"),
    (["--disaggregation-mode", "decode"], "--disaggregation-mode decode"),
    (["--enable-pdmux"], "--enable-pdmux"),
    (["--enable-two-batch-overlap", "--enable-dp-attention", "--tp-size", "2", "--dp-size", "2"],
     "--enable-two-batch-overlap"),
    (["--pp-size", "2"], "--pp-size 2"),
    (["--dtype", "float16", "--kv-cache-dtype", "bf16"], r"--dtype float16 with --kv-cache-dtype bf16: queries and "
                                                         r"KV cache must share one dtype \(bf16 or fp16\)"),
    (["--dtype", "half", "--kv-cache-dtype", "bfloat16"], "--dtype half with --kv-cache-dtype bfloat16"),
    (["--dtype", "float32"], "--dtype float32: LOCKS's kernels take bf16 or fp16 queries"),
    (["--dtype", "float", "--kv-cache-dtype", "bf16"], "--dtype float:"),
])
def test_unsupported_combinations_fail_naming_the_flag(flags, named):
    with pytest.raises(ValueError, match=f"--enable-locks does not support {named}"):
        parse("--enable-locks", *flags)


@pytest.mark.parametrize("dtype", ["auto", "float16", "bfloat16"])
def test_fp8_e4m3_kv_cache_accepted_with_16_bit_queries(dtype):
    """--dtype and --kv-cache-dtype need not match for an fp8 cache (auto: the attention backend checks at load)."""
    sa = parse("--enable-locks", "--kv-cache-dtype", "fp8_e4m3", "--dtype", dtype)
    assert sa.locks_config is not None and sa.kv_cache_dtype == "fp8_e4m3"


def _stand_in_runner(monkeypatch, q_heads=32, kv_heads=8, tp=1, head_dim=128, context_len=4096, **runner_fields):
    """A model runner as far as the attention backend's load-time checks read it."""
    from types import SimpleNamespace

    import torch

    load_sglang_plugins()
    from sglang_locks.plugin import attention_backend as ab

    monkeypatch.setattr(ab, "get_parallel", lambda: SimpleNamespace(attn_tp_size=tp))
    mc = SimpleNamespace(num_attention_heads=q_heads, get_num_kv_heads=lambda t: max(1, kv_heads // t),
                         head_dim=head_dim, is_encoder_decoder=False, context_len=context_len)
    fields = dict(model_config=mc, use_mla_backend=False, sliding_window_size=None, dtype=torch.bfloat16,
                  kv_cache_dtype=torch.bfloat16)
    return SimpleNamespace(**{**fields, **runner_fields})


def _load_time_reason(monkeypatch, q_heads=32, kv_heads=8, tp=1, head_dim=128, **runner_fields):
    """The backend's load-time check (attention_backend._unsupported) on a stand-in model runner."""
    from sglang_locks.plugin import attention_backend as ab

    return ab._unsupported(_stand_in_runner(monkeypatch, q_heads, kv_heads, tp, head_dim, **runner_fields))


@pytest.mark.parametrize("q_heads, kv_heads, tp, head_dim, why", [
    (28, 4, 1, 128, None),                                   # Qwen2.5-7B: 7 query heads per KV head
    (40, 8, 2, 128, None),                                   # Qwen2.5-14B on two GPUs: 5
    (32, 8, 1, 64, None),                                    # Llama-3.2-1B's head_dim 64
    (71, 1, 1, 64, "71 query heads on 1 KV heads per GPU"),  # Falcon-7B's multi-query attention
    (64, 2, 1, 128, "64 query heads on 2 KV heads per GPU"),
    (32, 32, 1, 96, "head_dim 96"),                          # Phi-3-mini
    (32, 32, 1, 80, "head_dim 80"),
])
def test_models_the_kernels_cannot_take_are_rejected_at_load(q_heads, kv_heads, tp, head_dim, why, monkeypatch):
    """At model load (the backend's first check), naming what: the score kernel takes 1..16 query heads per KV
    head (any count, padded to a power of two) and, like the summary build, head_dim / 2 a power of two; not a
    failure deep in a kernel at the first decode."""
    got = _load_time_reason(monkeypatch, q_heads, kv_heads, tp, head_dim)
    assert got == why if why is None else got.startswith(why)


@pytest.mark.parametrize("layout, why", [("nhd", None), ("hnd", "KV cache layout hnd"),
                                         ("vectorized_5d", "KV cache layout vectorized_5d")])
def test_kv_pools_not_token_major_are_rejected_at_load(layout, why, monkeypatch):
    """The kernels read each layer's keys and values as token-major [slots, H_kv, d] buffers: SGLang's head-major
    layouts (SGLANG_USE_HND_KVCACHE=1, the vectorized one) fail at load, naming the layout, not silently."""
    from types import SimpleNamespace

    got = _load_time_reason(monkeypatch, token_to_kv_pool=SimpleNamespace(kv_cache_layout=layout))
    assert got == why if why is None else got.startswith(why)


@pytest.mark.parametrize("q_dtype, kv_dtype, why", [
    ("bfloat16", "bfloat16", None),
    ("float16", "float16", None),
    # --dtype auto on an fp16 model with --kv-cache-dtype bf16, which the flags alone cannot tell.
    ("float16", "bfloat16", "torch.float16 queries on a torch.bfloat16 KV cache (--dtype and --kv-cache-dtype must "
                            "give one dtype, bf16 or fp16)"),
    ("bfloat16", "float16", "torch.bfloat16 queries on a torch.float16 KV cache"),
    # An fp8 cache holds keys / k_scale in float8_e4m3fn, read with 16-bit queries.
    ("bfloat16", "float8_e4m3fn", None),
    ("float16", "float8_e4m3fn", None),
    ("float32", "float8_e4m3fn", "torch.float32 queries on a torch.float8_e4m3fn KV cache (bf16 or fp16 queries only)"),
    ("bfloat16", "float8_e5m2", "KV cache dtype torch.float8_e5m2 (bf16, fp16 or float8_e4m3fn only)"),
])
def test_query_and_kv_cache_dtypes_checked_at_load(q_dtype, kv_dtype, why, monkeypatch):
    """16-bit caches of the queries' dtype, and fp8 ones (float8_e4m3fn) with bf16 or fp16 queries."""
    import torch

    got = _load_time_reason(monkeypatch, dtype=getattr(torch, q_dtype), kv_cache_dtype=getattr(torch, kv_dtype))
    assert got == why if why is None else got.startswith(why)


def _start_backend(monkeypatch, config, layers=2, context_len=4096):
    """LocksFlashInferAttnBackend on a stand-in runner of `layers` attention layers: its checks of the flags against
    the model run before FlashInfer's own set-up, which needs a GPU (and fails on the stand-in)."""
    import torch
    from sglang.srt.layers.radix_attention import RadixAttention

    runner = _stand_in_runner(monkeypatch, context_len=context_len, init_new_workspace=False)
    runner.model = torch.nn.ModuleList(RadixAttention(32, 128, 128**-0.5, 8, layer_id=l) for l in range(layers))
    from sglang_locks.plugin.attention_backend import LocksFlashInferAttnBackend

    return LocksFlashInferAttnBackend(runner, config)


@pytest.mark.parametrize("config, message", [
    # Without --context-length only the model's context length bounds the budget and the prefilter.
    (LocksConfig(token_budget=2**40), r"--enable-locks: --locks-token-budget must be a multiple of 16 in "
                                      r"\[48, 4096\] \(up to the context length 4096;"),
    (LocksConfig(token_budget=512, prefilter=9), r"--enable-locks: --locks-prefilter must be in \[0, 8\]"),
    (LocksConfig(dense_layers=(0, 1)), r"--locks-dense-layers lists every attention layer \(0\.\.1\); drop "
                                       r"--enable-locks to decode densely"),
    (LocksConfig(dense_layers=(2,)), r"--locks-dense-layers: no attention layer \[2\] \(layers 0\.\.1\)"),
])
def test_flags_the_model_bounds_are_rejected_at_load(config, message, monkeypatch):
    with pytest.raises(ValueError, match=message):
        _start_backend(monkeypatch, config)


def test_flags_within_the_model_pass_the_load_checks(monkeypatch):
    """Flags the model allows get past the checks, as far as FlashInfer's set-up (which the stand-in fails)."""
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    reached = []

    def stock_init(self, runner, **kwargs):
        reached.append(runner)
        raise RuntimeError("FlashInfer's set-up")

    monkeypatch.setattr(FlashInferAttnBackend, "__init__", stock_init)
    with pytest.raises(RuntimeError, match="FlashInfer's set-up"):
        _start_backend(monkeypatch, LocksConfig(token_budget=4096, dense_layers=(1,)))
    with pytest.raises(RuntimeError, match="FlashInfer's set-up"):
        _start_backend(monkeypatch, LocksConfig(token_budget=512, prefilter=8))
    assert len(reached) == 2


def test_explicit_page_size_16_and_flashinfer_accepted():
    sa = parse("--enable-locks", "--page-size", "16", "--attention-backend", "flashinfer")
    assert (sa.page_size, sa.attention_backend) == (16, "flashinfer")
