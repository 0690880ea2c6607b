"""What every launch wrapper needs to know about the Triton runtime."""

import ctypes
import functools
import logging
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

# Programmatic dependent launch of the decode chain (score -> select -> attend -> merge): SGLANG_LOCKS_PDL=0 off,
# 1 (default) for DEPENDENT_KERNELS, or a comma-separated list of CHAIN_KERNELS. "score" is the Gluon score kernel
# (score_pages_gluon), "score_heads" its form for 16 query heads per KV head (score_pages_gluon_heads).
PDL_ENV = "SGLANG_LOCKS_PDL"
CHAIN_KERNELS = ("score", "score_heads", "select", "attend", "merge")
# Launched so by default where that measured faster on the H200: the score kernel, the sparse decode and its
# merge; the selection and the heads score kernel measured slower (docs/performance.md).
DEPENDENT_KERNELS = ("score", "attend", "merge")


# SGLANG_LOCKS_L2_KEEP=1 (default) stores the outputs that the next kernel of the decode chain reads (the score
# kernel's scores and partials, the sparse decode's parts) with L2 policy evict-last, so that the selection finds
# them in L2 rather than evicted by the layer's stream of page summaries; 0 stores them with the default policy.
# (Loads read once a step cannot be marked evict-first instead: Triton's and Gluon's cp.async drop the hint.)
L2_KEEP_ENV = "SGLANG_LOCKS_L2_KEEP"


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
def _libcuda():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def resident_blocks(compiled) -> int:
    """Programs of a compiled Triton kernel that one SM holds at once (the CUDA driver's occupancy of its
    registers, shared memory and warps), or 0 where the driver cannot say."""
    lib = _libcuda()
    if hasattr(compiled, "result"):  # Triton's asynchronous compile mode
        compiled = compiled.result()
    try:
        compiled._init_handles()  # loads the module: registers known (Triton has no public hook for it)
        blocks = ctypes.c_int(0)
        status = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks), ctypes.c_void_p(compiled.function), compiled.metadata.num_warps * 32,
            ctypes.c_size_t(compiled.metadata.shared))
    except (AttributeError, TypeError):  # no libcuda, or a Triton without these fields
        status = -1
    if status != 0:
        logging.getLogger(__name__).warning("kernel occupancy unavailable (CUDA status %s)", status)
        return 0
    return blocks.value


@functools.lru_cache(maxsize=None)
def _sm90_or_later(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


@functools.lru_cache(maxsize=None)
def _dependent_kernels(value: str) -> tuple:
    kernels = {"0": (), "1": DEPENDENT_KERNELS}.get(value, tuple(value.split(",")))
    if set(kernels) - set(CHAIN_KERNELS):
        raise ValueError(f"{PDL_ENV} must be 0, 1 or a comma-separated list of {CHAIN_KERNELS}, got {value!r}")
    return kernels


def dependent_launch(device: torch.device, kernel: str) -> dict:
    """Launch options of a kernel of the decode chain: with programmatic dependent launch (Hopper+) a kernel is
    scheduled while the one before it runs, and waits (griddepcontrol.wait, compile-time PDL) before it reads
    or writes anything, so that only the launch latency overlaps."""
    if kernel not in _dependent_kernels(os.environ.get(PDL_ENV, "1")) or interpreted() or device.type != "cuda":
        return {"PDL": 0}
    if not _sm90_or_later(device.index if device.index is not None else torch.cuda.current_device()):
        return {"PDL": 0}
    return {"PDL": 1, "launch_pdl": True}


def l2_keep() -> str:
    """The eviction policy (compile-time KEEP) of a decode-chain kernel's stores that the next kernel reads."""
    value = os.environ.get(L2_KEEP_ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{L2_KEEP_ENV} must be 0 or 1, got {value!r}")
    return "evict_last" if value == "1" else ""


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """First thing in a kernel of the decode chain (dependent_launch): wait for the kernel before it to finish
    (its outputs visible), then let the kernel after it launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
