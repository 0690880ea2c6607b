"""What every launch wrapper needs to know about the Triton runtime."""

import contextlib
import ctypes
import functools
import logging
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..environment import dependent_launch_enabled

# The decode chain (score -> select -> attend -> merge). "score" is the Gluon score kernel (score_pages_gluon),
# "score_heads" its form for 16 query heads per KV head (score_pages_gluon_heads).
CHAIN_KERNELS = ("score", "score_heads", "select", "attend", "merge")
# Launched as dependents where that measured faster on the H200: the score kernel, the sparse decode and its
# merge; the selection and the heads score kernel measured slower (docs/performance.md).
DEPENDENT_KERNELS = ("score", "attend", "merge")
# The outputs that the next kernel of the decode chain reads (the score kernel's scores and partials, the sparse
# decode's parts) are stored evict-last, so that it finds them in L2 rather than evicted by the layer's stream of
# page summaries. (Loads read once a step cannot be marked evict-first instead: cp.async drops the hint.)
L2_KEEP = "evict_last"
_dependent_override = None  # dependent_kernels()


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


@contextlib.contextmanager
def dependent_kernels(kernels: tuple):
    """Within: exactly these kernels of CHAIN_KERNELS launch as dependents, whatever the environment (tests of
    every combination, benchmarks timing a kernel without the overlap)."""
    global _dependent_override
    if set(kernels) - set(CHAIN_KERNELS):
        raise ValueError(f"kernels must be among {CHAIN_KERNELS}, got {kernels}")
    before, _dependent_override = _dependent_override, tuple(kernels)
    try:
        yield
    finally:
        _dependent_override = before


def dependent_launch(device: torch.device, kernel: str) -> dict:
    """Launch options of a kernel of the decode chain: with programmatic dependent launch (Hopper+) a kernel is
    scheduled while the one before it runs, and waits (griddepcontrol.wait, compile-time PDL) before it reads
    or writes anything, so that only the launch latency overlaps."""
    if _dependent_override is not None:
        chain = _dependent_override
    else:
        chain = DEPENDENT_KERNELS if dependent_launch_enabled() else ()
    if kernel not in chain or interpreted() or device.type != "cuda":
        return {"PDL": 0}
    if not _sm90_or_later(device.index if device.index is not None else torch.cuda.current_device()):
        return {"PDL": 0}
    return {"PDL": 1, "launch_pdl": True}


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """First thing in a kernel of the decode chain (dependent_launch): wait for the kernel before it to finish
    (its outputs visible), then let the kernel after it launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
