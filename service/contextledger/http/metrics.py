"""Prometheus metrics on a registry of the app's own (several apps per process in tests).

Session activity is counted from each session's hook bus (compactions, summaries,
recall) and from the routes (appends); pool use is read at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from contextledger import Session
from contextledger import hooks as hk


class _Pools(Collector):
    def __init__(self, stats: Callable[[], dict[str, tuple[int, int]]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily]:
        size = GaugeMetricFamily(
            "contextledger_pool_connections", "Open database connections", labels=["tenant"]
        )
        idle = GaugeMetricFamily(
            "contextledger_pool_idle_connections", "Idle database connections", labels=["tenant"]
        )
        for tenant, (open_, free) in self._stats().items():
            size.add_metric([tenant], open_)
            idle.add_metric([tenant], free)
        yield size
        yield idle


class Metrics:
    def __init__(self, pool_stats: Callable[[], dict[str, tuple[int, int]]]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "contextledger_http_requests",
            "HTTP requests",
            ["method", "route", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "contextledger_http_request_duration_seconds",
            "HTTP request latency",
            ["method", "route"],
            registry=r,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
        )
        self.appends = Counter("contextledger_appends", "Messages appended", registry=r)
        self.compactions = Counter(
            "contextledger_compactions", "Compactions", ["strategy", "ephemeral"], registry=r
        )
        self.summaries = Counter("contextledger_summaries", "Summarizations", registry=r)
        self.stream_polls = Counter(
            "contextledger_stream_polls",
            "Reads by the shared polls of event streams (one per watched session)",
            registry=r,
        )
        self.recall_hits = Counter(
            "contextledger_recall_hits", "Request views that carried a recall block", registry=r
        )
        self.recalled = Counter(
            "contextledger_recalled_messages", "Messages brought back by recall", registry=r
        )
        self.proxy_tokens = Counter(
            "contextledger_proxy_tokens", "Tokens reported by the upstream", ["kind"], registry=r
        )
        self.proxy_usage = Counter(
            "contextledger_proxy_usage_tokens",
            "Tokens reported by the upstream, by tenant and the model that answered",
            ["tenant", "model", "kind"],
            registry=r,
        )
        r.register(_Pools(pool_stats))

    def watch(self, session: Session) -> None:
        """Count what a session announces on its hook bus."""

        async def compacted(event: str, data: dict[str, Any]) -> None:
            self.compactions.labels(
                str(data.get("strategy", "?")), str(bool(data.get("ephemeral")))
            ).inc()

        async def summarized(event: str, data: dict[str, Any]) -> None:
            self.summaries.inc()

        async def included(event: str, data: dict[str, Any]) -> None:
            if data.get("source") == "recall":  # recall's block (recall.py), not a user's
                self.recall_hits.inc()
                self.recalled.inc(len(data.get("seqs") or ()))

        session.hooks.on(hk.POST_COMPACT, compacted)
        session.hooks.on(hk.SUMMARIZATION, summarized)
        session.hooks.on(hk.INCLUDE, included)

    def render(self) -> bytes:
        return generate_latest(self.registry)
