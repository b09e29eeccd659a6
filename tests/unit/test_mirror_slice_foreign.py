"""Issue 31, item 4: a same-named EndpointSlice that is not the operator's, where a scale-to-zero
model's mirror slice goes. The operator's EndpointSlice cache holds only its own slices (a
label-selected watch), so such a slice was invisible: the model wrote over it. Now observe
asks the API server for that one name while the cache has no mirror slice for a model that
may go to zero; a slice of someone else is reported and left alone (decide() writes no
scale-to-zero object then: test_scaletozero_reconcile), and looked at again later."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import Status
from spyre_operator.api import SpyreModelSpec
from spyre_operator.control.controller import Caches, Controller
from spyre_operator.decide import Observed
from spyre_operator.desired import names
from spyre_operator.desired.plan import plan_model

from .samples import GENERATE
from .test_scaletozero_reconcile import CONFIG, s2z


class Slices:
    """``client.list(EndpointSlice, namespace=, fields=)``: the slices it holds, by name."""

    def __init__(self, *bodies: dict[str, Any], code: int = 0) -> None:
        self.bodies, self.code, self.asked = list(bodies), code, []

    def list(self, resource: Any, namespace: str, fields: dict[str, str]) -> Any:
        self.asked.append((resource.__name__, namespace, fields))
        if self.code:
            raise ApiError(status=Status(code=self.code, message="forbidden"))

        async def items() -> Any:
            for b in self.bodies:
                if b["metadata"]["name"] == fields["metadata.name"]:
                    yield _Obj(b)

        return items()


class _Obj:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def to_dict(self) -> dict[str, Any]:
        return self.body


def slice_body(owner: dict[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": names.mirror_slice_name("m"), "namespace": "ns"}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"metadata": meta, "addressType": "IPv4", "endpoints": []}


def observe(client: Any, spec: dict[str, Any] | None = None, enabled: bool = True) -> Observed:
    c = Controller(client=client, caches=Caches(), workers=1)  # type: ignore[arg-type]
    c.scale_to_zero = CONFIG if enabled else CONFIG.__class__(enabled=False)
    plan = plan_model("m", "ns", "uid-m", SpyreModelSpec.model_validate(spec or s2z()))
    obs = Observed(keda=c.scale_to_zero)
    asyncio.run(c.observer.mirror_slice(obs, plan))
    return obs


def test_a_foreign_slice_under_the_mirror_name_is_reported_and_looked_at_again() -> None:
    client = Slices(slice_body(None))
    obs = observe(client)
    assert obs.mirror_slice is None
    assert obs.foreign_scale_to_zero and "not managed by the operator" in obs.foreign_scale_to_zero
    assert obs.recheck_after is not None and obs.recheck_after > 0
    name = names.mirror_slice_name("m")
    assert client.asked == [("EndpointSlice", "ns", {"metadata.name": name})]


def test_a_slice_controlled_by_another_object_is_foreign_too() -> None:
    other = {"kind": "Service", "name": "x", "uid": "u", "apiVersion": "v1", "controller": True}
    obs = observe(Slices(slice_body(other)))
    assert obs.foreign_scale_to_zero and "controlled by Service x" in obs.foreign_scale_to_zero


def test_the_operators_own_slice_the_cache_has_not_shown_yet_is_read_as_ours() -> None:
    ours = {"kind": "SpyreModel", "name": "m", "uid": "uid-m", "controller": True,
            "apiVersion": "serving.spyre.dev/v1alpha1"}
    obs = observe(Slices(slice_body(ours)))
    assert obs.foreign_scale_to_zero is None and obs.mirror_slice is not None


def test_no_slice_is_nothing_and_a_model_without_zero_asks_nothing() -> None:
    client = Slices()
    obs = observe(client)
    assert obs.foreign_scale_to_zero is None and obs.mirror_slice is None
    assert obs.recheck_after is None
    quiet = Slices(slice_body(None))
    assert observe(quiet, spec=dict(GENERATE)).foreign_scale_to_zero is None
    assert observe(quiet, enabled=False).foreign_scale_to_zero is None
    assert quiet.asked == []


def test_an_api_error_other_than_forbidden_propagates() -> None:
    with pytest.raises(ApiError):
        observe(Slices(code=500))
    assert observe(Slices(code=403)).foreign_scale_to_zero is None  # the watch's RBAC says it


def test_every_reconcile_of_a_valid_model_observes_the_mirror_slice() -> None:
    from .samples import model
    from .test_controller_failures import controller_with

    m = model("m", s2z())
    c, _ = controller_with(m)
    seen: list[str] = []

    async def record(obs: Observed, plan: Any) -> None:
        seen.append(plan.name)

    c.observer.mirror_slice = record  # type: ignore[method-assign]
    asyncio.run(c.reconcile_key(("ns", "m")))
    assert seen == ["m"]
