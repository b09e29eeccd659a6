"""The controller's reconcile when something fails unexpectedly, and the status it compares
with before writing (pure of any cluster: a recording applier stands in for the API)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from spyre_operator.control.controller import ERROR_BACKOFF_BASE, Caches, Controller
from spyre_operator.decide import Observed, decide
from spyre_operator.decide import conditions as C

from .samples import GENERATE, model

NOW = "2026-11-21T10:00:00Z"


class RecordingApplier:
    """Records every write the controller asks for."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []
        self.statuses: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str]] = []
        self.rv = 100
        #: UIDs of models the API server no longer has (deleted during a watch gap)
        self.gone: set[str] = set()

    async def apply(self, obj: Any, live: Any) -> bool:
        self.writes.append(("apply", obj.kind))
        return True

    async def ensure_job(self, job: Any, live: Any) -> bool:
        self.writes.append(("job", job.metadata.name))
        return True

    async def owner_exists(self, model: dict[str, Any]) -> bool:
        return model["metadata"].get("uid") not in self.gone

    async def named(self, resource: type, name: str, namespace: str) -> dict[str, Any] | None:
        """A lookup by name of a kind the watches filter (ConfigMaps): none of someone else's."""
        return None

    async def delete(self, resource: type, name: str, namespace: str) -> bool:
        self.writes.append(("delete", resource.__name__))
        return True

    async def release_owner(self, pvc: Any, keep: list[Any], model: str) -> None:
        self.writes.append(("release", pvc["metadata"]["name"], keep))

    async def apply_status(
        self, name: str, ns: str, status: dict[str, Any], current: dict[str, Any] | None
    ) -> str | None:
        if status == current:
            return None
        self.statuses.append(status)
        self.rv += 1
        return str(self.rv)

    async def event(self, m: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))


async def until_requeued(c: Controller, delays: list[float], tick: float) -> None:
    """Poll (100 ticks at most) until a reconcile asked for a requeue (``delays``, recorded by
    a stubbed ``queue.add_after``) and no key is being reconciled."""
    for _ in range(100):
        await asyncio.sleep(tick)
        if delays and not c.queue._active:
            return


def reconcile_once(c: Controller, tick: float = 0.01) -> list[float]:
    """Start ``c``, reconcile ns/m until it asked for a requeue, stop; the requeue delays."""
    delays: list[float] = []
    c.queue.add_after = lambda key, delay: delays.append(delay)  # type: ignore[method-assign]

    async def once() -> None:
        c.start()
        c.queue.add(("ns", "m"))
        await until_requeued(c, delays, tick)
        await c.stop()

    asyncio.run(once())
    return delays


def serving_status(m: dict[str, Any]) -> dict[str, Any]:
    """A status as the operator wrote it: the model compiles (nothing observed yet)."""
    return decide(m, Observed(), NOW).status


def controller_with(m: dict[str, Any]) -> tuple[Controller, RecordingApplier]:
    key = (m["metadata"]["namespace"], m["metadata"]["name"])
    c = Controller(client=None, caches=Caches({"models": {key: [m]}}),  # type: ignore[arg-type]
                   workers=1, clock=lambda: NOW)
    applier = RecordingApplier()
    c.applier = applier  # type: ignore[assignment]
    return c, applier


def test_a_bug_in_observe_leaves_children_and_status_and_reports_it() -> None:
    """reconcile_key caught every exception: a failing observe() became a decision from an
    empty observation (PVC and Job applied from scratch, status rewritten to Compiling)."""
    m = model("m", GENERATE)
    m["metadata"]["resourceVersion"] = "7"
    m["status"] = serving_status(m)
    before = m["status"]
    c, applier = controller_with(m)

    def broken(*_: Any, **__: Any) -> Observed:
        raise KeyError("metadata")

    c.observer.observe = broken  # type: ignore[method-assign]
    delays: list[float] = []
    c.queue.add_after = lambda key, delay: delays.append(delay)  # type: ignore[method-assign]

    async def run_twice() -> None:
        c.start()
        for _ in range(2):
            c.queue.add(("ns", "m"))
            for _ in range(50):
                await asyncio.sleep(0.01)
                if len(delays) >= _ + 1 and not c.queue._active:
                    break
        await c.stop()

    asyncio.run(run_twice())
    assert applier.writes == [], "children were written from an empty observation"
    assert len(applier.statuses) == 1, "one report, not one per attempt"
    st = applier.statuses[0]
    rec = C.find(st["conditions"], C.RECONCILING)
    assert rec is not None and (rec["status"], rec["reason"]) == (C.TRUE, C.RECONCILE_ERROR)
    assert "KeyError" in rec["message"] and "metadata" in rec["message"]
    # every other field and condition as it was
    assert {k: v for k, v in st.items() if k != "conditions"} == {
        k: v for k, v in before.items() if k != "conditions"}
    others = [x for x in st["conditions"] if x["type"] != C.RECONCILING]
    assert others == [x for x in before["conditions"] if x["type"] != C.RECONCILING]
    assert [(t, r) for t, r, _ in applier.events] == [("Warning", C.RECONCILE_ERROR)]
    assert "KeyError" in applier.events[0][2]
    # and it backs off, exponentially
    assert len(delays) == 2 and delays[1] > delays[0] >= 0.8 * ERROR_BACKOFF_BASE


def test_an_invalid_spec_is_still_reported_as_such() -> None:
    m = model("m", {**GENERATE, "replicas": -1})
    c, applier = controller_with(m)
    asyncio.run(c.reconcile_key(("ns", "m")))
    assert applier.writes == []
    ready = C.find(applier.statuses[-1]["conditions"], C.READY)
    assert ready is not None and ready["reason"] == C.INVALID_SPEC


def test_a_reconcile_plans_the_model_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 49, 2: the controller's plan is the one decide() uses (it validated the spec and
    planned it again, in decide/assemble.py), and the decision is the one decide() makes
    when it plans itself."""
    from spyre_operator.control.controller import plan_model as controller_plan
    from spyre_operator.decide import assemble

    m = model("m", GENERATE)
    c, applier = controller_with(m)
    calls: list[str] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return controller_plan(*args, **kwargs)

    monkeypatch.setattr("spyre_operator.control.controller.plan_model", counted)
    monkeypatch.setattr(assemble, "plan_model", counted)
    asyncio.run(c.reconcile_key(("ns", "m")))
    assert calls == ["m"]
    assert applier.statuses[-1] == decide(m, Observed(cache_pvc=None), NOW).status
    assert [w[0] for w in applier.writes][:1] == ["job"]  # the precompile Job, as planned


@pytest.mark.parametrize("field", ["servingArtifactKey", "condition"])
def test_a_status_field_another_manager_changed_is_written_back(field: str) -> None:
    """Reproduced: the operator compared with its own last write and never corrected a field
    another field manager had changed, until the next transition."""
    m = model("m", GENERATE)
    m["metadata"]["resourceVersion"] = "7"
    c, _ = controller_with(m)
    key = ("ns", "m")
    ours = serving_status(m)
    ours["servingArtifactKey"] = "abc"
    c.status.remember(key, m, ours)
    # the watch has not delivered our write yet: decide from it
    assert c.status.with_written_status(key, m)["status"] == ours
    # the cache moved on (our write and then another manager's): the live status counts
    edited = {**ours}
    if field == "servingArtifactKey":
        edited["servingArtifactKey"] = "tampered"
    else:
        edited["conditions"] = [
            {**x, "status": "False", "reason": "Tampered"} if x["type"] == C.READY else x
            for x in ours["conditions"]]
    live = {**m, "metadata": {**m["metadata"], "resourceVersion": "9"}, "status": edited}
    assert c.status.with_written_status(key, live)["status"] == edited
    assert key not in c.status.written


def test_a_reconcile_that_hangs_is_cut_off_reported_and_retried() -> None:
    """An API call that never answers (an HTTP/2 stream the client's read timeout did not
    cover, on the real node) held its model's key for good: every later event on the model was
    only marked dirty and nothing reconciled it again."""
    m = model("m", GENERATE)
    m["metadata"]["resourceVersion"] = "7"
    m["status"] = serving_status(m)
    c, applier = controller_with(m)
    c.reconcile_deadline = 0.2
    calls: list[int] = []
    real_observe = c.observer.observe

    async def hanging_status(*_: Any, **__: Any) -> str | None:
        calls.append(1)
        if len(calls) == 1:
            await asyncio.Event().wait()  # the first write never returns
        return "8"

    def observe(*a: Any, **kw: Any) -> Observed:
        return real_observe(*a, **kw)

    c.observer.observe = observe  # type: ignore[method-assign]
    delays: list[float] = []
    c.queue.add_after = lambda key, delay: delays.append(delay)  # type: ignore[method-assign]
    applier.apply_status = hanging_status  # type: ignore[method-assign]

    async def run() -> None:
        c.start()
        c.queue.add(("ns", "m"))
        await until_requeued(c, delays, 0.02)
        # the key is free again: a new event reconciles it at once
        c.queue.add(("ns", "m"))
        for _ in range(100):
            await asyncio.sleep(0.02)
            if len(calls) >= 3 and not c.queue._active:
                break
        await c.stop()

    asyncio.run(run())
    assert delays, "the hung reconcile was never given up"
    assert len(calls) >= 3, calls  # hung write, the failure report, the next reconcile
    assert c.stats.errors >= 1
    reported = [e for e in applier.events if e[1] == C.RECONCILE_ERROR]
    assert reported and "did not finish in 0s" in reported[0][2], applier.events


@pytest.mark.parametrize("message, reported", [
    # two models of one key applied together: the other one's Job (other pod annotations)
    # appeared between this reconcile's read and its create
    ('Job.batch "spyre-compile-x" is invalid: spec.template: Invalid value: {...}: field is '
     "immutable", False),
    ('Job.batch "spyre-compile-x" is invalid: spec.template.spec.containers[0].image: '
     "Required value", True),
])
def test_a_job_a_sharer_created_an_instant_ago_is_no_failure(message: str,
                                                             reported: bool) -> None:
    from lightkube import ApiError
    from lightkube.models.meta_v1 import Status

    m = model("m", GENERATE)
    m["metadata"]["resourceVersion"] = "7"
    c, applier = controller_with(m)

    async def refuse(job: Any, live: Any) -> bool:
        assert live is None
        raise ApiError(status=Status(code=422, message=message))

    applier.ensure_job = refuse  # type: ignore[method-assign]
    delays = reconcile_once(c)
    written = [C.find(st["conditions"], C.DEGRADED) for st in applier.statuses]
    degraded = [d for d in written if d is not None and d["status"] == C.TRUE]
    assert bool(degraded) == reported, applier.statuses
    assert c.stats.errors == (1 if reported else 0)
    assert delays and (reported or delays[0] == 1.0), delays


def test_a_model_deleted_before_its_status_write_is_forgotten_not_retried() -> None:
    """The model the caches held is gone by the time its status is written (a fresh operator
    listed a namespace being deleted): the API server's 404 on the model's own status means what
    its DELETED event will say. Forgotten at once, as that event would have: no error, no
    retry, no "failed (retry in ...)" warning for a model nobody has (seen in a full run: the
    routing test, which asserts its operator logs no failed reconcile, read the one of another
    test's namespace being deleted)."""
    from lightkube import ApiError
    from lightkube.models.meta_v1 import Status

    m = model("m", GENERATE)
    m["metadata"]["resourceVersion"] = "7"
    c, applier = controller_with(m)

    async def gone(name: str, ns: str, status: dict[str, Any], current: Any) -> str | None:
        raise ApiError(status=Status(code=404, reason="NotFound",
                                     message=f'spyremodels.serving.spyre.dev "{name}" not found'))

    applier.apply_status = gone  # type: ignore[method-assign]
    forgotten: list[Any] = []
    c.status.forget = forgotten.append  # type: ignore[method-assign]
    assert asyncio.run(c.reconcile_key(("ns", "m"))) is None
    assert forgotten == [("ns", "m")]
    assert c.stats.errors == 0
