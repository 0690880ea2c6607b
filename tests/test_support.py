"""sglang_locks.support: the attention shapes the kernels take, as the plugin asks before building anything."""

import pytest

from sglang_locks import attention_shape_reason


@pytest.mark.parametrize("head_dim, hq, hkv", [(128, 32, 8), (64, 9, 3), (128, 16, 1), (256, 4, 4), (32, 2, 2)])
def test_shapes_the_kernels_take(head_dim, hq, hkv):
    assert attention_shape_reason(head_dim, hq, hkv) is None


@pytest.mark.parametrize("head_dim, hq, hkv, says", [
    (96, 32, 8, "head_dim 96"), (20, 4, 4, "head_dim 20"), (127, 4, 4, "head_dim 127"),
    (128, 34, 1, "1..16 query heads"), (128, 12, 8, "12 query heads on 8"), (128, 8, 0, "on 0 KV heads"),
])
def test_other_shapes_are_refused_with_the_reason(head_dim, hq, hkv, says):
    assert says in attention_shape_reason(head_dim, hq, hkv)
