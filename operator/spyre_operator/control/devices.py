"""Observation of a model's cards under DRA (``Controller.devices``; accelerator.deviceClassName):
its ResourceClaimTemplates, whether its DeviceClass exists, and the devices allocated to its
serving pods' ResourceClaims. Its state: those reads, cached (a class's existence a while, an
allocation for as long as its claim is in use)."""

from __future__ import annotations

import time
from typing import Any

from lightkube import ApiError

from ..decide import Observed
from ..desired import names
from ..desired.devices import (
    RESOURCE_GROUP,
    RESOURCE_VERSION,
    DeviceClass,
    ResourceClaim,
    ResourceClaimTemplate,
    device_class,
)
from ..desired.plan import ModelPlan
from .base import ControllerParts
from .common import ModelKey

#: Whether a DeviceClass exists is asked again after this long.
DEVICE_CLASS_TTL = 30.0
#: The serving pods whose ResourceClaims are read (status.devices lists at most 16).
MAX_CLAIMED_PODS = 16


class DeviceObserver:
    """What the model's DRA claims hold (read from the API server: nothing here is watched)."""

    def __init__(self, controller: ControllerParts) -> None:
        self.c = controller
        #: DeviceClass name -> (when asked, exists; None: may not be read).
        self._device_classes: dict[str, tuple[float, bool | None]] = {}
        #: model -> its serving pods' allocated claims -> their devices (an allocation does
        #: not change while the claim lives: read once).
        self._allocated: dict[ModelKey, dict[str, list[dict[str, str]]]] = {}

    def forget(self, key: ModelKey) -> None:
        """The model is gone: its claims' devices are dropped."""
        self._allocated.pop(key, None)

    async def observe(
        self, key: ModelKey, obs: Observed, plan: ModelPlan, listed: bool
    ) -> None:
        """DRA (accelerator.deviceClassName): the model's ResourceClaimTemplates, whether its
        DeviceClass exists, and the devices allocated to its serving pods' claims (on each
        pod record as ``devices``; ``listed``: obs.server_pods is already read)."""
        cls = device_class(plan.spec)
        if cls is None:
            return
        ns, uid = key[0], plan.owner.uid
        if not listed:
            obs.server_pods = await self.c.observer.recent_server_pods(key)
        labels: dict[str, Any] = {
            names.MODEL_LABEL: names.model_label_value(key[1]),
            names.COMPONENT: names.COMPONENT_CARDS,
        }
        async for t in self.c.client.list(ResourceClaimTemplate, namespace=ns, labels=labels):
            # A list's items carry no apiVersion and kind; without them the applied object
            # never matched the live one and was written at every reconcile.
            live = {**t.to_dict(), "apiVersion": f"{RESOURCE_GROUP}/{RESOURCE_VERSION}",
                    "kind": "ResourceClaimTemplate"}
            refs = live["metadata"].get("ownerReferences") or []
            if any(r.get("uid") == uid for r in refs):  # a label is a claim; the owner decides
                obs.cards_templates[live["metadata"]["name"]] = live
        obs.device_class_found = await self._device_class_found(cls)
        known = self._allocated.get(key, {})
        now: dict[str, list[dict[str, str]]] = {}
        for pod in obs.server_pods[:MAX_CLAIMED_PODS]:
            devices: list[dict[str, str]] = []
            for claim in pod.get("claims") or []:
                if claim not in known:
                    got = await self._allocation(ns, claim)
                    if got is None:
                        continue
                    known[claim] = got
                now[claim] = known[claim]
                devices += known[claim]
            if devices:
                pod["devices"] = devices
        self._allocated[key] = now

    async def _device_class_found(self, name: str) -> bool | None:
        """Whether the DeviceClass exists (None: the operator may not read it, e.g. a
        namespaced install, which has no cluster-wide rights)."""
        at = time.monotonic()
        cached = self._device_classes.get(name)
        if cached is not None and at - cached[0] < DEVICE_CLASS_TTL:
            return cached[1]
        found: bool | None
        try:
            await self.c.client.get(DeviceClass, name)
            found = True
        except ApiError as e:
            if e.status.code not in (403, 404):
                raise
            found = None if e.status.code == 403 else False
        self._device_classes[name] = (at, found)
        return found

    async def _allocation(self, ns: str, claim: str) -> list[dict[str, str]] | None:
        """The devices allocated to a ResourceClaim (None: not allocated yet, or gone)."""
        try:
            live = (await self.c.client.get(ResourceClaim, claim, namespace=ns)).to_dict()
        except ApiError as e:
            if e.status.code == 404:
                return None
            raise
        allocation = (live.get("status") or {}).get("allocation")
        if not allocation:
            return None
        return [
            {"driver": str(r.get("driver")), "pool": str(r.get("pool")),
             "device": str(r.get("device"))}
            for r in (allocation.get("devices") or {}).get("results") or []
        ]  # fmt: skip
