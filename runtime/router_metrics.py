"""Prometheus metrics of the router (GET /metrics on the router), read from its replica
records at scrape time, one series per replica (label `replica`: its URL). Each replica
still serves its own /metrics (latencies, tokens, the scheduler's gauges): scrape both."""
from __future__ import annotations

from typing import Any, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_GAUGES = (
    ("treadle_router_replica_healthy", "1 while the replica is in the rotation", lambda r: float(r.healthy)),
    ("treadle_router_replica_in_flight_requests", "Requests sent to the replica and not yet answered",
     lambda r: r.in_flight),
    ("treadle_router_prefix_match_rate", "Prompt characters routed to the replica that the router's prefix "
     "tree had seen there before / all routed there", lambda r: r.prefix_match_rate),
)
_COUNTERS = (
    ("treadle_router_connect_failures", "Requests the replica refused before they reached it (retried "
     "elsewhere)", lambda r: r.connect_failures),
    ("treadle_router_replica_dropped", "Times the replica left the rotation", lambda r: r.times_dropped),
    ("treadle_router_replica_failures", "Requests the replica failed after taking them (the router answered "
     "502, or ended the stream with an error event)", lambda r: r.failures),
)


class RouterCollector:
    def __init__(self, router: Any) -> None:
        self.router = router

    def collect(self) -> Iterator:
        reps = self.router.replicas
        for name, doc, get in _GAUGES:
            g = GaugeMetricFamily(name, doc, labels=["replica"])
            for r in reps:
                g.add_metric([r.url], get(r))
            yield g
        for name, doc, get in _COUNTERS:
            c = CounterMetricFamily(name, doc, labels=["replica"])
            for r in reps:
                c.add_metric([r.url], get(r))
            yield c
        routed = CounterMetricFamily("treadle_router_requests", "Requests routed, by replica and the HTTP "
                                     "status the client got (502: the replica failed before its answer was "
                                     "whole)", labels=["replica", "status"])
        for r in reps:
            for status, n in sorted(r.responses.items()):
                routed.add_metric([r.url, str(status)], n)
        yield routed
        refused = CounterMetricFamily("treadle_router_no_replica", "Requests answered 503: no healthy replica "
                                      "could take them")
        refused.add_metric([], self.router.no_replica)
        yield refused


class RouterMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, router: Any) -> None:
        self.registry = CollectorRegistry()  # private: several routers in one process never collide
        self.registry.register(RouterCollector(router))

    def render(self) -> bytes:
        return generate_latest(self.registry)
