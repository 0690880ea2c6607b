"""The entry point loads in SGLang's load_plugins() and every hook is applied (SGLang only logs failures)."""

import os
import re
import subprocess
import sys

import pytest

from plugin_helpers import load_sglang_plugins

CHECK = """
import sys; sys.path.insert(0, {tests!r})
import sglang_cpu_env; sglang_cpu_env.install()
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_locks.plugin import HOOKS, optional_hooks
load_plugins()
missing = [t for t, _, _ in (*HOOKS, *optional_hooks()) if t not in HookRegistry._patched]
print("MISSING", missing)
"""


def missing_hooks_in_fresh_process(**env):
    tests = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", CHECK.format(tests=tests)], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=300)
    line = [l for l in out.stdout.splitlines() if l.startswith("MISSING")]
    assert line, out.stdout + out.stderr
    return line[-1]


def test_entry_point_is_installed():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("locks") == "sglang_locks.plugin:register"


def test_every_hook_applied():
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_locks.plugin import HOOKS, optional_hooks

    load_sglang_plugins()
    assert [t for t, _, _ in (*HOOKS, *optional_hooks()) if t not in HookRegistry._patched] == []


def test_flashinfer_backend_entry_wrapped():
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    load_sglang_plugins()
    assert ATTENTION_BACKENDS["flashinfer"].stock_factory is not None


def test_hooks_reach_sglang_code():
    """The patched methods SGLang calls are ours (wrappers around the originals)."""
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.server_args import ServerArgs

    load_sglang_plugins()
    for fn in (PagedTokenToKVPoolAllocator._release_page_ids, PagedTokenToKVPoolAllocator.clear,
               ServerArgs.from_cli_args, ServerArgs.add_cli_args):
        assert hasattr(fn, "__wrapped__"), fn


def test_the_check_detects_a_plugin_that_did_not_load():
    """Run load_plugins() with our plugin filtered out: the check must report every hook missing."""
    from sglang_locks.plugin import HOOKS, optional_hooks

    everything = [t for t, _, _ in (*HOOKS, *optional_hooks())]
    assert missing_hooks_in_fresh_process() == "MISSING []"
    assert missing_hooks_in_fresh_process(SGLANG_PLUGINS="someone_else") == f"MISSING {everything}"


def test_attention_backend_module_imports():
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    from sglang_locks.plugin.attention_backend import LocksFlashInferAttnBackend

    assert issubclass(LocksFlashInferAttnBackend, FlashInferAttnBackend)


def test_summary_bytes_shrink_the_kv_cell(monkeypatch):
    """DefaultPoolConfigurator._compute_cell_size (hooked) grows by the summaries of the LOCKS layers."""
    from types import SimpleNamespace

    import sglang.srt.runtime_context as rc
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    from sglang_locks.config import LocksConfig
    from sglang_locks.plugin.memory import add_summary_bytes

    load_sglang_plugins()
    monkeypatch.setattr(rc, "get_parallel", lambda: SimpleNamespace(attn_tp_size=1))
    model = SimpleNamespace(get_num_kv_heads=lambda tp: 8, head_dim=128)
    kvc = SimpleNamespace(server_args=SimpleNamespace(locks_config=LocksConfig(dense_layers=(0, 1))),
                          model_config=model, layer_info=SimpleNamespace(start_layer=0))
    # 804 B per page and KV head at d=128, r=8 (int8-int4-int8); 30 LOCKS layers of 32; 8 B of stamps per page.
    assert add_summary_bytes(1000, None, kvc, 32) == 1000 + -(-(804 * 8 * 30 + 8) // 16)
    kvc.server_args.locks_config = None
    assert add_summary_bytes(1000, None, kvc, 32) == 1000
    assert hasattr(DefaultPoolConfigurator._compute_cell_size, "__wrapped__")


def _start_locks_backend():
    """What SGLang's model runner does at start-up: build the "flashinfer" backend of a server with --enable-locks."""
    from types import SimpleNamespace

    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    from sglang_locks.config import LocksConfig

    load_sglang_plugins()
    ATTENTION_BACKENDS["flashinfer"](SimpleNamespace(server_args=SimpleNamespace(locks_config=LocksConfig())))


def test_start_up_fails_naming_a_hook_that_was_not_applied(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_locks.plugin import ALLOCATOR

    load_sglang_plugins()
    target = f"{ALLOCATOR}._release_page_ids"
    monkeypatch.setattr(HookRegistry, "_patched", HookRegistry._patched - {target})
    with pytest.raises(RuntimeError, match=f"did not apply the plugin's hooks to {re.escape(target)} \\("):
        _start_locks_backend()


def test_start_up_fails_on_an_sglang_version_not_supported(monkeypatch):
    import sglang

    monkeypatch.setattr(sglang, "__version__", "0.4.0")
    with pytest.raises(RuntimeError, match=r"supports SGLang 0\.5\.17 to 0\.5\.23, not 0\.4\.0"):
        _start_locks_backend()


def test_start_up_checks_pass_on_the_supported_install():
    from sglang_locks.plugin import check_installed

    load_sglang_plugins()
    check_installed()
