"""status.cache says the claim's capacity, its free space and its downloaded models' size
(issue 47, 1 and 3).

Capacity is the PVC's ``status.capacity``; free space and the models' size are what the newest
GC Job measured on the volume (``spyre-engine gc`` reports statvfs and the hub directory: the
operator mounts no claim), kept in status for that incarnation of the claim so a restart or
the Job's TTL loses no figure, and never shown for another claim."""

from __future__ import annotations

import copy
import json
from typing import Any

from spyre_operator.decide import Observed, decide
from spyre_operator.decide.gc import parse_gc_result
from spyre_operator.decide.observed import ClaimMeasure

from .samples import GENERATE, model
from .test_reconcile import BOUND, job_obj
from .test_rollback import SUMMARY

T0, T1 = "2026-12-06T10:00:00Z", "2026-12-06T11:00:00Z"


def _claim(uid: str) -> dict[str, Any]:
    return {**BOUND, "metadata": {**BOUND["metadata"], "uid": uid},
            "status": {"phase": "Bound", "capacity": {"storage": "50Gi"}}}  # fmt: skip


def _compiled(m: dict[str, Any], claim: dict[str, Any],
              free: tuple[int, str] | None) -> Observed:  # fmt: skip
    measured = None if free is None else ClaimMeasure(free[1], free[0], 3 * 2**30)
    obs = Observed(cache_pvc=claim, job=job_obj(m, "Complete"), claim_measured=measured)
    obs.job_pods = [{"name": "j", "terminated": {"exitCode": 0, "message": SUMMARY,
                                                  "finishedAt": T0}}]  # fmt: skip
    return obs


def test_capacity_and_the_last_measured_free_space_in_status() -> None:
    m = model("m", GENERATE)
    st = decide(m, _compiled(m, _claim("u1"), (7 * 2**30, T0)), T0).status["cache"]
    assert st["capacityBytes"] == 50 * 2**30 and st["claimUID"] == "u1"
    assert st["freeBytes"] == 7 * 2**30 and st["measuredAt"] == T0
    assert st["weightsBytes"] == 3 * 2**30

    # the GC Job gone (TTL) or the operator restarted: status keeps the figure
    m2 = copy.deepcopy(m)
    m2["status"] = decide(m, _compiled(m, _claim("u1"), (7 * 2**30, T0)), T0).status
    again = decide(m2, _compiled(m2, _claim("u1"), None), T1).status["cache"]
    assert again["freeBytes"] == 7 * 2**30 and again["measuredAt"] == T0
    assert again["weightsBytes"] == 3 * 2**30
    # a newer measurement replaces it
    newer = decide(m2, _compiled(m2, _claim("u1"), (2**30, T1)), T1).status["cache"]
    assert newer["freeBytes"] == 2**30 and newer["measuredAt"] == T1
    # another incarnation of the claim (deleted and made again): no figure of the old one
    other = decide(m2, _compiled(m2, _claim("u2"), None), T1).status["cache"]
    assert "freeBytes" not in other and "weightsBytes" not in other
    assert other["claimUID"] == "u2"
    assert other["capacityBytes"] == 50 * 2**30


def test_the_gc_summary_reports_the_volume_and_only_plain_counts_are_read() -> None:
    doc = {"removed": [], "skipped": [], "freedBytes": 0, "remainingBytes": 5,
           "volumeBytes": 100, "freeBytes": 40, "weightsBytes": 30}  # fmt: skip
    r = parse_gc_result(json.dumps(doc))
    assert r is not None and r.volume_bytes == 100 and r.free_bytes == 40
    assert r.weights_bytes == 30
    for bad in (-1, "40", 4.5, True, None, [40]):
        r = parse_gc_result(json.dumps({**doc, "freeBytes": bad}))
        assert r is not None and r.free_bytes is None, bad

