"""SGLang's FlashInfer backend with LOCKS decode; registered as "flashinfer" (stock without --enable-locks).

Prefill/extend is FlashInfer's, followed per layer by the summaries of the
pages the extend sealed. Decode: a step whose requests hold fewer KV tokens
in all than --locks-min-step-tokens is FlashInfer's own decode (the DENSE
variant, see graph_variants); otherwise a LocksDecode is planned once per
step on the host (one per captured batch size under CUDA graphs, static
buffers) and run per layer. Layers in --locks-dense-layers decode through
FlashInfer, and so do requests shorter than --locks-min-context when that
exceeds the budget: they run through FlashInfer's plan with the long
requests' lengths set to 1, LOCKS with the short ones' set to 1, and each
row keeps its path's output.

An fp8 KV cache (--kv-cache-dtype fp8_e4m3) holds each layer's keys and
values divided by its k_scale_float / v_scale_float (from the checkpoint,
else 1.0): the summaries are built from the dequantised keys, the decode
step's KV goes in through the pool's set_kv_buffer (which quantises), and
the sparse decode reads the pages with the layer's scales.
"""

from __future__ import annotations

import copy
import logging
from typing import Dict, Optional, Tuple

import torch

from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.runtime_context import get_parallel

from ..config import PAGE_SIZE, LocksConfig
from ..decode import LocksDecode, SelectionState
from ..environment import read_environment
from ..scoring import candidate_buffer
from ..support import attention_shape_reason
from .audit import RecallAudit
from .graph_variants import DENSE, LOCKS, default_min_step_tokens, step_variant
from .server_args import check_context_len, locks_audit_of
from .summary_store import SealedPages, SummaryStore, attach_store, store_for_pool

logger = logging.getLogger(__name__)

LOCKS_WORKSPACE_BYTES = 128 * 1024 * 1024


def _unsupported(runner) -> Optional[str]:
    mc = runner.model_config
    if runner.use_mla_backend:
        return "MLA attention (DeepSeek-type models)"
    if runner.sliding_window_size is not None:
        return "sliding-window attention"
    if mc.is_encoder_decoder:
        return "encoder-decoder models"
    if runner.kv_cache_dtype not in (torch.bfloat16, torch.float16, torch.float8_e4m3fn):
        return f"KV cache dtype {runner.kv_cache_dtype} (bf16, fp16 or float8_e4m3fn only)"
    if runner.kv_cache_dtype == torch.float8_e4m3fn:
        if runner.dtype not in (torch.bfloat16, torch.float16):
            return f"{runner.dtype} queries on a {runner.kv_cache_dtype} KV cache (bf16 or fp16 queries only)"
    elif runner.dtype != runner.kv_cache_dtype:
        return (f"{runner.dtype} queries on a {runner.kv_cache_dtype} KV cache (--dtype and --kv-cache-dtype must "
                "give one dtype, bf16 or fp16)")
    layout = getattr(getattr(runner, "token_to_kv_pool", None), "kv_cache_layout", "nhd")
    if layout != "nhd":  # the kernels read token-major [slots, H_kv, d] buffers
        return f"KV cache layout {layout} (token-major nhd only; unset SGLANG_USE_HND_KVCACHE)"
    tp = get_parallel().attn_tp_size
    return attention_shape_reason(mc.head_dim, mc.num_attention_heads // tp, mc.get_num_kv_heads(tp))


def _attention_layers(model) -> Dict[int, RadixAttention]:
    return {m.layer_id: m for m in model.modules() if isinstance(m, RadixAttention)}


def _k_scale(layer: RadixAttention) -> float:
    """The layer's k scale of an fp8 KV cache, set at model load (None: the cache holds the keys unscaled)."""
    return 1.0 if layer.k_scale_float is None else layer.k_scale_float


def _kv_written_in_select(q_dtype, kv_dtype, pool) -> bool:
    """Whether the decode step's keys and values go into the cache inside the selection launch (CacheWrite), not
    by a store launch of their own: where that is a plain copy, into a cache of the queries' dtype. Others (fp8)
    go through the pool's set_kv_buffer, which quantises them with the layer's scales as SGLang's own writes do."""
    return (kv_dtype == q_dtype and getattr(pool, "store_dtype", None) == pool.dtype
            and not getattr(pool, "is_quantized_kv_cache", False))


class LocksFlashInferAttnBackend(FlashInferAttnBackend):
    def __init__(self, runner, config: LocksConfig, **kwargs):
        why = _unsupported(runner)
        if why:
            raise ValueError(f"--enable-locks does not support {why}")
        # The flags the model bounds, refused before any buffer is sized by them.
        check_context_len(config, runner.model_config.context_len)
        layers = _attention_layers(runner.model)
        bad = [l for l in config.dense_layers if l not in layers]
        if bad:
            raise ValueError(f"--locks-dense-layers: no attention layer {bad} (layers 0..{max(layers)})")
        locks_layers = [l for l in sorted(layers) if l not in config.dense_layers]
        if not locks_layers:
            raise ValueError(f"--locks-dense-layers lists every attention layer (0..{max(layers)}); "
                             "drop --enable-locks to decode densely")
        scalings = {layers[l].scaling for l in locks_layers}
        if len(scalings) > 1 or any(layers[l].logit_cap for l in locks_layers):
            raise ValueError("--enable-locks needs one softmax scale and no logit soft-capping across layers")
        super().__init__(runner, init_new_workspace=runner.init_new_workspace, **kwargs)
        self.config = config
        self.sm_scale = scalings.pop()
        tp = get_parallel().attn_tp_size
        mc = runner.model_config
        self.num_qo_heads = mc.num_attention_heads // tp
        self.num_kv_heads = mc.get_num_kv_heads(tp)
        self.head_dim = mc.head_dim
        self.q_dtype, self.kv_dtype = runner.dtype, runner.kv_cache_dtype
        self.static_max_pages = -(-self.max_context_len // PAGE_SIZE)
        # An fp8 cache's k scales (set at model load, before the backend), which the summary builds and the audit
        # dequantise the keys by; a 16-bit cache holds the keys as they are (None).
        self.k_scales = ({l: _k_scale(layers[l]) for l in locks_layers} if self.kv_dtype == torch.float8_e4m3fn
                         else None)
        self.store = self._store_for(runner, locks_layers)
        self.audit = self._audit_for(runner, locks_layers)
        self.write_kv_in_select = _kv_written_in_select(self.q_dtype, self.kv_dtype, self.token_to_kv_pool)
        # Rows shorter than min_context take FlashInfer's path (only when that exceeds the budget:
        # within it LOCKS attends every page anyway).
        self.dense_rows = config.min_context > config.token_budget
        self.needs_stock_decode = bool(config.dense_layers) or self.dense_rows
        self.locks_workspace = torch.empty(LOCKS_WORKSPACE_BYTES, dtype=torch.uint8, device=runner.device)
        self.graph_decoders: Dict[int, LocksDecode] = {}
        self.eager_decoder: Optional[LocksDecode] = None
        self.eager_capacity = 0
        self.graph_rows: Optional[Tuple[torch.Tensor, torch.Tensor]] = None  # static (seq_lens, short)
        self.graph_row_views: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}  # their first bs rows, per bs
        self.graph_candidates: Optional[torch.Tensor] = None  # the prefilter's, shared by the graph decoders
        self.graph_selection_state: Optional[SelectionState] = None  # the selection's, shared by them too
        self.locks_seq_lens: Optional[torch.Tensor] = None  # this step's: LOCKS lengths [bs]
        self.short_rows: Optional[torch.Tensor] = None  # and rows decoded densely [bs]
        self.decoder: Optional[LocksDecode] = None
        self.sealed: Optional[SealedPages] = None
        self.check_stale = read_environment().check_stale
        self.min_step_tokens = (default_min_step_tokens(self.num_kv_heads) if config.min_step_tokens is None
                                else config.min_step_tokens)
        self.variant = LOCKS  # of the decode step being planned, or of the graph being captured
        self._stock_graph_bs = set()  # batch sizes whose FlashInfer graph wrappers exist
        logger.info("LOCKS: decode steps with fewer than %d KV tokens in all decode densely (--locks-min-step-tokens)",
                    self.min_step_tokens)

    def _store_for(self, runner, locks_layers) -> SummaryStore:
        pool = self.token_to_kv_pool
        store = store_for_pool(pool)  # one per pool, shared by the backends of one runner
        if store is None:
            num_pages = pool.get_key_buffer(pool.start_layer).shape[0] // PAGE_SIZE
            k_scales = None
            if self.k_scales is not None:  # the summaries are those of the dequantised keys
                k_scales = torch.tensor([self.k_scales[l] for l in locks_layers], dtype=torch.float32,
                                        device=runner.device)
            store = SummaryStore(self.config, locks_layers, num_pages, self.num_kv_heads, self.head_dim,
                                 runner.device, k_scales=k_scales)
            attach_store(pool, store)
            store.warm_up(pool)
            logger.info("LOCKS summary store: %d pages x %d layers x %d KV heads, %.2f GiB (%s, rank %d)",
                        num_pages, len(locks_layers), self.num_kv_heads, store.nbytes() / 2**30,
                        self.config.summary_precision, self.config.rank)
        return store

    def _audit_for(self, runner, locks_layers) -> Optional[RecallAudit]:
        config = locks_audit_of(runner.server_args)
        if config is None:
            return None
        from .audit_metrics import AuditMetrics  # imports prometheus_client, in the scheduler process

        labels = {"model_name": runner.server_args.served_model_name, "tp_rank": str(get_parallel().tp_rank)}
        metrics = AuditMetrics(labels)
        audit = RecallAudit(config, locks_layers, self.num_qo_heads, self.num_kv_heads, self.head_dim,
                            self.config.budget_pages, self.q_dtype, runner.device, self.store, metrics)
        logger.info("LOCKS recall audit every %d LOCKS decode steps: layers %s, %d of the batch's first %d requests "
                    "in turn", config.every, [layer for layer, _ in audit.groups], config.requests,
                    config.captured_requests)
        return audit

    # ------------------------------------------------------------ per-step metadata
    def graph_variants(self) -> Tuple[str, ...]:
        """The decode graphs captured per batch size (graph_variants' hooks)."""
        return (LOCKS, DENSE) if self.min_step_tokens > 0 else (LOCKS,)

    def init_forward_metadata(self, forward_batch):
        self.store.flush_pending(self.token_to_kv_pool)
        mode = forward_batch.forward_mode
        if mode.is_decode():
            bs = forward_batch.batch_size
            if self._start_decode_step(forward_batch) == DENSE:
                super().init_forward_metadata(forward_batch)
                return
            if bs > self.eager_capacity:  # grows by doubling: few re-allocations
                self.eager_capacity = max(bs, 2 * self.eager_capacity)
                self.eager_decoder = self._new_decoder(self.eager_capacity, use_cuda_graph=False)
            self._plan_decode(forward_batch, self.eager_decoder, self._row_buffers(bs), max_pages=None)
            if self.needs_stock_decode:
                super().init_forward_metadata(self._stock_view(forward_batch))
            return
        super().init_forward_metadata(forward_batch)
        if mode.is_extend():
            self._plan_extend(forward_batch)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        if not in_capture:
            self.store.flush_pending(self.token_to_kv_pool)
        mode = forward_batch.forward_mode
        if mode.is_decode():
            bs = forward_batch.batch_size
            if not in_capture:  # in capture the hook on capture_one_shape sets the variant
                self._start_decode_step(forward_batch)
            if self.variant == DENSE:
                self._stock_out_graph(forward_batch, in_capture)
                return
            if in_capture and bs not in self.graph_decoders:
                self.graph_decoders[bs] = self._new_decoder(bs, use_cuda_graph=True)
            self._plan_decode(forward_batch, self.graph_decoders[bs], self._graph_rows_of(bs), self.static_max_pages,
                              check_stale=not in_capture)
            if self.needs_stock_decode:
                self._stock_out_graph(self._stock_view(forward_batch), in_capture)
            return
        super().init_forward_metadata_out_graph(forward_batch, in_capture)
        if mode.is_extend():
            if in_capture:
                raise ValueError("--enable-locks does not support --cuda-graph-backend-prefill full "
                                 "(summaries are built eagerly after each layer's KV write)")
            self._plan_extend(forward_batch)

    def _start_decode_step(self, fb) -> str:
        """A real decode step (not a capture): record its seals, whatever the variant, and choose it."""
        # Plain Python from here, no tensor slices: host time before the step's launch adds to its latency.
        lens = fb.seq_lens_cpu.tolist()[: fb.batch_size]
        self.store.record_decode_seals(self.req_to_token_pool.req_to_token, fb.req_pool_indices, lens)
        self.variant = step_variant(lens, self.min_step_tokens)
        self.store.count_step(self.variant)
        return self.variant

    def _stock_out_graph(self, fb, in_capture: bool) -> None:
        """FlashInfer's own graph metadata; its wrappers are created once per batch size, so that the
        graphs of both variants (and both captures of one batch size) share them."""
        bs = fb.batch_size
        first = in_capture and bs not in self._stock_graph_bs
        if first:
            self._stock_graph_bs.add(bs)
        super().init_forward_metadata_out_graph(fb, first)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, kv_indices_buf=None):
        super().init_cuda_graph_state(max_bs, max_num_tokens, kv_indices_buf)
        self.graph_rows = self._row_buffers(max_bs)
        self.graph_row_views.clear()
        device = self.locks_workspace.device
        self.graph_candidates = candidate_buffer(max_bs * self.num_kv_heads, self.config, device)
        self.graph_selection_state = SelectionState(max_bs * self.num_kv_heads, device,
                                                    self.num_qo_heads // self.num_kv_heads)

    def _row_buffers(self, bs: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(LOCKS lengths, rows decoded densely) of bs requests."""
        device = self.locks_workspace.device
        return torch.ones(bs, dtype=torch.int64, device=device), torch.zeros(bs, dtype=torch.bool, device=device)

    def _graph_rows_of(self, bs: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The static row buffers' first bs rows, as views made once per batch size."""
        if bs not in self.graph_row_views:
            self.graph_row_views[bs] = (self.graph_rows[0][:bs], self.graph_rows[1][:bs])
        return self.graph_row_views[bs]

    def _new_decoder(self, bs: int, use_cuda_graph: bool) -> LocksDecode:
        return LocksDecode(self.config, self.locks_workspace, self.num_qo_heads, self.num_kv_heads,
                           self.head_dim, bs, use_cuda_graph,
                           candidates=self.graph_candidates if use_cuda_graph else None,
                           selection_state=self.graph_selection_state if use_cuda_graph else None)

    def _plan_decode(self, fb, decoder: LocksDecode, rows, max_pages, check_stale: bool = True) -> None:
        """rows: _row_buffers of exactly the step's batch size."""
        bs = fb.batch_size
        self.locks_seq_lens, self.short_rows = rows
        lens_cpu = fb.seq_lens_cpu[:bs]
        locks_lens = lens_cpu
        if self.dense_rows:
            short = lens_cpu < self.config.min_context
            locks_lens = torch.where(short, torch.ones_like(lens_cpu), lens_cpu)
            self.short_rows.copy_(short, non_blocking=True)
        self.locks_seq_lens.copy_(locks_lens, non_blocking=True)
        decoder.plan(locks_lens, self.q_dtype, self.kv_dtype, self.sm_scale, max_pages)
        self.decoder = decoder
        if self.check_stale and check_stale:
            self.store.check_scorable(self.req_to_token_pool.req_to_token, fb.req_pool_indices[:bs],
                                      self.locks_seq_lens)

    def _stock_view(self, fb):
        """The batch FlashInfer's own decode plan sees: long rows cut to 1 token when short rows go dense."""
        if not self.dense_rows:
            return fb
        view = copy.copy(fb)
        bs = fb.batch_size
        cpu = fb.seq_lens_cpu.clone()
        cpu[:bs] = torch.where(cpu[:bs] < self.config.min_context, cpu[:bs], torch.ones_like(cpu[:bs]))
        view.seq_lens_cpu = cpu
        view.seq_lens = cpu.to(fb.seq_lens.device, non_blocking=True)
        view.seq_lens_sum = int(cpu[:bs].sum())
        return view

    def _plan_extend(self, fb) -> None:
        self.sealed = self.store.sealed_by_extend(self.req_to_token_pool.req_to_token, fb.req_pool_indices,
                                                  fb.extend_prefix_lens_cpu, fb.seq_lens_cpu)

    def locks_audit_step(self, fb) -> None:
        """After a forward (audit.audit_after_forward): every N-th LOCKS decode step, the recall audit of the rows
        the step captured, read while its lengths, request rows and KV are still the step's."""
        if (self.audit is None or not fb.forward_mode.is_decode() or self.variant != LOCKS
                or not self.audit.due()):
            return
        start, n = self.audit.window(fb.batch_size)
        rows = slice(start, start + n)
        max_tokens = int(fb.seq_lens_cpu[rows].max())
        tables = self.req_to_token_pool.req_to_token[fb.req_pool_indices[rows], :max_tokens]
        pool = self.token_to_kv_pool
        self.audit.run(start, {layer: pool.get_key_buffer(layer) for layer in self.audit.slot_of}, tables,
                       self.locks_seq_lens[rows], max_tokens, self.decoder.sparse.indptr, self.sm_scale,
                       self.k_scales)

    # ------------------------------------------------------------ per-layer work
    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        o = super().forward_extend(q, k, v, layer, forward_batch, save_kv_cache)
        # Without save_kv_cache the model wrote the layer's KV itself (fused with RoPE) or reads KV already
        # cached: either way the layer's keys are in the cache now.
        if self.sealed is not None:
            self.store.build_layer(layer.layer_id, self.token_to_kv_pool.get_key_buffer(layer.layer_id),
                                   self.sealed)
        return o

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True):
        if self.variant == DENSE or layer.layer_id in self.config.dense_layers:
            return super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache)
        bs = forward_batch.batch_size
        pool = self.token_to_kv_pool
        new_kv = None
        if k is not None and save_kv_cache:
            if self.write_kv_in_select:
                new_kv = (k.view(bs, self.num_kv_heads, self.head_dim), v.view(bs, self.num_kv_heads, self.head_dim),
                          forward_batch.out_cache_loc)
            else:
                pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v,
                                   *self._kv_write_scales(layer))
        q3 = q.contiguous().view(bs, self.num_qo_heads, self.head_dim)
        o = self.decoder.run(q3, pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id),
                             self.store.layer(layer.layer_id), self.req_to_token_pool.req_to_token,
                             forward_batch.req_pool_indices[:bs], self.locks_seq_lens, new_kv,
                             # Python floats, as FlashInfer's own decode takes them: no device read in the graph.
                             k_scale=layer.k_scale_float, v_scale=layer.v_scale_float)
        if self.audit is not None:
            self.audit.capture(layer.layer_id, q3, self.decoder.sparse.indices)
        if self.dense_rows:
            dense = super().forward_decode(q, k, v, layer, forward_batch, save_kv_cache=False)
            o = torch.where(self.short_rows[:, None, None], dense.view_as(o), o)
        return o.reshape(bs, self.num_qo_heads * self.head_dim)
