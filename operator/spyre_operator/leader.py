"""Lease-based leader election, so several operator replicas are safe: only one writes.

Standby replicas keep watching (their caches stay warm) and take over within a lease duration
when the leader stops renewing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from lightkube import ApiError, AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

log = logging.getLogger(__name__)

LEASE_NAME = "spyre-model-operator"


def _now() -> datetime:
    return datetime.now(UTC)


def _fmt(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(s: str | datetime | None) -> datetime | None:
    if s is None:
        return None
    if isinstance(s, datetime):
        return s if s.tzinfo else s.replace(tzinfo=UTC)
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(s, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


class LeaderElector:
    """Acquire and renew a coordination.k8s.io Lease; report changes via ``on_change``."""

    def __init__(
        self,
        client: AsyncClient,
        namespace: str,
        identity: str,
        on_change: Callable[[bool], None],
        lease_seconds: int = 15,
        renew_seconds: float = 5.0,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.identity = identity
        self.on_change = on_change
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.leading = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="leader-election")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.leading:
            await self._release()

    def _set(self, leading: bool) -> None:
        if leading != self.leading:
            self.leading = leading
            log.info("%s leadership (%s)", "Acquired" if leading else "Lost", self.identity)
            self.on_change(leading)

    async def _run(self) -> None:
        while True:
            try:
                self._set(await self._try_acquire())
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001
                log.warning("leader election: %s", e)
                self._set(False)
            await asyncio.sleep(self.renew_seconds)

    async def _try_acquire(self) -> bool:
        now = _now()
        spec = LeaseSpec(
            holderIdentity=self.identity,
            leaseDurationSeconds=self.lease_seconds,
            renewTime=now,
        )
        try:
            lease = await self.client.get(Lease, LEASE_NAME, namespace=self.namespace)
        except ApiError as e:
            if e.status.code != 404:
                raise
            spec.acquireTime = now
            lease_obj = Lease(
                metadata=ObjectMeta(name=LEASE_NAME, namespace=self.namespace), spec=spec
            )
            try:
                await self.client.create(lease_obj)
            except ApiError as e2:
                if e2.status.code == 409:
                    return False
                raise
            return True
        holder = lease.spec.holderIdentity if lease.spec else None
        renew = _parse(lease.spec.renewTime) if lease.spec else None
        duration = (lease.spec.leaseDurationSeconds if lease.spec else None) or self.lease_seconds
        expired = renew is None or renew + timedelta(seconds=duration) < now
        if holder != self.identity and holder and not expired:
            return False
        if holder != self.identity:
            spec.acquireTime = now
            spec.leaseTransitions = ((lease.spec.leaseTransitions or 0) + 1) if lease.spec else 1
        else:
            spec.acquireTime = _parse(lease.spec.acquireTime if lease.spec else None) or now
            spec.leaseTransitions = lease.spec.leaseTransitions if lease.spec else None
        lease.spec = spec
        try:
            await self.client.replace(lease)  # resourceVersion guards against races
        except ApiError as e:
            if e.status.code == 409:
                return False
            raise
        return True

    async def _release(self) -> None:
        try:
            lease = await self.client.get(Lease, LEASE_NAME, namespace=self.namespace)
            if lease.spec and lease.spec.holderIdentity == self.identity:
                lease.spec.holderIdentity = None
                await self.client.replace(lease)
        except Exception as e:  # noqa: BLE001
            log.warning("could not release lease: %s", e)
