"""Routing in the controller: which events reconcile which models (no N² fan-out)."""

from __future__ import annotations

import asyncio
from typing import Any

from spyre_operator.api import SpyreModelSpec
from spyre_operator.control.controller import Caches, Controller
from spyre_operator.desired.plan import OwnerRef, plan_model
from spyre_operator.handlers import ClaimUser

from .samples import GENERATE


def controller(users: dict[str, list[str]]) -> Controller:
    """A controller whose claim_users index holds ``claim -> model names`` in namespace ns."""
    index = {("ns", claim): [ClaimUser(OwnerRef(n, f"uid-{n}"), None) for n in names]
             for claim, names in users.items()}
    return Controller(client=None, caches=Caches({"claim_users": index}))  # type: ignore[arg-type]


def plan(name: str, **spec: Any) -> Any:
    return plan_model(name, "ns", f"uid-{name}",
                      SpyreModelSpec.model_validate({**GENERATE, **spec}))


def test_new_model_and_status_updates_do_not_wake_peers() -> None:
    c = controller({"spyre-compile-cache": ["a", "b", "c"]})
    assert c.router.claim_peers_if_changed(("ns", "a"), plan("a")) == []  # first sight
    assert c.router.claim_peers_if_changed(("ns", "a"), plan("a")) == []  # e.g. a status write


def test_leaving_or_changing_key_wakes_peers() -> None:
    c = controller({"spyre-compile-cache": ["a", "b"], "other": ["c"]})
    c.router.claim_peers_if_changed(("ns", "a"), plan("a"))
    edited = plan("a", compile={"maxModelLen": 3072})
    assert c.router.claim_peers_if_changed(("ns", "a"), edited) == [("ns", "b")]
    moved = plan("a", compile={"maxModelLen": 3072}, cache={"claimName": "other"})
    assert c.router.claim_peers_if_changed(("ns", "a"), moved) == [("ns", "b"), ("ns", "c")]
    assert c.router.claim_peers_if_changed(("ns", "a"), None) == [("ns", "c")]  # deleted


def test_pvc_events_wake_all_users_only_on_phase_changes() -> None:
    c = controller({"cache": ["a", "b", "c"]})
    everyone = [("ns", "a"), ("ns", "b"), ("ns", "c")]
    assert c.router.models_for_pvc_event("ns", "cache", "Pending") == everyone  # created
    assert c.router.models_for_pvc_event("ns", "cache", "Bound") == everyone
    assert c.router.models_for_pvc_event("ns", "cache", "Bound") == [("ns", "a")]  # owners changed
    assert c.router.models_for_pvc_event("ns", "cache", None) == everyone  # deleted


def test_decides_from_the_status_it_last_wrote_until_the_cache_catches_up() -> None:
    c = controller({})
    key = ("ns", "a")
    stale = {"metadata": {"name": "a", "uid": "u1", "resourceVersion": "5"},
             "status": {"observedGeneration": 1}}
    written = {"observedGeneration": 2}
    c.status.remember(key, stale, written)
    assert c.status.with_written_status(key, stale)["status"] == written
    caught_up = {"metadata": {**stale["metadata"], "resourceVersion": "6"}, "status": written}
    assert c.status.with_written_status(key, caught_up) is caught_up
    assert key not in c.status.written
    c.status.remember(key, stale, written)
    recreated = {"metadata": {"name": "a", "uid": "u2", "resourceVersion": "5"}}
    assert c.status.with_written_status(key, recreated) is recreated


def test_urgent_keys_go_first_and_are_not_duplicated() -> None:
    from spyre_operator.control.controller import WorkQueue

    async def order() -> list[Any]:
        q = WorkQueue()
        q.add(("ns", "old-1"))
        q.add(("ns", "old-2"))
        q.add(("ns", "new"), urgent=True)
        q.add(("ns", "old-2"), urgent=True)  # promoted; its normal entry becomes stale
        q.add(("ns", "old-1"))  # already queued
        out = [await q.get() for _ in range(3)]
        assert len(q) == 3 and q._queue.qsize() == 1  # the stale entry is left
        for k in out:
            q.done(k)
        return out

    assert asyncio.run(order()) == [("ns", "new"), ("ns", "old-2"), ("ns", "old-1")]


def test_model_claim_events_wake_the_models_loading_from_it() -> None:
    """pvc:// claims were not watched: a claim created later woke nobody (issue 11.8)."""
    from spyre_operator.handlers import index_model_claim_users

    body = {"metadata": {"namespace": "ns", "name": "w", "uid": "uid-w", "generation": 1},
            "spec": {"model": {"uri": "pvc://weights/granite"}}}
    index = {k: [v] for k, v in index_model_claim_users(body=body).items()}
    c = Controller(client=None, caches=Caches({"model_claim_users": index}))  # type: ignore[arg-type]
    assert c.router.models_for_model_claim("ns", "weights") == [("ns", "w")]
    assert c.router.models_for_model_claim("ns", "other") == []
