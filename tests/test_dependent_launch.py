"""The decode chain's launch knobs: SGLANG_LOCKS_PDL (which kernels take programmatic dependent launch) and
SGLANG_LOCKS_L2_KEEP (the L2 eviction policy of the outputs the next kernel reads)."""

import pytest
import torch

from sglang_locks.kernels import _triton


def test_default_is_the_score_kernel_the_sparse_decode_and_its_merge(monkeypatch):
    """Not the selection nor the score kernel of 16 query heads per KV head: both measured slower so."""
    monkeypatch.delenv(_triton.PDL_ENV, raising=False)
    assert _triton._dependent_kernels("1") == ("score", "attend", "merge") == _triton.DEPENDENT_KERNELS
    assert _triton._dependent_kernels("0") == ()
    assert _triton._dependent_kernels("score,select") == ("score", "select")


def test_unknown_kernel_names_the_variable(monkeypatch):
    monkeypatch.setenv(_triton.PDL_ENV, "attend,decode")
    with pytest.raises(ValueError, match="SGLANG_LOCKS_PDL must be 0, 1 or a comma-separated list"):
        _triton.dependent_launch(torch.device("cpu"), "attend")


def test_no_dependent_launch_off_the_gpu(monkeypatch):
    """CPU tensors and the interpreter compile the kernels without griddepcontrol (PDL 0), whatever the setting."""
    monkeypatch.setenv(_triton.PDL_ENV, ",".join(_triton.CHAIN_KERNELS))
    for kernel in _triton.CHAIN_KERNELS:
        assert _triton.dependent_launch(torch.device("cpu"), kernel) == {"PDL": 0}


def test_outputs_for_the_next_kernel_are_kept_in_l2_by_default(monkeypatch):
    monkeypatch.delenv(_triton.L2_KEEP_ENV, raising=False)
    assert _triton.l2_keep() == "evict_last"
    monkeypatch.setenv(_triton.L2_KEEP_ENV, "0")
    assert _triton.l2_keep() == ""


def test_l2_keep_error_names_the_variable(monkeypatch):
    monkeypatch.setenv(_triton.L2_KEEP_ENV, "yes")
    with pytest.raises(ValueError, match="SGLANG_LOCKS_L2_KEEP must be 0 or 1"):
        _triton.l2_keep()
