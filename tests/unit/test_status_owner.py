"""A status field another field manager set alone never makes the operator write (issue 31,
10): the status apply cannot remove it, so comparing the live status with it wrote the model's
status on every reconcile."""

from __future__ import annotations

from spyre_operator import FIELD_MANAGER
from spyre_operator.handlers import index_models
from spyre_operator.kube.apply import comparable_status, status_fields_owned

OURS = {"manager": FIELD_MANAGER, "operation": "Apply", "subresource": "status",
        "fieldsV1": {"f:status": {"f:conditions": {}, "f:observedGeneration": {},
                                  "f:operator": {"f:install": {}}}}}
THEIRS = {"manager": "kubectl-edit", "operation": "Update", "subresource": "status",
          "fieldsV1": {"f:status": {"f:note": {}}}}
SPEC = {"manager": FIELD_MANAGER, "operation": "Apply",
        "fieldsV1": {"f:metadata": {"f:annotations": {}}}}


def test_the_operators_status_fields_come_from_its_managed_fields() -> None:
    meta = {"managedFields": [OURS, THEIRS, SPEC]}
    assert status_fields_owned(meta) == ["conditions", "observedGeneration", "operator"]
    assert status_fields_owned({}) is None  # nothing known: compare everything
    body = {"metadata": {"name": "m", "namespace": "ns", **meta}, "spec": {}, "status": {}}
    [(key, cached)] = index_models(namespace="ns", name="m", body=body).items()
    assert "managedFields" not in cached["metadata"]
    assert cached["x-spyre-status-fields"] == ["conditions", "observedGeneration", "operator"]


def test_a_field_only_another_manager_set_is_left_out_of_the_comparison() -> None:
    desired = {"conditions": [1], "observedGeneration": 2}
    live = {"conditions": [1], "observedGeneration": 2, "note": "set by hand"}
    owned = ["conditions", "observedGeneration"]
    assert comparable_status(live, desired, owned) == desired  # no write
    # a field the operator owns and no longer writes is compared (the apply removes it)
    assert comparable_status({**live, "operator": {}}, desired, [*owned, "operator"]) != desired
    # one it owns that someone changed is compared, and written back
    assert comparable_status({**live, "conditions": [0]}, desired, owned) != desired
    assert comparable_status(live, desired, None) == live  # unknown: as before
    assert comparable_status(None, desired, owned) is None


def test_status_fields_an_older_crd_prunes_are_noticed_on_the_write() -> None:
    """Issue 31, 10: a CRD left at an older version (helm keeps CRDs on upgrade) prunes the
    status fields it does not know, silently: the answer to the write shows which."""
    import asyncio
    from types import SimpleNamespace
    from typing import Any

    from spyre_operator.kube.apply import Applier, pruned

    sent = {"servedSpec": "{}", "artifact": {"key": "k", "waitingSince": "t"},
            "conditions": [], "operator": {"install": "a/b"}, "replicas": None}
    kept = {"artifact": {"key": "k"}, "conditions": []}
    assert pruned(sent, kept) == ["status.servedSpec", "status.artifact.waitingSince",
                                  "status.operator"]
    assert pruned(sent, {**sent}) == []

    class Client:
        async def apply(self, obj: Any, **_: Any) -> Any:
            return SimpleNamespace(status=kept, metadata=SimpleNamespace(resourceVersion="9"))

    a = Applier(Client())  # type: ignore[arg-type]
    assert asyncio.run(a.apply_status("m", "ns", sent, None)) == "9"
    assert a.pruned == {"status.servedSpec", "status.artifact.waitingSince", "status.operator"}
    assert a.last_pruned is not None and set(a.last_pruned[2]) == a.pruned


def test_a_pruning_crd_is_one_warning_event_and_an_error_in_the_log() -> None:
    import asyncio

    from .samples import model
    from .test_budget import cluster, drain, spec

    m = model("m", spec(1))
    c, applier = cluster([m], compiles=3)
    applier.last_pruned = ("ns", "m", ["status.servedSpec"])  # type: ignore[attr-defined]

    async def run() -> None:
        c.enqueue([("ns", "m")])
        await drain(c)
        c.queue.add(("ns", "m"))
        await drain(c)
        await asyncio.gather(*c.writer.pending)
        await c.stop()

    asyncio.run(run())
    warned = [e for e in applier.events if e[1] == "CRDOutdated"]
    assert len(warned) == 1 and "status.servedSpec" in warned[0][2], applier.events


def test_a_field_another_manager_set_does_not_renew_the_install_stamp() -> None:
    """The stamp (peers.stamped) is kept when nothing else changes; compared with the live
    status and its foreign field, it was renewed, and so written, on every reconcile."""
    from spyre_operator.control import peers

    stamp = {"install": "ns/op", "identity": "a", "writtenAt": "2026-11-27T00:00:00Z"}
    desired = {"conditions": [1]}
    live = {"conditions": [1], "operator": stamp, "scaleToZero": {"lastActiveTime": "t"}}
    owned = ["conditions", "operator"]
    seen = comparable_status(live, {**desired, peers.STAMP_FIELD: None}, owned)
    out = peers.stamped(desired, seen, "ns/op", "a", "2026-11-27T01:00:00Z")
    assert out[peers.STAMP_FIELD] == stamp
    assert comparable_status(live, out, owned) == out  # no write
