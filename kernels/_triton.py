"""What every launch wrapper needs to know about the Triton runtime."""

import os

import torch


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
