"""Which serving Deployments are switching artifacts: the rollout budget's facts (pure).

The rollout budget (``--max-concurrent-rollouts``) bounds how many models switch artifacts (or
cache claims) at once. A slot is held by a switch in progress only: from the template change
until every asked replica of the new template was updated and available once. The Deployment
controller cannot say that by itself: a complete rollout that is scaled up (an HPA or KEDA at
the cluster's capacity) shows fewer available replicas than asked, and its progress deadline
is never applied to a scale-up (``Progressing`` stays ``NewReplicaSetAvailable``), so such a
Deployment would hold a slot for good. The operator records the completion on the Deployment
itself (``names.ROLLED_OUT_LABEL``, what the API server keeps, not the operator's memory):
written once it sees the rollout complete, kept by every later apply of the same artifact and
claims, and dropped by the apply that switches them. The record is a digest of what rolled
out, in a label: an annotation change starts a new generation of a Deployment, and the apply
hash (kube/apply.py) leaves the record out, so writing it changes nothing the controller acts on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from lightkube.resources.apps_v1 import Deployment

from ..desired import names
from .release import mounted_claims, rollout_complete


def identity(deployment: Mapping[str, Any]) -> str:
    """What a switch changes: the artifact key a Deployment serves and the claims it mounts."""
    meta = deployment.get("metadata") or {}
    key = (meta.get("annotations") or {}).get(names.ARTIFACT_KEY_ANNOTATION) or ""
    return f"{key}/{','.join(sorted(mounted_claims(deployment)))}"


def record(ident: str) -> str:
    """The label value that says ``ident`` rolled out (a label value holds 63 characters)."""
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


def _recorded(deployment: Mapping[str, Any], ident: str) -> bool:
    meta = deployment.get("metadata") or {}
    if (meta.get("labels") or {}).get(names.ROLLED_OUT_LABEL) == record(ident):
        return True
    return (meta.get("annotations") or {}).get(names.ROLLED_OUT_ANNOTATION) == ident


def _wanted(deployment: Mapping[str, Any]) -> int:
    want = (deployment.get("spec") or {}).get("replicas")
    return 1 if want is None else int(want)


def all_available(deployment: Mapping[str, Any]) -> bool:
    """Every asked replica updated and available (and no older pod left, observed)."""
    st = deployment.get("status") or {}
    want = _wanted(deployment)
    return (
        rollout_complete(deployment)
        and (st.get("updatedReplicas") or 0) >= want
        and (st.get("availableReplicas") or 0) >= want
    )


def rolled_out(deployment: Mapping[str, Any]) -> bool:
    """The Deployment completed the rollout of what it serves now, once."""
    return _recorded(deployment, identity(deployment))


def deadline_exceeded(deployment: Mapping[str, Any]) -> bool:
    for c in (deployment.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded":
            return True
    return False


def deployment_rolling(deployment: Mapping[str, Any]) -> bool:
    """A serving Deployment whose rollout holds a slot of the rollout budget: pods of an older
    template left or not observed since its last change; or, for an artifact and claims it has
    not completed a rollout of yet, not every asked replica updated and available. One past its
    progress deadline (RolloutStalled) no longer does; nor does a scale-up of a completed
    rollout that waits for capacity."""
    if deadline_exceeded(deployment):
        return False
    if not rollout_complete(deployment):
        return True
    return not rolled_out(deployment) and not all_available(deployment)


def mark_rolled_out(desired: Deployment, live: Mapping[str, Any] | None) -> Deployment:
    """``desired`` with ``names.ROLLED_OUT_LABEL`` when its artifact and claims have rolled
    out: the live Deployment already says so, or serves them with every replica available now.
    Left out otherwise, so the apply of a switch removes it."""
    if live is None or desired.metadata is None:
        return desired
    ident = identity(desired.to_dict())
    if _recorded(live, ident) or (identity(live) == ident and all_available(live)):
        desired.metadata.labels = {
            **(desired.metadata.labels or {}), names.ROLLED_OUT_LABEL: record(ident)}
    return desired
