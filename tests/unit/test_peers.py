"""Two operator installs on the same SpyreModels (peers.py): the stamp every status write
carries, and the controller leaving a model alone while another install writes it."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from spyre_operator.control import peers
from spyre_operator.control.controller import CONFLICT_EVENT_SECONDS
from spyre_operator.control.leader import LeaderElector

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
    assert b.stats.conflicts == 1 and b.status.yielded == {key: "ns-a/op"}
    assert requeued == [b.peer_window], "b looks again after the window"
    _reconcile(b, key)  # still within the window: still alone, no second Event
    assert b_writes.writes == [] and len(b_writes.events) == 1
    assert CONFLICT_EVENT_SECONDS >= 60

    # a stopped (its Lease is gone): its stamp grows stale, b takes over and stamps the model
    b.clock = lambda: MUCH_LATER
    b.status.peer_leases = Leases({"ns-a/op": peers.LEASE_GONE})  # type: ignore[assignment]
    _reconcile(b, key)
    assert b_writes.writes and b_writes.statuses[-1]["operator"]["install"] == "ns-b/op"
    assert b.status.yielded == {}


class Leases:
    """PeerLeases with fixed answers (None: being asked)."""

    def __init__(self, answers: dict[str, str | None]) -> None:
        self.answers, self.asked = answers, []

    def state(self, install: str) -> str | None:
        self.asked.append(install)
        return self.answers[install]


def _idle_model_of_a(at: str) -> tuple[Any, Any, Any]:
    """Install b, and a model a wrote (stamped ``at``) and left idle."""
    key = ("ns", "m")
    m = model("m", GENERATE)
    a, a_writes = controller_with(copy.deepcopy(m))
    a.install, a.clock = "ns-a/op", (lambda: at)
    _reconcile(a, key)
    b, b_writes = controller_with({**m, "status": a_writes.statuses[-1]})
    b.install = "ns-b/op"
    requeued: list[float] = []
    b.queue.add_after = lambda k, delay: requeued.append(delay)  # type: ignore[method-assign]
    return b, b_writes, requeued


def test_an_idle_model_of_a_running_install_is_not_taken_from_it() -> None:
    """Issue 31, item 6: two live installs took idle models from each other every window
    (the stamp moves only with a real write). A stale stamp whose install holds its Lease is
    left alone (up to HOLD_SECONDS); past that it is taken over."""
    b, writes, requeued = _idle_model_of_a(NOW)
    b.status.peer_leases = Leases({"ns-a/op": peers.LEASE_HELD})  # type: ignore[assignment]
    b.clock = lambda: MUCH_LATER
    _reconcile(b, ("ns", "m"))
    assert writes.writes == [] and writes.statuses == [], "b took a running install's model"
    assert b.status.yielded == {("ns", "m"): "ns-a/op"} and requeued == [b.peer_window]
    assert "holds its Lease" in writes.events[0][2]
    b.clock = lambda: "2026-11-21T11:00:01Z"  # an hour later: a may no longer watch it
    _reconcile(b, ("ns", "m"))
    assert writes.statuses and writes.statuses[-1]["operator"]["install"] == "ns-b/op"


def test_a_lease_that_cannot_be_read_delays_the_takeover_and_says_why() -> None:
    b, writes, _ = _idle_model_of_a(NOW)
    b.status.peer_leases = Leases({"ns-a/op": peers.LEASE_UNKNOWN})  # type: ignore[assignment]
    b.clock = lambda: MUCH_LATER
    _reconcile(b, ("ns", "m"))
    assert writes.statuses == [] and "may not read its Lease" in writes.events[0][2]
    b.clock = lambda: "2026-11-21T10:15:00Z"  # TAKEOVER_UNKNOWN_SECONDS after a's write
    _reconcile(b, ("ns", "m"))
    assert writes.statuses and writes.statuses[-1]["operator"]["install"] == "ns-b/op"


def test_while_the_lease_is_asked_the_model_waits_quietly() -> None:
    b, writes, requeued = _idle_model_of_a(NOW)
    b.status.peer_leases = Leases({"ns-a/op": None})  # type: ignore[assignment]
    b.clock = lambda: MUCH_LATER
    _reconcile(b, ("ns", "m"))
    assert writes.statuses == [] and writes.events == [] and b.stats.conflicts == 0
    assert requeued == [1.0]


def test_a_fresh_stamp_needs_no_lease() -> None:
    b, writes, _ = _idle_model_of_a(NOW)
    leases = Leases({})
    b.status.peer_leases = leases  # type: ignore[assignment]
    b.clock = lambda: LATER
    _reconcile(b, ("ns", "m"))
    assert leases.asked == [] and writes.statuses == []


def test_lease_state_from_the_lease() -> None:
    t = peers._seconds("2026-11-21T10:00:00Z")
    assert t is not None
    held = {"spec": {"holderIdentity": "pod-1", "renewTime": "2026-11-21T10:00:00.000000Z",
                     "leaseDurationSeconds": 15}}
    assert peers.lease_state(held, t + 14) == peers.LEASE_HELD
    assert peers.lease_state(held, t + 16) == peers.LEASE_GONE  # not renewed: stopped
    released = {"spec": {**held["spec"], "holderIdentity": ""}}
    assert peers.lease_state(released, t) == peers.LEASE_GONE
    assert peers.lease_state(None, t) == peers.LEASE_GONE
    assert peers.lease_of("ns-a/op") == ("ns-a", "op")
    assert peers.lease_of("garbage") is None and peers.lease_of("a/b/c") is None


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


def test_peer_leases_asks_once_caches_and_reads_404_and_403() -> None:
    from lightkube import ApiError
    from lightkube.models.meta_v1 import Status
    from spyre_operator.control.peer_leases import PeerLeases

    class Client:
        def __init__(self) -> None:
            self.gets: list[tuple[str, str]] = []

        async def get(self, resource: Any, name: str, namespace: str) -> Any:
            self.gets.append((namespace, name))
            code = {"gone": 404, "locked": 403}.get(namespace)
            if code:
                raise ApiError(status=Status(code=code, message="no"))
            raise AssertionError("unexpected")

    async def run() -> None:
        client, tasks = Client(), []
        answered: list[str] = []
        leases = PeerLeases(client, lambda coro: tasks.append(asyncio.ensure_future(coro)),  # type: ignore[arg-type]
                            on_answer=answered.append)
        assert leases.state("gone/op") is None and leases.state("gone/op") is None
        assert leases.state("locked/op") is None
        await asyncio.gather(*tasks)
        assert client.gets == [("gone", "op"), ("locked", "op")], "asked once each"
        assert leases.state("gone/op") == peers.LEASE_GONE
        assert leases.state("locked/op") == peers.LEASE_UNKNOWN
        assert answered == ["gone/op", "locked/op"] and len(client.gets) == 2  # cached
        assert leases.state("not-an-install") == peers.LEASE_UNKNOWN

    asyncio.run(run())
