"""A canary pod's own count of the requests it judged (``GET /health/canary`` on the engine,
engine/spyre_engine/canary.py ``report``): what the canary decision holds the rollout on until
every canary pod has judged ``minRequests`` (decide/canary.py).

Pure: the control layer reads it (control/observe.py). The answer comes from a pod's HTTP
port, so it is parsed as hostile: at most
``MAX_REPORT_BYTES``, one JSON object, the counts non-negative integers within bounds; anything
else is an error message, never a count."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

#: The engine's answer is ~200 bytes.
MAX_REPORT_BYTES = 4096
#: One read of one canary pod (the operator reads a model's canary pods at most every
#: SERVER_PODS_TTL seconds, while a canary runs).
REPORT_TIMEOUT_SECONDS = 3.0
#: The engine's route (a unit test compares it with the engine's).
REPORT_PATH = "/health/canary"
_MAX_COUNT = 10**12


@dataclass(frozen=True)
class CanaryReport:
    """What a canary pod says it judged."""

    judged: int
    errors: int


def parse_report(body: bytes) -> CanaryReport:
    """The counts of an engine's answer; ValueError (with why) for anything else."""
    if len(body) > MAX_REPORT_BYTES:
        raise ValueError(f"answer over {MAX_REPORT_BYTES} bytes")
    try:
        doc: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("canary") is not True:
        raise ValueError("not a canary's report")
    counts = []
    for field in ("judged", "errors"):
        v = doc.get(field)
        if type(v) is not int or not 0 <= v <= _MAX_COUNT:
            raise ValueError(f"{field} is not a count: {str(v)[:40]!r}")
        counts.append(v)
    if counts[1] > counts[0]:
        raise ValueError("more errors than requests judged")
    return CanaryReport(judged=counts[0], errors=counts[1])
