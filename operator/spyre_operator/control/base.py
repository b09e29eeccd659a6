"""What the Controller's parts (the mixins of control/) read and call on it, for the type
checker only: the attributes Controller.__init__ sets, and the methods one part calls on
another. Nothing here exists at run time beyond an empty class."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio
    from collections import Counter
    from collections.abc import Callable, Coroutine, Iterable, Mapping

    from lightkube import AsyncClient

    from .. import budget as B
    from ..apply import Applier
    from ..gc import GarbageCollector
    from ..metrics import Instruments
    from ..reconcile import Decision, Observed, Policy, ScaleToZeroConfig
    from .common import Caches, ModelKey, Stats
    from .peer_leases import PeerLeases
    from .queue import WorkQueue


class ControllerBase:
    """The Controller's state, as its parts see it (set in Controller.__init__)."""

    client: AsyncClient
    max_concurrent_compiles: int
    max_concurrent_rollouts: int
    compile_waiting: B.Waiting
    rollout_waiting: B.Waiting
    _compile_reserved: B.Reservations
    _rollout_reserved: B.Reservations
    _budget_seeded: bool
    policy: Policy
    caches: Caches
    applier: Applier
    instruments: Instruments
    queue: WorkQueue
    workers: int
    reconcile_deadline: float
    clock: Callable[[], str]
    stats: Stats
    requests: Counter[tuple[str, str]]
    _failures: dict[ModelKey, int]
    _deleted_jobs: dict[str, float]
    _job_messages: dict[str, list[dict[str, Any]]]
    _starting_jobs: dict[str, tuple[float, list[Any], list[Any]]]
    _job_messages_limit: int
    _tasks: list[asyncio.Task[None]]
    _pending: set[asyncio.Task[None]]
    _event_slots: asyncio.Semaphore
    _written_status: dict[ModelKey, tuple[str | None, str | None, dict[str, Any]]]
    _pruned_reported: bool
    _server_pods: dict[ModelKey, tuple[float, list[dict[str, Any]]]]
    _claim_sigs: dict[ModelKey, tuple[str, str, str | None]]
    _pvc_phases: dict[tuple[str, str], str]
    started_at: str
    gc: GarbageCollector
    active: asyncio.Event
    may_write: Callable[[], bool]
    install: str | None
    identity: str
    peer_window: float
    peer_leases: PeerLeases
    yielded: dict[ModelKey, str]
    _conflicts_reported: dict[ModelKey, tuple[str, float]]
    inference_pools: Any | None
    scale_to_zero: ScaleToZeroConfig
    scaled_objects: Any | None
    http_scaled_objects: Any | None
    interceptor_slices: Any | None

    if TYPE_CHECKING:
        # Methods one part calls on another (each defined in one mixin of control/).

        def enqueue(self, keys: Iterable[ModelKey], urgent: bool = False) -> None: ...

        def models_for_claim(self, namespace: str, claim: str) -> list[ModelKey]: ...

        def compiles_in_use(self) -> int: ...

        def _background(self, coro: Coroutine[Any, Any, None]) -> None: ...

        def _remember_status(
            self, key: ModelKey, model: Mapping[str, Any], status: dict[str, Any]
        ) -> None: ...

        def _report_pruned(self, model: Mapping[str, Any]) -> None: ...

        def _with_written_status(
            self, key: ModelKey, model: dict[str, Any]
        ) -> dict[str, Any]: ...

        async def _pods(
            self, namespace: str, selector: dict[str, str]
        ) -> list[dict[str, Any]]: ...

        async def execute(
            self, model: Mapping[str, Any], obs: Observed, d: Decision
        ) -> None: ...
