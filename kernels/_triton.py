"""What every launch wrapper needs to know about the Triton runtime."""

import os

import torch


def interpreted() -> bool:
    """True when Triton runs kernels on the CPU (TRITON_INTERPRET=1, used by CI)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_usable(device: torch.device) -> bool:
    return device.type == "cuda" or interpreted()
