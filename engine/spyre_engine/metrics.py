"""The engine's own Prometheus series, appended to vLLM's on ``/metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class EngineMetrics:
    """``spyre_engine_*`` series in a private registry (vLLM's live in the vLLM process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.startup_phase_seconds = Gauge(
            "spyre_engine_startup_phase_seconds",
            "Seconds spent in each start-up phase "
            "(validate, resolve_model, verify, engine_start, total)",
            ["phase"],
            registry=self.registry,
        )
        self.artifact_info = Gauge(
            "spyre_engine_artifact_info",
            "The artifact this server serves from (value is always 1)",
            ["key", "backend", "model", "artifact_dir"],
            registry=self.registry,
        )
        self.draining = Gauge(
            "spyre_engine_draining",
            "1 after SIGTERM while in-flight requests drain, else 0",
            registry=self.registry,
        )
        self.inflight = Gauge(
            "spyre_engine_inflight_requests",
            "Requests (including open streams) currently being proxied to vLLM",
            registry=self.registry,
        )
        self.rejected_draining = Counter(
            "spyre_engine_requests_rejected_while_draining",
            "Requests answered 503 because the server was draining",
            registry=self.registry,
        )
        self.aborted_at_deadline = Counter(
            "spyre_engine_requests_aborted_at_drain_deadline",
            "In-flight requests ended with an error because the drain deadline passed",
            registry=self.registry,
        )
        self.requests = Counter(
            "spyre_engine_requests",
            "Inference requests (POST /v1/...) answered, by status class (2xx, 4xx, 5xx); not "
            "the 503s of a drain or of a model still loading",
            ["code"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "spyre_engine_request_duration_seconds",
            "Seconds from an inference request to the end of its answer (a stream's last event)",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=self.registry,
        )
        self.ready = Gauge(
            "spyre_engine_ready",
            "1 while the server passes its readiness probe",
            registry=self.registry,
        )

    def render(self) -> bytes:
        """The series in the Prometheus text format."""
        return generate_latest(self.registry)
