"""The environment variables sglang-locks reads, in one place: each 0 or 1, validated where it is read."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

# Programmatic dependent launch of the decode chain (kernels/_triton.dependent_launch): 0 turns it off, for a
# driver or GPU where it misbehaves.
DEPENDENT_LAUNCH_ENV = "SGLANG_LOCKS_PDL"
# Count, every decode step, the pages that would be scored from an invalid summary (plugin's SummaryStore): a
# check of the summaries' bookkeeping that costs device work every step.
CHECK_STALE_ENV = "SGLANG_LOCKS_CHECK_STALE"


@dataclass(frozen=True)
class Environment:
    dependent_launch: bool = True
    check_stale: bool = False


def _flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    value = environ.get(name)
    if value is None:
        return default
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


def dependent_launch_enabled(environ: Mapping[str, str] = None) -> bool:
    """Environment.dependent_launch alone: read at every launch of the decode chain, so only its variable."""
    return _flag(os.environ if environ is None else environ, DEPENDENT_LAUNCH_ENV, Environment.dependent_launch)


def read_environment(environ: Mapping[str, str] = None) -> Environment:
    """The switches as the process's environment (or environ) sets them; unset ones take Environment's defaults."""
    environ = os.environ if environ is None else environ
    return Environment(dependent_launch=dependent_launch_enabled(environ),
                       check_stale=_flag(environ, CHECK_STALE_ENV, Environment.check_stale))
