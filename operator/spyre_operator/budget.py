"""Cluster-wide budgets: how many precompile Jobs run, and how many models roll, at once.

An engine-image change (or any compile-affecting edit of many models) would otherwise start a
precompile Job per model at the same moment, and switch every serving Deployment as soon as
its artifact is ready. With a budget, a model that would start a Job (or switch its
Deployment to a new artifact) while every slot is taken waits instead: nothing is created,
the Deployment keeps serving the old artifact, and status says so
(``WaitingForCompileSlot`` / ``WaitingForRolloutSlot``).

``decide()`` stays pure: the controller (the one active replica, through leader election)
counts the slots in use from its watch caches, across every namespace it watches, and hands
each model a :class:`Slot` in ``Observed``. The order among waiting models is kept here: a
freed slot goes to the namespace holding the fewest, and within it oldest waiting first (when
it started waiting, as its status records it, then name), so a restarted operator or a new
leader rebuilds the same order from the models' status and its caches.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterator, Mapping

from .decide.slots import FREE, WAITING_RECHECK_SECONDS, Slot, ordinal

__all__ = ["FREE", "WAITING_RECHECK_SECONDS", "Slot", "ordinal"]  # the decisions' part, here too

ModelKey = tuple[str, str]  # (namespace, name)

#: A slot taken by a write the watch has not shown yet is held at most this long.
RESERVATION_SECONDS = 60.0
DEFAULT_MAX_CONCURRENT_COMPILES = 4
DEFAULT_MAX_CONCURRENT_ROLLOUTS = 4


class Waiting:
    """Models waiting for one budget, by when they started waiting (then namespace, name)."""

    def __init__(self) -> None:
        self._since: dict[ModelKey, str] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._since

    def __len__(self) -> int:
        return len(self._since)

    def add(self, key: ModelKey, since: str) -> None:
        self._since[key] = since

    def discard(self, key: ModelKey) -> bool:
        """Forget ``key``; whether it was waiting."""
        return self._since.pop(key, None) is not None

    def clear(self) -> None:
        self._since.clear()

    def since(self) -> dict[ModelKey, str]:
        """Every waiting model and when it started waiting."""
        return dict(self._since)


def _walk(
    limit: int, held: Mapping[str, int], waiting: Mapping[ModelKey, str], ns_limit: int
) -> Iterator[tuple[ModelKey, bool]]:
    """The waiting models in the order slots go to them, each with whether one does now.

    Fair share (issue 45): the next slot goes to the longest-waiting model of the namespace
    that holds the fewest slots (counting the ones just given), so one namespace's many
    models cannot take every slot while another namespace waits; with one namespace it is
    plain oldest-first. A namespace at ``ns_limit`` (0: no cap) gets none."""
    queues: dict[str, list[tuple[str, ModelKey]]] = {}
    for k, since in waiting.items():
        queues.setdefault(k[0], []).append((since, k))
    for q in queues.values():
        q.sort(reverse=True)  # the oldest last: popped first
    taken = dict(held)
    free = limit - sum(held.values()) if limit > 0 else None
    heap = [(taken.get(ns, 0), q[-1], ns) for ns, q in queues.items()]
    heapq.heapify(heap)
    while heap:
        _, _, ns = heapq.heappop(heap)
        _, k = queues[ns].pop()
        goes = (free is None or free > 0) and (ns_limit <= 0 or taken.get(ns, 0) < ns_limit)
        if goes:
            taken[ns] = taken.get(ns, 0) + 1
            if free is not None:
                free -= 1
        yield k, goes
        if queues[ns]:
            heapq.heappush(heap, (taken.get(ns, 0), queues[ns][-1], ns))


def fair_slot(
    limit: int, held: Mapping[str, int], waiting: Waiting, key: ModelKey, since: str,
    ns_limit: int = 0,
) -> Slot:
    """``key``'s answer: free when its turn in :func:`_walk` (with it waiting since
    ``since``) comes with a slot. ``held``: slots in use by namespace."""
    if limit <= 0 and ns_limit <= 0:
        return FREE
    order = {**waiting.since(), key: since}
    in_use, ns_in_use = sum(held.values()), held.get(key[0], 0)
    for position, (k, goes) in enumerate(_walk(limit, held, order, ns_limit), start=1):
        if k == key:
            full = not goes and ns_limit > 0 and ns_in_use >= ns_limit
            return Slot(goes, in_use, limit, position, ns_in_use, ns_limit, full)
    raise AssertionError("unreachable: key is in the order")  # pragma: no cover


def fair_first(
    limit: int, held: Mapping[str, int], waiting: Waiting, ns_limit: int = 0
) -> list[ModelKey]:
    """The waiting models a slot goes to now (whom to wake)."""
    return [k for k, goes in _walk(limit, held, waiting.since(), ns_limit) if goes]


class Reservations:
    """Slots taken by this replica's writes that the watch cache does not show yet (a Job just
    created, a Deployment just switched): without them, concurrent reconciles would each see
    the same free slot. Each is dropped once the cache shows the write, or after
    RESERVATION_SECONDS."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], tuple[str, float]] = {}

    def hold(self, ns: str, name: str, what: str = "") -> None:
        self._held[(ns, name)] = (what, time.monotonic())

    def get(self, ns: str, name: str) -> str | None:
        held = self._held.get((ns, name))
        return None if held is None else held[0]

    def drop(self, ns: str, name: str) -> None:
        self._held.pop((ns, name), None)

    def clear(self) -> None:
        self._held.clear()

    def live(self) -> dict[tuple[str, str], str]:
        """The reservations not expired (expired ones are forgotten)."""
        cutoff = time.monotonic() - RESERVATION_SECONDS
        for k, (_, t) in list(self._held.items()):
            if t < cutoff:
                del self._held[k]
        return {k: what for k, (what, _) in self._held.items()}
