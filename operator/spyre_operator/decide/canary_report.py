"""A canary pod's own count of the requests it judged (``GET /health/canary`` on the engine,
engine/spyre_engine/canary.py ``report``): what the canary decision holds the rollout on until
every canary pod has judged ``minRequests`` (decide/canary.py). And what any serving pod
served since Ready (``GET /health/served``, ``served_report``): the figures the canary's pods
are compared on with the previous artifact's (the baseline).

Pure: the control layer reads it (control/observe.py). The answer comes from a pod's HTTP
port, so it is parsed as hostile: at most
``MAX_REPORT_BYTES``, one JSON object, the counts non-negative integers within bounds; anything
else is an error message, never a count."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import spyre_contract as contract

#: The engine's answer is ~200 bytes.
MAX_REPORT_BYTES = 4096
#: One read of one canary pod (the operator reads a model's canary pods at most every
#: SERVER_PODS_TTL seconds, while a canary runs).
REPORT_TIMEOUT_SECONDS = 3.0
#: The engine's routes (a unit test compares them with the engine's).
REPORT_PATH = contract.CANARY_REPORT_PATH
SERVED_PATH = contract.SERVED_REPORT_PATH
_MAX_COUNT = 10**12


@dataclass(frozen=True)
class CanaryReport:
    """What a canary pod says it judged."""

    judged: int
    errors: int


def _load(body: bytes, marker: str, what: str) -> dict[str, Any]:
    """One JSON object of at most MAX_REPORT_BYTES whose ``marker`` is true; ValueError
    (with why) for anything else."""
    if len(body) > MAX_REPORT_BYTES:
        raise ValueError(f"answer over {MAX_REPORT_BYTES} bytes")
    try:
        doc: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get(marker) is not True:
        raise ValueError(f"not {what}")
    return doc


def _counts(doc: dict[str, Any]) -> tuple[int, int]:
    """``judged`` and ``errors``: counts, no more errors than requests."""
    judged, errors = _count(doc, "judged"), _count(doc, "errors")
    if errors > judged:
        raise ValueError("more errors than requests judged")
    return judged, errors


def _count(doc: dict[str, Any], field: str) -> int:
    v = doc.get(field)
    if type(v) is not int or not 0 <= v <= _MAX_COUNT:
        raise ValueError(f"{field} is not a count: {str(v)[:40]!r}")
    return v


def parse_report(body: bytes) -> CanaryReport:
    """The counts of an engine's answer; ValueError (with why) for anything else."""
    judged, errors = _counts(_load(body, "canary", "a canary's report"))
    return CanaryReport(judged=judged, errors=errors)


#: Seconds summed over requests: bounded like the counts (a pod's lifetime of requests).
_MAX_SECONDS = 1e12


@dataclass(frozen=True)
class ServedReport:
    """What a serving pod served since Ready: requests answered or failed by the model (a
    client's 4xx is none), their seconds, and vLLM's time to first token and time per output
    token (sums and counts; None: vLLM's metrics were not read)."""

    judged: int
    errors: int
    seconds: float
    ttft: tuple[float, int] | None = None
    tpot: tuple[float, int] | None = None


def _seconds(doc: dict[str, Any], field: str) -> float:
    v = doc.get(field)
    if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v <= _MAX_SECONDS:
        raise ValueError(f"{field} is not a number of seconds: {str(v)[:40]!r}")  # NaN too
    return float(v)


def parse_served(body: bytes) -> ServedReport:
    """The figures of an engine's ``/health/served`` answer; ValueError (with why) otherwise."""
    doc = _load(body, "served", "a serving pod's report")
    judged, errors = _counts(doc)
    seconds = _seconds(doc, "secondsSum")
    latency = doc.get("latency")
    if latency is None:
        return ServedReport(judged, errors, seconds)
    if not isinstance(latency, dict):
        raise ValueError("latency is not an object")
    return ServedReport(
        judged, errors, seconds,
        ttft=(_seconds(latency, "ttftSum"), _count(latency, "ttftCount")),
        tpot=(_seconds(latency, "tpotSum"), _count(latency, "tpotCount")),
    )  # fmt: skip
