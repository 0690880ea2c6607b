"""What every launch wrapper needs to know about the Triton runtime."""

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# Programmatic dependent launch of the decode chain (score -> select -> attend -> merge): 0 off, 1 on.
PDL_ENV = "SGLANG_LOCKS_PDL"


def interpreted() -> bool:
    """True when Triton runs kernels on the CPU (TRITON_INTERPRET=1, used by CI)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_usable(device: torch.device) -> bool:
    return device.type == "cuda" or interpreted()


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of device (4 under the interpreter: small grids)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=None)
def _sm90_or_later(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def dependent_launch(device: torch.device) -> dict:
    """Launch options of a kernel in the decode chain: with programmatic dependent launch (Hopper+) a kernel
    is scheduled while the one before it finishes, and waits (griddepcontrol.wait, compile-time PDL > 0)
    before it reads or writes anything, so only the launch latency overlaps. SGLANG_LOCKS_PDL=0 turns it off."""
    mode = int(os.environ.get(PDL_ENV, "1"))
    if mode not in (0, 1, 2):
        raise ValueError(f"{PDL_ENV} must be 0 or 1, got {mode}")
    if mode == 0 or interpreted() or device.type != "cuda":
        return {"PDL": 0}
    if not _sm90_or_later(device.index if device.index is not None else torch.cuda.current_device()):
        return {"PDL": 0}
    return {"PDL": mode, "launch_pdl": True}


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """First thing in a kernel of the decode chain (dependent_launch): wait for the kernel before it to finish
    (its outputs visible); with PDL 1 let the kernel after it launch now."""
    if PDL > 0:
        gdc_wait()
    if PDL == 1:
        gdc_launch_dependents()


@triton.jit
def pdl_end(PDL: tl.constexpr):
    """With PDL 2 the kernel after this one launches once every program has passed this point."""
    if PDL == 2:
        gdc_launch_dependents()
