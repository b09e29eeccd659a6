"""The canary compared with the baseline (issue 44, 5): the previous artifact's pods over the
canary's window (pure, no I/O).

Every serving pod says what it served since Ready (``GET /health/served``: requests the model
answered or failed, vLLM's time-to-first-token and time-per-output-token histograms;
canary_report.py). The canary's pods turned Ready when the window started, so theirs is the
window's. The previous artifact's pods have served for longer: their figures when the window
started are recorded in ``status.canary.baselineStart`` (the operator's own record, so a
restarted operator compares over the same window) and taken off what they say later. A pod
that is new, or restarted (a count that went down), counts from its own Ready.

At the window's end the canary's mean TTFT and TPOT may be at most ``maxLatencyRatio`` times
the baseline's; the error share stays the canary's own absolute bound (the engine judges it
on every request: a canary is never excused by a baseline that fails as well). Compared only
when both sides served ``minRequests`` in the window; otherwise status says why not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .canary_report import ServedReport
from .observed import Observed


@dataclass
class _Side:
    pods: int = 0
    requests: int = 0
    errors: int = 0
    ttft: list[float] = field(default_factory=lambda: [0.0, 0.0])
    tpot: list[float] = field(default_factory=lambda: [0.0, 0.0])
    #: pods whose figures could not be read (why)
    unread: list[str] = field(default_factory=list)

    def add(self, judged: int, errors: int, ttft: tuple[float, float] | None,
            tpot: tuple[float, float] | None) -> None:  # fmt: skip
        self.pods += 1
        self.requests += judged
        self.errors += errors
        for acc, got in ((self.ttft, ttft), (self.tpot, tpot)):
            if got is not None:
                acc[0] += got[0]
                acc[1] += got[1]

    @staticmethod
    def _mean(acc: list[float]) -> float | None:
        return acc[0] / acc[1] if acc[1] > 0 else None

    @property
    def ttft_mean(self) -> float | None:
        return self._mean(self.ttft)

    @property
    def tpot_mean(self) -> float | None:
        return self._mean(self.tpot)

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pods": self.pods, "requests": self.requests}
        if self.requests:
            out["errorRatio"] = round(self.errors / self.requests, 4)
        for k, v in (("ttftSeconds", self.ttft_mean), ("tpotSeconds", self.tpot_mean)):
            if v is not None:
                out[k] = round(v, 6)
        return out

    def text(self) -> str:
        parts = [f"{self.requests} request{'s' if self.requests != 1 else ''} on {self.pods} "
                 f"pod{'s' if self.pods != 1 else ''}"]  # fmt: skip
        if self.requests:
            parts.append(f"{self.errors / self.requests:.0%} server errors")
        if self.ttft_mean is not None:
            parts.append(f"TTFT {self.ttft_mean * 1000:.1f} ms")
        if self.tpot_mean is not None:
            parts.append(f"TPOT {self.tpot_mean * 1000:.1f} ms")
        return ", ".join(parts)


def _counts(pod: str, r: ServedReport) -> dict[str, Any]:
    """One pod's figures as status.canary.baselineStart records them."""
    out: dict[str, Any] = {"pod": pod, "judged": r.judged, "errors": r.errors}
    if r.ttft is not None:
        out["ttftSum"], out["ttftCount"] = r.ttft
    if r.tpot is not None:
        out["tpotSum"], out["tpotCount"] = r.tpot
    return out


def _since(now: ServedReport, start: dict[str, Any] | None) -> tuple[
    int, int, tuple[float, float] | None, tuple[float, float] | None
]:  # fmt: skip
    """What a baseline pod served after its recorded start (all of it: no record, or a count
    that went down, i.e. a restart)."""
    def pair(got: tuple[float, int] | None, key: str) -> tuple[float, float] | None:
        if got is None or start is None:
            return _as_pair(got)
        s, c = float(start.get(f"{key}Sum") or 0), float(start.get(f"{key}Count") or 0)
        return (got[0] - s, got[1] - c) if got[0] >= s and got[1] >= c else _as_pair(got)

    j = int((start or {}).get("judged") or 0)
    e = int((start or {}).get("errors") or 0)
    if start is None or now.judged < j or now.errors < e:  # new, or restarted
        return now.judged, now.errors, _as_pair(now.ttft), _as_pair(now.tpot)
    return now.judged - j, now.errors - e, pair(now.ttft, "ttft"), pair(now.tpot, "tpot")


@dataclass
class Comparison:
    """The status fields (baselineFrom, baselineStart, comparison) and, at the window's end,
    why the canary is worse than the baseline (None: not worse, or not compared)."""

    status: dict[str, Any]
    worse: str | None = None
    #: the comparison's conclusion alone (what a passed canary's message quotes)
    conclusion: str = ""


def compare(
    obs: Observed,
    canary_pods: list[dict[str, Any]],
    baseline_pods: list[dict[str, Any]],
    old: dict[str, Any],
    started: str,
    min_requests: int,
    max_ratio: float | None,
    previous: str,
) -> Comparison:
    """The canary's pods and the baseline's (the previous artifact's, ``previous``) over the
    window that started at ``started`` (``old``: status.canary as it was)."""
    reports = obs.served_reports
    recorded = old.get("baselineStart") if old.get("baselineFrom") == started else None
    base_ready = sorted((p for p in baseline_pods if p.get("ready")), key=lambda p: str(p["name"]))
    if recorded is None:
        # The window's first look: what the baseline pods had served until now.
        recorded = [_counts(str(p["name"]), r) for p in base_ready
                    if isinstance(r := reports.get(str(p["name"])), ServedReport)]  # fmt: skip
    starts = {str(c.get("pod")): c for c in recorded if isinstance(c, dict)}
    canary, baseline = _Side(), _Side()
    for p in sorted((p for p in canary_pods if p.get("ready")), key=lambda p: str(p["name"])):
        r = reports.get(str(p["name"]))
        if isinstance(r, ServedReport):
            canary.add(r.judged, r.errors, _as_pair(r.ttft), _as_pair(r.tpot))
        else:
            canary.unread.append(f"{p['name']}: {r or 'not read yet'}")
    for p in base_ready:
        r = reports.get(str(p["name"]))
        if isinstance(r, ServedReport):
            baseline.add(*_since(r, starts.get(str(p["name"]))))
        else:
            baseline.unread.append(f"{p['name']}: {r or 'not read yet'}")
    sides, conclusion, worse = _verdict(canary, baseline, min_requests, max_ratio, previous)
    message = f"{sides}; {conclusion}"
    status = {
        "baselineFrom": started,
        "baselineStart": recorded,
        "comparison": {"canary": canary.figures(), "baseline": baseline.figures(),
                       "message": message[:1024]},
    }  # fmt: skip
    return Comparison(status, worse, conclusion)


def _as_pair(got: tuple[float, int] | None) -> tuple[float, float] | None:
    return None if got is None else (float(got[0]), float(got[1]))


def _verdict(
    canary: _Side, baseline: _Side, min_requests: int, max_ratio: float | None, previous: str
) -> tuple[str, str, str | None]:
    """Both sides, the conclusion, and why the canary is worse (None: it is not, or it was
    not compared)."""
    sides = f"canary: {canary.text()}; baseline (artifact {previous}): {baseline.text()}"
    unread = canary.unread + baseline.unread
    if unread:
        sides += f"; unread: {'; '.join(unread)}"
    if max_ratio is None:
        return sides, "not compared (maxLatencyRatio is null)", None
    short = [f"the {name} served {side.requests} of the {min_requests} requests needed"
             for name, side in (("canary", canary), ("baseline", baseline))
             if side.requests < min_requests]  # fmt: skip
    if short:
        return sides, f"not compared yet: {', '.join(short)}", None
    worse = []
    for what, c, b in (("time to first token", canary.ttft_mean, baseline.ttft_mean),
                       ("time per output token", canary.tpot_mean, baseline.tpot_mean)):
        if c is not None and b is not None and c > max_ratio * b:
            worse.append(f"its mean {what} {c * 1000:.1f} ms is {c / b:.1f}x the baseline's "
                         f"{b * 1000:.1f} ms (maxLatencyRatio {max_ratio:g})")  # fmt: skip
    if canary.ttft_mean is None or baseline.ttft_mean is None:
        return sides, "latency not compared (vLLM's histograms unread on a side)", None
    if worse:
        return sides, "worse than the baseline", "; ".join(worse)
    return sides, f"within {max_ratio:g}x of the baseline", None
