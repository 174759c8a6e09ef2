"""The server's Prometheus metrics: its requests and cases (`Metrics`), and among them run_code's
count of backend failures by cause and the process's ready guests."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric

from ..case import api, failures


class Metrics:
    """What /metrics shows, in a registry of the server's own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.cases = Counter(
            "verl_hyperlight_cases",
            "Requests to /run_code by how they were answered (the response's status, or "
            "invalid / rejected / cancelled)",
            ["status"],
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "verl_hyperlight_cases_in_flight", "Cases running now", registry=self.registry
        )
        self.queued = Gauge(
            "verl_hyperlight_cases_queued",
            "Requests waiting for a micro-VM, their bodies read whole",
            registry=self.registry,
        )
        self.reading = Gauge(
            "verl_hyperlight_requests_reading",
            "Requests whose bodies are still arriving (they hold no place yet)",
            registry=self.registry,
        )
        self.held = Gauge(
            "verl_hyperlight_body_bytes_held",
            "Bytes of the request bodies held now (being read, waiting or running), within "
            "serve's --max-bodies-mb",
            registry=self.registry,
        )
        self.seconds = Histogram(
            "verl_hyperlight_case_seconds",
            "Time from a /run_code request to its answer (waiting included)",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=self.registry,
        )
        self.registry.register(BackendFailures())
        ready_guests = Gauge(
            "verl_hyperlight_ready_guests",
            "Micro-VMs started ahead of their cases, waiting for one now",
            registry=self.registry,
        )
        ready_guests.set_function(lambda: api.ready_guests().waiting)  # read when scraped
        self.registry.register(ReadyGuestsTaken())


class BackendFailures:
    """run_code's count of backend failures by cause, as a Prometheus counter."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "verl_hyperlight_backend_failures",
            "Cases answered SandboxError because the backend failed, by cause",
            labels=["cause"],
        )
        for cause, count in sorted(failures.log.counts().items()):
            family.add_metric([cause], count)
        yield family


class ReadyGuestsTaken:
    """The cases run in a ready guest so far, as a Prometheus counter (read when scraped)."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "verl_hyperlight_cases_in_ready_guests",
            "Cases run in a micro-VM started ahead of them",
        )
        family.add_metric([], api.ready_guests().taken)
        yield family
