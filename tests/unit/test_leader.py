"""leader.LeaderElector without a cluster: renew deadline, single errors, write gating."""

from __future__ import annotations

import asyncio
from typing import Any

from spyre_operator.control.leader import LeaderElector


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def elector(outcomes: list[Any], clock: Clock, changes: list[bool]) -> LeaderElector:
    e = LeaderElector(client=None, namespace="ns", identity="me",  # type: ignore[arg-type]
                      on_change=changes.append, clock=clock)

    async def try_acquire() -> bool:
        out = outcomes.pop(0)
        if isinstance(out, Exception):
            raise out
        return bool(out)

    e._try_acquire = try_acquire  # type: ignore[method-assign]
    return e


def test_acquire_then_one_failed_renewal_keeps_leading() -> None:
    clock, changes = Clock(), []
    e = elector([True, RuntimeError("API server hiccup"), True], clock, changes)
    asyncio.run(e.step())
    assert changes == [True] and e.holds()
    clock.t += 2
    asyncio.run(e.step())  # one error inside the renew deadline: still the leader
    assert changes == [True] and e.holds()
    clock.t += 2
    asyncio.run(e.step())
    assert e.holds()


def test_no_renewal_within_the_deadline_stops_writing_at_once() -> None:
    clock, changes = Clock(), []
    e = elector([True, RuntimeError("down"), RuntimeError("down")], clock, changes)
    asyncio.run(e.step())
    clock.t += 11  # e.g. the process was paused: the lease (15 s) may pass to another replica
    assert not e.holds(), "writes are gated before the elector even runs again"
    asyncio.run(e.step())
    assert changes == [True, False]


def test_losing_the_lease_to_another_holder_steps_down() -> None:
    clock, changes = Clock(), []
    e = elector([True, False], clock, changes)
    asyncio.run(e.step())
    clock.t += 2
    asyncio.run(e.step())
    assert changes == [True, False] and not e.holds()
