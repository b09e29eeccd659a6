"""Controller types and helpers shared by its parts: the model key, the tunables, the caches'
views (Caches), the counters (Stats), the errors a reconcile raises and how they are told
apart, and the pure helpers on live objects (foreign_owner, compact_pod)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx2  # lightkube's HTTP client (httpx is a test-only package here)
from lightkube import ApiError

from ..desired import names

ModelKey = tuple[str, str]  # (namespace, name)

#: Re-check a model that is waiting on something no watched object announces (a pod crash).
NOT_READY_RECHECK_SECONDS = 15.0
ERROR_BACKOFF_BASE = 1.0
ERROR_BACKOFF_MAX = 300.0
#: Longest a single reconcile may take. Each API request has its own timeout, but a request
#: on an HTTP/2 stream can wait past it (seen on the real node: a status PATCH whose answer
#: never came, the model's key then held for good, every later event only marking it dirty).
#: Past this the reconcile is cut off, reported (Reconciling=True ReconcileError) and retried.
RECONCILE_DEADLINE_SECONDS = 120.0
#: Serving pods are listed at most this often per model (see _recent_server_pods).
SERVER_PODS_TTL = 5.0
#: Events posted concurrently in the background.
EVENT_CONCURRENCY = 8
#: While another install writes a model, repeat its OperatorConflict Event this often.
CONFLICT_EVENT_SECONDS = 600.0
#: Warning Event reason: the installed CRD prunes status fields the operator writes.
CRD_OUTDATED = "CRDOutdated"
#: Terminal Jobs whose pods are remembered before the gone ones are forgotten.
JOB_MESSAGES_MIN_LIMIT = 256
#: Default concurrent reconciles: a reconcile mostly waits on the API server, so many cheap
#: coroutines keep throughput up (the benchmark at 500 models; see tests/bench/RESULTS.md).
DEFAULT_WORKERS = 32


@dataclass
class Caches:
    """Views of kopf's indices (name -> index); each index maps a key to a store of values.

    kopf drops a value only on a DELETED event: after a watch gap its re-list adds and updates
    but never removes what was deleted meanwhile. ``ghosts`` holds the UIDs the operator's own
    re-list (resync.py) found gone while an index still holds them: every read skips them."""

    indices: Mapping[str, Any] = field(default_factory=dict)
    ghosts: frozenset[str] = frozenset()

    def _live(self, value: Any) -> bool:
        return not self.ghosts or uid_of(value) not in self.ghosts

    def one(self, index: str, key: Any) -> Any | None:
        idx = self.indices.get(index)
        if idx is None or key not in idx:
            return None
        for value in idx[key]:
            if self._live(value):
                return value
        return None

    def all(self, index: str, key: Any) -> list[Any]:
        idx = self.indices.get(index)
        if idx is None or key not in idx:
            return []
        return [v for v in idx[key] if self._live(v)]

    def keys(self, index: str) -> list[Any]:
        """The keys of ``index`` with a value that is not a ghost."""
        idx = self.indices.get(index) or {}
        return [k for k in list(idx.keys()) if self.one(index, k) is not None]

    def values(self, index: str) -> dict[Any, Any]:
        """``index`` as a plain mapping of key -> first value, ghosts left out."""
        return {k: v for k in list((self.indices.get(index) or {}).keys())
                if (v := self.one(index, k)) is not None}


def uid_of(value: Any) -> str | None:
    """The UID of an index value: an object's (a dict), or its SpyreModel's (an OwnerRef, a
    ClaimUser)."""
    if isinstance(value, Mapping):
        return (value.get("metadata") or {}).get("uid")
    owner = getattr(value, "owner", value)
    uid = getattr(owner, "uid", None)
    return str(uid) if uid else None


@dataclass
class Stats:
    """Counters exposed on the operator's metrics and used by the benchmark."""

    reconciles: int = 0
    errors: int = 0
    #: times another install was found writing a model this one watches (peers.py)
    conflicts: int = 0
    reconcile_seconds: float = 0.0
    #: reconciles per model namespace: a test confirms its own model was reconciled
    namespace_reconciles: Counter[str] = field(default_factory=Counter)


class RejectedWrites(Exception):
    """Some writes of a reconcile were rejected; status says so, the worker backs off."""


class ReconcileHung(Exception):
    """A reconcile ran past the deadline and was cut off (reported, then retried)."""


class NotLeader(RuntimeError):
    """The leader lease is not held (any more): this replica must not write."""


class OwnerGone(RuntimeError):
    """The model a reconcile would create children for is not in the API server (any more):
    the caches still held it after a watch gap (resync.py finds it at its next round), or it
    was deleted before its status was written (a 404 on its own status)."""


def unexpected(e: BaseException) -> bool:
    """An error no cluster state explains (a bug, e.g. in observe()), as opposed to the API
    server refusing or failing a request, the connection dropping, or losing the lease."""
    return not isinstance(
        e, ApiError | RejectedWrites | NotLeader | httpx2.HTTPError | OSError | TimeoutError
    )


def foreign_owner(kind: str, live: Mapping[str, Any], model: str) -> str | None:
    """Why ``live`` (a child named after ``model``) is not the operator's, or None if it is.

    Ours: controlled by a SpyreModel of that name (any uid: a model deleted and created again
    adopts what its earlier incarnation left for the garbage collector).
    """
    meta = live.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller"):
            if ref.get("kind") == "SpyreModel" and ref.get("name") == model:
                return None
            return (
                f"{kind} {meta.get('name')} exists and is controlled by {ref.get('kind')} "
                f"{ref.get('name')}, not by this SpyreModel: delete it or rename the SpyreModel"
            )
    return (
        f"{kind} {meta.get('name')} exists and is not managed by the operator: delete it "
        "or rename the SpyreModel"
    )


def is_rejected_write(e: ApiError) -> bool:
    """A client error the API server will repeat until something changes (not a race)."""
    code = e.status.code or 0
    return 400 <= code < 500 and code not in (404, 409, 429)


def says_terminating(message: str) -> bool:
    return "because it is being terminated" in message


def namespace_going_away(e: BaseException) -> bool:
    """An error that only says the model's namespace is being (or was) deleted."""
    if isinstance(e, RejectedWrites):
        return says_terminating(str(e))
    if not isinstance(e, ApiError):
        return False
    details = e.status.details
    gone = e.status.code == 404 and details is not None and details.kind == "namespaces"
    return gone or (e.status.code == 403 and says_terminating(e.status.message or ""))


def compact_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The few fields of a pod the reconcile reads (termination messages, crash loops)."""
    meta = pod.get("metadata", {})
    labels = meta.get("labels") or {}
    out: dict[str, Any] = {
        "name": meta.get("name"),
        "phase": (pod.get("status") or {}).get("phase"),
        "artifact": labels.get(names.ARTIFACT_LABEL),
    }
    reason = (pod.get("status") or {}).get("reason")
    if reason:  # set when the kubelet ended the pod itself (Evicted, NodeShutdown, ...)
        out["reason"] = reason
    canary = labels.get(names.CANARY_LABEL) == "true"
    if canary:
        out["canary"] = True
    ip = (pod.get("status") or {}).get("podIP")
    # where the operator reads a canary's count and any pod's figures (decide/canary_report.py)
    if ip:
        out["podIP"] = str(ip)
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        state = cs.get("state") or {}
        last = cs.get("lastState") or {}
        # The last termination explains a container that is down now (restarting, crash
        # looping); once it runs and is ready again, an old OOM kill is history, not a failure.
        # A canary's is its verdict (CanaryFailed) even once the kubelet has restarted it.
        term = state.get("terminated") or (
            last.get("terminated")
            if canary or (not cs.get("ready") and not state.get("running"))
            else None
        )
        if term:
            out["terminated"] = {
                "exitCode": term.get("exitCode"),
                "reason": term.get("reason"),
                "message": term.get("message"),
                "finishedAt": term.get("finishedAt"),
            }
        waiting = (state.get("waiting") or {}).get("reason")
        if waiting:
            out["waiting"] = waiting
            message = (state.get("waiting") or {}).get("message")
            if message:  # the kubelet's: which image, which Secret or ConfigMap
                out["waitingMessage"] = str(message)[:512]
        out["ready"] = bool(cs.get("ready"))
    conds = (pod.get("status") or {}).get("conditions") or []
    for c in conds:
        if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
            out["unschedulable"] = c.get("message") or "no node fits"
        if canary and c.get("type") == "Ready" and c.get("status") == "True":
            # A canary's window starts again when its pod turns Ready again (decide/canary.py).
            out["readySince"] = c.get("lastTransitionTime")
    spec = pod.get("spec") or {}
    # DRA: the templates the pod's claims were made from (a template in use is not deleted)
    # and its claims (the devices allocated to them: status.devices, DevicesUnavailable).
    templates = [c["resourceClaimTemplateName"] for c in spec.get("resourceClaims") or []
                 if c.get("resourceClaimTemplateName")]  # fmt: skip
    if templates:
        out["claimTemplates"] = templates
    claims = [c["resourceClaimName"] for c in (pod.get("status") or {}).get(
        "resourceClaimStatuses") or [] if c.get("resourceClaimName")]  # fmt: skip
    if claims:
        out["claims"] = claims
    if not spec.get("nodeName") and not any(c.get("type") == "PodScheduled" for c in conds):
        # No scheduler has looked at it yet (each writes PodScheduled when it tries).
        out["unscheduledSince"] = meta.get("creationTimestamp")
        out["scheduler"] = spec.get("schedulerName") or "default-scheduler"
    return out
