"""What a Job's status says: one predicate per question, used by every caller.

A Job has finished once its ``Complete`` or ``Failed`` condition is True (the Job controller
sets them after the pods are gone; ``SuccessCriteriaMet`` / ``FailureTarget`` come earlier,
while pods may still be terminating and writing). Precompile Jobs, GC Jobs, the watch routing
and the reconcile policy all ask this; answering it in five places let the answers drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COMPLETE, FAILED = "Complete", "Failed"


def condition(job: Mapping[str, Any] | None, type_: str) -> dict[str, Any] | None:
    """The Job's condition of ``type_`` if it is True, else None."""
    for c in ((job or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return dict(c)
    return None


def complete(job: Mapping[str, Any] | None) -> bool:
    """The Job succeeded."""
    return condition(job, COMPLETE) is not None


def failed(job: Mapping[str, Any] | None) -> bool:
    """The Job failed (backoff limit, deadline, or a pod failure policy)."""
    return condition(job, FAILED) is not None


def finished(job: Mapping[str, Any] | None) -> bool:
    """The Job succeeded or failed: none of its pods runs any more."""
    return complete(job) or failed(job)


def finished_at(job: Mapping[str, Any] | None) -> str | None:
    """When the Job finished (completionTime, else its terminal condition's transition)."""
    st = (job or {}).get("status") or {}
    if st.get("completionTime"):
        return str(st["completionTime"])
    for type_ in (COMPLETE, FAILED):
        c = condition(job, type_)
        if c is not None and c.get("lastTransitionTime"):
            return str(c["lastTransitionTime"])
    return None
