"""The routing decision: the model's InferencePool and RoutingReady (:func:`decide_routing`;
pure, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..desired.inference_pool import build_inference_pool, inference_pool_name, wants_inference_pool
from ..desired.plan import ModelPlan
from . import conditions as C
from .observed import API_FORBIDDEN, API_NOT_SERVED, API_UNKNOWN, Observed


@dataclass
class RoutingOutcome:
    """The InferencePool to write or delete, and RoutingReady (None: routing not asked for)."""

    cond: C.Cond | None = None
    pool: Any | None = None
    delete: bool = False


def _parent_name(parent: dict[str, Any], namespace: str) -> str:
    ref = parent.get("parentRef") or {}
    kind = ref.get("kind") or "Gateway"
    return f"{kind} {ref.get('namespace') or namespace}/{ref.get('name', '?')}"


def _pool_condition(name: str, namespace: str, pool: dict[str, Any] | None) -> C.Cond:
    """RoutingReady from status.parents[].conditions of an InferencePool (v1).

    Accepted=True on some parent (and ResolvedRefs not False there) means a Gateway routes to
    the pool. No parents means no Gateway has taken it up yet: an HTTPRoute must reference it.
    """
    t = C.ROUTING_READY
    if pool is None:
        return C.Cond(t, C.FALSE, C.INFERENCE_POOL_PENDING, f"creating InferencePool {name}")
    parents = ((pool.get("status") or {}).get("parents")) or []
    if not parents:
        return C.Cond(
            t,
            C.FALSE,
            C.INFERENCE_POOL_PENDING,
            f"InferencePool {name} has no parent yet: reference it from an HTTPRoute of a "
            "Gateway whose implementation supports the Inference Extension",
        )
    accepted, refused, unresolved, pending = [], [], [], []
    for parent in parents:
        conds = {c.get("type"): c for c in parent.get("conditions") or []}
        who = _parent_name(parent, namespace)
        acc, refs = conds.get("Accepted") or {}, conds.get("ResolvedRefs") or {}
        detail = f"{who}: {acc.get('reason') or 'no reason'}: {acc.get('message') or ''}".rstrip(
            ": "
        )
        if acc.get("status") == C.TRUE and refs.get("status") == C.FALSE:
            unresolved.append(f"{who}: {refs.get('reason')}: {refs.get('message') or ''}")
        elif acc.get("status") == C.TRUE:
            accepted.append(who)
        elif acc.get("status") == C.FALSE:
            refused.append(detail)
        else:
            pending.append(detail)
    if accepted:
        by = ", ".join(accepted)
        msg = f"InferencePool {name} accepted by {by}"
        return C.Cond(t, C.TRUE, C.INFERENCE_POOL_ACCEPTED, msg)
    if unresolved:
        return C.Cond(
            t,
            C.FALSE,
            C.INFERENCE_POOL_REFS_NOT_RESOLVED,
            f"InferencePool {name}: {'; '.join(unresolved)}"[:1024],
        )
    if refused:
        return C.Cond(
            t,
            C.FALSE,
            C.INFERENCE_POOL_NOT_ACCEPTED,
            f"InferencePool {name} not accepted by {'; '.join(refused)}"[:1024],
        )
    return C.Cond(
        t,
        C.FALSE,
        C.INFERENCE_POOL_PENDING,
        f"InferencePool {name}: waiting for {'; '.join(pending)}"[:1024],
    )


def decide_routing(plan: ModelPlan, obs: Observed, old_conditions: Any) -> RoutingOutcome:
    """The model's InferencePool and RoutingReady.

    Routing is an add-on: whatever happens here (no CRD, no RBAC, a foreign pool, no Gateway)
    the model serves through its Service, so RoutingReady is the only condition it touches.
    Without the CRD nothing is written and nothing retried: the InferencePool watch notices
    when the CRD is installed and reconciles the models that asked for a pool.
    """
    name = inference_pool_name(plan.name)
    t = C.ROUTING_READY
    if not wants_inference_pool(plan):
        return RoutingOutcome(delete=obs.inference_pool is not None)
    if obs.foreign_inference_pool:
        return RoutingOutcome(C.Cond(t, C.FALSE, C.NAME_CONFLICT, obs.foreign_inference_pool))
    if obs.inference_pool_api == API_NOT_SERVED:
        return RoutingOutcome(
            C.Cond(
                t,
                C.FALSE,
                C.INFERENCE_POOL_CRD_MISSING,
                "the cluster does not serve InferencePools (inference.networking.k8s.io/v1): "
                "install the Gateway API Inference Extension CRDs; the operator creates "
                f"InferencePool {name} once they exist. The model serves through its Service "
                "meanwhile",
            )
        )
    if obs.inference_pool_api == API_FORBIDDEN:
        return RoutingOutcome(
            C.Cond(
                t,
                C.FALSE,
                C.INFERENCE_POOL_FORBIDDEN,
                "the operator may not watch or write InferencePools (grant list, watch, create, "
                "patch, delete on inferencepools.inference.networking.k8s.io): "
                + obs.inference_pool_api_message,
            )
        )
    if obs.inference_pool_api == API_UNKNOWN:
        old = C.find(old_conditions, t)
        if old is not None:  # the watch has not listed yet: keep what was known
            return RoutingOutcome(C.Cond(t, old["status"], old["reason"], old.get("message", "")))
        return RoutingOutcome(
            C.Cond(
                t, C.UNKNOWN, C.INFERENCE_POOL_PENDING, "checking whether InferencePools are served"
            )
        )
    return RoutingOutcome(
        _pool_condition(name, plan.namespace, obs.inference_pool), pool=build_inference_pool(plan)
    )
