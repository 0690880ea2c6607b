"""SGLANG_LOCKS_PDL: which kernels of the decode chain take programmatic dependent launch."""

import pytest
import torch

from sglang_locks.kernels import _triton


def test_default_is_the_sparse_decode_and_its_merge(monkeypatch):
    monkeypatch.delenv(_triton.PDL_ENV, raising=False)
    assert _triton._dependent_kernels("1") == ("attend", "merge") == _triton.DEPENDENT_KERNELS
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
