"""LOCKS sparse decode attention for SGLang: page summaries, scoring, selection, sparse decode."""

from .config import LocksConfig
from .decode import LocksDecode, locks_decode_reference
from .scoring import score_pages
from .selection import select_pages
from .shared_prefix import SharedRuns, shared_runs
from .sparse_decode import SparseDecodeWrapper
from .summaries import PageSummaries, summarize_pages, summarize_pages_reference

__all__ = ["LocksConfig", "PageSummaries", "summarize_pages", "summarize_pages_reference", "score_pages", "select_pages",
           "LocksDecode", "locks_decode_reference", "SparseDecodeWrapper", "SharedRuns", "shared_runs"]
__version__ = "0.1.0"
