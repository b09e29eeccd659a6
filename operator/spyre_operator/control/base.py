"""What the Controller's collaborators (control/) read and call on it, for the type checker:
the shared infrastructure Controller.__init__ sets (client, caches, apply layer, queue,
clock, policy) and the collaborators themselves, which reach each other through it
(``c.budgets``, ``c.writer``, ...). A Protocol: nothing here exists at run time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from lightkube import AsyncClient

    from ..decide import Policy, ScaleToZeroConfig
    from ..kube.apply import Applier
    from .budgets import Budgets
    from .claims import ClaimReleaser
    from .common import Caches, ModelKey, Stats
    from .devices import DeviceObserver
    from .event_routing import Router
    from .execute import Writer
    from .gc import GarbageCollector
    from .observe import Observer
    from .queue import WorkQueue
    from .status import StatusReporter


class ControllerParts(Protocol):
    """The Controller as its collaborators see it."""

    client: AsyncClient
    caches: Caches
    applier: Applier
    queue: WorkQueue
    policy: Policy
    stats: Stats
    clock: Callable[[], str]
    may_write: Callable[[], bool]
    started_at: str
    install: str | None
    identity: str
    peer_window: float
    inference_pools: Any | None
    scale_to_zero: ScaleToZeroConfig
    scaled_objects: Any | None
    http_scaled_objects: Any | None
    interceptor_slices: Any | None
    # the collaborators
    budgets: Budgets
    writer: Writer
    status: StatusReporter
    observer: Observer
    devices: DeviceObserver
    router: Router
    claims: ClaimReleaser
    gc: GarbageCollector

    def enqueue(self, keys: Iterable[ModelKey], urgent: bool = False) -> None: ...
