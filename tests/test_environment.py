"""The environment switches (sglang_locks.environment) and the decode chain's dependent launches they set."""

import pytest
import torch

from sglang_locks.environment import CHECK_STALE_ENV, DEPENDENT_LAUNCH_ENV, Environment, read_environment
from sglang_locks.kernels import _triton


def test_unset_switches_take_the_defaults():
    assert read_environment({}) == Environment(dependent_launch=True, check_stale=False)
    assert read_environment({DEPENDENT_LAUNCH_ENV: "0", CHECK_STALE_ENV: "1"}) == Environment(False, True)


@pytest.mark.parametrize("name", [DEPENDENT_LAUNCH_ENV, CHECK_STALE_ENV])
@pytest.mark.parametrize("value", ["yes", "", "2", "score,attend"])
def test_a_value_other_than_0_or_1_names_the_variable(name, value):
    with pytest.raises(ValueError, match=f"{name} must be 0 or 1, got {value!r}"):
        read_environment({name: value})


def test_the_chain_launches_the_measured_kernels_as_dependents_unless_switched_off(monkeypatch):
    """Not the selection nor the score kernel of 16 query heads per KV head: both measured slower so."""
    assert _triton.DEPENDENT_KERNELS == ("score", "attend", "merge")
    seen = []
    monkeypatch.setattr(_triton, "interpreted", lambda: False)
    monkeypatch.setattr(_triton, "_sm90_or_later", lambda index: True)
    cuda = torch.device("cuda", 0)
    monkeypatch.delenv(DEPENDENT_LAUNCH_ENV, raising=False)
    seen.append({k for k in _triton.CHAIN_KERNELS if _triton.dependent_launch(cuda, k)["PDL"]})
    monkeypatch.setenv(DEPENDENT_LAUNCH_ENV, "0")
    seen.append({k for k in _triton.CHAIN_KERNELS if _triton.dependent_launch(cuda, k)["PDL"]})
    with _triton.dependent_kernels(("select",)):  # tests and benchmarks override the environment
        seen.append({k for k in _triton.CHAIN_KERNELS if _triton.dependent_launch(cuda, k)["PDL"]})
    assert seen == [set(_triton.DEPENDENT_KERNELS), set(), {"select"}]
    assert _triton._dependent_override is None


def test_an_override_names_only_chain_kernels():
    with pytest.raises(ValueError, match="kernels must be among"):
        with _triton.dependent_kernels(("attend", "decode")):
            pass


def test_no_dependent_launch_off_the_gpu():
    """CPU tensors and the interpreter compile the kernels without griddepcontrol (PDL 0), whatever the setting."""
    with _triton.dependent_kernels(_triton.CHAIN_KERNELS):
        for kernel in _triton.CHAIN_KERNELS:
            assert _triton.dependent_launch(torch.device("cpu"), kernel) == {"PDL": 0}
