"""LOCKS configuration: one dataclass, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Tuple

PAGE_SIZE = 16
SUMMARY_PRECISIONS = ("fp32", "bf16", "int8-int4-int8")
GQA_AGGREGATIONS = ("mass", "max", "logsumexp")
SPARSE_DECODE_KERNELS = ("triton", "flashinfer")


@dataclass(frozen=True)
class LocksConfig:
    """What LOCKS keeps per page and how much it attends per decode step.

    token_budget counts the sealed pages attended per (request, KV head): the
    sink pages, the last local_pages sealed pages and the best-scored rest,
    ``token_budget // page_size`` pages in all. The unsealed tail page (0-15
    tokens) is attended on top of the budget. A context whose sealed pages all
    fit in the budget is attended densely, and so is one shorter than
    min_context tokens (where the caller supports it: the SGLang plugin does).

    prefilter: with P > 0, each decode step first scores every sealed page by
    an estimate from its centroid and first prefilter_rank ranks (rank 0:
    q . mu + log 16 alone, 132 of a page's 804 summary bytes), keeps the
    prefilter * budget_pages best of each (request, KV head) and selects among
    those, scored with the whole summary. 0 (the default) scores every page in
    full, the seed's LOCKS: the prefilter trades recall for speed
    (docs/performance.md and docs/accuracy.md have both measured).

    sparse_decode: the kernel attending the selected pages, "triton"
    (kernels/sparse_attend.py, 1.2-1.3x faster on the H200) or "flashinfer"
    (FlashInfer's batch decode over the same page entries).
    """

    page_size: int = PAGE_SIZE
    rank: int = 8
    token_budget: int = 2048
    sink_pages: int = 1
    local_pages: int = 1
    dense_layers: Tuple[int, ...] = field(default_factory=tuple)
    summary_precision: str = "int8-int4-int8"
    gqa_aggregation: str = "mass"
    min_context: int = 0
    min_step_tokens: Optional[int] = None
    prefilter: int = 0
    prefilter_rank: int = 0
    sparse_decode: str = "triton"

    def __post_init__(self) -> None:
        if self.page_size != PAGE_SIZE:
            raise ValueError(
                f"page_size must be {PAGE_SIZE} (LOCKS summarises 16-token pages), got {self.page_size}"
            )
        if not 1 <= self.rank <= self.page_size:
            raise ValueError(f"rank must be in [1, page_size={self.page_size}], got {self.rank}")
        if self.sink_pages < 0:
            raise ValueError(f"sink_pages must be >= 0, got {self.sink_pages}")
        if self.local_pages < 0:
            raise ValueError(f"local_pages must be >= 0, got {self.local_pages}")
        min_budget = self.min_token_budget
        if self.token_budget < min_budget or self.token_budget % self.page_size:
            raise ValueError(
                f"token_budget must be a multiple of {self.page_size} and >= "
                f"(sink_pages + local_pages + 1) * page_size = {min_budget}, got {self.token_budget}"
            )
        if any((not isinstance(l, int)) or l < 0 for l in self.dense_layers):
            raise ValueError(f"dense_layers must be layer indices >= 0, got {self.dense_layers}")
        object.__setattr__(self, "dense_layers", tuple(sorted(set(self.dense_layers))))
        if self.summary_precision not in SUMMARY_PRECISIONS:
            raise ValueError(
                f"summary_precision must be one of {SUMMARY_PRECISIONS}, got {self.summary_precision!r}"
            )
        if self.min_context < 0:
            raise ValueError(f"min_context must be >= 0 tokens, got {self.min_context}")
        if self.min_step_tokens is not None and self.min_step_tokens < 0:
            raise ValueError(f"min_step_tokens must be >= 0 tokens (0: never dense), got {self.min_step_tokens}")
        if self.prefilter < 0:
            raise ValueError(f"prefilter must be >= 0 (candidate pages per budget page; 0: off), got {self.prefilter}")
        if not 0 <= self.prefilter_rank <= self.rank:
            raise ValueError(f"prefilter_rank must be in [0, rank={self.rank}], got {self.prefilter_rank}")
        if self.sparse_decode not in SPARSE_DECODE_KERNELS:
            raise ValueError(f"sparse_decode must be one of {SPARSE_DECODE_KERNELS}, got {self.sparse_decode!r}")
        if self.gqa_aggregation not in GQA_AGGREGATIONS:
            raise ValueError(
                f"gqa_aggregation must be one of {GQA_AGGREGATIONS}, got {self.gqa_aggregation!r}"
            )

    def check_context_len(self, context_len: int) -> None:
        """ValueError where a context of context_len tokens leaves token_budget or prefilter nothing to select:
        a budget above the context attends every page densely, and candidates above its pages are every page
        (both would only size per-request buffers for nothing)."""
        top = context_len // self.page_size * self.page_size
        if top < self.min_token_budget:
            raise ValueError(
                f"the context length {context_len} is below the smallest token_budget, (sink_pages + local_pages + 1)"
                f" * page_size = {self.min_token_budget}: every request would decode densely"
            )
        if self.token_budget > top:
            raise ValueError(
                f"token_budget must be a multiple of {self.page_size} in [{self.min_token_budget}, {top}] (up to the "
                f"context length {context_len}; a longer budget attends every page densely), got {self.token_budget}"
            )
        pages = context_len // self.page_size
        if self.candidate_pages > pages:
            raise ValueError(
                f"prefilter must be in [0, {pages // self.budget_pages}] (prefilter * token_budget / page_size "
                f"candidate pages, at most the {pages} pages of the context length {context_len}), got {self.prefilter}"
            )

    @property
    def min_token_budget(self) -> int:
        """The sink pages, the local pages and one scored page."""
        return (self.sink_pages + self.local_pages + 1) * self.page_size

    @property
    def budget_pages(self) -> int:
        """Sealed pages attended per (request, KV head), forced ones included."""
        return self.token_budget // self.page_size

    @property
    def candidate_pages(self) -> int:
        """Pages per (request, KV head) the prefilter keeps for full scoring; 0: no prefilter."""
        return self.prefilter * self.budget_pages

    @property
    def quantized(self) -> bool:
        return self.summary_precision == "int8-int4-int8"
