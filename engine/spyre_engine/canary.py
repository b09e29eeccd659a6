"""A canary judges its own traffic: ``spyre-engine serve --canary-seconds N`` counts the inference
requests it answers from Ready on (their status and seconds, the same figures as
``spyre_engine_requests_total`` and ``spyre_engine_request_duration_seconds``) and, while the
window is open, stops with ``CanaryFailed`` once they break the model's bounds: the share of
server errors, or the mean latency. The operator runs a new artifact's first pods this way
beside the previous artifact's and rolls back on that reason (operator/spyre_operator/decide/
canary.py). Pure, no I/O; the fault injector lets tests and chaos drills make a canary fail."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from prometheus_client.parser import text_string_to_metric_families


def is_inference(method: str, path: str) -> bool:
    """What the canary judges and the request series count: the OpenAI API's POSTs."""
    return method == "POST" and path.startswith("/v1/")


def is_evidence(status: int) -> bool:
    """Whether an answer says something about the artifact: what the model answered (2xx) or
    failed (5xx). A 4xx is the client's request at fault (malformed, refused): five of those
    in milliseconds would otherwise make ``minRequests`` with a fine mean latency."""
    return not 400 <= status < 500


def status_class(status: int) -> str:
    return f"{status // 100}xx"


@dataclass(frozen=True)
class CanaryBounds:
    """The model's bounds (spec.serving.canary), as the engine's flags give them."""

    seconds: float
    max_error_ratio: float
    min_requests: int
    max_mean_latency: float | None = None


@dataclass
class Tally:
    """The canary's inference requests since Ready."""

    requests: int = 0
    errors: int = 0
    seconds: float = 0.0

    def add(self, status: int, seconds: float) -> None:
        self.requests += 1
        self.errors += status >= 500
        self.seconds += seconds


def judging(bounds: CanaryBounds, tally: Tally, window_over: bool) -> bool:
    """Whether a canary still judges its requests: during its window, and after it until
    ``min_requests`` were judged (an idle window is no evidence; the operator holds the
    rollout until the count is reached)."""
    return not window_over or tally.requests < max(bounds.min_requests, 1)


def report(bounds: CanaryBounds, tally: Tally, window_left: float | None) -> dict[str, object]:
    """What ``GET /health/canary`` answers (the operator reads ``judged`` against the model's
    minRequests before it promotes): the canary's counts, the window left (None: not Ready
    yet) and whether it still judges."""
    over = window_left is not None and window_left <= 0
    return {
        "canary": True,
        "judged": tally.requests,
        "errors": tally.errors,
        "meanSeconds": round(tally.seconds / tally.requests, 6) if tally.requests else None,
        "minRequests": bounds.min_requests,
        "windowLeftSeconds": None if window_left is None else round(max(window_left, 0.0), 3),
        "judging": window_left is not None and judging(bounds, tally, over),
    }


def verdict(bounds: CanaryBounds, tally: Tally) -> str | None:
    """Why the canary fails, or None while it keeps within its bounds. Nothing is judged
    before ``min_requests`` requests: one early error is not a rate."""
    if tally.requests < max(bounds.min_requests, 1):
        return None
    ratio = tally.errors / tally.requests
    if ratio > bounds.max_error_ratio:
        return (
            f"{tally.errors} of its {tally.requests} requests failed with a server error "
            f"({ratio:.0%}, the bound is {bounds.max_error_ratio:.0%})"
        )
    mean = tally.seconds / tally.requests
    if bounds.max_mean_latency is not None and mean > bounds.max_mean_latency:
        return (
            f"its {tally.requests} requests took {mean:.2f} s on average (the bound is "
            f"{bounds.max_mean_latency:.2f} s)"
        )
    return None


class FaultInjector:
    """``--fault-error-ratio R``: the share R of inference requests is answered 500 without
    reaching vLLM, evenly and deterministically (request n fails when floor(n R) grows), so a
    test knows how many fail. For tests and chaos drills; 0 (the default) injects nothing."""

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio
        self.seen = 0

    def fails_next(self) -> bool:
        if self.ratio <= 0:
            return False
        self.seen += 1
        return math.floor(self.seen * self.ratio) > math.floor((self.seen - 1) * self.ratio)


#: vLLM's own histograms the baseline comparison reads (vllm/v1/metrics/loggers.py): time to
#: the first token, and each request's mean time per output token.
LATENCY_SERIES = {
    "ttft": "vllm:time_to_first_token_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
}


@dataclass(frozen=True)
class Latency:
    """Sums and counts of vLLM's latency histograms (every model name's series added up)."""

    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    tpot_sum: float = 0.0
    tpot_count: float = 0.0

    def since(self, before: Latency) -> Latency:
        """What was observed after ``before`` (a counter that went down restarted: all of it)."""
        if any(getattr(self, f.name) < getattr(before, f.name) for f in fields(self)):
            return self
        return Latency(*(getattr(self, f.name) - getattr(before, f.name) for f in fields(self)))


def vllm_latency(text: str) -> Latency:
    """The latency sums and counts in vLLM's ``/metrics`` text (zero where absent)."""
    got = {f"{k}_{part}": 0.0 for k in LATENCY_SERIES for part in ("sum", "count")}
    wanted = {f"{series}_{part}": f"{k}_{part}" for k, series in LATENCY_SERIES.items()
              for part in ("sum", "count")}  # fmt: skip
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = wanted.get(sample.name)
            if key is not None and math.isfinite(sample.value):
                got[key] += sample.value
    return Latency(**got)


def served_report(tally: Tally, latency: Latency | None) -> dict[str, object]:
    """What ``GET /health/served`` answers on every serving pod: the inference requests it
    answered or failed since Ready (a client's 4xx is no evidence) and vLLM's latency
    histograms over the same time (None: vLLM's metrics unread). The operator compares a
    canary's with the previous artifact's pods' over the canary's window
    (operator/spyre_operator/decide/canary.py)."""
    return {
        "served": True,
        "judged": tally.requests,
        "errors": tally.errors,
        "secondsSum": round(tally.seconds, 6),
        "latency": None if latency is None else {
            "ttftSum": round(latency.ttft_sum, 6), "ttftCount": int(latency.ttft_count),
            "tpotSum": round(latency.tpot_sum, 6), "tpotCount": int(latency.tpot_count),
        },
    }  # fmt: skip
