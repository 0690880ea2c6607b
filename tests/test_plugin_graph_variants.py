"""Per-step choice of LOCKS or dense decode, and the decode graphs captured and keyed per variant."""

import pytest

from plugin_helpers import load_sglang_plugins
from sglang_locks.plugin.graph_variants import (
    DENSE,
    LOCKS,
    capture_each_variant,
    default_min_step_tokens,
    graph_label,
    step_variant,
)


class FakeBackend:
    """What the hooks read of the LOCKS backend: its variants and the current one."""

    def __init__(self, variants=(LOCKS, DENSE)):
        self.variants, self.variant = variants, LOCKS

    def graph_variants(self):
        return self.variants


class FakeRunner:
    def __init__(self, backend):
        self.attn_backend = backend


def test_default_threshold_scales_with_kv_heads():
    # The H200 crossovers at bs=1: Llama-3.1-8B (8 KV heads) ~24-32K tokens, GLM-4-9B-1M (2) ~128K.
    assert (default_min_step_tokens(8), default_min_step_tokens(2), default_min_step_tokens(1)) == (32768, 131072,
                                                                                                     262144)


@pytest.mark.parametrize("lens, threshold, want", [
    ([5000], 32768, DENSE),
    ([32767], 32768, DENSE),
    ([32768], 32768, LOCKS),
    ([9000, 9000, 9000, 9000], 32768, LOCKS),  # a step's KV tokens in all: fixed costs are per step
    ([1, 1, 1], 32768, DENSE),                 # graph padding rows (seq_len 1)
    ([100], 0, LOCKS),                         # 0: never dense
])
def test_step_variant_counts_the_steps_tokens(lens, threshold, want):
    assert step_variant(lens, threshold) == want


def test_graph_label_keeps_sglangs_label():
    assert graph_label(None, DENSE) == "locks-dense"
    assert graph_label("lora", LOCKS) == "lora+locks-locks"
    assert graph_label("nolora", DENSE) != graph_label("nolora", LOCKS)


def test_each_variant_captured_with_the_backend_set_to_it():
    seen = []

    def capture(runner, bs, forward):
        seen.append((bs, runner.attn_backend.variant))

    capture_each_variant(capture, FakeRunner(FakeBackend()), 8, None)
    assert seen == [(8, LOCKS), (8, DENSE)]
    seen.clear()
    capture_each_variant(capture, FakeRunner(FakeBackend(variants=(LOCKS,))), 4, None)
    assert seen == [(4, LOCKS)]


def test_stock_runner_captures_once():
    class Stock:
        attn_backend = object()

    calls = []
    capture_each_variant(lambda runner, *a: calls.append(a), Stock(), 2, None, None, "lora")
    assert calls == [(2, None, None, "lora")]


def test_sglangs_graph_keys_carry_the_variant():
    """The hooked DecodeCudaGraphRunner._make_graph_key: one key per variant, SGLang's label kept;
    stock backends' keys unchanged."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.model_executor.runner.shape_key import ShapeKey

    load_sglang_plugins()
    backend = FakeBackend()
    runner = FakeRunner(backend)
    keys = set()
    for variant in (LOCKS, DENSE):
        backend.variant = variant
        keys.add(DecodeCudaGraphRunner._make_graph_key(runner, 4, variant_label="lora"))
    assert keys == {ShapeKey(4, None, "lora+locks-locks"), ShapeKey(4, None, "lora+locks-dense")}
    assert DecodeCudaGraphRunner._make_graph_key(FakeRunner(object()), 4) == ShapeKey(4)
    assert hasattr(DecodeCudaGraphRunner.capture_one_shape, "__wrapped__")
