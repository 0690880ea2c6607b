"""The SGLang releases the plugin supports, and what differs between them.

Every hook target keeps its name across the range; what differs is chosen
here by the feature the installed SGLang has, not by its version string (one
more: DecodeCudaGraphRunner._make_graph_key gained an argument, which its hook
passes on). .ci/sglang_matrix.sh reads the version list from this file, which
therefore imports only the standard library at module level.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

# Each checked on CPU in CI (tests/requirements-sglang-cpu*.txt); the GPU tests run on the first.
SUPPORTED_SGLANG_VERSIONS = ("0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")


def supported_range() -> str:
    """The list as refusals name it: it holds every release from its first to its last."""
    return f"{SUPPORTED_SGLANG_VERSIONS[0]} to {SUPPORTED_SGLANG_VERSIONS[-1]}"


def _resolved_apart(server_args) -> bool:
    """Up to 0.5.18 resolution runs as ServerArgs is built and writes the resolved values into its fields, which
    are read-only from then on. From 0.5.19 (ServerArgs.resolve_once, run by the launcher) the fields keep the
    operator's input, writable until resolution, which declares its values beside them."""
    return hasattr(server_args, "resolve_once")


def set_server_args_attr(server_args, name: str, value) -> None:
    """An attribute beyond ServerArgs's fields, set while parsing and pickled with it to every process."""
    if _resolved_apart(server_args):
        setattr(server_args, name, value)
    else:
        object.__setattr__(server_args, name, value)


def metadata_glue_graph_enabled() -> bool:
    """SGLANG_ENABLE_METADATA_GLUE_GRAPH (from 0.5.19, off by default): the decode runner captures the attention
    backend's per-replay metadata prep in a CUDA graph and replays it instead of calling it."""
    from sglang.srt.environ import envs

    flag = getattr(envs, "SGLANG_ENABLE_METADATA_GLUE_GRAPH", None)
    return flag is not None and bool(flag.get())


def cuda_graph_config(server_args):
    """The resolved CUDA-graph configuration SGLang captures by."""
    if not _resolved_apart(server_args):
        return server_args.cuda_graph_config
    from sglang.srt.arg_groups.overrides import resolved_view

    return resolved_view(server_args).cuda_graph_config


HICACHE_MODULE = "sglang.srt.mem_cache.hiradix_cache"


def hicache_load_back_target() -> Optional[str]:
    """HiRadixCache.load_back, the hook target that lets --enable-hierarchical-cache run with LOCKS, where this
    SGLang has its hiradix_cache module (later releases fold HiCache into unified_radix_cache); else None."""
    try:
        found = importlib.util.find_spec(HICACHE_MODULE) is not None
    except ImportError:  # no sglang at all
        found = False
    return f"{HICACHE_MODULE}.HiRadixCache.load_back" if found else None
