"""Triton kernels of LOCKS, each with its launch wrapper and a torch reference beside it.

Installed as ``sglang_locks.kernels`` (the PyPI package ``kernels`` is an SGLang
dependency, so this folder must never be importable as top-level ``kernels``).
"""
