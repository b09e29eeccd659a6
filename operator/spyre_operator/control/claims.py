"""Claims left behind (``Controller.claims``): the managed cache PVCs a model no longer names
are released. (The artifact GC of a claim is ``Controller.gc``, control/gc.py.)"""

from __future__ import annotations

import logging
from typing import Any

from lightkube.resources.core_v1 import PersistentVolumeClaim

from ..decide import claim_named_by, claims_to_release, mounted_claims, rollout_complete
from ..decide import jobs as job_status
from .base import ControllerParts

log = logging.getLogger("spyre_operator.control.controller")  # the controller's


class ClaimReleaser:
    """Release of the cache claims a model left. No state of its own: all from the caches."""

    def __init__(self, controller: ControllerParts) -> None:
        self.c = controller

    async def release(self, plan: Any, deployment: dict[str, Any] | None) -> None:
        """Release the managed cache PVCs the model owns but no longer names (decide/release.py):
        drop its ownerReference, or delete the PVC once no SpyreModel owns or names it; only
        when no pod of the operator may read from it."""
        ns, uid = plan.namespace, plan.uid
        pvc_index = self.c.caches.indices.get("pvcs") or {}
        owned = [
            pvc
            for k in list(pvc_index.keys())
            if k[0] == ns
            and k[1] != plan.claim
            and (pvc := self.c.caches.one("pvcs", k)) is not None
            and any(r.get("uid") == uid for r in pvc["metadata"].get("ownerReferences") or [])
        ]
        if not owned or not rollout_complete(deployment) or not self.c.may_write():
            return
        users = self.c.caches.indices.get("claim_users") or {}
        named = {k[1] for k in list(users.keys()) if k[0] == ns and self.c.caches.all(
            "claim_users", k)}
        # every model's spec as written, valid or not: a spec the API models refuse now still
        # names its claim (it is no claim user above), which must outlive the Delete users
        named |= {c for k in self.c.caches.keys("models") if k[0] == ns and (c := claim_named_by(
            (self.c.caches.one("models", k) or {}).get("spec")))}
        mounted = mounted_claims(deployment)
        for r in claims_to_release(
            uid, plan.claim, owned, mounted, self._claims_in_use(ns), named
        ):
            if r.keep is None:
                log.info("PVC %s/%s: no SpyreModel names it (retainPolicy Delete)", ns, r.name)
                await self.c.applier.delete(PersistentVolumeClaim, r.name, ns)
            else:
                await self.c.applier.release_owner(r.pvc, r.keep, plan.name)

    def _claims_in_use(self, ns: str) -> set[str]:
        """Claims a pod of the operator may read or write: those every Deployment of the
        namespace mounts, and those an unfinished Job (precompile or GC) writes to."""
        in_use: set[str] = set()
        for k in list((self.c.caches.indices.get("deployments") or {}).keys()):
            if k[0] == ns:
                in_use |= mounted_claims(self.c.caches.one("deployments", k))
        for k in list((self.c.caches.indices.get("claim_jobs") or {}).keys()):
            jobs = self.c.caches.all("claim_jobs", k) if k[0] == ns else []
            if any(not job_status.finished(j) for j in jobs):
                in_use.add(k[1])
        return in_use
