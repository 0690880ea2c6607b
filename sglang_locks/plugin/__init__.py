"""SGLang plugin (entry point group ``sglang.srt.plugins``): LOCKS decode behind --enable-locks.

``register()`` runs in every SGLang process through ``load_plugins()``. It only
registers hooks; each hook is a no-op unless the server runs with --enable-locks.
"""

from __future__ import annotations

from . import audit, counters, graph_variants, memory, server_args, summary_store
from .compat import SUPPORTED_SGLANG_VERSIONS, hicache_load_back_target, supported_range

SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
ALLOCATOR = "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator"
DECODE_GRAPHS = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"

# (target, hook, hook type name): everything the plugin patches.
HOOKS = (
    (f"{SERVER_ARGS}.add_cli_args", server_args.add_locks_args, "AFTER"),
    (f"{SERVER_ARGS}.from_cli_args", server_args.from_cli_args_with_locks, "AROUND"),
    (f"{ALLOCATOR}._release_page_ids", summary_store.on_release_pages, "AFTER"),
    (f"{ALLOCATOR}.clear", summary_store.on_allocator_clear, "AFTER"),
    ("sglang.srt.model_executor.pool_configurator.DefaultPoolConfigurator._compute_cell_size",
     memory.add_summary_bytes, "AFTER"),
    ("sglang.srt.mem_cache.kv_cache_configurator.KVCacheConfigurator._profile_available_bytes",
     memory.reserve_decoder_bytes, "AFTER"),
    ("sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_extend", counters.count_reused_pages, "AROUND"),
    ("sglang.srt.managers.scheduler.Scheduler.get_internal_state", counters.add_locks_state, "AFTER"),
    (f"{DECODE_GRAPHS}.capture_one_shape", graph_variants.capture_each_variant, "AROUND"),
    (f"{DECODE_GRAPHS}._make_graph_key", graph_variants.key_with_variant, "AROUND"),
    ("sglang.srt.model_executor.model_runner.ModelRunner.forward", audit.audit_after_forward, "AFTER"),
)


def optional_hooks():
    """Hooks on targets only some supported releases have (registered where they exist, required where used)."""
    load_back = hicache_load_back_target()
    return ((load_back, summary_store.on_load_back, "AFTER"),) if load_back else ()


def register() -> None:
    from sglang.srt.layers.attention import attention_registry
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook, kind in (*HOOKS, *optional_hooks()):
        HookRegistry.register(target, hook, HookType[kind])
    # The registry is a dict, which hooks do not rebind: wrap its "flashinfer" entry here.
    stock = attention_registry.ATTENTION_BACKENDS["flashinfer"]
    if getattr(stock, "stock_factory", None) is None:
        attention_registry.ATTENTION_BACKENDS["flashinfer"] = _locks_or_stock(stock)


def check_installed(server_args=None) -> None:
    """Refuse --enable-locks unless this is a supported SGLang and every hook it needs is in place: SGLang only
    logs a hook it failed to apply, and without the release hooks freed pages would be scored from their old
    summaries (without the load-back hook, so would HiCache's reloaded pages)."""
    import sglang
    from sglang.srt.plugins.hook_registry import HookRegistry

    if sglang.__version__ not in SUPPORTED_SGLANG_VERSIONS:
        raise RuntimeError(f"--enable-locks supports SGLang {supported_range()}, not {sglang.__version__}")
    needed = [target for target, _, _ in HOOKS]
    if getattr(server_args, "enable_hierarchical_cache", False):
        needed += [target for target, _, _ in optional_hooks()] or ["HiRadixCache.load_back (absent)"]
    missing = [target for target in needed if target not in HookRegistry._patched]
    if missing:
        raise RuntimeError(f"--enable-locks: SGLang did not apply the plugin's hooks to {', '.join(missing)} "
                           "(see SGLang's 'Failed to apply hooks' log lines)")


def _locks_or_stock(stock_factory):
    def create_flashinfer_backend(runner):
        config = server_args.locks_config_of(runner.server_args)
        if config is None:
            return stock_factory(runner)
        check_installed(runner.server_args)
        from .attention_backend import LocksFlashInferAttnBackend  # needs FlashInfer

        return LocksFlashInferAttnBackend(runner, config)

    create_flashinfer_backend.stock_factory = stock_factory
    return create_flashinfer_backend
