"""What the LOCKS kernels can take, for a caller that refuses a model before building anything (the plugin)."""

from __future__ import annotations

from typing import Optional

from .kernels.build_summaries import head_dim_reason
from .kernels.score_pages import MAX_GROUP


def attention_shape_reason(head_dim: int, num_qo_heads: int, num_kv_heads: int) -> Optional[str]:
    """Why the summary, score and selection kernels cannot take this attention shape (per GPU), or None."""
    reason = head_dim_reason(head_dim)
    if reason:
        return reason
    if num_kv_heads < 1 or num_qo_heads % num_kv_heads or not 1 <= num_qo_heads // num_kv_heads <= MAX_GROUP:
        return (f"{num_qo_heads} query heads on {num_kv_heads} KV heads per GPU (1..{MAX_GROUP} query heads per KV "
                "head, which the score kernel holds in one tile)")
    return None
