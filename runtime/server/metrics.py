"""Prometheus metrics of the server, in a private registry (so several servers in one
process, e.g. in tests, never collide).

Latency histograms and token counters are observed by the TokenizerManager as outputs
arrive; the scheduler gauges are refreshed from the scheduler's `info()` on each scrape.
"""
from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.ttft = Histogram("treadle_time_to_first_token_seconds", "Time to first token", registry=r,
                              buckets=_LATENCY_BUCKETS)
        self.itl = Histogram("treadle_inter_token_latency_seconds", "Time between output tokens (streamed)",
                             registry=r, buckets=_LATENCY_BUCKETS)
        self.e2e = Histogram("treadle_e2e_request_latency_seconds", "Request latency", registry=r,
                             buckets=_LATENCY_BUCKETS)
        self.prompt_tokens = Counter("treadle_prompt_tokens", "Prompt tokens processed", registry=r)
        self.cached_tokens = Counter("treadle_cached_prompt_tokens", "Prompt tokens served from the radix cache",
                                     registry=r)
        self.generation_tokens = Counter("treadle_generation_tokens", "Output tokens generated", registry=r)
        self.requests = Counter("treadle_requests", "Finished requests by finish reason", ["finish_reason"],
                                registry=r)
        # refused ones too (400, 401, 404, 413, 503 ...), which never reach the scheduler
        self.http_responses = Counter("treadle_http_responses", "HTTP responses by route and status",
                                      ["route", "status"], registry=r)
        self.running = Gauge("treadle_num_running_requests", "Requests in the running batch", registry=r)
        self.queued = Gauge("treadle_num_queued_requests", "Requests waiting for admission", registry=r)
        self.in_flight = Gauge("treadle_num_in_flight_requests", "Requests the HTTP server waits on", registry=r)
        self.token_usage = Gauge("treadle_token_usage", "Fraction of KV slots held by running requests",
                                 registry=r)
        self.cache_hit_rate = Gauge("treadle_cache_hit_rate", "Prompt tokens served from cache / all", registry=r)

    def on_finish(self, out: Any, latency_s: float) -> None:
        """Count a finished request (a ReqOutput with `finished` set)."""
        self.e2e.observe(latency_s)
        self.prompt_tokens.inc(out.prompt_tokens)
        self.cached_tokens.inc(out.cached_tokens)
        self.generation_tokens.inc(out.completion_tokens)
        reason = (out.finished or {}).get("type", "unknown")
        self.requests.labels(finish_reason="error" if out.error else str(reason)).inc()

    def render(self, info: dict, in_flight: int) -> bytes:
        """The text exposition, with gauges refreshed from the scheduler's info()."""
        self.running.set(info["num_running"])
        self.queued.set(info["num_waiting"])
        self.in_flight.set(in_flight)
        total = max(1, info["total_slots"])
        self.token_usage.set((total - info["free_slots"] - info["evictable_slots"]) / total)
        self.cache_hit_rate.set(info["cache_hit_rate"])
        return generate_latest(self.registry)
