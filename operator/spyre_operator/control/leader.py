"""Lease-based leader election, so several operator replicas are safe: only one writes.

Standby replicas keep watching (their caches stay warm) and take over within a lease duration
when the leader stops renewing. As in client-go's leaderelection:

- the lease lasts ``lease_seconds`` (15); the leader renews every ``retry_seconds`` (2) and
  must succeed within ``renew_deadline_seconds`` (10) of its last renewal, or it stops
  writing: :meth:`LeaderElector.holds` is checked before every write, so a leader that was
  paused or cut off never writes after its lease may have passed to another replica;
- a single failed renewal (an API server hiccup) is retried, not a step-down: stepping down
  re-queues every model, which at 500 models is minutes of work;
- a renewal that hangs is cut at the renew deadline.

The Lease is named per install (the chart passes its release's full name), so two releases in
one namespace each lead their own scope. Two installs whose watch scopes overlap still both
lead (their Leases differ): peers.py notices that on the models and reports it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from lightkube import ApiError, AsyncClient
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

log = logging.getLogger(__name__)

#: The Lease's name when none is given (``spyre-operator run`` outside the chart).
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
        renew_deadline_seconds: float = 10.0,
        retry_seconds: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        lease_name: str = LEASE_NAME,
    ) -> None:
        assert renew_deadline_seconds < lease_seconds
        self.client = client
        self.namespace = namespace
        self.lease_name = lease_name
        self.identity = identity
        self.on_change = on_change
        self.lease_seconds = lease_seconds
        self.renew_deadline_seconds = renew_deadline_seconds
        self.retry_seconds = retry_seconds
        self.clock = clock
        self.leading = False
        #: When the lease was last acquired or renewed (monotonic clock).
        self.renewed_at: float | None = None
        self._lease: Lease | None = None
        self._task: asyncio.Task[None] | None = None

    def holds(self) -> bool:
        """Whether this replica may write now: leading, and renewed within the deadline."""
        return self.leading and self._fresh()

    def _fresh(self) -> bool:
        return (
            self.renewed_at is not None
            and self.clock() - self.renewed_at < self.renew_deadline_seconds
        )

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
            log.info(
                "%s leadership of Lease %s/%s (%s)",
                "Acquired" if leading else "Lost",
                self.namespace,
                self.lease_name,
                self.identity,
            )
            self.on_change(leading)

    async def _run(self) -> None:
        while True:
            await self.step()
            await asyncio.sleep(self.retry_seconds)

    async def step(self) -> None:
        """One acquire-or-renew attempt."""
        started = self.clock()
        try:
            acquired = await asyncio.wait_for(
                self._try_acquire(), timeout=self.renew_deadline_seconds
            )
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - retried; only the deadline steps down
            log.warning("leader election: %s: %s", type(e).__name__, e)
            if self.leading and not self.holds():
                log.warning("leader election: no renewal within %.0fs", self.renew_deadline_seconds)
                self._set(False)
            return
        if acquired:
            self.renewed_at = started  # the lease counts from before the request was sent
        self._set(acquired and self._fresh())

    async def _try_acquire(self) -> bool:
        if self.leading and self._lease is not None and self._lease.spec is not None:
            # Renew from the Lease this replica last wrote: one request, not a GET and a PUT.
            # Its resourceVersion makes the update fail if anyone else wrote in between.
            self._lease.spec.renewTime = _now()
            try:
                self._lease = await self.client.replace(self._lease)
                return True
            except ApiError as e:
                self._lease = None
                if e.status.code != 409:
                    raise
        return await self._acquire()

    async def _acquire(self) -> bool:
        now = _now()
        spec = LeaseSpec(
            holderIdentity=self.identity,
            leaseDurationSeconds=self.lease_seconds,
            renewTime=now,
        )
        try:
            lease = await self.client.get(Lease, self.lease_name, namespace=self.namespace)
        except ApiError as e:
            if e.status.code != 404:
                raise
            spec.acquireTime = now
            lease_obj = Lease(
                metadata=ObjectMeta(name=self.lease_name, namespace=self.namespace), spec=spec
            )
            try:
                self._lease = await self.client.create(lease_obj)
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
            self._lease = await self.client.replace(lease)  # resourceVersion guards races
        except ApiError as e:
            if e.status.code == 409:
                return False
            raise
        return True

    async def _release(self) -> None:
        try:
            lease = await self.client.get(Lease, self.lease_name, namespace=self.namespace)
            if lease.spec and lease.spec.holderIdentity == self.identity:
                lease.spec.holderIdentity = None
                await self.client.replace(lease)
        except Exception as e:  # noqa: BLE001
            log.warning("could not release lease: %s", e)
