"""A status field another field manager set alone never makes the operator write (issue 31,
10): the status apply cannot remove it, so comparing the live status with it wrote the model's
status on every reconcile."""

from __future__ import annotations

from spyre_operator import FIELD_MANAGER
from spyre_operator.apply import comparable_status, status_fields_owned
from spyre_operator.handlers import index_models

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
