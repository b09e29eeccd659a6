"""Two operator installs on the same SpyreModels (peers.py): the stamp every status write
carries, and the controller leaving a model alone while another install writes it."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from spyre_operator import peers
from spyre_operator.controller import CONFLICT_EVENT_SECONDS
from spyre_operator.leader import LeaderElector

from .samples import GENERATE, model
from .test_controller_failures import NOW, controller_with

LATER = "2026-11-21T10:00:20Z"  # 20 s after NOW: inside a 30 s window
MUCH_LATER = "2026-11-21T10:00:31Z"  # past it


def stamp(install: str, at: str = NOW) -> dict[str, Any]:
    return {"operator": {"install": install, "identity": "pod-1", "writtenAt": at}}


def test_a_fresh_stamp_of_another_install_is_a_foreign_writer() -> None:
    other = peers.foreign_writer(stamp("ns-b/op"), "ns-a/op", LATER, 30)
    assert other == peers.ForeignWriter("ns-b/op", "pod-1", 20.0)
    message = peers.conflict_message(other, "ns-a/op")
    assert "ns-b/op" in message and "ns-a/op" in message and "disjoint" in message


def test_own_missing_or_stale_stamps_are_not() -> None:
    assert peers.foreign_writer(stamp("ns-a/op"), "ns-a/op", LATER, 30) is None
    assert peers.foreign_writer({}, "ns-a/op", LATER, 30) is None
    assert peers.foreign_writer(None, "ns-a/op", LATER, 30) is None
    assert peers.foreign_writer(stamp("ns-b/op"), "ns-a/op", MUCH_LATER, 30) is None
    assert peers.foreign_writer(stamp("ns-b/op", "garbage"), "ns-a/op", LATER, 30) is None


def test_the_stamp_is_kept_when_nothing_else_changes() -> None:
    """An idle reconcile writes nothing: the stamp's time moves only with a real write."""
    live = {"replicas": 1, **stamp("ns-a/op")}
    same = peers.stamped({"replicas": 1}, live, "ns-a/op", "pod-2", LATER)
    assert same == live
    changed = peers.stamped({"replicas": 2}, live, "ns-a/op", "pod-2", LATER)
    assert changed["operator"] == {"install": "ns-a/op", "identity": "pod-2", "writtenAt": LATER}
    taken = peers.stamped({"replicas": 1}, {"replicas": 1, **stamp("ns-b/op")}, "ns-a/op", "p",
                          LATER)  # fmt: skip
    assert taken["operator"]["install"] == "ns-a/op"


def _reconcile(c: Any, key: tuple[str, str]) -> None:
    asyncio.run(c.reconcile_key(key))


def test_a_model_another_install_writes_is_left_alone_and_reported() -> None:
    key = ("ns", "m")
    m = model("m", GENERATE)
    a, a_writes = controller_with(copy.deepcopy(m))
    a.install = "ns-a/op"
    _reconcile(a, key)
    written = a_writes.statuses[-1]
    assert written["operator"]["install"] == "ns-a/op", "every status write is stamped"
    assert a_writes.writes, "install a writes the children"

    # install b watches the same namespace and sees a's status 20 s later
    seen = {**m, "status": written}
    b, b_writes = controller_with(seen)
    b.install, b.clock = "ns-b/op", (lambda: LATER)
    requeued: list[float] = []
    b.queue.add_after = lambda k, delay: requeued.append(delay)  # type: ignore[method-assign]
    _reconcile(b, key)
    assert b_writes.writes == [] and b_writes.statuses == [], "b wrote to a's model"
    assert [(t, r) for t, r, _ in b_writes.events] == [("Warning", peers.CONFLICT_REASON)]
    assert "ns-a/op" in b_writes.events[0][2]
    assert b.stats.conflicts == 1 and b.yielded == {key: "ns-a/op"}
    assert requeued == [b.peer_window], "b looks again after the window"
    _reconcile(b, key)  # still within the window: still alone, no second Event
    assert b_writes.writes == [] and len(b_writes.events) == 1
    assert CONFLICT_EVENT_SECONDS >= 60

    # a stopped: its stamp grows stale, b takes over and stamps the model
    b.clock = lambda: MUCH_LATER
    _reconcile(b, key)
    assert b_writes.writes and b_writes.statuses[-1]["operator"]["install"] == "ns-b/op"
    assert b.yielded == {}


def test_an_idle_reconcile_writes_no_new_stamp() -> None:
    key = ("ns", "m")
    m = model("m", GENERATE)
    a, writes = controller_with(m)
    a.install = "ns-a/op"
    _reconcile(a, key)
    n = len(writes.statuses)
    a.clock = lambda: MUCH_LATER  # time passes; nothing else changes
    m["status"] = writes.statuses[-1]
    _reconcile(a, key)
    assert len(writes.statuses) == n, "an idle reconcile rewrote the stamp"


def test_the_lease_name_is_per_install() -> None:
    default = LeaderElector(client=None, namespace="ns", identity="me",  # type: ignore[arg-type]
                            on_change=lambda _: None)
    named = LeaderElector(client=None, namespace="ns", identity="me",  # type: ignore[arg-type]
                          on_change=lambda _: None, lease_name="team-a-spyre-model-operator")
    assert default.lease_name == "spyre-model-operator"
    assert named.lease_name == "team-a-spyre-model-operator"
    assert peers.install_id("ns", named.lease_name) == "ns/team-a-spyre-model-operator"
