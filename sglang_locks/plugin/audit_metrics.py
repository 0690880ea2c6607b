"""The recall audit's Prometheus series, in SGLang's metrics (--enable-metrics, GET /metrics).

SGLang runs prometheus_client in multiprocess mode: the launcher sets
PROMETHEUS_MULTIPROC_DIR before it starts the scheduler processes, every
process's metrics write to files there, and the HTTP server's /metrics
collects them all. So series made here, in a scheduler process (where the
attention backend lives), show on /metrics; prometheus_client is imported
only here, late, as SGLang does, so that it sees that directory.

    sglang:locks_audit_recall{layer_group="8-15", layer="11", ...}   histogram of audited rows' recall
    sglang:locks_<counter>{...}                                      SummaryStore.counters(), as on /server_info
"""

from __future__ import annotations

from typing import Dict, Sequence

# Recall is read near 1: the buckets are fine there.
RECALL_BUCKETS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.925, 0.95, 0.96, 0.97, 0.98, 0.99, 0.995, 1.0)


class AuditMetrics:
    def __init__(self, labels: Dict[str, str], registry=None) -> None:
        """labels: the series' own (model_name, tp_rank); registry: prometheus_client's default when None."""
        from prometheus_client import REGISTRY, Gauge, Histogram

        self._registry = REGISTRY if registry is None else registry
        self._gauge_cls = Gauge
        self.labels = dict(labels)
        self.recall = Histogram(
            "sglang:locks_audit_recall",
            "LOCKS recall audit (--locks-audit-every): share of a (request, KV head) row's exact attention mass "
            "held by the pages its selection attended, per audited layer of each layer group",
            labelnames=[*self.labels, "layer_group", "layer"], buckets=RECALL_BUCKETS, registry=self._registry)
        self._gauges = {}

    def observe_recall(self, layer_group: str, layer: int, values: Sequence[float]) -> None:
        series = self.recall.labels(**self.labels, layer_group=layer_group, layer=str(layer))
        for v in values:
            series.observe(v)

    def set_counters(self, counters: Dict[str, int]) -> None:
        for name, value in counters.items():
            if name not in self._gauges:
                self._gauges[name] = self._gauge_cls(
                    f"sglang:locks_{name}", f"LOCKS {name.replace('_', ' ')} (/server_info's internal_states[i]"
                    f"['locks']['{name}'])", labelnames=list(self.labels), multiprocess_mode="mostrecent",
                    registry=self._registry)
            self._gauges[name].labels(**self.labels).set(value)
