"""Per decode step, LOCKS or FlashInfer's dense decode: the cheaper one, under CUDA graphs too.

LOCKS has fixed costs per layer (scoring and selection launches, the sparse
decode's), which a short dense read does not: on the H200 at bs=1, decode with
LOCKS was up to 9 % slower than FullKV below ~32K tokens for the
Llama-3.1-8B shape (8 KV heads) and ~128K for GLM-4-9B-1M (2 KV heads)
(benchmarks/results/e2e_decode_crossover.json). So a decode step whose requests hold
fewer KV tokens in all than ``min_step_tokens`` runs FlashInfer's own decode,
exactly as stock SGLang; the rest decode through LOCKS. Decode-sealed pages
are summarised in both, so a request that grows past the threshold finds its
summaries ready.

Under CUDA graphs the decode runner captures every batch size once per
variant (AROUND hook on ``capture_one_shape``) and keys each graph by the
variant in ``ShapeKey.variant_label`` (AROUND hook on ``_make_graph_key``,
which the runner calls after the step's ``init_forward_metadata_out_graph``
has chosen the variant), so a step replays the graph of its variant.
"""

from __future__ import annotations

from typing import Optional, Sequence

LOCKS, DENSE = "locks", "dense"
# KV tokens below which a bs=1 step decodes densely, times KV heads per GPU: the H200 crossover
# (Llama-3.1-8B 8 heads -> 32K, GLM-4-9B-1M 2 heads -> 128K; LOCKS's saving per token grows with the heads).
AUTO_STEP_TOKENS_X_KV_HEADS = 1 << 18


def default_min_step_tokens(num_kv_heads: int) -> int:
    return AUTO_STEP_TOKENS_X_KV_HEADS // num_kv_heads


def step_variant(seq_lens: Sequence[int], min_step_tokens: int) -> str:
    """LOCKS, or DENSE when the step's requests hold fewer than min_step_tokens KV tokens in all."""
    return DENSE if sum(seq_lens) < min_step_tokens else LOCKS


def graph_label(label: Optional[str], variant: str) -> str:
    """The graph's ShapeKey.variant_label: SGLang's own (LoRA) label, if any, and the variant."""
    return f"{label}+locks-{variant}" if label else f"locks-{variant}"


def _locks_backend(runner):
    backend = getattr(runner, "attn_backend", None)
    return backend if callable(getattr(backend, "graph_variants", None)) else None


def capture_each_variant(original, runner, *args, **kwargs):
    """AROUND hook on DecodeCudaGraphRunner.capture_one_shape."""
    backend = _locks_backend(runner)
    if backend is None:
        return original(runner, *args, **kwargs)
    for variant in backend.graph_variants():
        backend.variant = variant
        original(runner, *args, **kwargs)
    return None


def key_with_variant(original, runner, size, stream_idx=None, variant_label=None, *rest, **kwargs):
    """AROUND hook on DecodeCudaGraphRunner._make_graph_key; rest: SGLang's own attention variant, from 0.5.18
    (dsa_variant, then attention_variant), passed on as given."""
    backend = _locks_backend(runner)
    if backend is not None:
        variant_label = graph_label(variant_label, backend.variant)
    return original(runner, size, stream_idx, variant_label, *rest, **kwargs)
