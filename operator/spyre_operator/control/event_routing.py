"""Which models an event concerns (``Controller.router``): the models_for_* lookups the watch
handlers enqueue. Its state (the claims' signatures, the PVCs' phases) is its own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..decide import conditions as C
from ..desired.scaletozero import SLICE_SERVICE_NAME
from .base import ControllerParts
from .common import ModelKey


class Router:
    """Work queue routing: the models to reconcile for an event on a model or a child."""

    def __init__(self, controller: ControllerParts) -> None:
        self.c = controller
        #: model -> (claim, key, volume) of its last reconcile: see claim_peers_if_changed.
        self._claim_sigs: dict[ModelKey, tuple[str, str, str | None]] = {}
        #: (namespace, claim) -> the PVC's phase last seen: see models_for_pvc_event.
        self._pvc_phases: dict[tuple[str, str], str] = {}

    def models_for_owner_refs(self, namespace: str, body: Mapping[str, Any]) -> list[ModelKey]:
        """SpyreModels named in a child's ownerReferences."""
        refs = body.get("metadata", {}).get("ownerReferences") or []
        return [(namespace, r["name"]) for r in refs if r.get("kind") == "SpyreModel"]

    def models_for_claim(self, namespace: str, claim: str) -> list[ModelKey]:
        """SpyreModels using ``claim`` as their cache."""
        users = self.c.caches.all("claim_users", (namespace, claim))
        return [(namespace, u.owner.name) for u in users]

    def models_for_model_claim(self, namespace: str, claim: str) -> list[ModelKey]:
        """SpyreModels loading weights from pvc://``claim`` (it appeared, went or changed)."""
        owners = self.c.caches.all("model_claim_users", (namespace, claim))
        return [(namespace, o.name) for o in owners]

    def models_for_routing_object(self, namespace: str, body: Mapping[str, Any]) -> list[ModelKey]:
        """An InferencePool changed: its owners, or the same-named model (a foreign pool)."""
        keys = self.models_for_owner_refs(namespace, body)
        name = str((body.get("metadata") or {}).get("name") or "")
        return keys or self.models_for_child_name(namespace, name)

    def models_for_child_name(self, namespace: str, name: str) -> list[ModelKey]:
        """SpyreModels one of whose children is named ``name`` (a foreign object of that name
        conflicts with them): by the derived names, not the model's own."""
        return [(namespace, m) for m in self.c.caches.all("child_names", (namespace, name))]

    def models_wanting_routing(self) -> list[ModelKey]:
        """Models that ask for an InferencePool or still report on one (RoutingReady)."""
        models = self.c.caches.indices.get("models") or {}
        out = []
        for key in list(models.keys()):
            m = self.c.caches.one("models", key) or {}
            routing = (m.get("spec") or {}).get("routing") or {}
            conds = (m.get("status") or {}).get("conditions")
            if routing.get("inferencePool") or C.find(conds, C.ROUTING_READY):
                out.append(key)
        return out

    def models_wanting_scale_to_zero(self) -> list[ModelKey]:
        """Models that allow zero replicas (autoscaling.minReplicas 0)."""
        models = self.c.caches.indices.get("models") or {}
        out = []
        for key in list(models.keys()):
            m = self.c.caches.one("models", key) or {}
            auto = (m.get("spec") or {}).get("autoscaling") or {}
            if auto.get("minReplicas") == 0:
                out.append(key)
        return out

    def models_for_interceptor_slice(self, body: Mapping[str, Any]) -> list[ModelKey]:
        """An EndpointSlice of the interceptor's namespace changed: if it is the proxy
        Service's, every scale-to-zero model mirrors it."""
        labels = (body.get("metadata") or {}).get("labels") or {}
        if labels.get(SLICE_SERVICE_NAME) != self.c.scale_to_zero.interceptor_service:
            return []
        return self.models_wanting_scale_to_zero()

    def claim_peers_if_changed(self, key: ModelKey, plan: Any | None) -> list[ModelKey]:
        """Models sharing a cache claim with ``key``, if ``key``'s use of the claim changed.

        Every reconcile writes the shared objects (the cache PVC's and the precompile Job's
        ownerReferences) from the indices, so a new model's own reconcile brings them up to
        date. Only a model that leaves a claim or an artifact key (an edit, a deletion, an
        invalid spec) or changes its volume settings leaves state that just its peers can
        fix. Enqueueing every peer on every event (status writes included) would cost N²
        reconciles for N models on one claim.
        """
        sig = None
        if plan is not None:
            sig = (plan.claim, plan.key, repr(plan.volume) if plan.claim_managed else None)
        old = self._claim_sigs.pop(key, None)
        if sig is not None:
            self._claim_sigs[key] = sig
        if old is None and sig is not None and sig[2] is None:
            # A new cache.claimName user: a PVC the operator made for the others must lose
            # its ownerReferences now (deleting them must not delete a claim it names).
            return sorted(set(self.models_for_claim(key[0], sig[0])) - {key})
        if old is None or old == sig:
            return []
        if sig is None or sig[0] != old[0]:
            # Deleted (or moved): what only it listed on the old claim is an orphan now.
            self.c.gc.sweep_requested.add((key[0], old[0]))
        peers = set(self.models_for_claim(key[0], old[0]))
        if sig is not None and sig[0] != old[0]:
            peers |= set(self.models_for_claim(key[0], sig[0]))
        peers.discard(key)
        return sorted(peers)

    def models_for_pvc_event(self, namespace: str, claim: str, phase: str | None) -> list[ModelKey]:
        """Models to reconcile for an event on PVC ``claim`` (``phase`` None: deleted).

        All users when the PVC appeared, vanished or changed phase (their CacheVolumeReady
        condition changes); otherwise one user, which re-applies the PVC if it drifted (any
        user builds the same PVC). The PVC's owner list changes with every new user, and
        reconciling every user on each of those events would cost N² reconciles.
        """
        users = self.models_for_claim(namespace, claim)
        k = (namespace, claim)
        old = self._pvc_phases.get(k, "absent")
        if phase is None:
            self._pvc_phases.pop(k, None)
        else:
            self._pvc_phases[k] = phase
        if old != (phase or "absent"):
            return users
        return sorted(users)[:1]
