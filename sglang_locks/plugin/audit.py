"""--locks-audit-every N: the live recall audit, the share of the exact attention mass the selection attended.

Inside every LOCKS decode step (CUDA graph or eager) ``capture`` copies, for
one audited layer per layer group, the queries of the batch's first
``captured_requests`` requests and their rows' page entries (the sparse
decode's ``indices``, which the next layer's selection overwrites) into static
buffers: two device copies per audited layer, no branch on the step. Each
audit takes the next ``requests`` of those in turn (``window``), so that over
audits every request of the batch's first ``captured_requests`` is sampled,
not only the longest-running ones at its head. After
every N-th LOCKS step's forward (an AFTER hook on ``ModelRunner.forward``,
on the forward's stream, before anything can free the step's pages or
overwrite its request rows), ``run`` computes eagerly from the K cache the
exact mass per page of those rows and the share their entries held
(sglang_locks.page_mass, all audited layers in one pass), and starts a
non-blocking copy of the shares and of the store's device counters to the host. The next audit publishes it to
Prometheus (audit_metrics) once the copy has landed, and skips its own
work while it has not: no step waits for the device.

Rows whose sealed pages all fit in the budget attend every token and are
not observed, nor are rows that --locks-min-context sends to FlashInfer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..config import PAGE_SIZE
from ..page_mass import attended_share, layers_attended_pages, layers_page_mass


@dataclass(frozen=True)
class AuditConfig:
    every: int  # audit every N-th LOCKS decode step
    requests: int = 2  # requests audited at a time, all of their KV heads
    captured_requests: int = 64  # the batch's first requests captured each step, audited `requests` at a time in turn
    layer_groups: int = 4  # LOCKS layers split into this many contiguous groups, one audited layer each

    def __post_init__(self) -> None:
        for name in ("every", "requests", "captured_requests", "layer_groups"):
            if getattr(self, name) < 1:
                raise ValueError(f"audit {name} must be >= 1, got {getattr(self, name)}")
        if self.captured_requests < self.requests:
            raise ValueError(f"audit captured_requests ({self.captured_requests}) must be >= requests "
                             f"({self.requests})")


def layer_groups(layers: Sequence[int], groups: int) -> List[Tuple[int, str]]:
    """(audited layer, label "first-last") of each of up to `groups` contiguous groups of the sorted layers;
    the audited layer is the group's middle one."""
    layers = sorted(layers)
    n = min(groups, len(layers))
    bounds = [len(layers) * i // n for i in range(n + 1)]
    return [(layers[(lo + hi - 1) // 2], f"{layers[lo]}-{layers[hi - 1]}") for lo, hi in zip(bounds, bounds[1:])]


class _HostCopy:
    """Device tensors copied into (pinned) host memory, read once the copy has landed: never a wait."""

    def __init__(self, *tensors: torch.Tensor):
        cuda = tensors[0].is_cuda
        self.host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda) for t in tensors]
        for host, t in zip(self.host, tensors):
            host.copy_(t, non_blocking=True)
        self.event = torch.cuda.Event() if cuda else None
        if self.event is not None:
            self.event.record()

    def ready(self) -> bool:
        return self.event is None or self.event.query()


class RecallAudit:
    def __init__(self, config: AuditConfig, layers: Sequence[int], num_qo_heads: int, num_kv_heads: int,
                 head_dim: int, budget_pages: int, q_dtype, device, store, metrics) -> None:
        """layers: the LOCKS layers; store: the SummaryStore whose counters the audit exports; metrics: an
        audit_metrics.AuditMetrics."""
        self.config = config
        self.groups = layer_groups(layers, config.layer_groups)
        self.slot_of = {layer: i for i, (layer, _) in enumerate(self.groups)}
        self.num_kv_heads, self.budget_pages = num_kv_heads, budget_pages
        # A request's rows hold at most budget + tail entries each; the first requests' rows are a prefix.
        self.entries_per_request = num_kv_heads * (budget_pages + 1)
        slots, captured = len(self.groups), config.captured_requests
        self.q = torch.zeros(slots, captured, num_qo_heads, head_dim, dtype=q_dtype, device=device)
        self.indices = torch.zeros(slots, captured * self.entries_per_request, dtype=torch.int32, device=device)
        self.store, self.metrics = store, metrics
        self.steps = 0
        self.audits = 0  # audits run: which window of the captured requests the next one takes
        self._in_flight: Optional[_HostCopy] = None

    def capture(self, layer_id: int, q: torch.Tensor, indices: torch.Tensor) -> None:
        """In the decode step, after the layer's LOCKS decode: q [bs, Hq, d], indices the sparse decode's."""
        slot = self.slot_of.get(layer_id)
        if slot is None:
            return
        n = min(self.config.captured_requests, q.shape[0])
        self.q[slot, :n].copy_(q[:n])
        self.indices[slot, : n * self.entries_per_request].copy_(indices[: n * self.entries_per_request])

    def due(self) -> bool:
        """Count a LOCKS decode step; True on every N-th."""
        self.steps += 1
        return self.steps % self.config.every == 0

    def window(self, batch_size: int) -> Tuple[int, int]:
        """(first request, count) of the batch the next audit takes: the next `requests` of the captured ones
        (the batch's first min(captured_requests, batch_size)), in turn."""
        pool = min(self.config.captured_requests, batch_size)
        n = self.config.requests
        windows = -(-pool // n)  # the last one may hold fewer
        start = (self.audits % windows) * n
        return start, min(n, pool - start)

    def run(self, start: int, k_buffers: Dict[int, torch.Tensor], tables: torch.Tensor, seq_lens: torch.Tensor,
            max_tokens: int, indptr: torch.Tensor, sm_scale: float,
            k_scales: Optional[Dict[int, float]] = None) -> None:
        """After the step's forward, eagerly: the shares of the captured rows of the batch's requests start ..
        start + n - 1 (a window). tables [n, >= max_tokens] their req_to_token rows; seq_lens [n] their LOCKS
        lengths (device); max_tokens >= each of them (host); indptr the sparse decode's rows of the step;
        k_scales: layer -> its k scale (page_mass: an fp8 cache holds keys / k_scale), for the audited layers at
        least (None: 1.0)."""
        if not self.publish():
            return
        n = tables.shape[0]
        hkv = self.num_kv_heads
        layers = [layer for layer, _ in self.groups]
        scales = [1.0 if k_scales is None else k_scales[layer] for layer in layers]
        mass = layers_page_mass(self.q[:, start : start + n], [k_buffers[layer] for layer in layers], scales,
                                tables, seq_lens, max_tokens, sm_scale)
        # The window's rows keep their offsets into the captured entries (those before them are skipped).
        entries = self.indices[:, : (start + n) * self.entries_per_request]
        attended = layers_attended_pages(tables, mass.shape[-1], indptr[start * hkv : (start + n) * hkv + 1],
                                         entries, hkv)
        selecting = (seq_lens.to(torch.int64) // PAGE_SIZE > self.budget_pages)[None, :, None]
        unobserved = torch.full((), math.nan, device=seq_lens.device)
        share = torch.where(selecting, attended_share(mass, attended), unobserved)
        self._in_flight = _HostCopy(share, self.store.device_counts())
        self.audits += 1

    def publish(self) -> bool:
        """Hand the last audit's results to the metrics once they are on the host; False while in flight."""
        pending = self._in_flight
        if pending is None:
            return True
        if not pending.ready():
            return False
        share, device_counts = pending.host
        for (layer, label), values in zip(self.groups, share.flatten(1)):
            self.metrics.observe_recall(label, layer, values[~values.isnan()].tolist())
        self.metrics.set_counters(self.store.counters(device_counts.tolist()))
        self._in_flight = None
        return True


def audit_after_forward(result, runner, forward_batch, *_args, **_kwargs):
    """AFTER hook on ModelRunner.forward: the LOCKS backend's audit of the step just launched."""
    step = getattr(runner.attn_backend, "locks_audit_step", None)
    if step is not None:
        step(forward_batch)
    return result
