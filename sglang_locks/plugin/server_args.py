"""--enable-locks and --locks-* flags: added to SGLang's parser, validated once into a LocksConfig.

``add_locks_args`` runs after ``ServerArgs.add_cli_args``; ``from_cli_args_with_locks``
wraps ``ServerArgs.from_cli_args``: it checks the flags, forces page size 16
and the FlashInfer backend, and attaches the config as ``server_args.locks_config``
(None without --enable-locks), which travels with server_args to every process.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
from typing import List, Optional, Tuple

from ..config import PAGE_SIZE, SPARSE_DECODE_KERNELS, LocksConfig
from . import compat
from .audit import AuditConfig

logger = logging.getLogger(__name__)

_DEFAULTS = LocksConfig()
# LocksConfig field -> flag; --locks-min-context defaults to the budget (contexts within it are dense anyway).
FLAGS = {
    "token_budget": "--locks-token-budget",
    "rank": "--locks-rank",
    "sink_pages": "--locks-sink-pages",
    "local_pages": "--locks-local-pages",
    "dense_layers": "--locks-dense-layers",
    "min_context": "--locks-min-context",
    "min_step_tokens": "--locks-min-step-tokens",
    "prefilter": "--locks-prefilter",
    "prefilter_rank": "--locks-prefilter-rank",
    "sparse_decode": "--locks-sparse-decode",
}
# SGLang: the KV cache must hold what the summaries and the sparse decode read: 16-bit keys and values as is, or
# fp8_e4m3 ones divided by their layer's scale (float8_e4m3fn, with bf16 or fp16 queries).
SUPPORTED_KV_CACHE_DTYPES = ("auto", "bf16", "bfloat16", "fp16", "float16", "fp8_e4m3")
# --dtype and --kv-cache-dtype values -> the torch dtype they give (absent: auto, the model's).
DTYPES = {"half": "float16", "float16": "float16", "fp16": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float": "float32", "float32": "float32"}


def _dense_layers(text: str) -> Tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--locks-dense-layers takes comma-separated layer indices, got {text!r}")


def add_locks_args(_result, parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("LOCKS sparse decode attention (sglang-locks)")
    g.add_argument("--enable-locks", action="store_true",
                   help="Decode through LOCKS sparse attention (forces --attention-backend flashinfer, --page-size 16).")
    g.add_argument("--locks-token-budget", type=int, default=_DEFAULTS.token_budget,
                   help="Sealed-page tokens attended per request and KV head: a multiple of 16 in "
                        "[(sink pages + local pages + 1) * 16, context length].")
    g.add_argument("--locks-rank", type=int, default=_DEFAULTS.rank, help="Rank of each page's key basis, 1..16.")
    g.add_argument("--locks-sink-pages", type=int, default=_DEFAULTS.sink_pages,
                   help="First pages always attended.")
    g.add_argument("--locks-local-pages", type=int, default=_DEFAULTS.local_pages,
                   help="Last sealed pages always attended (>= 1).")
    g.add_argument("--locks-dense-layers", type=_dense_layers, default=(),
                   help="Comma-separated layer indices decoded densely by FlashInfer.")
    g.add_argument("--locks-min-context", type=int, default=None,
                   help="Requests with fewer tokens decode densely (default: the token budget).")
    g.add_argument("--locks-min-step-tokens", type=int, default=None,
                   help="Decode steps whose requests hold fewer KV tokens in all run FlashInfer's dense decode "
                        "(default: 262144 / KV heads per GPU, where LOCKS stops paying off; 0: never).")
    g.add_argument("--locks-prefilter", type=int, default=_DEFAULTS.prefilter,
                   help="Score every page by its centroid first and only the best PREFILTER x budget pages of each "
                        "request and KV head in full (0: every page in full; at most context length / budget).")
    g.add_argument("--locks-prefilter-rank", type=int, default=_DEFAULTS.prefilter_rank,
                   help="Ranks of each page's summary in the prefilter's estimate, 0..--locks-rank (0: centroid only).")
    g.add_argument("--locks-sparse-decode", choices=SPARSE_DECODE_KERNELS, default=_DEFAULTS.sparse_decode,
                   help="Kernel attending the selected pages: triton (split over pages) or FlashInfer's batch decode.")
    g.add_argument("--locks-audit-every", type=int, default=0, metavar="N",
                   help="Every N-th LOCKS decode step, measure the share of the exact attention mass the selected "
                        "pages held, for sampled rows, on /metrics (needs --enable-metrics; 0: off).")


def _flag_error(message: str) -> ValueError:
    for field, flag in FLAGS.items():
        message = re.sub(rf"\b{field}\b", flag, message)
    return ValueError(f"--enable-locks: {message}")


def check_context_len(config: LocksConfig, context_len: int) -> None:
    """LocksConfig.check_context_len, its ValueError naming the flags."""
    try:
        config.check_context_len(context_len)
    except ValueError as e:
        raise _flag_error(str(e)) from None


def _given_flags(ns: argparse.Namespace) -> List[str]:
    """The --locks-* flags whose parsed values differ from add_locks_args's defaults."""
    parser = argparse.ArgumentParser(add_help=False)
    add_locks_args(None, parser)
    defaults = vars(parser.parse_args([]))
    return ["--" + dest.replace("_", "-") for dest, default in defaults.items()
            if dest.startswith("locks_") and getattr(ns, dest, default) != default]


def _warn_unused(ns: argparse.Namespace) -> None:
    given = _given_flags(ns)
    if not getattr(ns, "enable_locks", False):
        if given:
            logger.warning("%s: no effect without --enable-locks", ", ".join(given))
    elif "--locks-prefilter-rank" in given and ns.locks_prefilter == 0:
        logger.warning("--locks-prefilter-rank %d: no effect without --locks-prefilter (0: every page is scored "
                       "in full)", ns.locks_prefilter_rank)


def locks_config_from_args(ns: argparse.Namespace) -> Optional[LocksConfig]:
    """The validated LocksConfig of parsed flags, None without --enable-locks. ValueError names the flag."""
    _warn_unused(ns)
    if not getattr(ns, "enable_locks", False):
        return None
    if ns.locks_local_pages < 1:
        # A page sealed by a decode step is summarised at the next forward; until then it must be forced in.
        raise _flag_error(f"local_pages must be >= 1, got {ns.locks_local_pages}")
    min_context = ns.locks_min_context if ns.locks_min_context is not None else ns.locks_token_budget
    try:
        config = LocksConfig(rank=ns.locks_rank, token_budget=ns.locks_token_budget, sink_pages=ns.locks_sink_pages,
                             local_pages=ns.locks_local_pages, dense_layers=tuple(ns.locks_dense_layers),
                             min_context=min_context,
                             min_step_tokens=ns.locks_min_step_tokens, prefilter=ns.locks_prefilter,
                             prefilter_rank=ns.locks_prefilter_rank, sparse_decode=ns.locks_sparse_decode)
    except ValueError as e:
        raise _flag_error(str(e)) from None
    if ns.context_length is not None:  # else the attention backend checks the model's at load
        check_context_len(config, ns.context_length)
    if config.min_context > config.token_budget and config.dense_layers:
        raise _flag_error("min_context above token_budget cannot be combined with dense_layers "
                          "(both need FlashInfer's own decode plan, with different lengths)")
    _reject_unsupported(ns)
    return config


def _reject_unsupported(ns: argparse.Namespace) -> None:
    def fail(flag: str, why: str):
        raise ValueError(f"--enable-locks does not support {flag}: {why}")

    if ns.page_size not in (None, PAGE_SIZE):
        fail(f"--page-size {ns.page_size}", f"LOCKS summarises {PAGE_SIZE}-token pages; use --page-size {PAGE_SIZE}")
    for flag in ("attention_backend", "decode_attention_backend", "prefill_attention_backend"):
        value = getattr(ns, flag, None)
        if value not in (None, "flashinfer"):
            fail(f"--{flag.replace('_', '-')} {value}", "LOCKS runs on the flashinfer backend")
    if ns.kv_cache_dtype not in SUPPORTED_KV_CACHE_DTYPES:
        fail(f"--kv-cache-dtype {ns.kv_cache_dtype}", f"supported: {', '.join(SUPPORTED_KV_CACHE_DTYPES)}")
    q_dtype = DTYPES.get(ns.dtype)
    if q_dtype == "float32":
        fail(f"--dtype {ns.dtype}", "LOCKS's kernels take bf16 or fp16 queries")
    kv_dtype = DTYPES.get(ns.kv_cache_dtype)  # a 16-bit cache's (None: auto or fp8_e4m3, either query dtype)
    if q_dtype is not None and kv_dtype not in (None, q_dtype):  # with auto the attention backend checks at load
        fail(f"--dtype {ns.dtype} with --kv-cache-dtype {ns.kv_cache_dtype}",
             "queries and KV cache must share one dtype (bf16 or fp16)")
    if ns.pp_size > 1:
        fail(f"--pp-size {ns.pp_size}", "not run with pipeline stages, each of which holds a slice of the layers "
             "(the attention backend checks --locks-dense-layers against its stage's own)")
    if ns.speculative_algorithm:
        fail("--speculative-algorithm", "verify steps move KV between pages")
    if ns.enable_hierarchical_cache and compat.hicache_load_back_target() is None:
        import sglang

        fail("--enable-hierarchical-cache", f"SGLang {sglang.__version__} has no hiradix_cache.HiRadixCache, whose "
             "load-back LOCKS follows to rebuild the summaries of reloaded pages (0.5.17 to 0.5.20 have it)")
    if getattr(ns, "enable_hisparse", False):
        fail("--enable-hisparse", "another sparse attention")
    if ns.dcp_size > 1:
        fail(f"--dcp-size {ns.dcp_size}", "pages are split across ranks")
    if getattr(ns, "enable_pdmux", False):
        # Its programs of one row wait for each other, sized for every SM of the device.
        fail("--enable-pdmux", "the LOCKS selection kernel needs the whole GPU, not a green-context SM partition")
    if getattr(ns, "enable_two_batch_overlap", False):
        # SGLang's TboAttnBackend builds a primary and two child backends and plans each micro-batch on a child;
        # LOCKS's decode state and summary builds follow one backend per forward (not run with micro-batches).
        fail("--enable-two-batch-overlap", "micro-batches are planned on child attention backends, which LOCKS "
             "does not drive")
    if ns.disaggregation_mode != "null":
        fail(f"--disaggregation-mode {ns.disaggregation_mode}", "transferred KV arrives without summaries")
    if compat.metadata_glue_graph_enabled():
        fail("SGLANG_ENABLE_METADATA_GLUE_GRAPH=1", "it replays the decode step's metadata prep from a CUDA graph, "
             "without LOCKS's host-side plan (the step's sealed pages and its LOCKS or dense variant)")


def audit_config_from_args(ns: argparse.Namespace) -> Optional[AuditConfig]:
    """The recall audit's config (with --enable-locks), None when off. ValueError names the flag."""
    every = ns.locks_audit_every
    if every == 0:
        return None
    if every < 0:
        raise ValueError(f"--enable-locks: --locks-audit-every must be >= 1 (audit every N-th LOCKS decode step) "
                         f"or 0 (off), got {every}")
    if not ns.enable_metrics:
        raise ValueError("--enable-locks: --locks-audit-every needs --enable-metrics (the audit's results are "
                         "exported on /metrics only)")
    return AuditConfig(every=every)


def from_cli_args_with_locks(original, cls, ns: argparse.Namespace):
    config = locks_config_from_args(ns)
    audit = audit_config_from_args(ns) if config is not None else None
    if config is not None:
        ns.page_size = PAGE_SIZE
        ns.attention_backend = "flashinfer"
        # LOCKS reads req_to_token inside the decode graph, after the pre-replay
        # snapshot SGLang's fast write-after-read barrier assumes is the last read.
        os.environ["SGLANG_FORCE_COARSE_WAR_BARRIER"] = "1"
    server_args = original(cls, ns)
    compat.set_server_args_attr(server_args, "locks_config", config)  # pickled with it to every process
    compat.set_server_args_attr(server_args, "locks_audit", audit)
    if config is not None:
        logger.info("LOCKS enabled: %s", dataclasses.asdict(config))
    return server_args


def locks_config_of(server_args) -> Optional[LocksConfig]:
    return getattr(server_args, "locks_config", None)


def locks_audit_of(server_args) -> Optional[AuditConfig]:
    return getattr(server_args, "locks_audit", None)
