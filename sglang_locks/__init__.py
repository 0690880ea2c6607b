"""LOCKS sparse decode attention for SGLang: page summaries, scoring, selection, sparse decode."""

from .config import LocksConfig
from .summaries import PageSummaries, summarize_pages, summarize_pages_reference
from .scoring import score_pages
from .selection import select_pages

__all__ = ["LocksConfig", "PageSummaries", "summarize_pages", "summarize_pages_reference", "score_pages", "select_pages"]
__version__ = "0.1.0"
