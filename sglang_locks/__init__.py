"""LOCKS sparse decode attention for SGLang: page summaries, scoring, selection, sparse decode."""

from .config import LocksConfig
from .decode import LocksDecode, SelectionState, locks_decode_reference
from .scoring import score_pages
from .selection import select_pages
from .shared_prefix import SharedRuns, shared_runs
from .sparse_decode import SparseDecodeWrapper
from .summaries import PageSummaries, summarize_pages, summarize_pages_reference
from .support import attention_shape_reason

__all__ = ["LocksConfig", "PageSummaries", "summarize_pages", "summarize_pages_reference", "score_pages", "select_pages",
           "LocksDecode", "SelectionState", "locks_decode_reference", "SparseDecodeWrapper", "SharedRuns", "shared_runs",
           "attention_shape_reason"]
__version__ = "0.1.0"
